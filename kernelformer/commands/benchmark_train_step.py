"""Train-step time per attention kind: steps that reuse the stored projection vs steps that redraw it.

  kernelformer benchmark train_step --config configs/listops.py:quick \\
      --kinds posrf-iid,posrf-orf,posrf-mm,posrf-fastfood,softmax --batch_size 8 --length 512

Writes ``train_step.md`` (a table) into --out_dir (default runs/benchmarks/) and prints it. See
kernelformer/bench/train_step.py for what is measured.
"""
from __future__ import annotations

import argparse
import os
import sys

from kernelformer.commands import _common


def main(argv) -> int:
  parser = argparse.ArgumentParser(prog='kernelformer benchmark train_step', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--config', default='configs/listops.py:quick', help='FILE.py:PRESET')
  parser.add_argument('--kinds', default='posrf-iid,posrf-orf,posrf-mm,posrf-fastfood,softmax')
  parser.add_argument('--batch_size', type=int, default=8)
  parser.add_argument('--length', type=int, default=0, help='data.max_length (0: the preset\'s)')
  parser.add_argument('--num_features', type=int, default=0, help='0: the kind\'s default')
  parser.add_argument('--set', action='append', default=[], metavar='FIELD=VALUE',
                      help='config override, e.g. --set model.num_heads=2 (repeatable)')
  parser.add_argument('--repeats', type=int, default=10)
  parser.add_argument('--out_dir', default=os.path.join('runs', 'benchmarks'))
  args = parser.parse_args(argv)
  from kernelformer.bench import measure, train_step  # pylint: disable=g-import-not-at-top
  kinds = [k.strip() for k in args.kinds.split(',') if k.strip()]
  error = _common.unknown_kind_error(kinds)
  if error:
    print(error, file=sys.stderr)
    return 2
  from kernelformer.reproduce import sweeps  # pylint: disable=g-import-not-at-top
  try:
    config = sweeps.load_config(*_common.split_spec(_common.resolve_spec(args.config)))
    with config.unlocked():
      sweeps.apply_overrides(config, [('data.max_length', args.length)] * bool(args.length) + [
          ('model.attention.num_features', args.num_features)] * bool(args.num_features) + [
              (f, sweeps.parse_value(v)) for f, _, v in (i.partition('=') for i in args.set)])
  except (sweeps.SweepError, TypeError) as e:   # no such field; a value of another type
    print(f'error: {e}', file=sys.stderr)
    return 2
  results = train_step.measure(config, kinds, batch_size=args.batch_size, repeats=args.repeats)
  _common.write_benchmark_table(
      'train_step', argv, args.out_dir,
      f'load average after the run: {measure.load_average()}; batch {args.batch_size}, length '
      f'{config.data.max_length}, redraw_every {config.model.attention.redraw_every or 100}.',
      lambda header: train_step.markdown(results, header))
  return 0
