"""The step loop of a run (``Loop``): dispatch, boundaries (log, validation, checkpoint, stop),
divergence, and the profiler trace."""
from __future__ import annotations

import collections
import dataclasses
import functools
import os
import time
from typing import Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from kernelformer import run_config
from kernelformer.training import checkpoint as ckpt_lib
from kernelformer.training import metrics as metrics_lib
from kernelformer.training.population import Population
from kernelformer.training import selection
from kernelformer.training import sharding
from kernelformer.training import signals as signals_lib
from kernelformer.training import workdir as workdir_lib
from kernelformer.training.run_meta import Journal, RunMeta, Segment, Setup, Watch
from kernelformer.training.steps import TrainState, build_steps, empty_window, evaluate, window_values


# Steps in flight: past MAX_IN_FLIGHT the host waits until RESUME_IN_FLIGHT are, one wake-up of the
# host thread per 8 steps (docs/architecture.md, "The loop never waits for the host").
MAX_IN_FLIGHT = 16
RESUME_IN_FLIGHT = 8


def next_boundary(run: run_config.Run, num_steps: int, step: int) -> int:
  """The first step after ``step`` that ends with validation, a checkpoint or the end: the host waits
  for the device there (computed once per boundary, not per step)."""
  candidates = [step + every - step % every
                for every in (run.eval_every, run.checkpoint_every) if every > 0]
  if num_steps > step:
    candidates.append(num_steps)
  return min(candidates, default=step + 1)


def advice(policy: str) -> str:
  """What to change after a divergence (skipping non-finite steps only where it is not already on)."""
  return ('lower optim.learning_rate or set optim.grad_clip_norm' if policy == 'skip' else
          "lower optim.learning_rate, set optim.grad_clip_norm, or on_nonfinite='skip'")


def divergence_error(window: dict, policy: str, kept: str) -> workdir_lib.RunError:
  """The line that stops the run at the first non-finite step of ``window`` (policy 'stop', or 'skip'
  after too many in a row); ``kept``: what the stopped run leaves (``kept``)."""
  step = window['bad_step']
  if policy == 'skip':
    return workdir_lib.RunError(
        f'step {step}: {window["consecutive"]} non-finite steps (loss or gradient norm) in a row; the '
        f'run diverged and was stopped, nothing from it saved; {kept}; {advice(policy)}',
        workdir_lib.EXIT_DIVERGED)
  loss, norm = window['bad_loss'], window['bad_grad_norm']
  bad = ' and '.join(n for n, v in (('loss', loss), ('gradient norm', norm)) if not np.isfinite(v))
  return workdir_lib.RunError(
      f'step {step}: non-finite {bad or "loss or gradient norm"} (loss {loss:.4g}, gradient norm '
      f'{norm:.4g}); the run diverged and was stopped, nothing from this step saved; {kept}; '
      f'{advice(policy)}', workdir_lib.EXIT_DIVERGED)


def kept(setup: Setup) -> str:
  """What a stopped run leaves: the newest checkpoint on disk (each one passed ``check_finite``), and
  a finished run continued here is unchanged (its record is written only when the stretch ends)."""
  last = setup.checkpoints.latest_step() if setup.checkpoints is not None else None
  out = (f'the last good checkpoint (step {last}) and best/ are kept' if last is not None
         else 'no checkpoint had been written')
  if setup.prior is not None and setup.prior.provisional:
    out += (f"; the finished run (results.json, step {setup.prior.previous.get('final_step')}) and "
            f'its record are unchanged')
  return out


