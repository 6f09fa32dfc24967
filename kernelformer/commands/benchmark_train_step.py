"""Train-step time per attention kind: steps that reuse the stored projection vs steps that redraw it.

  kernelformer benchmark train_step --config configs/listops.py:quick \\
      --kinds posrf-iid,posrf-orf,posrf-mm,posrf-fastfood,softmax --batch_size 8 --length 512

Writes ``train_step.md`` (a table) into --out_dir (default runs/benchmarks/) and prints it. See
kernelformer/bench/train_step.py for what is measured.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import platform
import sys

from kernelformer.commands import _common


def _load(spec: str):
  path, preset = _common.split_spec(_common.resolve_spec(spec))
  module_spec = importlib.util.spec_from_file_location('_bench_config', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(preset) if preset else module.get_config()


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
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  from kernelformer.bench import train_step  # pylint: disable=g-import-not-at-top
  kinds = [k.strip() for k in args.kinds.split(',') if k.strip()]
  for k in kinds:
    try:
      registry.get(k)
    except registry.UnknownKernelError as e:
      print(f'error: {e}', file=sys.stderr)
      return 2
  config = _load(args.config)
  with config.unlocked():
    if args.length:
      config.data.max_length = args.length
    if args.num_features:
      config.model.attention.num_features = args.num_features
    for item in args.set:
      field, sep, value = item.partition('=')
      *parents, leaf = field.split('.')
      node = config
      try:
        for name in parents:
          node = node[name]
        node[leaf] = type(node[leaf])(ast.literal_eval(value)) if node[leaf] is not None else \
            ast.literal_eval(value)
      except (KeyError, ValueError, SyntaxError, TypeError) as e:
        print(f'error: --set {item}: {e}', file=sys.stderr)
        return 2
  results = train_step.measure(config, kinds, batch_size=args.batch_size, repeats=args.repeats)
  import jax  # pylint: disable=g-import-not-at-top
  header = (f'`kernelformer benchmark train_step {" ".join(argv)}`; {jax.devices()[0].device_kind} '
            f'({platform.processor() or platform.machine()}, {os.cpu_count()} cores), jax '
            f'{jax.__version__}; load average after the run: {train_step.load_average()}; '
            f'batch {args.batch_size}, length {config.data.max_length}, '
            f'redraw_every {config.model.attention.redraw_every or 100}.')
  table = train_step.markdown(results, header)
  os.makedirs(args.out_dir, exist_ok=True)
  with open(os.path.join(args.out_dir, 'train_step.md'), 'w') as f:
    f.write(table)
  print(table)
  return 0
