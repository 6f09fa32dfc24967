"""``train_and_evaluate(config, workdir)``: the one training loop for every task and attention kind,
read top to bottom (parts: ``steps``, ``run_meta``, ``loop``, ``finish``; outputs: docs/runs.md).

* Parallelism: ``jax.jit`` over a 1-D ``data`` mesh of all devices, batch sharded, state replicated; the
  same code runs on 1 CPU, 8 GPUs or a TPU pod (``config.batch_size`` is global).
* Randomness: a run is a function of (config, seed). Dropout keys are ``fold_in(seed_key, step)``; the
  random-feature key is fixed and the attention modules fold in ``step // redraw_every`` themselves;
  batches are a function of the step (``input_pipeline``). So a resumed run equals an uninterrupted one.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import time
from typing import Callable, Iterable, Optional

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
from kernelformer.training import validate
from kernelformer.training.finish import finish, test
from kernelformer.training.loop import Loop, stop_profile
from kernelformer.training.run_meta import (Journal, Prior, RunMeta, Segment, Setup, Watch,
                                            finished_results, read_prior)
from kernelformer.training.steps import TrainState, build_steps

KEEP_BEST = 2   # best/ keeps two: the test falls back to the earlier if the newest does not restore


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       hooks: Iterable[Callable[[int, TrainState], None]] = (),
                       devices: Optional[list] = None) -> dict:
  """Trains ``config`` in ``workdir`` (resuming if it holds a checkpoint); returns the results dict.

  ``hooks`` are called after every step is dispatched, with (step, state); ``state`` may still be
  computing (reading it waits for it). Tests use them to interrupt a run. ``devices`` restricts the
  mesh (default: all devices). Run safety: docs/runs.md; each stop is a ``workdir_lib.RunError``.
  """
  logging.getLogger('absl').setLevel(logging.WARNING)
  run = validate.validate_run(config, workdir, devices)  # user mistakes: one line, before anything is created
  with held([workdir]) as (watchdog, [workdir]):
    return _train_and_evaluate(config, run, workdir, hooks, devices, watchdog)


@contextlib.contextmanager
def held(workdirs: list):
  """(the watchdog, the absolute ``workdirs``): each made, locked (the lead process) with its record
  settled (a write cut short: finished or undone); the watchdog releases the locks when it fires."""
  workdirs = [os.path.abspath(w) for w in workdirs]
  watchdog, locks = signals_lib.Watchdog(), []
  watchdog.on_fire = lambda: [lock.release() for lock in locks]
  try:
    for w in workdirs:
      os.makedirs(w, exist_ok=True)
      locks.append(workdir_lib.WorkdirLock(w))
      if jax.process_index() == 0:
        locks[-1].acquire()
        record_lib.settle_record(w)
    yield watchdog, workdirs
  finally:
    watchdog.close()
    for lock in locks:
      lock.release()


def _train_and_evaluate(config, run, workdir, hooks, devices, watchdog) -> dict:
  """read the workdir -> build -> restore -> train -> test -> finish, each phase a function of the
  values the one before returned (``run_meta``)."""
  t0, started = time.monotonic(), workdir_lib.now_iso()
  prior = read_prior(config, run, workdir)
  finished = finished_results(run, prior)
  if finished is not None:
    return finished
  setup, state = build(config, run, workdir, prior, hooks=hooks, devices=devices, watchdog=watchdog)
  setup, state, meta, segment, journal = restore(setup, state, t0=t0, started=started)
  completed = False
  try:
    with setup.stop:
      loop = Loop(setup, meta, segment, journal)
      state = loop.run(state, segment.start_step, setup.num_steps, setup.batches)
      meta = loop.meta
      tested = test(setup, meta, state, segment)
    completed = True
  finally:
    close(setup, segment, journal, completed)
  return finish(setup, meta, segment, journal, state, tested)


def prepare_data(run: run_config.Run, is_lead: bool):
  """The task and its ``TaskInfo``; missing data stops here, before any compilation."""
  task = lra_tasks.get(run.data.task)
  if is_lead:
    try:
      task.prepare(run.data)
    except OSError as e:   # a read-only or unwritable data directory: one line, not a traceback
      line = workdir_lib.unwritable_data(e, str(run.data.data_dir))
      if line is None:
        raise
      raise lra_tasks.DataError(f'{task.name}: {line}') from None
  ckpt_lib.sync('prepare_data')
  missing = task.check(run.data)
  if missing:
    raise lra_tasks.DataError(f'{task.name}: data missing: ' + '; '.join(missing))
  return task, task.info(run.data)


def build(config: ml_collections.ConfigDict, run: run_config.Run, workdir: str, prior: Prior, *,
          hooks: Iterable = (), devices: Optional[list] = None,
          watchdog: Optional[signals_lib.Watchdog] = None, program=None) -> tuple[Setup, TrainState]:
  """Data (missing data stops here), mesh, model, the compiled-to-be steps, the sources, the checkpoint
  managers, and a fresh state; ``program``: a population member's (task, info, parts, state)."""
  is_lead = jax.process_index() == 0
  if program is None:
    task, info = prepare_data(run, is_lead)
    parts, state = build_steps(run, info, devices)
  else:
    task, info, parts, state = program
  setup = Setup(
      config=config, run=run, workdir=workdir, prior=prior, is_lead=is_lead,
      num_steps=run.num_train_steps, policy=run.policy, hooks=tuple(hooks),
      stop=signals_lib.StopSignals(), watch=Watch(watchdog, run), info=info, task=task, **parts,
      val_source=task.source(run.data, 'val'),
      batches=input_pipeline.TrainBatches(task.source(run.data, 'train'), run.batch_size, run.seed),
      checkpoints=ckpt_lib.Checkpoints(os.path.join(workdir, 'checkpoints'), run.keep_checkpoints),
      best=ckpt_lib.Checkpoints(os.path.join(workdir, 'best.next' if prior.provisional else 'best'),
                                KEEP_BEST))
  return setup, state