class Loop:
  """The step loop of one segment: it owns the compiled step, the steps in flight, the queued logs and
  the window; its boundaries (log, validation, checkpoint, stop) update the ``RunMeta``, ``Segment``
  and ``Journal`` it is given; the state is an argument and the result of ``run``."""

  def __init__(self, setup: Setup, meta: RunMeta, segment: Segment, journal: Journal):
    self.setup, self.meta, self.segment, self.journal = setup, meta, segment, journal
    self.compiled = None     # the loop step, compiled ahead of time at the first batch
    self.window = jax.device_put(empty_window(), sharding.replicated(setup.mesh))
    self.in_flight = collections.deque()      # (step, its window) of steps dispatched, not waited for
    self.pending_logs = collections.deque()   # (log step, its window), read once the step is done
    self.dispatching = self.dispatched = segment.start_step
    self.steps_before = meta.steps_trained - segment.start_step   # steps_trained = this + dispatched

  def update(self, **changes) -> RunMeta:
    """The run's record with ``changes``: every change of ``RunMeta`` in a run is one of these."""
    self.meta = dataclasses.replace(self.meta, **changes)
    return self.meta

  def run(self, state: TrainState, start: int, until: int, batches) -> TrainState:
    """Steps start..``until`` of ``batches`` (``run_members``: this run, a population of one)."""
    one = Population((self.setup.config,), self.setup.mesh, self.setup.loop_step, ())
    placed = () if self.meta.stopped_early else batches.device_iterate(start, until, self.setup.mesh)
    return run_members(one, {0: self}, state, self.window, start, until, placed, self.setup.hooks)

  def wait(self, keep: int) -> None:
    """Waits (no transfer) until at most ``keep`` steps are in flight -- one wait, for the newest step
    that must finish (steps finish in order) -- with the watchdog naming the first unfinished step;
    logs whose step is done are read and written."""
    if len(self.in_flight) <= keep:
      return
    done, window = self.in_flight[-keep - 1]
    if not window.is_ready():
      self.setup.watch.step(self.unfinished_steps, self.first_unfinished)
      window.block_until_ready()   # the steps before it are done too; they leave the queue after it
    while len(self.in_flight) > keep:
      self.in_flight.popleft()
    self.flush_logs(done)

  def first_unfinished(self) -> int:
    """The first training step dispatched (or being dispatched) that has not finished; called by the
    watchdog's thread (steps finish in order; reading ``is_ready`` transfers nothing)."""
    for done, window in list(self.in_flight):
      if not window.is_ready():
        return done
    return self.dispatching

  def unfinished_steps(self) -> str:
    """What the watchdog names when a training step does not finish."""
    first = self.first_unfinished()
    return (f'training step {first}' if first >= self.dispatching else
            f'training steps {first}-{self.dispatching} (dispatched; {first} has not finished)')

  def flush_logs(self, upto: int) -> None:
    while self.pending_logs and self.pending_logs[0][0] <= upto:
      done, window = self.pending_logs.popleft()
      self.log(done, self.read(done, window))

  # ---- boundaries: the only places the host reads the device ----------------------------------------
  def read(self, done: int, window) -> dict:
    """Reads a window (the one transfer of a boundary); stops a diverged run."""
    window = window_values(window)
    segment = self.segment
    first, t0 = segment.span
    meta = self.update(timed_steps=self.meta.timed_steps + done - first,
                       train_seconds=self.meta.train_seconds + time.perf_counter() - t0,
                       steps_trained=self.steps_before + self.dispatched)
    segment.span = (done, time.perf_counter())
    segment.timer.tick(done)
    segment.progress.timed(meta.timed_steps, meta.train_seconds)  # the rate results.json gives
    if window['bad_step'] >= 0:
      raise divergence_error(window, self.setup.policy, kept(self.setup))
    return window

  def read_window(self, done: int) -> dict:
    """Waits for every step in flight and reads the current window."""
    self.wait(0)
    self.flush_logs(done)
    return self.read(done, self.window)

  def boundary(self, done: int, state: TrainState) -> None:
    """Logging, validation and checkpoints due after step ``done``."""
    run, num_steps = self.setup.run, self.setup.num_steps
    window = self.read_window(done)
    if done % run.log_every == 0 or done == num_steps:
      self.log(done, window)
    val = None
    if done % run.eval_every == 0 or done == num_steps:
      val = self.validate(done, state)
      update, keep = selection.on_validation(
          run.eval.test_checkpoint, val['accuracy'], done, num_steps,
          {'best_val_accuracy': self.meta.best_val_accuracy, 'best_step': self.meta.best_step})
      if update:
        self.check_finite(done, state, val)
        self.update(**update)   # best_val_accuracy, and best_step where best/ keeps this step
        if keep:
          self.save(self.setup.best, done, state)
      lowest = self.meta.lowest_val_loss
      if good_loss(val['loss'], lowest):
        self.update(lowest_val_loss=val['loss'] if lowest is None else min(lowest, val['loss']))
      self.stop_early(done, val)
    if done % run.checkpoint_every == 0 or done == num_steps or self.meta.stopped_early is not None:
      self.save_checkpoint(done, state, val)
    self.setup.watch.step(f'after step {done}')
    self.segment.span = (done, time.perf_counter())

  def stop_early(self, done: int, val: dict) -> None:
    """``config.early_stop_accuracy`` > 0: validation accuracy above it ends the training here
    (Zoology's rule, ``zoology/train.py`` 198-200 @ d88d6f5: strictly above); the checkpoint written
    then carries the reason, so a resumed or re-run workdir does not train further; results.json says so."""
    threshold = self.setup.run.early_stop_accuracy
    if threshold > 0 and val['accuracy'] > threshold:
      self.update(stopped_early={'step': done, 'val_accuracy': val['accuracy'], 'threshold': threshold})
      workdir_lib.say(f"step {done}: validation accuracy {val['accuracy']:.4f} > {threshold}: "
                      f'training ends here (early_stop_accuracy)')

  def save_now(self, done: int, state: TrainState) -> None:
    """SIGINT/SIGTERM: the state of the last dispatched step is live (only earlier ones were donated);
    checked and saved, then the run stops (``run_members``)."""
    if self.segment.last_saved != done:
      self.read_window(done)
      self.save_checkpoint(done, state)

  def validate(self, done: int, state: TrainState) -> dict:
    setup = self.setup
    val = evaluate(setup.eval_step, state, setup.val_source, setup.run, setup.mesh,
                   on_batch=setup.watch.eval_progress(f'validating at step {done}'))
    self.journal.write('val', done, val)
    self.update(val_examples=val['examples'])
    return val

  def save_checkpoint(self, done: int, state: TrainState, val: Optional[dict] = None) -> None:
    if self.segment.last_saved != done:
      self.check_finite(done, state, val)
      self.save(self.setup.checkpoints, done, state)
      self.segment.last_saved = done

  def check_finite(self, done: int, state: TrainState, val: Optional[dict]) -> None:
    """A checkpoint is written only when it is good (``good_loss``): finite parameters, and a
    validation loss (``val`` of this step, else one validation batch) that is finite and not orders of
    magnitude above the lowest the run has seen; otherwise the run stops as diverged at ``done``."""
    setup = self.setup
    if not bool(_all_finite(state.params)):
      reason = 'non-finite parameters'
    else:
      if val is None:
        val = evaluate(setup.eval_step, state, setup.val_source, setup.run, setup.mesh,
                       max_batches=1, on_batch=setup.watch.eval_progress(f'checking step {done}'))
      lowest = self.meta.lowest_val_loss
      if good_loss(val['loss'], lowest):
        return
      reason = (f"non-finite validation loss {val['loss']}" if not np.isfinite(val['loss']) else
                f"validation loss {val['loss']:.4g}, over {DIVERGED_FACTOR:g} x "
                f'max(1, the lowest so far {lowest:.4g})')
    raise workdir_lib.RunError(
        f'step {done}: {reason}; the run diverged and was stopped, nothing from this step saved; '
        f'{kept(setup)}; {advice(setup.policy)}', workdir_lib.EXIT_DIVERGED)

  def log(self, done: int, window: dict) -> None:
    n = window['applied']
    summary = {k: window[k] / n if n else float('nan')
               for k in ('loss', 'accuracy', 'learning_rate', 'grad_norm')}
    if self.setup.run.model.attention.distills:
      summary['aux_loss'] = window['aux_loss'] / n if n else float('nan')   # part of 'loss'
    summary['steps_per_sec'] = self.segment.timer.rate()
    if window['skipped']:
      summary['skipped_steps'] = window['skipped']
      workdir_lib.say(f"step {done}: {window['skipped']} non-finite updates skipped since the last "
                      f"log (the first at step {window['first_skipped']}; {window['consecutive']} "
                      f'in a row now)')
    self.journal.write('train', done, summary)
    self.segment.progress.update(self.dispatched, summary)  # a queued log is read a step or two later

  def save(self, manager: ckpt_lib.Checkpoints, step: int, state: TrainState) -> None:
    """A checkpoint, then (the first time, unless continuing a finished run) the run's record."""
    setup = self.setup
    setup.watch.disarm()  # a slow disk is not a hang, and a write is never cut short
    meta = self.meta.as_meta(self.segment.wall_seconds(self.meta))
    held = self.journal.uncommitted()
    if held is not None:
      meta['uncommitted'] = held
    with setup.stop.deferred():
      manager.save(step, state, meta)
      if not setup.prior.provisional:
        self.journal.commit()


