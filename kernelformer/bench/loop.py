"""The trainer's loop against a bare loop of the same compiled step (docs/benchmarks.md, "Training loop
and input pipeline", says what is measured and why; this is how).

Both sides run ``train_and_evaluate``'s own executable (``steps.make_loop_step``) on the same model and
batches. **trainer**: ``loop.Loop.run`` (set up by ``benchmark_loop``) -- batches placed
``input_pipeline.PREFETCH`` ahead (on CPU by the step's own dispatch, ``input_pipeline.stages_on_host``,
counted here), at most ``loop.MAX_IN_FLIGHT`` steps in flight, watchdog, progress bar, a logging
boundary every ``log_every`` steps. The round's host batches are read before it starts;
``--with_pipeline`` adds a side reading through ``input_pipeline.TrainBatches`` as a run does, and
times the pipeline alone (one thread: examples/s). **bare**: ``for batch in placed: state, window =
step(state, window, batch)`` over batches placed beforehand, then one ``block_until_ready``.

Rounds alternate the sides (order flipped every round); each side times its last ``steps - 1`` steps
(the first step of a ``Loop.run`` call waits by design), the executable is checked after every round
(``RoundMismatch``), and the figure is the median over rounds of each round's trainer / bare ratio.
Validation and checkpoints are set past the end. Data: random tokens of the task's vocabulary and
length in an ``ArraySource`` (``text``: configs/text.py:lra's model with configs/text.py:
kernel_learning's GMM-RKS attention), or the task's own generated source (``mqar``:
configs/mqar.py:zoology). ``kind`` and ``batch`` override a setting.
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
from kernelformer.bench import measure as measure_lib
from kernelformer.bench import train_step
from kernelformer.training import input_pipeline
from kernelformer.training import sharding
from kernelformer.training import loop as loop_lib

@dataclasses.dataclass(frozen=True)
class Setting:
  """A benchmark setting: a task config's preset, with the attention (and batch) it is run at."""
  module: str             # configs/<module>.py
  preset: str
  steps: int              # default steps per round (of each side)
  source: str             # what the table's config column says
  kind: Optional[str] = None          # attention kind (None: the preset's)
  num_features: Optional[int] = None  # the kind's M (None: the preset's)
  task_data: bool = False # the task's own training source (generated tasks), not random tokens


SETTINGS = {
    'tiny': Setting('listops', 'tiny', 60, 'configs/listops.py:tiny'),
    'quick': Setting('listops', 'quick', 40, 'configs/listops.py:quick'),
    # Zoology's figure-2 model at its batch of 512 on its own generated data: the setting where the
    # input pipeline has the most to do per step.
    'mqar': Setting('mqar', 'zoology', 10, 'configs/mqar.py:zoology (Zoology MQAR, 64 tokens, 4 pairs, '
                    'batch 512)', task_data=True),
    # The LRA Text model at its batch, with the attention of configs/text.py:kernel_learning (the
    # softmax of the lra preset does not fit a 23 GiB CPU host: 12.6 GiB temp per step).
    'text': Setting('text', 'lra', 4,
                    'configs/text.py:lra model (4 x 256, 4 heads, mlp 1024, 1000 bytes) with '
                    "configs/text.py:kernel_learning's attention (gmm-rks, M=128)",
                    kind='gmm-rks', num_features=128),
}


class RoundMismatch(RuntimeError):
  """The two sides of a round did not run the same number of steps of the same executable."""


