"""Time the trainer's own jitted train step for several attention kinds, interleaved, in one process.

What it answers: does the weight sampler still cost anything per step? Fixed samplers'
projections live in the ``features`` collection and are redrawn only in the step that starts a new
window of ``redraw_every`` steps, so two numbers per kind:

* ``step_ms``: the median of steps *inside* a window (the stored W is reused) -- what 99 of 100 steps
  cost with the default ``redraw_every=100``;
* ``redraw_step_ms``: the median of steps that *start* a window (the sampler runs: ORF's QR, MM's SVD,
  FastFood's structure), measured by setting the state's step to a window boundary before each call.

Kinds are measured round-robin (one step of each per round) so the load of a shared machine hits them
alike. The step is ``steps.make_steps``'s train step compiled once per kind with the state donated,
exactly as ``train_and_evaluate`` runs it; the batch is random tokens of the task's vocabulary.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import lra_tasks
from kernelformer import run_config
from kernelformer.training import optim as optim_lib
from kernelformer.training import sharding
from kernelformer.training import steps as steps_lib
from lra_tasks import common as lra_common


@dataclasses.dataclass
class StepTiming:
  kind: str
  step_ms: float
  redraw_step_ms: float
  compile_s: float


def random_batch(info, batch_size: int, seed: int = 0) -> dict:
  """``batch_size`` examples of random tokens of the task's vocabulary and length (numpy), with random
  targets: the input both step benchmarks feed (no data files needed)."""
  rng = np.random.default_rng(seed)
  batch = {name: rng.integers(1, info.vocab_size, size=(batch_size, info.max_length)).astype(np.int32)
           for name in steps_lib.input_names(info)}
  batch['targets'] = rng.integers(0, info.num_classes, size=(batch_size,)).astype(np.int32)
  return batch


def random_source(info, n: int, seed: int = 0) -> lra_common.ArraySource:
  """A source of ``n`` examples of ``random_batch``."""
  return lra_common.ArraySource(**random_batch(info, n, seed))


def train_source(task, data, info, n: int):
  """The task's training split where its data is on disk (MQAR: generated), else ``random_source``."""
  return task.source(data, 'train') if not task.check(data) else random_source(info, n)


def _compiled_step(config: ml_collections.ConfigDict, info, batch):
  run = run_config.of(config)
  model = steps_lib.build_model(run, info)
  keys = steps_lib.run_keys(config.seed)
  tx, schedule = optim_lib.make_optimizer(run.optim, run.num_train_steps, run.model.dtype == 'float16')
  train_step, _ = steps_lib.make_steps(model, tx, schedule, run, keys)
  mesh = sharding.make_mesh(None)
  state = steps_lib.init_state(model, tx, info, run, keys, mesh)
  start = time.perf_counter()
  compiled = jax.jit(train_step, donate_argnums=0).lower(state, batch).compile()
  return compiled, state, time.perf_counter() - start


def measure(config: ml_collections.ConfigDict, kinds: Sequence[str], *, batch_size: int,
            repeats: int = 10) -> list[StepTiming]:
  """Median step times of ``kinds`` on ``config``'s model (its task gives vocabulary and length)."""
  task = lra_tasks.get(config.data.task)
  info = task.info(config.data)
  redraw = int(config.model.attention.redraw_every or 100)
  batch = random_batch(info, batch_size)
  runs = {}
  for kind in kinds:
    c = config.copy_and_resolve_references()
    with c.unlocked():
      c.model.attention.kind = kind
    runs[kind] = list(_compiled_step(c, info, batch))
  times = {kind: {'hit': [], 'redraw': []} for kind in kinds}
  for r in range(repeats + 1):                       # round 0 is a warm-up
    for kind in kinds:
      compiled, state, _ = runs[kind]
      for what in ('redraw', 'hit'):
        # A window boundary (the sampler runs), then the step after it, inside that window (reuse).
        step = (r + 1) * redraw + (1 if what == 'hit' else 0)
        state = state.replace(step=jnp.asarray(step, jnp.int32))
        t0 = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
        if r:
          times[kind][what].append(time.perf_counter() - t0)
      runs[kind][1] = state
  return [StepTiming(kind, 1e3 * statistics.median(times[kind]['hit']),
                     1e3 * statistics.median(times[kind]['redraw']), runs[kind][2]) for kind in kinds]


def markdown(results: Sequence[StepTiming], header: str) -> str:
  lines = [header, '', '| kind | step inside a window (ms) | step that redraws (ms) | compile (s) |',
           '|---|---:|---:|---:|']
  for t in results:
    lines.append(f'| {t.kind} | {t.step_ms:.1f} | {t.redraw_step_ms:.1f} | {t.compile_s:.1f} |')
  return '\n'.join(lines) + '\n'