def run_members(pop: Population, loops: dict, state, window, start: int, until: int, placed,
                hooks=(), stopped=None):
  """Dispatches steps start..``until`` of ``pop`` (a population; a single run is one of one) on the
  ``placed`` batches; the host waits for the device only at validation and checkpoint boundaries (and
  after step ``until``). Member ``i``'s waits, logs, boundaries and stop are ``loops[i]``'s, on its
  slice of the window (``Loop.window``) and state. A log boundary queues the window of its step, read
  once that step is done while later steps run. ``stopped(i, error, state)``: member ``i`` stopped
  early (``error`` None) or diverged (its ``RunError``; without ``stopped`` it raises); it is frozen
  from then on (the step's ``active``). Returns the state."""
  live = [i for i, loop in loops.items() if loop.meta.stopped_early is None]   # else: restored there
  each = functools.partial(_each, loops, live, stopped)
  first = next(iter(loops.values())).setup
  run, stop, where = first.run, first.stop, os.path.commonpath([l.setup.workdir for l in loops.values()])
  each(lambda i, loop: (loop.in_flight.clear(), loop.pending_logs.clear(),
                        setattr(loop, 'steps_before', loop.meta.steps_trained - start)))
  sliced = lambda i, loop: setattr(loop, 'window', pop.member(window, i))
  boundary = next_boundary(run, first.num_steps, start) if live else start
  for step, batch in zip(range(start, until) if live else (), placed):
    done, lead, active = step + 1, loops[live[0]], pop.extra([i in live for i in range(len(pop.configs))])
    if lead.compiled is None:   # ahead of time, once: the same executable runs every step
      lead.setup.watch.compiling(f'compiling the train step (before step {done})')
      compiled = pop.compile(state, window, batch, active)
      each(lambda i, loop: (setattr(loop, 'compiled', compiled),
                            loop.update(compiled_memory_bytes=metrics_lib.memory_of(compiled))))
      if stop.requested:
        raise stop.stop_error(lead.segment.last_saved, where)
    # Armed before the dispatch too: a backend may run a step inline (e.g. CPU with a host callback).
    each(lambda i, loop: setattr(loop, 'dispatching', done))
    lead.setup.watch.step(lead.unfinished_steps, lead.first_unfinished)
    if run.profile_steps > 0 and jax.process_index() == 0:
      profile(lead.setup.workdir, step - start, run.profile_steps)
    state, window = lead.compiled(state, window, batch, *active)
    each(lambda i, loop: (setattr(loop, 'dispatched', done), loop.in_flight.append((done, window))))
    if done == start + 1 or len(lead.in_flight) > MAX_IN_FLIGHT:
      each(lambda i, loop: loop.wait(0 if done == start + 1 else RESUME_IN_FLIGHT))
    if done == start + 1:  # the segment's first step warms up (allocation, autotuning): not timed
      each(lambda i, loop: (setattr(loop.segment, 'span', (done, time.perf_counter())),
                            loop.segment.timer.tick(done)))
    if done == boundary:
      each(lambda i, loop: (sliced(i, loop), loop.boundary(done, pop.member(state, i, loop.setup.mesh))))
      for i in [i for i in live if loops[i].meta.stopped_early is not None]:
        live.remove(i)
        if stopped is not None:
          stopped(i, None, state)
      boundary = next_boundary(run, first.num_steps, done)
    else:
      if done % run.log_every == 0:   # the next step starts a new window
        each(lambda i, loop: loop.pending_logs.append((done, pop.member(window, i))))
      if done == until:   # (a log step too: it is read and written here, with every step done)
        each(lambda i, loop: (sliced(i, loop), loop.read_window(done)))
    if not live:
      break
    lead = loops[live[0]]
    lead.segment.progress.update(done)   # after a boundary's read, so the bar shows the trainer's rate
    if hooks:
      lead.setup.watch.step(f'after step {done} (hooks)')
      for hook in hooks:
        hook(done, state)
    if stop.requested:
      each(lambda i, loop: (sliced(i, loop), loop.save_now(done, pop.member(state, i, loop.setup.mesh))))
      raise stop.stop_error(done, where)
  if stop.requested:
    raise stop.stop_error(next(iter(loops.values())).segment.last_saved, where)
  each(sliced)   # a later call goes on from each member's window (the benchmark's)
  return state


