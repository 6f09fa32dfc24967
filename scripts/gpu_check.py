"""The GPU check; the logic is kernelformer/bench/gpu_check.py (its docstring: sections, budgets).

  python scripts/gpu_check.py                              # on one GPU, <= ~14 minutes
  python scripts/gpu_check.py --dry_run --out_dir /tmp/gc  # CPU: tiny shapes, interpret mode
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernelformer.bench.gpu_check import main  # noqa: E402  pylint: disable=g-import-not-at-top

if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