@dataclasses.dataclass
class LoopTiming:
  setting: str
  source: str
  batch: int
  steps: int
  log_every: int
  trainer_rates: list        # steps/s of each round, in order
  bare_rates: list
  pipeline_rates: list
  peak_resident_gib: Optional[float] = None
  pipeline_examples_per_s: list = dataclasses.field(default_factory=list)   # the pipeline alone

  @property
  def rounds(self) -> int:
    return len(self.trainer_rates)

  @property
  def trainer_steps_per_s(self) -> float:
    return statistics.median(self.trainer_rates)

  @property
  def bare_steps_per_s(self) -> float:
    return statistics.median(self.bare_rates)

  @property
  def pipeline_steps_per_s(self) -> Optional[float]:
    return statistics.median(self.pipeline_rates) if self.pipeline_rates else None

  @property
  def pipeline_round_ratios(self) -> list:
    """Each round's trainer-with-pipeline steps/s over the bare loop's in the same round."""
    return [t / b for t, b in zip(self.pipeline_rates, self.bare_rates)]

  @property
  def pipeline_ratio(self) -> Optional[float]:
    return statistics.median(self.pipeline_round_ratios) if self.pipeline_rates else None

  @property
  def round_ratios(self) -> list:
    """Each round's trainer steps/s over the bare loop's in the same round."""
    return [t / b for t, b in zip(self.trainer_rates, self.bare_rates)]

  @property
  def ratio(self) -> float:
    """The median over rounds of the per-round ratios."""
    return statistics.median(self.round_ratios)


def get_config(setting: str, kind: Optional[str] = None, batch: Optional[int] = None):
  import importlib  # pylint: disable=g-import-not-at-top
  s = SETTINGS[setting]
  c = importlib.import_module(f'kernelformer.configs.{s.module}').get_config(s.preset)
  with c.unlocked():
    c.progress = False
    c.eval_every = c.checkpoint_every = 1 << 30
    c.num_train_steps = 1 << 30
    if kind or s.kind:
      c.model.attention.kind = kind or s.kind
      if not kind and s.num_features:
        c.model.attention.num_features = s.num_features
    if batch:
      c.batch_size = batch
  return c


def source(setting: str, kind: Optional[str], batch: int) -> str:
  """The table's config cell: what was run, with a batch or kind other than the setting's named."""
  s = SETTINGS[setting]
  text = s.source
  if kind and kind != s.kind:
    text = f'{text.split(" with ")[0]} with attention {kind}'
  import importlib  # pylint: disable=g-import-not-at-top
  preset = importlib.import_module(f'kernelformer.configs.{s.module}').get_config(s.preset)
  preset_batch = int(preset.batch_size)
  if batch != preset_batch:
    text += f', **batch {batch}** (the preset\'s: {preset_batch})'
  return text


def peak_resident_gib() -> Optional[float]:
  """This process's peak resident memory so far (Linux; None elsewhere)."""
  mib = measure_lib.peak_rss_mib()
  return None if mib is None else mib / 1024.0


class _Preloaded:
  """``TrainBatches``' interface over batches read beforehand (numpy, not yet on the devices)."""

  def __init__(self, batches: dict):
    self._batches = batches

  def batch(self, step: int) -> dict:
    return self._batches[step]

  def iterate(self, start: int, stop: int):
    return (self._batches[s] for s in range(start, stop))

  def device_iterate(self, start: int, stop: int, mesh):
    return input_pipeline.placed_ahead(self.batch, start, stop, mesh)


