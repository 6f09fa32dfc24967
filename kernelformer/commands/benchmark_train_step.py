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
  from kernelformer.bench import measure, train_step  # pylint: disable=g-import-not-at-top
  kinds = [k.strip() for k in args.kinds.split(',') if k.strip()]
  error = _common.unknown_kind_error(kinds)
  if error:
    print(error, file=sys.stderr)
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
  _common.write_benchmark_table(
      'train_step', argv, args.out_dir,
      f'load average after the run: {measure.load_average()}; batch {args.batch_size}, length '
      f'{config.data.max_length}, redraw_every {config.model.attention.redraw_every or 100}.',
      lambda header: train_step.markdown(results, header))
  return 0
