"""Alias of `kernelformer benchmark loader` (kernelformer/commands/benchmark_loader.py); `python scripts/benchmark_loader.py --help` lists the flags.

  python scripts/benchmark_loader.py ARGS   ==   kernelformer benchmark loader ARGS
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernelformer.commands.benchmark_loader import *  # noqa: E402,F401,F403  pylint: disable=wildcard-import
from kernelformer.commands.benchmark_loader import main  # noqa: E402  pylint: disable=g-import-not-at-top

if __name__ == '__main__':
  from kernelformer import cli  # pylint: disable=g-import-not-at-top
  sys.exit(cli.main([*'benchmark loader'.split(), *sys.argv[1:]]))