class _Bench:
  """One setting: the trainer's loop set up without a workdir's files, and the bare loop beside it."""

  def __init__(self, setting: str, steps: int, kind: Optional[str], batch: Optional[int] = None):
    self.setting, self.steps = setting, steps
    config = self.config = get_config(setting, kind, batch)
    self.source = source(setting, kind, int(config.batch_size))
    info = lra_tasks.get(config.data.task).info(config.data)
    self.tmp = tempfile.mkdtemp(prefix='kf-loop-bench-')
    # The trainer's own loop, set up without a workdir's files (``loop.benchmark_loop``).
    self.loop, self.state = loop_lib.benchmark_loop(config, info, self.tmp)
    task = lra_tasks.get(config.data.task)
    data = (task.source(config.data, 'train') if SETTINGS[setting].task_data
            else train_step.random_source(info, 4 * config.batch_size))
    self.pipeline = input_pipeline.TrainBatches(data, config.batch_size, config.seed)
    self.state = self.loop.run(self.state, 0, 2, self.pipeline)   # compiles, warms up
    self.start = 2                   # the first step of the next round
    self.executable = self.loop.compiled   # what both sides run, every round
    self.trainer_rates, self.bare_rates, self.pipeline_rates = [], [], []
    self.pipeline_examples = []

  def pipeline_alone(self) -> None:
    """The input pipeline alone (one thread, no step): examples/s reading this round's batches."""
    start = self.start
    t0 = time.perf_counter()
    for s in range(start, start + self.steps):
      self.pipeline.batch(s)
    self.pipeline_examples.append(self.steps * int(self.config.batch_size)
                                  / (time.perf_counter() - t0))

  def _round_batches(self):
    start = self.start
    return start, {s: self.pipeline.batch(s) for s in range(start, start + self.steps)}

  def _check(self, side: str, start: int) -> None:
    """After a round (outside its timed span): the side ran exactly ``steps`` steps, all of them by
    the executable compiled at set-up (a re-compiled or different step would not be the same work)."""
    ran = int(jax.device_get(self.state.step)) - start
    same = self.loop.compiled is self.executable
    if ran != self.steps or not same:
      raise RoundMismatch(f'{self.setting}: the {side} round ran {ran} steps (expected {self.steps})'
                          + ('' if same else
                             ' with an executable other than the one compiled at set-up'))
    self.start = start + self.steps

  def trainer_round(self, with_pipeline: bool = False) -> None:
    """``Loop.run`` over this round's steps; its batches read beforehand (the loop alone), or by
    the input pipeline as in a run (``with_pipeline``). Timed by the trainer's own clock (what
    results.json reports): from the end of the round's first step -- the trainer waits for a
    segment's first step, its warm-up -- to the read of the window after the last."""
    start, numpy_batches = (self.start, None) if with_pipeline else self._round_batches()
    batches = self.pipeline if with_pipeline else _Preloaded(numpy_batches)
    before = self.loop.meta   # frozen: the loop replaces it
    self.state = self.loop.run(self.state, start, start + self.steps, batches)
    timed = self.loop.meta.timed_steps - before.timed_steps
    seconds = self.loop.meta.train_seconds - before.train_seconds
    self._check('trainer with input pipeline' if with_pipeline else 'trainer', start)
    if timed != self.steps - 1:
      raise RoundMismatch(f'{self.setting}: the trainer timed {timed} steps (expected '
                          f'{self.steps - 1}: all but the first)')
    (self.pipeline_rates if with_pipeline else self.trainer_rates).append(timed / seconds)

  def bare_round(self) -> None:
    """The same steps dispatched back to back over batches placed beforehand; timed, as the trainer,
    from the end of the round's first step to the end of the last."""
    start, numpy_batches = self._round_batches()
    placed = [sharding.shard_batch(numpy_batches[s], self.loop.setup.mesh)
              for s in sorted(numpy_batches)]
    jax.block_until_ready(placed)
    step = self.executable
    state, window = step(self.state, self.loop.window, placed[0])
    jax.block_until_ready(window)
    t0 = time.perf_counter()
    for batch in placed[1:]:
      state, window = step(state, window, batch)
    jax.block_until_ready(window)
    rate = (len(placed) - 1) / (time.perf_counter() - t0)
    self.state, self.loop.window = state, window
    self._check('bare', start)
    self.bare_rates.append(rate)

  def result(self) -> LoopTiming:
    return LoopTiming(self.setting, self.source, int(self.config.batch_size), self.steps,
                      int(self.config.log_every), list(self.trainer_rates), list(self.bare_rates),
                      list(self.pipeline_rates), peak_resident_gib(), list(self.pipeline_examples))

  def close(self) -> None:
    """Ends the loop's watchdog thread (a run's own end does this in ``train_and_evaluate``) and
    removes the scratch folder: a process that benchmarks keeps no thread or run alive after."""
    self.loop.setup.watch.watchdog.close()
    shutil.rmtree(self.tmp, ignore_errors=True)


