"""The trainer's loop against a bare loop of the same compiled step (issue 24, item 2).

Both sides run ``train_and_evaluate``'s own executable (``trainer.make_loop_step``: the train step
plus the on-device window of sums and the non-finite check), on the same model and batches:

* **trainer**: ``trainer._Run.train`` for ``steps`` steps -- host batches placed on the devices
  ``trainer.PREFETCH`` ahead (on CPU: by the step's own dispatch, ``trainer.stages_on_host``; that
  copy is counted here, the bare loop's is not), at most ``trainer.MAX_IN_FLIGHT`` steps in flight
  (then a wait until ``trainer.RESUME_IN_FLIGHT`` are), the watchdog armed per step, the progress
  bar, and a logging boundary every ``log_every`` steps (one read of the window) plus one read at
  the end. The round's host batches are read before it starts, so the
  figure is the loop's own cost; ``--with_pipeline`` adds a third side, the same loop reading its
  batches through the input pipeline (grain) as a run does -- that one also measures the pipeline;
* **bare**: ``for batch in placed: state, window = step(state, window, batch)`` over batches placed on
  the devices beforehand, then one ``block_until_ready``.

Rounds alternate trainer and bare (one round of each per setting, settings in turn), so the load of a
shared machine hits both alike; the figure is the median over rounds of each side's steps/s, and the
ratio of the medians. Validation and checkpoints are not part of either side (``eval_every`` and
``checkpoint_every`` are set past the end). The data are random tokens of the task's vocabulary and
length (no data files needed), so the Text-sized setting runs anywhere.
"""
from __future__ import annotations

import dataclasses
import shutil
import statistics
import tempfile
import time
from typing import Optional, Sequence

import jax

import lra_tasks
from kernelformer.bench import train_step
from kernelformer.training import input_pipeline
from kernelformer.training import metrics as metrics_lib
from kernelformer.training import sharding
from kernelformer.training import signals as signals_lib
from kernelformer.training import trainer

# name: (config module, preset, default steps per round, what it stands for)
SETTINGS = {
    'tiny': ('listops', 'tiny', 60, 'configs/listops.py:tiny'),
    'quick': ('listops', 'quick', 40, 'configs/listops.py:quick'),
    'text': ('text', 'lra', 10, 'configs/text.py:lra (LRA Text: 4 x 256, batch 32, 1000 bytes)'),
}


@dataclasses.dataclass
class LoopTiming:
  setting: str
  source: str
  steps: int
  log_every: int
  rounds: int
  trainer_steps_per_s: float
  bare_steps_per_s: float
  pipeline_steps_per_s: Optional[float]

  @property
  def ratio(self) -> float:
    return self.trainer_steps_per_s / self.bare_steps_per_s


def get_config(setting: str, kind: Optional[str] = None):
  import importlib  # pylint: disable=g-import-not-at-top
  module, preset, _, _ = SETTINGS[setting]
  c = importlib.import_module(f'configs.{module}').get_config(preset)
  with c.unlocked():
    c.progress = False
    c.eval_every = c.checkpoint_every = 1 << 30
    c.num_train_steps = 1 << 30
    if kind:
      c.model.attention.kind = kind
  return c


class _RandomTokens:
  """A random-access source of ``n`` examples: random tokens of the task's vocabulary and length."""

  def __init__(self, info, n: int, seed: int = 0):
    batch = train_step.random_batch(info, n, seed)
    self._rows = [{name: x[i] for name, x in batch.items()} for i in range(n)]

  def __len__(self):
    return len(self._rows)

  def __getitem__(self, i):
    return self._rows[i]


class _Preloaded:
  """``TrainBatches``' interface over batches read beforehand (numpy, not yet on the devices)."""

  def __init__(self, batches: dict):
    self._batches = batches

  def batch(self, step: int) -> dict:
    return self._batches[step]

  def iterate(self, start: int, stop: int):
    return (self._batches[s] for s in range(start, stop))


