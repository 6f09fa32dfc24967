"""``train_population(config, workdirs)``: the members of ``config.population`` (``population.py``)
trained as one program, each in its own workdir exactly as its single run (``trainer``) leaves it.

Each member has its single run's ``Setup``, ``RunMeta``, ``Segment``, ``Journal`` and ``Loop``, built by
the trainer's functions with the population's step; one step loop (``_run``) dispatches that step and,
at each boundary, hands each live member its slice of the state and window for its ``Loop.boundary``.
A member that stops (early stop, divergence) is frozen: the step's ``active`` mask keeps its state.
Resume, the diverged-member record: docs/runs.md ("Populations").
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from typing import Optional, Sequence

import jax

from kernelformer.training import input_pipeline
from kernelformer.training import metrics as metrics_lib
from kernelformer.training import population
from kernelformer.training import record as record_lib
from kernelformer.training import sharding
from kernelformer.training import signals as signals_lib
from kernelformer.training import trainer
from kernelformer.training import validate
from kernelformer.training import workdir as workdir_lib
from kernelformer.training.finish import finish, test
from kernelformer.training.loop import MAX_IN_FLIGHT, RESUME_IN_FLIGHT, Loop, next_boundary
from kernelformer.training.run_meta import RunResults, finished_results, read_prior
from kernelformer.training.steps import build_steps

DIVERGED = 'diverged.json'   # in a member's workdir: it diverged in its population ({'error': line})


class PopulationDiverged(workdir_lib.RunError):
  """Members diverged (each said its line); ``results``: each member's, None for a diverged one."""

  def __init__(self, line: str, results: list):
    super().__init__(line, workdir_lib.EXIT_DIVERGED)
    self.results = results


def train_population(config, workdirs: Sequence[str], *, hooks=(), devices=None) -> list[RunResults]:
  """Trains the members of ``config.population``, member i in ``workdirs[i]`` (each as its single run
  of ``population.members(config)[i]`` would, finished members left as they are); returns their
  results. Diverged members: ``PopulationDiverged`` once the others are done. ``hooks``: called with
  (step, the population's state) after every step."""
  logging.getLogger('absl').setLevel(logging.WARNING)
  runs = validate.validate_population(config, workdirs, devices)
  workdirs = [os.path.abspath(w) for w in workdirs]
  watchdog = signals_lib.Watchdog()
  with contextlib.ExitStack() as stack:
    locks = []
    for w in workdirs:
      os.makedirs(w, exist_ok=True)
      locks.append(workdir_lib.WorkdirLock(w))
      if jax.process_index() == 0:
        locks[-1].acquire()
        stack.callback(locks[-1].release)
        record_lib.settle_record(w)   # a record write cut short: finished or undone
    watchdog.on_fire = lambda: [lock.release() for lock in locks]
    stack.callback(watchdog.close)
    return _train(config, runs, workdirs, hooks, devices, watchdog)


def _train(config, runs, workdirs, hooks, devices, watchdog) -> list:
  """Each member: finished (left alone), diverged (its record), or built and restored -- the live ones
  at the newest step they all have -- then trained together, tested and finished one by one."""
  t0, started = time.monotonic(), workdir_lib.now_iso()
  configs = population.members(config)
  priors = [read_prior(c, r, w) for c, r, w in zip(configs, runs, workdirs)]
  results = [finished_results(r, p) for r, p in zip(runs, priors)]
  diverged = {i: _diverged(w) for i, w in enumerate(workdirs) if results[i] is None and _diverged(w)}
  todo = [i for i, r in enumerate(results) if r is None and i not in diverged]
  for i, line in diverged.items():
    workdir_lib.say(f'{workdirs[i]}: {line}')
  task, info = trainer.prepare_data(runs[0], jax.process_index() == 0) if todo else (None, None)
  pop, fresh, window = population.build(config, info, task.source(runs[0].data, 'train'),
                                        devices=devices) if todo else (None, None, None)
  stop, mesh, setups, loops, states = signals_lib.StopSignals(), sharding.make_mesh(devices), {}, {}, {}
  try:
    for i in todo:
      parts, _ = build_steps(runs[i], info, devices, fresh=False)
      setup, states[i] = trainer.build(
          configs[i], runs[i], workdirs[i], priors[i], devices=devices, watchdog=watchdog,
          program=(task, info, {**parts, 'loop_step': pop.step}, _member(pop, fresh, i, mesh)))
      setups[i] = dataclasses.replace(setup, stop=stop)
    live = [i for i in todo if not _stopped_early(setups[i])]
    upto = min((setups[i].checkpoints.latest_step() or 0 for i in live), default=None)
    for i in todo:
      setup, states[i], *rest = trainer.restore(setups.pop(i), states[i], t0=t0, started=started,
                                                upto=upto if i in live else None)
      loops[i] = Loop(setup, *rest)
      if i != todo[0]:   # one progress bar
        loops[i].segment.progress = metrics_lib.Progress(0, 0, enabled=False)
    if len({int(states[i].step) for i in live}) > 1:
      raise workdir_lib.RunError('the members resume at different steps (' + ', '.join(
          f'{workdirs[i]}: {int(states[i].step)}' for i in live) + '): a damaged checkpoint was set '
          'aside; train the members one by one (kernelformer train --workdir MEMBER)')
    with stop:
      state = pop.stack([states[i] if i in states else _member(pop, fresh, i, mesh)
                         for i in range(len(configs))]) if todo else None
      if live:
        state = _run(pop, mesh, loops, state, window, int(states[live[0]].step), live, hooks,
                     results, diverged)
      for i in list(loops):
        results[i] = _finish(loops.pop(i), _member(pop, state, i, mesh))
  finally:
    for loop in loops.values():
      trainer.close(loop.setup, loop.segment, loop.journal, False)
    for setup in setups.values():
      setup.checkpoints.close()
      setup.best.close()
  if diverged:
    raise PopulationDiverged(f"{len(diverged)} of {len(configs)} members diverged ("
                             f"{', '.join(workdirs[i] for i in diverged)}); the others finished", results)
  return results


