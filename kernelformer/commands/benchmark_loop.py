"""The trainer's steps/s against a bare loop of the same compiled step, and the input pipeline's cost.

  kernelformer benchmark loop                                   # tiny, quick, mqar, text; 3 rounds
  kernelformer benchmark loop --settings tiny,quick --steps 100 --rounds 5 --time_limit_s 300
  kernelformer benchmark loop --settings tiny,quick,mqar --with_pipeline --rounds 5
  kernelformer benchmark loop --settings text --rounds 7        # ~25 min on 2 CPU cores, 7.5 GiB
  kernelformer benchmark loop --settings text --batch text=8          # the Text model at batch 8

Settings: tiny and quick (configs/listops.py); mqar: Zoology's figure-2 model on its own generated data
(configs/mqar.py:zoology: length 64, 4 pairs, vocabulary 8192, batch 512); text: the LRA Text model
(configs/text.py:lra: 4 x 256, 4 heads, mlp 1024, 1000 bytes, batch 32) with
configs/text.py:kernel_learning's attention (gmm-rks, M=128), whose step fits a CPU host (6.5 GiB temp;
the lra preset's softmax asks 12.6 GiB). A --batch or --kind other than the setting's is named in the
table.

--with_pipeline adds the trainer reading its batches through the input pipeline as a run does
(``trainer with pipeline / bare``) and the pipeline alone (examples/s).

Writes ``loop.md`` (a table) into --out_dir (default runs/benchmarks/) and prints it. See
kernelformer/bench/loop.py for what each side runs. Goal: trainer / bare >= 0.95, and trainer with
pipeline / bare >= 0.95.
"""
from __future__ import annotations

import argparse
import os
import sys

from kernelformer.commands import _common


def main(argv) -> int:
  from kernelformer.bench import loop, measure  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(prog='kernelformer benchmark loop', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--settings', default=','.join(loop.SETTINGS),
                      help=f'comma-separated, of: {", ".join(loop.SETTINGS)}')
  parser.add_argument('--steps', default='',
                      help='steps per round (>= 2; the first of each round is not timed): one number for '
                           'all settings, or setting=N,... '
                           '(default: ' + ', '.join(f'{k}={v.steps}' for k, v in loop.SETTINGS.items())
                           + ')')
  parser.add_argument('--rounds', type=int, default=3, help='interleaved rounds of each side')
  parser.add_argument('--batch', default='',
                      help='per-step batch: one number for all settings, or setting=N,... (default: '
                           "the preset's, 32 for text; another is named in the table)")
  parser.add_argument('--kind', default='',
                      help="attention kind (default: the setting's; text: gmm-rks)")
  parser.add_argument('--time_limit_s', type=float, default=0.0,
                      help='no new round after this many seconds (0: none)')
  parser.add_argument('--with_pipeline', action='store_true',
                      help='also time the loop reading batches through the input pipeline')
  parser.add_argument('--out_dir', default=os.path.join('runs', 'benchmarks'))
  args = parser.parse_args(argv)
  settings = [s.strip() for s in args.settings.split(',') if s.strip()]
  bad = [s for s in settings if s not in loop.SETTINGS]
  if bad or not settings:
    print(f'error: --settings: unknown {", ".join(bad) or "(none given)"}; valid: '
          f'{", ".join(loop.SETTINGS)}', file=sys.stderr)
    return 2
  try:
    steps = _per_setting(args.steps, settings, loop.SETTINGS, minimum=2)
  except ValueError as e:
    print(f'error: --steps {args.steps}: {e}', file=sys.stderr)
    return 2
  try:
    batch = _per_setting(args.batch, settings, loop.SETTINGS)
  except ValueError as e:
    print(f'error: --batch {args.batch}: {e}', file=sys.stderr)
    return 2
  if args.rounds < 1:
    print('error: --rounds must be >= 1', file=sys.stderr)
    return 2
  error = _common.unknown_kind_error([args.kind] if args.kind else [])
  if error:
    print(error, file=sys.stderr)
    return 2
  from kernelformer.training import sharding  # pylint: disable=g-import-not-at-top
  before = measure.load_average()
  try:
    results = loop.measure(settings, steps=steps, rounds=args.rounds, kind=args.kind or None,
                           batch=batch, time_limit_s=args.time_limit_s,
                           with_pipeline=args.with_pipeline)
  except sharding.ShardingError as e:   # a --batch the devices do not divide
    print(f'error: --batch {args.batch}: {e}', file=sys.stderr)
    return 2
  _common.write_benchmark_table(
      'loop', argv, args.out_dir,
      f'load average before {before}, after {measure.load_average()}.',
      lambda header: loop.markdown(results, header))
  return 0


def _per_setting(text: str, settings, known, minimum: int = 1) -> dict:
  """``N`` (every chosen setting) or ``setting=N,...`` -> {setting: N}; N >= ``minimum``."""
  values = {}
  for part in filter(None, (p.strip() for p in text.split(','))):
    name, sep, value = part.rpartition('=')
    for s in ([name] if sep else settings):
      if s not in known:
        raise ValueError(f'unknown setting {s!r}')
      try:
        values[s] = int(value)
      except ValueError:
        raise ValueError(f'{value!r} is not a whole number') from None
      if values[s] < minimum:
        raise ValueError(f'must be >= {minimum}')
  return values
