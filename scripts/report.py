"""Alias of `kernelformer report` (kernelformer/commands/report.py); `python scripts/report.py --help` lists the flags.

  python scripts/report.py ARGS   ==   kernelformer report ARGS
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernelformer import cli  # noqa: E402  pylint: disable=g-import-not-at-top

if __name__ == '__main__':
  sys.exit(cli.main(['report', *sys.argv[1:]]))
