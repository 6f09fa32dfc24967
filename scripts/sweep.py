"""Alias of `kernelformer sweep` (kernelformer/commands/sweep.py); `python scripts/sweep.py --help` lists the flags.

  python scripts/sweep.py ARGS   ==   kernelformer sweep ARGS
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernelformer import cli  # noqa: E402  pylint: disable=g-import-not-at-top

if __name__ == '__main__':
  sys.exit(cli.main(['sweep', *sys.argv[1:]]))
