"""Alias of `kernelformer benchmark attention` (kernelformer/commands/benchmark_attention.py); `python scripts/benchmark_attention.py --help` lists the flags.

  python scripts/benchmark_attention.py ARGS   ==   kernelformer benchmark attention ARGS
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernelformer.commands.benchmark_attention import *  # noqa: E402,F401,F403  pylint: disable=wildcard-import
from kernelformer.commands.benchmark_attention import main  # noqa: E402  pylint: disable=g-import-not-at-top

if __name__ == '__main__':
  from kernelformer import cli  # pylint: disable=g-import-not-at-top
  sys.exit(cli.main([*'benchmark attention'.split(), *sys.argv[1:]]))
