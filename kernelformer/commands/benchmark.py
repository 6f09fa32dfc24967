"""kernelformer benchmark: measurements behind docs/benchmarks.md.

usage:
  kernelformer benchmark [attention] [flags]    # time, compiled memory and FLOPs vs sequence length
  kernelformer benchmark approximation [flags]  # approximation quality of the kernels (four paper plots)
  kernelformer benchmark loader [flags]         # Pathfinder loader speed, raw PNGs vs decoded cache
  kernelformer benchmark train_step [flags]     # train-step time per kind, reusing vs redrawing W
  kernelformer benchmark pallas-resources       # registers / spills / shared memory of every Pallas
                                                # kernel, compiled offline for sm_90a and sm_80
  kernelformer benchmark loop [flags]           # the trainer's steps/s vs a bare loop of the same step
  kernelformer benchmark redraw --workdir RUN   # a trained run's accuracy under other random draws
  kernelformer benchmark population [flags]     # member-steps/s of populations vs single runs
  kernelformer benchmark NAME --help            # the flags of one

attention and approximation write into runs/benchmarks/ unless --out_dir says otherwise (the committed
results of docs/benchmarks.md are regenerated with --out_dir docs/benchmarks); --quick runs tiny sizes.
"""
from __future__ import annotations

import importlib
import sys

BENCHMARKS = {'attention': 'benchmark_attention', 'approximation': 'approximation',
              'loader': 'benchmark_loader', 'train_step': 'benchmark_train_step',
              'pallas-resources': 'benchmark_pallas_resources', 'loop': 'benchmark_loop',
              'redraw': 'benchmark_redraw', 'population': 'benchmark_population'}


def run(args) -> int:
  args = list(args)
  if args and args[0] in BENCHMARKS:
    name, args = args[0], args[1:]
  elif args and not args[0].startswith('-'):
    print(f'error: unknown benchmark {args[0]!r}; valid: {", ".join(BENCHMARKS)}', file=sys.stderr)
    return 2
  elif args and args[0] in ('-h', '--help'):
    print(__doc__.strip())
    return 0
  else:
    name = 'attention'
  module = importlib.import_module(f'kernelformer.commands.{BENCHMARKS[name]}')
  result = module.main(args)
  return result if isinstance(result, int) else 0
