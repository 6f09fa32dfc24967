"""A trained run's accuracy under other random draws (how much it depends on the draw it trained with).

  kernelformer benchmark redraw --workdir RUN [--checkpoint best|latest|STEP] [--draw_steps 0,1000]
                                [--split val] [--out FILE.md]

Evaluates one checkpoint of RUN on the whole split, first with the draws evaluation uses (those of the
checkpoint's last training step), then with the draws of each training step in --draw_steps. Reads
RUN's config.json and checkpoints and writes nothing there, so it may run beside the training. What is
measured: kernelformer/bench/redraw.py.
"""
from __future__ import annotations

import argparse
import shlex

from kernelformer.commands import _common


def main(argv) -> int:
  parser = argparse.ArgumentParser(prog='kernelformer benchmark redraw', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--workdir', required=True, help='a run directory (kernelformer train --workdir)')
  parser.add_argument('--checkpoint', default='best',
                      help="'best' (best validation, default), 'latest', or a step number")
  parser.add_argument('--draw_steps', default='0', help='comma-separated training steps whose draws to '
                      'evaluate with (default 0)')
  parser.add_argument('--split', default='val', choices=('train', 'val', 'test'))
  parser.add_argument('--out', default='', help='also write the table to this markdown file')
  args = parser.parse_args(argv)
  try:
    steps = [int(s) for s in args.draw_steps.split(',') if s.strip()]
  except ValueError:
    raise _common.UserError(f'--draw_steps must be comma-separated integers, got {args.draw_steps!r}'
                            ) from None
  if any(s < 0 for s in steps):
    raise _common.UserError(f'--draw_steps must be >= 0, got {args.draw_steps!r}')
  if args.checkpoint not in ('best', 'latest') and not args.checkpoint.isdigit():
    raise _common.UserError(f"--checkpoint must be 'best', 'latest' or a step, got {args.checkpoint!r}")
  from kernelformer.bench import redraw  # pylint: disable=g-import-not-at-top
  command = 'kernelformer benchmark redraw ' + ' '.join(shlex.quote(a) for a in argv)
  try:
    step, rows = redraw.accuracy_by_draw(args.workdir, steps, checkpoint=args.checkpoint,
                                         split=args.split, log=lambda m: print(m, flush=True))
  except redraw.RedrawError as e:
    raise _common.UserError(str(e)) from None
  table = redraw.markdown(args.workdir, step, rows, args.split, command)
  print(table)
  if args.out:
    with open(args.out, 'w', encoding='utf-8') as f:
      f.write(table + '\n')
  return 0