def _each(loops: dict, live: list, stopped, fn) -> None:
  """``fn(i, loops[i])`` for each live member; one that diverges (``RunError`` EXIT_DIVERGED) is
  ``stopped`` and no longer live (without ``stopped``: the error stops the run)."""
  for i in list(live):
    try:
      fn(i, loops[i])
    except workdir_lib.RunError as e:
      if stopped is None or e.exit_code != workdir_lib.EXIT_DIVERGED:
        raise
      live.remove(i)
      stopped(i, e, None)


def benchmark_loop(config: ml_collections.ConfigDict, info, workdir: str) -> tuple[Loop, TrainState]:
  """The step loop alone, without a workdir's files, data preparation, record or final boundary (set
  ``eval_every`` and ``checkpoint_every`` past the steps run), for ``kernelformer benchmark loop``;
  ``Loop.run(state, start, until, batches)`` runs it; ``workdir`` is only where a profile would go."""
  run = run_config.of(config)
  parts, state = build_steps(run, info, None)
  num_steps = 1 << 30
  setup = Setup(config=config, run=run, workdir=workdir, prior=None, is_lead=jax.process_index() == 0,
                num_steps=num_steps, policy=run.policy, hooks=(), stop=signals_lib.StopSignals(),
                watch=Watch(signals_lib.Watchdog(), run), info=info, **parts)
  meta, _ = RunMeta.from_meta({}, 0, False, workdir_lib.now_iso())
  segment = Segment(start_step=0, last_saved=None, t0=time.monotonic(),
                    progress=metrics_lib.Progress(0, 0, enabled=False), timer=metrics_lib.StepTimer())
  journal = Journal(setup, 0, 0, writer=metrics_lib.MetricsWriter(workdir, enabled=False))
  return Loop(setup, meta, segment, journal), state


# The rule for a good checkpoint (``Loop.check_finite``; docs/architecture.md): a finite validation loss
# at most DIVERGED_FACTOR x max(1, the lowest so far); the floor of 1 nat spares ordinary overfitting.
DIVERGED_FACTOR = 1000.0


def good_loss(loss: float, lowest: Optional[float]) -> bool:
  return bool(np.isfinite(loss)) and (lowest is None or
                                      loss <= DIVERGED_FACTOR * max(1.0, float(lowest)))


@jax.jit
def _all_finite(tree) -> jax.Array:
  return jnp.all(jnp.asarray([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def profile(workdir: str, i: int, n: int) -> None:
  """A jax.profiler trace of ``n`` steps: started before the segment's step ``i`` = 1 (after the
  compiled one), stopped before step ``n + 1`` (or at the segment's end, ``stop_profile``)."""
  if i == 1 and not _TRACING:
    jax.profiler.start_trace(os.path.join(workdir, 'profile'))
    _TRACING.append(True)
  elif i == n + 1:
    stop_profile()


_TRACING = []  # non-empty while this process has a profiler trace open


def stop_profile() -> None:
  if _TRACING:
    _TRACING.clear()
    jax.effects_barrier()
    jax.profiler.stop_trace()