def measure(settings: Sequence[str], *, steps: Optional[dict] = None, rounds: int = 3,
            kind: Optional[str] = None, batch: Optional[dict] = None, time_limit_s: float = 0.0,
            with_pipeline: bool = False) -> list[LoopTiming]:
  """Interleaved rounds (trainer, bare; and the trainer with its input pipeline if asked) of each
  setting, the sides' order rotating every round; stops adding rounds after ``time_limit_s`` (every
  setting still gets one round of each). ``steps`` and ``batch`` map a setting to its steps per round
  and its batch (default: the setting's)."""
  t_start = time.monotonic()
  benches = [_Bench(s, (steps or {}).get(s) or SETTINGS[s].steps, kind, (batch or {}).get(s))
             for s in settings]
  try:
    for r in range(rounds):
      for b in benches:
        sides = [b.trainer_round, b.bare_round]
        if with_pipeline:
          sides.append(lambda b=b: b.trainer_round(with_pipeline=True))
          b.pipeline_alone()
        for side in (sides[r % len(sides):] + sides[:r % len(sides)]):
          side()
      if time_limit_s and time.monotonic() - t_start > time_limit_s:
        break
    return [b.result() for b in benches]
  finally:
    for b in benches:
      b.close()


def _rate(steps_per_s: float) -> str:
  return f'{steps_per_s:.2f}' if steps_per_s >= 1 else f'{steps_per_s:.4f}'


def markdown(results: Sequence[LoopTiming], header: str) -> str:
  lines = [header, '',
           '| setting | config | batch | steps per round | log every | rounds | trainer (steps/s) | '
           'bare loop (steps/s) | trainer / bare | per-round trainer / bare (min-max) | '
           'trainer with input pipeline (steps/s) | trainer with pipeline / bare | '
           'input pipeline alone (examples/s) |',
           '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
  for t in results:
    pipe = _rate(t.pipeline_steps_per_s) if t.pipeline_steps_per_s else '-'
    pipe_ratio = (f'{t.pipeline_ratio:.3f} ({min(t.pipeline_round_ratios):.3f}-'
                  f'{max(t.pipeline_round_ratios):.3f})' if t.pipeline_rates else '-')
    alone = '-'
    if t.pipeline_examples_per_s:
      rate = statistics.median(t.pipeline_examples_per_s)
      alone = f'{rate:,.0f} ({1e3 * t.batch / rate:.2f} ms a batch)'
    lines.append(f'| {t.setting} | {t.source} | {t.batch} | {t.steps} | {t.log_every} | {t.rounds} | '
                 f'{_rate(t.trainer_steps_per_s)} | {_rate(t.bare_steps_per_s)} | {t.ratio:.3f} | '
                 f'{min(t.round_ratios):.3f}-{max(t.round_ratios):.3f} | {pipe} | {pipe_ratio} | '
                 f'{alone} |')
  lines += ['', 'steps/s: the median over rounds of each side; trainer / bare: the median over rounds of '
            "the round's trainer steps/s over its bare loop's (the two adjacent in time); likewise "
            'trainer with pipeline / bare (min-max over rounds in brackets). Input pipeline alone: '
            "the median over rounds of examples/s reading the round's batches in one thread."]
  for t in results:
    lines.append(f'{t.setting}, each round trainer / bare (steps/s): ' + ', '.join(
        f'{_rate(a)} / {_rate(b)}' for a, b in zip(t.trainer_rates, t.bare_rates)) + '.')
    if t.pipeline_rates:
      lines.append(f'{t.setting}, each round trainer with pipeline / bare (steps/s): ' + ', '.join(
          f'{_rate(a)} / {_rate(b)}' for a, b in zip(t.pipeline_rates, t.bare_rates)) + '.')
  peaks = [t.peak_resident_gib for t in results if t.peak_resident_gib]
  if peaks:
    lines.append(f'Peak resident memory of the process: {max(peaks):.1f} GiB.')
  return '\n'.join(lines) + '\n'
