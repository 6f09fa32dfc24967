"""Alias of `kernelformer train` (kernelformer/commands/train.py); `python scripts/train.py --help` lists the flags.

  python scripts/train.py ARGS   ==   kernelformer train ARGS
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernelformer import cli  # noqa: E402  pylint: disable=g-import-not-at-top

if __name__ == '__main__':
  sys.exit(cli.main(['train', *sys.argv[1:]]))
