"""The run's values, each built by one function and handed to the next (``trainer``): ``Prior`` (the
workdir as found) -> ``Setup`` (built once, never reassigned) -> ``restore`` -> the ``RunMeta`` record,
the ``Segment`` and the ``Journal`` -> ``Loop.run`` (the steps) -> ``test`` -> ``finish``."""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Callable, Iterable, Optional, Sequence

import flax.linen as nn
import jax
import ml_collections

import lra_tasks
from kernelformer import run_config
from kernelformer.training import checkpoint as ckpt_lib
from kernelformer.training import input_pipeline
from kernelformer.training import metrics as metrics_lib
from kernelformer.training import record as record_lib
from kernelformer.training import signals as signals_lib
from kernelformer.training import workdir as workdir_lib


class RunResults(dict):
  """The results dict, with ``status``: 'trained', 'reevaluated' or 'finished' (nothing was done)."""
  status = 'trained'


def code_segments(previous, start: int, current: dict, resumed: bool) -> list:
  """The code that trained each stretch of the run: ``[{'from_step', 'code_version'}, ...]``; a resume
  under other code appends an entry and warns (docs/architecture.md); checkpoints older than this
  field resume with an entry of unknown code for their steps."""
  segments = [dict(s) for s in previous] if isinstance(previous, list) else []
  if resumed and not segments and start > 0:
    segments = [{'from_step': 0, 'code_version': {'package_version': 'unknown (checkpoint older '
                                                                      'than code_versions)'}}]
  if segments and segments[-1].get('code_version') == current:
    return segments
  if segments:
    logging.warning('resumed at step %d under other code (%s) than trained the steps before it (%s); '
                    'both are recorded in results.json code_versions', start,
                    _describe_code(current), _describe_code(segments[-1].get('code_version') or {}))
  segments.append({'from_step': int(start), 'code_version': dict(current)})
  return segments


def _describe_code(version: dict) -> str:
  commit = version.get('git_commit')
  if commit:
    return f"commit {commit[:12]}{' (dirty tree)' if version.get('git_dirty') else ''}"
  return f"package {version.get('package_version', 'unknown')}"


@dataclasses.dataclass(frozen=True)
class Prior:
  """The workdir as the run found it, read before anything is written."""
  record: record_lib.RunRecord   # run.json: the config the workdir belongs to
  allowed: Any                    # the config changes run.json allows (``config.allow_config_change``)
  previous: Optional[dict]        # results.json of a finished run, else None

  @property
  def provisional(self) -> bool:
    """A stretch continuing a finished run: its record and best/ replace that run's only when it
    completes (docs/architecture.md, "The run's record")."""
    return self.previous is not None


def read_prior(config: ml_collections.ConfigDict, run: run_config.Run, workdir: str) -> Prior:
  record = record_lib.RunRecord(workdir)
  record.load()
  allowed = record.check(config, run.allow_config_change)
  previous, why = record_lib.read_results(workdir)
  if why:
    raise workdir_lib.RunError(f'{workdir}/results.json {why}; move it aside and re-run to re-test '
                               f'the final checkpoint')
  return Prior(record=record, allowed=allowed, previous=previous)


def finished_results(run: run_config.Run, prior: Prior) -> Optional[RunResults]:
  """A workdir belongs to one config; a finished run is finished. Decided before any write."""
  previous = prior.previous
  if previous is not None and not prior.allowed and not run.reevaluate and \
      (previous.get('final_step') == run.num_train_steps or previous.get('stopped_early')) and \
      previous.get('config_fingerprint') in (None, prior.record.fingerprint):
    done = RunResults(previous)
    done.status = 'finished'
    return done
  return None