def _run(pop, mesh, loops: dict, state, window, start: int, live: list, hooks, results: list,
         diverged: dict):
  """The population's steps from ``start``: each live member's boundaries, logs, waits and stop are its
  ``Loop``'s, on its slice; a member that stops early is tested and finished at once, a diverged one
  says its line (``_each``); both are then frozen (``active``)."""
  lead = loops[live[0]]
  run, num_steps, stop = lead.setup.run, lead.setup.num_steps, lead.setup.stop
  each = lambda fn: _each(loops, live, diverged, fn)
  placed = input_pipeline.placed_ahead(pop.batch, start, num_steps, pop.mesh)
  boundary, compiled = next_boundary(run, num_steps, start), None
  for step, batch in zip(range(start, num_steps), placed):
    done, active = step + 1, pop.extra([i in live for i in range(len(pop.configs))])
    if compiled is None:
      lead.setup.watch.compiling(f'compiling the train step (before step {done})')
      compiled = pop.step.lower(state, window, batch, *active).compile()
      each(lambda i, loop: loop.update(compiled_memory_bytes=metrics_lib.memory_of(compiled)))
    each(lambda i, loop: setattr(loop, 'dispatching', done))
    lead.setup.watch.step(lead.unfinished_steps, lead.first_unfinished)
    state, window = compiled(state, window, batch, *active)
    each(lambda i, loop: (setattr(loop, 'dispatched', done), loop.in_flight.append((done, window))))
    if done == start + 1 or len(lead.in_flight) > MAX_IN_FLIGHT:
      each(lambda i, loop: loop.wait(0 if done == start + 1 else RESUME_IN_FLIGHT))
    if done == start + 1:   # the segment's first step warms up: not timed
      each(lambda i, loop: (setattr(loop.segment, 'span', (done, time.perf_counter())),
                            loop.segment.timer.tick(done)))
    sliced = lambda i, loop: setattr(loop, 'window', pop.member(window, i))
    if done == boundary:
      each(lambda i, loop: (sliced(i, loop), loop.boundary(done, _member(pop, state, i, mesh))))
      for i in [i for i in live if loops[i].meta.stopped_early is not None]:
        live.remove(i)
        results[i] = _finish(loops.pop(i), _member(pop, state, i, mesh))
      boundary = next_boundary(run, num_steps, done)
    elif done % run.log_every == 0:
      each(lambda i, loop: loop.pending_logs.append((done, pop.member(window, i))))
    if not live:
      break
    lead = loops[live[0]]
    lead.segment.progress.update(done)
    if hooks:
      lead.setup.watch.step(f'after step {done} (hooks)')
      for hook in hooks:
        hook(done, state)
    if stop.requested:   # each live member's checkpoint at ``done``, then the stop (``Loop.stop_now``)
      each(lambda i, loop: loop.segment.last_saved == done or (
          sliced(i, loop), loop.read_window(done), loop.save_checkpoint(done, _member(pop, state, i, mesh))))
      raise stop.stop_error(done, os.path.commonpath([loops[i].setup.workdir for i in live]))
  return state


def _each(loops: dict, live: list, diverged: dict, fn) -> None:
  """``fn(i, loop)`` for each live member; a member that diverges (``RunError`` EXIT_DIVERGED) says its
  line, prefixed by its workdir, leaves its record (``DIVERGED``) and is frozen."""
  for i in list(live):
    try:
      fn(i, loops[i])
    except workdir_lib.RunError as e:
      if e.exit_code != workdir_lib.EXIT_DIVERGED:
        raise
      loop = loops.pop(i)
      live.remove(i)
      diverged[i] = str(e)
      workdir_lib.say(f'{loop.setup.workdir}: {e}')
      if loop.setup.is_lead:
        record_lib.atomic_write_json(os.path.join(loop.setup.workdir, DIVERGED),
                                     {'error': str(e)})
      trainer.close(loop.setup, loop.segment, loop.journal, False)


def _finish(loop: Loop, state) -> RunResults:
  """The member's test and results.json, as its single run's (``trainer._train_and_evaluate``)."""
  tested = test(loop.setup, loop.meta, state, loop.segment)
  trainer.close(loop.setup, loop.segment, loop.journal, True)
  return finish(loop.setup, loop.meta, loop.segment, loop.journal, state, tested)


def _member(pop, tree, i: int, mesh):
  """Member ``i``'s state (or window) on the single run's ``mesh`` (replicated)."""
  return tree if len(pop.configs) == 1 else jax.device_put(pop.member(tree, i),
                                                           sharding.replicated(mesh))


def _stopped_early(setup) -> bool:
  """The member's newest checkpoint is where it stopped early: it resumes there, frozen."""
  step = setup.checkpoints.latest_step()
  try:
    return step is not None and setup.checkpoints.meta(step).get('stopped_early') is not None
  except Exception:  # pylint: disable=broad-except  (a damaged one: the restore sets it aside)
    return False


def _diverged(workdir: str) -> Optional[str]:
  """The line of a member that diverged in its population (``DIVERGED``), else None."""
  try:
    with open(os.path.join(workdir, DIVERGED), encoding='utf-8') as f:
      return str(json.load(f)['error'])
  except FileNotFoundError:
    return None
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise workdir_lib.RunError(f'{workdir}/{DIVERGED} does not read ({e}); move it aside') from None
