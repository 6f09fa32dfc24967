"""kernelformer reproduce: one command per published measurement that is not a training table.

usage:
  kernelformer reproduce instability --task TASK [--seeds N] [flags]

examples:
  kernelformer reproduce instability --task text --seeds 3 --out_dir runs/reproduce
  kernelformer reproduce instability --task listops --seeds 20 --precision skyformer-amp \
      --set data.max_length=2048      # Skyformer's protocol: AMP, ListOps padded to 2048

instability: Skyformer's appendix table 3 (the ratio of each model's instability score to softmax
self-attention's over the first 20 training steps of the table 1 setting, the task config's
``skyformer`` preset), for one task column: Nystromformer, Kernelized Attention (``gaussian``) and
Skyformer against ``softmax``, mean ± sd over seeds, the published ratio beside ours. Writes
instability-TASK.{json,md} into --out_dir and prints the table. What is computed, and each choice the
paper leaves open: kernelformer/reproduce/instability.py. The task's data must be prepared
(kernelformer prepare-data --config TASK:skyformer; ListOps is generated on first use).

Seeds are not computed twice: a result already in --out_dir (kept as instability-TASK.previous.*)
gives its finished seeds to a new command with the same settings, device, jax and git commit (a
clean checkout): `--seeds 5` after `--seeds 3` computes seeds 3 and 4; otherwise a line says why.
Each kind compiles once per command, not per seed.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

from kernelformer.commands import _common

SUBCOMMANDS = ('instability',)


def instability(argv) -> int:
  from kernelformer.reproduce import instability as lib  # pylint: disable=g-import-not-at-top
  from kernelformer.reproduce import sweeps  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(prog='kernelformer reproduce instability', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--task', required=True, choices=lib.TASKS)
  parser.add_argument('--seeds', type=int, default=3, help='seeds 0..N-1 (default 3)')
  parser.add_argument('--steps', type=int, default=lib.STEPS, help='training steps (default 20)')
  parser.add_argument('--kinds', default=','.join(lib.KINDS),
                      help=f'comma-separated kinds scored against {lib.REFERENCE} '
                           f'(default {",".join(lib.KINDS)})')
  parser.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                      help='override a field of the preset (repeatable), e.g. data.data_dir=/data')
  parser.add_argument('--precision', default='float32', choices=lib.PRECISIONS,
                      help="skyformer-amp: torch AMP as Skyformer trains (float16 Linears, loss scaling)")
  parser.add_argument('--vary', default='all', choices=lib.VARY,
                      help='what the seed varies; init / batches: controls that keep seed 0 for the rest')
  parser.add_argument('--out_dir', default=os.path.join('runs', 'reproduce'))
  args = parser.parse_args(argv)
  if args.seeds < 1:
    raise _common.UserError(f'--seeds must be >= 1, got {args.seeds}')
  kinds = [k.strip() for k in args.kinds.split(',') if k.strip()]
  if not kinds:
    raise _common.UserError('--kinds names no kind')
  try:
    overrides = sweeps.parse_sets(args.set)
  except sweeps.SweepError as e:
    raise _common.UserError(f'--set: {e}') from None
  command = 'kernelformer reproduce instability ' + ' '.join(shlex.quote(a) for a in argv)
  previous = lib.read(args.task, args.out_dir, log=lambda m: print(m, flush=True))
  try:
    result = lib.run(args.task, list(range(args.seeds)), kinds=kinds, steps=args.steps,
                     overrides=overrides, log=lambda m: print(m, flush=True),
                     on_seed=lambda partial: lib.write(partial, args.out_dir, command),
                     previous=previous, precision=args.precision, vary=args.vary)
  except lib.InstabilityError as e:
    raise _common.UserError(str(e)) from None
  paths = lib.write(result, args.out_dir, command)
  print(lib.markdown(result, command))
  print('wrote ' + ', '.join(paths.values()))
  return 0


def run(args) -> int:
  args = list(args)
  if not args or args[0] in ('-h', '--help'):
    print(__doc__.strip())
    return 0 if args else 2
  name, rest = args[0], args[1:]
  if name not in SUBCOMMANDS:
    raise _common.UserError(f'unknown reproduce command {name!r}; valid: {", ".join(SUBCOMMANDS)}')
  return instability(rest)
