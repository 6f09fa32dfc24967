"""Tables and a plot from a sweep directory: kernels x tasks, mean ± std over seeds, paper numbers beside.

  python scripts/report.py runs/sweeps/mini             # writes runs/sweeps/mini/report.{md,csv,png}
  python scripts/report.py runs/sweeps/sf --paper spectraformer --out docs/sweeps/spectraformer

--paper defaults to the paper of the named sweep that made the directory (none for a --grid sweep);
--paper none hides paper numbers. The markdown table is also printed. The work is
kernelformer.reproduce.report; see docs/reproduce.md.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

_PAPER = flags.DEFINE_string('paper', None, 'Paper whose printed numbers to show: spectraformer, '
                             'kernel_learning, skyformer or none (default: the sweep\'s own).')
_OUT = flags.DEFINE_string('out', None, 'Output path without extension (default: SWEEP_DIR/report).')


def main(argv):
  if len(argv) != 2:
    raise app.UsageError('usage: scripts/report.py SWEEP_DIR [--paper NAME] [--out PREFIX]')
  sweep_dir = argv[1]
  if not os.path.isdir(sweep_dir):
    print(f'error: {sweep_dir} is not a directory', file=sys.stderr)
    sys.exit(2)
  from kernelformer.reproduce import report as report_lib  # pylint: disable=g-import-not-at-top
  try:
    report = report_lib.build(sweep_dir, paper=_PAPER.value)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  if not report.runs:
    print(f'error: {sweep_dir} holds no sweep.json and no results.json', file=sys.stderr)
    sys.exit(1)
  paths = report_lib.write(report, _OUT.value or os.path.join(sweep_dir, 'report'), sweep_dir)
  print(report_lib.markdown(report, sweep_dir))
  print('wrote ' + ', '.join(paths.values()))


if __name__ == '__main__':
  app.run(main)
