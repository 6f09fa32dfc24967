"""kernelformer report: tables and a plot from a sweep directory (or any folder of runs).

usage:
  kernelformer report SWEEP_DIR [--paper NAME] [--out PREFIX]

examples:
  kernelformer report runs/sweeps/mini             # writes runs/sweeps/mini/report.{md,csv,png}
  kernelformer report runs/sweeps/sf --paper spectraformer --out docs/sweeps/spectraformer

Rows are kernels (or the sweep's labels), columns tasks; a cell is mean ± std over seeds of runs whose
configs are identical except for the seed (their "fingerprint"). Runs of one kernel that differ in
anything else (steps, preset, options, ...) are never averaged: they get separate rows, and a warning
names the fields that differ. --paper defaults to the paper of the named sweep that made the directory
(none for a --grid sweep); --paper none hides paper numbers. The markdown table is also printed. The
work is kernelformer.reproduce.report; see docs/reproduce.md.
"""
from __future__ import annotations

import os
import sys

from absl import app, flags

from kernelformer.commands import _common

_PAPER = flags.DEFINE_string('paper', None, 'Paper whose printed numbers to show: spectraformer, '
                             'kernel_learning, skyformer or none (default: the sweep\'s own).')
_OUT = flags.DEFINE_string('out', None, 'Output path without extension (default: SWEEP_DIR/report).')


def _main(argv):
  if len(argv) != 2:
    raise app.UsageError('usage: kernelformer report SWEEP_DIR [--paper NAME] [--out PREFIX]')
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
  if not any(r.results for r in report.runs) and report.unreadable:
    print(f"error: {sweep_dir} holds no finished run; results.json that cannot be read: "
          f"{'; '.join(report.unreadable)}", file=sys.stderr)
    sys.exit(1)
  paths = report_lib.write(report, _OUT.value or os.path.join(sweep_dir, 'report'), sweep_dir)
  print(report_lib.markdown(report, sweep_dir))
  for warning in report.warnings:
    print(f'warning: {warning}', file=sys.stderr)
  for unreadable in report.unreadable:
    print(f'warning: {unreadable}; that run counts as not finished', file=sys.stderr)
  print('wrote ' + ', '.join(paths.values()))


def help_text() -> str:
  from kernelformer.reproduce import paper_numbers  # pylint: disable=g-import-not-at-top
  papers = 'papers (--paper NAME): ' + ', '.join(sorted(paper_numbers.PAPERS)) + ', none'
  return _common.absl_help(sys.modules[__name__], extra=lambda: papers)


def run(args) -> int:
  return _common.run_absl(sys.modules[__name__], 'kernelformer report', args, _main, help_text)