def restore(setup: Setup, state: TrainState, *, t0: float, started: str, upto: Optional[int] = None
            ) -> tuple[Setup, TrainState, RunMeta, Segment, Journal]:
  """The newest checkpoint (at most at ``upto``: a population's members resume at one step) that
  restores (damaged newer ones set aside), or step 0 -- never step 0 silently when checkpoints existed:
  that stops with one line unless ``config.start_over`` (``refuse_silent_restart``, which may give a
  new ``Setup``: best/ moved aside)."""
  if setup.prior.provisional:   # a stretch beyond a re-tested finished run: not it
    upto = min(setup.num_steps, setup.num_steps if upto is None else upto)
  restored = setup.checkpoints.restore_latest(ckpt_lib.abstract_like(state), upto)
  meta = {'best_val_accuracy': -1.0, 'best_step': -1}
  if restored is not None:
    state, meta = restored
    logging.warning('resumed from %s at step %d', setup.checkpoints.directory, int(state.step))
  elif upto is None or not setup.checkpoints.all_steps():
    setup = refuse_silent_restart(setup)
  start = int(state.step)
  if start > setup.num_steps:
    raise workdir_lib.RunError(
        f'workdir {setup.workdir} holds a checkpoint at step {start}, past num_train_steps='
        f'{setup.num_steps}; use a new --workdir (a run cannot be shortened)')
  record, held = RunMeta.from_meta(meta, start, restored is not None, started)
  # Events not yet in metrics.jsonl travel in the checkpoint meta (``uncommitted``), with the step the
  # record was last written at: a stretch resumed before its record was written loses none.
  stretch_from = int(held.get('from_step', start)) if restored is not None else start
  events = [tuple(e) for e in held.get('events', []) if int(e[1]) <= start]
  if setup.prior.provisional:   # its bests go to best.next: a copy of best/ unless resumed beyond it
    setup.checkpoints.keep_through(stretch_from)
    if start <= int(setup.prior.previous.get('final_step') or start):
      setup.best.copy_of(os.path.join(setup.workdir, 'best'))
  segment = Segment(start_step=start, last_saved=start if restored is not None else None, t0=t0,
                    progress=metrics_lib.Progress(setup.num_steps, start,
                                                  enabled=setup.is_lead and setup.run.progress),
                    timer=metrics_lib.StepTimer())
  return setup, state, record, segment, Journal(setup, stretch_from, start, events)


def refuse_silent_restart(setup: Setup) -> Setup:
  """No checkpoint restores: if some existed (set aside as damaged) or the run had finished, stop
  with one line; with ``start_over`` the earlier best/ is moved aside (never overwritten)."""
  checkpoints, best, prior = setup.checkpoints, setup.best, setup.prior
  damaged = checkpoints.damaged()
  # run.json (config.json in older workdirs) is written only once a checkpoint exists (``save``).
  started = prior.record.data is not None
  if not damaged and prior.previous is None and not started:
    return setup  # a new workdir, or a run that stopped before its first checkpoint
  what = (f"none of its checkpoints restores ({', '.join(damaged)} in "
          f'{checkpoints.directory})' if damaged else
          f'it holds results.json but no checkpoint in {checkpoints.directory}'
          if prior.previous is not None else
          f"{'config.json' if prior.record.data.get('from') == 'config.json' else 'run.json'} "
          f'records a run started here, but {checkpoints.directory} holds no checkpoint '
          f'(emptied or removed)')
  if not setup.run.start_over:
    raise workdir_lib.RunError(
        f'workdir {setup.workdir}: {what}; nothing was trained or overwritten; put the checkpoints '
        f'back, or pass --config.start_over=True to train from step 0 (best/ is then moved aside)')
  finished = os.path.join(setup.workdir, 'best')   # a stretch's best.next is then refilled from it
  if setup.is_lead and os.path.isdir(finished) and os.listdir(finished):
    best.close()
    n = 1
    while os.path.exists(f'{finished}.before-start-over-{n}'):
      n += 1
    os.rename(finished, f'{finished}.before-start-over-{n}')
    workdir_lib.say(f'start_over: {what}; training from step 0; the earlier best/ is kept as '
                    f'best.before-start-over-{n}')
  ckpt_lib.sync('start-over')
  return dataclasses.replace(setup, best=ckpt_lib.Checkpoints(best.directory, KEEP_BEST))


def close(setup: Setup, segment: Segment, journal: Journal, completed: bool) -> None:
  setup.watch.disarm()
  segment.progress.close()
  stop_profile()
  if not completed:
    journal.close()
    setup.best.close()
    if setup.prior.provisional and setup.is_lead and (setup.checkpoints.latest_step() or 0) <= int(
        setup.prior.previous.get('final_step') or 0):   # the next start refills best.next (restore)
      shutil.rmtree(setup.best.directory, ignore_errors=True)
    setup.checkpoints.close()
