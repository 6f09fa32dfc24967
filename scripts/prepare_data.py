"""Alias of `kernelformer prepare-data` (kernelformer/commands/prepare_data.py); `python scripts/prepare_data.py --help` lists the flags.

  python scripts/prepare_data.py ARGS   ==   kernelformer prepare-data ARGS
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernelformer.commands.prepare_data import *  # noqa: E402,F401,F403  pylint: disable=wildcard-import
from kernelformer.commands.prepare_data import main  # noqa: E402  pylint: disable=g-import-not-at-top

if __name__ == '__main__':
  from kernelformer import cli  # pylint: disable=g-import-not-at-top
  sys.exit(cli.main([*'prepare-data'.split(), *sys.argv[1:]]))
