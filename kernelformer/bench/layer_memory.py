"""Training-step memory and time for each ``model.remat`` x ``model.scan_layers`` setting.

``python -m kernelformer.bench.layer_memory --length 4096 --batch 2 --kind posrf-orf --rounds 3``

The step is the trainer's own (``steps.make_steps``: loss, gradient, optimizer update, the
'features' collection) for the model of ``configs/text.py`` preset ``lra`` (4 layers, 4 heads, emb 256,
MLP 1024, CLS) with the given attention kind and length. For each setting it compiles the step ahead of
time, reads XLA's ``memory_analysis`` (temp bytes: what the step needs beyond its arguments and
outputs), then times the settings interleaved (round r runs every setting once) and reports the median.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from kernelformer import run_config

DEFAULT_REMATS = ('none', 'block', 'dots_saveable', 'nothing_saveable')


def compile_step(length: int, batch: int, kind: str, remat: str, scan_layers: bool):
  """(compiled train step, its arguments, temp bytes) for one setting."""
  import lra_tasks  # pylint: disable=g-import-not-at-top
  from kernelformer.configs import text  # pylint: disable=g-import-not-at-top
  from kernelformer.training import optim, steps as steps_lib  # pylint: disable=g-import-not-at-top
  c = text.get_config('lra')
  c.data.max_length = length
  c.model.attention.kind = kind
  c.model.remat, c.model.scan_layers = remat, scan_layers
  info = lra_tasks.get('text').info(c.data)
  run = run_config.of(c)
  model = steps_lib.build_model(run, info)
  keys = steps_lib.run_keys(c.seed)
  tx, schedule = optim.make_optimizer(run.optim, run.num_train_steps, run.model.dtype == 'float16')
  train_step, _ = steps_lib.make_steps(model, tx, schedule, run, keys)
  tokens = jax.random.randint(jax.random.key(1), (batch, info.max_length), 1, info.vocab_size)
  state = jax.jit(steps_lib.initializer(model, tx, info, keys))(keys['init'])
  batch_ = {'inputs': tokens, 'targets': jnp.zeros((batch,), jnp.int32)}
  compiled = jax.jit(train_step).lower(state, batch_).compile()
  return compiled, (state, batch_), compiled.memory_analysis().temp_size_in_bytes


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--length', type=int, default=4096)
  parser.add_argument('--batch', type=int, default=2)
  parser.add_argument('--kind', default='posrf-orf')
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--remats', default=','.join(DEFAULT_REMATS))
  args = parser.parse_args(argv)
  settings = [(r, s) for s in (False, True) for r in args.remats.split(',')]
  progs = {}
  for remat, scan in settings:
    start = time.perf_counter()
    try:
      exe, call_args, temp = compile_step(args.length, args.batch, args.kind, remat, scan)
    except ValueError as e:
      print(f'error: {e}', file=sys.stderr)
      return 2
    compile_s = time.perf_counter() - start
    jax.block_until_ready(exe(*call_args))                   # warm-up
    progs[(remat, scan)] = (exe, call_args, temp, compile_s, [])
    print(f'compiled remat={remat} scan_layers={scan}: temp {temp / 2 ** 20:.1f} MiB, '
          f'{compile_s:.1f} s', flush=True)
  for _ in range(args.rounds):
    for exe, call_args, _, _, times in progs.values():
      start = time.perf_counter()
      jax.block_until_ready(exe(*call_args))
      times.append(time.perf_counter() - start)
  print(f'\nL={args.length}, batch {args.batch}, {args.kind}, configs/text.py lra model, '
        f'median of {args.rounds} interleaved rounds\n')
  print('| remat | scan_layers | temp MiB | step ms (median) | all rounds ms | compile s |')
  print('|---|---|---|---|---|---|')
  for (remat, scan), (_, _, temp, compile_s, times) in progs.items():
    print(f'| {remat} | {scan} | {temp / 2 ** 20:.0f} | {1e3 * statistics.median(times):.0f} | '
          f'{", ".join(f"{1e3 * t:.0f}" for t in times)} | {compile_s:.1f} |')
  return 0


if __name__ == '__main__':
  sys.exit(main())
