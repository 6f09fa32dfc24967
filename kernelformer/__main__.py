"""``python -m kernelformer COMMAND ...``: the same as the ``kernelformer`` command (kernelformer/cli.py)."""
import sys

from kernelformer.cli import main

if __name__ == '__main__':
  sys.exit(main())