class Watch:
  """The run's watchdog with its two limits (``watchdog_step_s``; ``watchdog_compile_s`` while
  compiling). The run's first evaluation batch compiles the eval step and gets the compile limit."""

  def __init__(self, watchdog: signals_lib.Watchdog, run: run_config.Run):
    self.watchdog = watchdog
    self.step_limit = float(run.watchdog_step_s)
    self.compile_limit = float(run.watchdog_compile_s)
    self.eval_compiled = False

  def step(self, what, progress: Optional[Callable[[], int]] = None) -> None:
    self.watchdog.arm(what, self.step_limit, progress)

  def compiling(self, what: str) -> None:
    self.watchdog.arm(what, self.compile_limit)

  def disarm(self) -> None:
    self.watchdog.disarm()

  def eval_progress(self, what: str) -> Callable[[int], None]:
    def on_batch(i):
      first = not self.eval_compiled
      self.eval_compiled = True
      self.watchdog.arm(f'{what}, batch {i + 1}' + (' (compiling)' if first else ''),
                        self.compile_limit if first else self.step_limit)
    return on_batch


@dataclasses.dataclass(frozen=True)
class Setup:
  """What a run is built from, once (``build``), never reassigned (``benchmark_loop``'s: no sources)."""
  config: ml_collections.ConfigDict   # the user's, as recorded (run.json, config.json, results.json)
  run: run_config.Run                 # what the run reads
  workdir: str
  prior: Optional[Prior]
  is_lead: bool
  num_steps: int
  policy: str                     # on_nonfinite: 'stop' | 'skip'
  hooks: tuple
  stop: signals_lib.StopSignals
  watch: Watch
  info: lra_tasks.TaskInfo
  mesh: jax.sharding.Mesh
  model: nn.Module
  features_key: jax.Array         # the random-feature key (stateful LM testing, ``lm_eval``)
  loop_step: jax.stages.Wrapped   # jitted ``make_loop_step``: (state, window, batch) -> (state, window)
  eval_step: jax.stages.Wrapped   # jitted: (state, batch) -> loss, correct and count sums
  task: Optional[lra_tasks.Task] = None
  val_source: Optional[Sequence[dict]] = None
  batches: Optional[input_pipeline.TrainBatches] = None   # the training split's
  checkpoints: Optional[ckpt_lib.Checkpoints] = None   # checkpoints/: the latest, for resuming
  best: Optional[ckpt_lib.Checkpoints] = None          # best/: the last KEEP_BEST bests


@dataclasses.dataclass(frozen=True)
class RunMeta:
  """The run's record: what every checkpoint carries as its meta and results.json reports. Restored with
  the state (``from_meta``), replaced at the loop's boundaries (``Loop.update``), written by ``as_meta``."""
  started: str                                # when the run's first segment started (ISO)
  code_versions: list                         # ``code_segments``
  data_order: list                            # ``input_pipeline.data_order_segments``
  best_val_accuracy: float = -1.0
  best_step: int = -1
  lowest_val_loss: Optional[float] = None     # the rule for a good checkpoint (``good_loss``)
  val_examples: Optional[int] = None          # of the last validation
  steps_trained: int = 0                      # steps dispatched over the run (a resumed step counts again)
  timed_steps: int = 0                        # steps inside timed spans (a segment's first is not)
  train_seconds: float = 0.0                  # the seconds of those spans
  wall_seconds: float = 0.0                   # the wall time of the earlier segments
  compiled_memory_bytes: Optional[int] = None
  stopped_early: Optional[dict] = None        # {step, val_accuracy, threshold}: ``early_stop_accuracy``
  carried: dict = dataclasses.field(default_factory=dict)   # meta keys of other code, kept as they were

  @classmethod
  def from_meta(cls, meta: dict, start: int, resumed: bool, started: str) -> tuple['RunMeta', dict]:
    """The record of a checkpoint's ``meta`` (of a fresh run: ``{}``) resumed at ``start``, and the
    events that meta held (``uncommitted``: not yet in metrics.jsonl)."""
    meta = dict(meta)
    held = meta.pop('uncommitted', None) or {}
    own = {f.name for f in dataclasses.fields(cls)}
    record = cls(
        started=meta.get('started') or started,
        code_versions=code_segments(meta.get('code_versions'), start, workdir_lib.code_version(),
                                    resumed),
        data_order=input_pipeline.data_order_segments(meta.get('data_order'), start, resumed),
        best_val_accuracy=meta.get('best_val_accuracy', -1.0), best_step=meta.get('best_step', -1),
        lowest_val_loss=meta.get('lowest_val_loss'), val_examples=meta.get('val_examples'),
        steps_trained=int(meta.get('steps_trained', start)),
        timed_steps=int(meta.get('timed_steps', 0)),
        train_seconds=float(meta.get('train_seconds', 0.0)),
        wall_seconds=float(meta.get('wall_seconds', 0.0)),
        compiled_memory_bytes=meta.get('compiled_memory_bytes'),
        stopped_early=meta.get('stopped_early'),
        carried={k: v for k, v in meta.items() if k not in own})
    return record, held

  def as_meta(self, wall_seconds: float) -> dict:
    """The checkpoint meta, with the wall time of the run so far."""
    meta = {**self.carried, 'best_val_accuracy': self.best_val_accuracy, 'best_step': self.best_step,
            'steps_trained': self.steps_trained, 'timed_steps': self.timed_steps,
            'train_seconds': self.train_seconds, 'wall_seconds': wall_seconds,
            'started': self.started, 'code_versions': self.code_versions,
            'data_order': self.data_order}
    for name in ('lowest_val_loss', 'val_examples', 'stopped_early'):   # absent until set
      if getattr(self, name) is not None:
        meta[name] = getattr(self, name)
    meta['compiled_memory_bytes'] = self.compiled_memory_bytes
    return meta