class _Bench:
  """One setting: a ``trainer._Run`` set up without a workdir's files, and the bare loop beside it."""

  def __init__(self, setting: str, steps: int, kind: Optional[str]):
    self.setting, self.steps = setting, steps
    config = self.config = get_config(setting, kind)
    info = lra_tasks.get(config.data.task).info(config.data)
    self.tmp = tempfile.mkdtemp(prefix='kf-loop-bench-')
    run = self.run = trainer._Run(config, self.tmp, (), None, signals_lib.Watchdog())  # pylint: disable=protected-access
    run.info = info
    run.build_steps()
    run.num_steps = 1 << 30          # no final boundary: a round ends with one read of the window
    run.start_step, run.last_saved = 0, None
    run.meta = {'steps_trained': 0, 'timed_steps': 0, 'train_seconds': 0.0}
    run.writer = metrics_lib.MetricsWriter(self.tmp, enabled=False)
    run.committed, run.pending_events = True, []
    run.progress = metrics_lib.Progress(0, 0, enabled=False)
    run.timer = metrics_lib.StepTimer()
    self.pipeline = input_pipeline.TrainBatches(_RandomTokens(info, 4 * config.batch_size),
                                                config.batch_size, config.seed)
    run.batches = self.pipeline
    run.train(until=2)               # compiles, warms up
    run.start_step = 2
    self.trainer_rates, self.bare_rates, self.pipeline_rates = [], [], []

  def _round_batches(self):
    start = self.run.start_step
    return start, {s: self.pipeline.batch(s) for s in range(start, start + self.steps)}

  def trainer_round(self, with_pipeline: bool = False) -> None:
    """``_Run.train`` over this round's steps; its batches read beforehand (the loop alone), or by
    the input pipeline as in a run (``with_pipeline``)."""
    run = self.run
    start, numpy_batches = (run.start_step, None) if with_pipeline else self._round_batches()
    run.batches = self.pipeline if with_pipeline else _Preloaded(numpy_batches)
    t0 = time.perf_counter()
    run.train(until=start + self.steps)
    rate = self.steps / (time.perf_counter() - t0)
    (self.pipeline_rates if with_pipeline else self.trainer_rates).append(rate)
    run.start_step = start + self.steps

  def bare_round(self) -> None:
    run = self.run
    start, numpy_batches = self._round_batches()
    placed = [sharding.shard_batch(numpy_batches[s], run.mesh) for s in sorted(numpy_batches)]
    jax.block_until_ready(placed)
    step, state, window = run.compiled, run.state, run.window
    t0 = time.perf_counter()
    for batch in placed:
      state, window = step(state, window, batch)
    jax.block_until_ready(window)
    self.bare_rates.append(self.steps / (time.perf_counter() - t0))
    run.state, run.window = state, window
    run.start_step = start + self.steps

  def result(self) -> LoopTiming:
    return LoopTiming(self.setting, SETTINGS[self.setting][3], self.steps, int(self.config.log_every),
                      len(self.trainer_rates), statistics.median(self.trainer_rates),
                      statistics.median(self.bare_rates),
                      statistics.median(self.pipeline_rates) if self.pipeline_rates else None)

  def close(self) -> None:
    shutil.rmtree(self.tmp, ignore_errors=True)


def measure(settings: Sequence[str], *, steps: Optional[dict] = None, rounds: int = 3,
            kind: Optional[str] = None, time_limit_s: float = 0.0,
            with_pipeline: bool = False) -> list[LoopTiming]:
  """Interleaved rounds (trainer, bare; and the trainer with its input pipeline if asked) of each
  setting; stops adding rounds after ``time_limit_s`` (every setting still gets one round of each)."""
  t_start = time.monotonic()
  benches = [_Bench(s, (steps or {}).get(s) or SETTINGS[s][2], kind) for s in settings]
  try:
    for r in range(rounds):
      for b in benches:
        sides = [b.trainer_round, b.bare_round]
        if with_pipeline:
          sides.append(lambda b=b: b.trainer_round(with_pipeline=True))
        for side in (sides[r % len(sides):] + sides[:r % len(sides)]):
          side()
      if time_limit_s and time.monotonic() - t_start > time_limit_s:
        break
    return [b.result() for b in benches]
  finally:
    for b in benches:
      b.close()


def markdown(results: Sequence[LoopTiming], header: str) -> str:
  lines = [header, '',
           '| setting | config | steps per round | log every | rounds | trainer (steps/s) | '
           'bare loop (steps/s) | trainer / bare | trainer with input pipeline (steps/s) |',
           '|---|---|---:|---:|---:|---:|---:|---:|---:|']
  for t in results:
    pipe = f'{t.pipeline_steps_per_s:.2f}' if t.pipeline_steps_per_s else '-'
    lines.append(f'| {t.setting} | {t.source} | {t.steps} | {t.log_every} | {t.rounds} | '
                 f'{t.trainer_steps_per_s:.2f} | {t.bare_steps_per_s:.2f} | {t.ratio:.3f} | {pipe} |')
  return '\n'.join(lines) + '\n'

