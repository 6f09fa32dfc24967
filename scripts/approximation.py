"""Alias of `kernelformer benchmark approximation` (kernelformer/commands/approximation.py); `python scripts/approximation.py --help` lists the flags.

  python scripts/approximation.py ARGS   ==   kernelformer benchmark approximation ARGS
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernelformer.commands.approximation import *  # noqa: E402,F401,F403  pylint: disable=wildcard-import
from kernelformer.commands.approximation import main  # noqa: E402  pylint: disable=g-import-not-at-top

if __name__ == '__main__':
  from kernelformer import cli  # pylint: disable=g-import-not-at-top
  sys.exit(cli.main([*'benchmark approximation'.split(), *sys.argv[1:]]))