@dataclasses.dataclass
class Segment:
  """This process's stretch of the run: its first step, the last step it checkpointed, its clocks."""
  start_step: int
  last_saved: Optional[int]       # the step of the newest checkpoint (None: none yet)
  t0: float                       # ``time.monotonic()`` when the segment started
  progress: metrics_lib.Progress
  timer: metrics_lib.StepTimer
  span: tuple = (0, 0.0)          # (step, ``time.perf_counter()``) where the current timed span began

  def wall_seconds(self, meta: RunMeta) -> float:
    return meta.wall_seconds + time.monotonic() - self.t0


class Journal:
  """metrics.jsonl and the run's record (run.json, config.json). Events are held until the run has
  something to keep (``commit``: its first checkpoint, or -- continuing a finished run -- its results),
  then written as they come; until then every checkpoint carries them (``uncommitted``)."""

  def __init__(self, setup: Setup, stretch_from: int, start_step: int, events: Iterable = (),
               writer: Optional[metrics_lib.MetricsWriter] = None):
    self.setup = setup
    self.stretch_from = stretch_from    # the step the workdir's record was last written at
    self.start_step = start_step
    self.pending = list(events)
    self.writer = writer                # given: the journal is committed already (the bench's loop)
    self.committed = writer is not None

  def commit(self, root: Optional[str] = None) -> None:
    """Writes run.json, config.json and metrics.jsonl (cut at the step the record was last written:
    the resumed run logs the rest again) into the workdir, or ``root``: the final record (``finish``)."""
    if self.committed and root is None:
      return
    setup, prior, was = self.setup, self.setup.prior, self.committed
    if setup.is_lead:
      if not was:
        prior.record.write(setup.config, prior.allowed, self.stretch_from, root)
      workdir_lib.truncate_metrics(setup.workdir, setup.num_steps if was else self.stretch_from,
                                   out=root and os.path.join(root, 'metrics.jsonl'))
    self.close()
    self.committed = True
    self.writer = metrics_lib.MetricsWriter(setup.workdir, enabled=setup.is_lead, root=root)
    if not was and (self.start_step == 0 or prior.allowed):
      self.writer.write_config(setup.config)
    for event in self.pending:
      self.writer.write(*event)
    self.pending = []

  def write(self, split: str, step: int, values: dict) -> None:
    """A metrics event: written once the run is committed, held until then."""
    if self.committed:
      self.writer.write(split, step, values)
    else:
      self.pending.append((split, step, values))

  def uncommitted(self) -> Optional[dict]:
    """What a checkpoint carries while the record is unwritten (None once it is)."""
    if self.committed:
      return None
    return {'from_step': self.stretch_from, 'events': [
        [split, int(at), {k: v.item() if hasattr(v, 'item') else v for k, v in values.items()}]
        for split, at, values in self.pending]}

  def close(self) -> None:
    if self.writer is not None:
      self.writer.close()
