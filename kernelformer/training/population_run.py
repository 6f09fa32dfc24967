"""``train_population(config, workdirs)``: the members of ``config.population`` (``population.py``)
trained as one program, each in its own workdir exactly as its single run (``trainer``) leaves it.

Each member has its single run's ``Setup``, ``RunMeta``, ``Segment``, ``Journal`` and ``Loop``, built by
the trainer's functions with the population's step; one step loop (``loop.run_members``) dispatches it
and, at each boundary, hands each live member its slice of the state and window for its ``Loop``.
A member that stops (early stop, divergence) is frozen: the step's ``active`` mask keeps its state.
Resume, the diverged-member record: docs/runs.md ("Populations").
"""
from __future__ import annotations

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
from kernelformer.training.loop import Loop, run_members
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
  runs = validate.validate_population(config, population.members(config), workdirs, devices)
  with trainer.held(workdirs) as (watchdog, workdirs):
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
  if not todo:
    return _end(results, diverged, workdirs)
  task, info = trainer.prepare_data(runs[0], jax.process_index() == 0)
  pop, fresh, window = population.build(config, info, task.source(runs[0].data, 'train'),
                                        devices=devices)
  stop, mesh, setups, loops, states = signals_lib.StopSignals(), sharding.make_mesh(devices), {}, {}, {}

  def stopped(i, error, state):   # early: tested and finished now; diverged: its line, its record
    loop = loops.pop(i)
    if error is None:
      results[i] = _finish(loop, pop.member(state, i, mesh))
      return
    diverged[i] = str(error)
    workdir_lib.say(f'{loop.setup.workdir}: {error}')
    if loop.setup.is_lead:
      record_lib.atomic_write_json(os.path.join(loop.setup.workdir, DIVERGED), {'error': str(error)})
    trainer.close(loop.setup, loop.segment, loop.journal, False)
  try:
    for i in todo:   # the single run's Setup, with the population's step and its slice of the state
      parts = {**build_steps(runs[i], info, devices, fresh=False)[0], 'loop_step': pop.step}
      setup, states[i] = trainer.build(configs[i], runs[i], workdirs[i], priors[i], devices=devices,
                                       watchdog=watchdog, program=(task, info, parts,
                                                                   pop.member(fresh, i, mesh)))
      setups[i] = dataclasses.replace(setup, stop=stop)
    live = _restore(setups, loops, states, t0, started)
    with stop:
      state = pop.stack([states[i] if i in states else pop.member(fresh, i, mesh)
                         for i in range(len(configs))])
      if live:
        start, until = int(states[live[0]].step), runs[live[0]].num_train_steps
        state = run_members(pop, {i: loops[i] for i in live}, state, window, start, until,
                            input_pipeline.placed_ahead(pop.batch, start, until, pop.mesh, True), hooks,
                            stopped)
      for i in list(loops):
        results[i] = _finish(loops.pop(i), pop.member(state, i, mesh))
  finally:
    for loop in loops.values():
      trainer.close(loop.setup, loop.segment, loop.journal, False)
    for setup in setups.values():
      setup.checkpoints.close()
      setup.best.close()
  return _end(results, diverged, workdirs)


def _restore(setups: dict, loops: dict, states: dict, t0: float, started: str) -> list:
  """Each member's ``Loop`` and state (``trainer.restore``) in place of its ``Setup``: the live ones at
  the newest step they all have, one stopped early where it stopped. Returns the live members."""
  todo = list(setups)
  live = [i for i in todo if not _stopped_early(setups[i])]
  upto = min((setups[i].checkpoints.latest_step() or 0 for i in live), default=None)
  for i in todo:
    setup, states[i], *rest = trainer.restore(setups.pop(i), states[i], t0=t0, started=started,
                                              upto=upto if i in live else None)
    loops[i] = Loop(setup, *rest)
    if i != (live or todo)[0]:   # one progress bar
      loops[i].segment.progress = metrics_lib.Progress(0, 0, enabled=False)
  if len({int(states[i].step) for i in live}) > 1:
    raise workdir_lib.RunError('the members resume at different steps (' + ', '.join(
        f'{loops[i].setup.workdir}: {int(states[i].step)}' for i in live) + '): their checkpoints/ '
        'hold no step in common; resume each alone (kernelformer train) with its overrides')
  return live


def _end(results: list, diverged: dict, workdirs: list) -> list:
  if diverged:
    raise PopulationDiverged(f"{len(diverged)} of {len(results)} members diverged ("
                             f"{', '.join(workdirs[i] for i in diverged)}); the others finished", results)
  return results


def _finish(loop: Loop, state) -> RunResults:
  """The member's test and results.json, as its single run's (``trainer._train_and_evaluate``)."""
  tested = test(loop.setup, loop.meta, state, loop.segment)
  trainer.close(loop.setup, loop.segment, loop.journal, True)
  return finish(loop.setup, loop.meta, loop.segment, loop.journal, state, tested)


def _stopped_early(setup) -> bool:
  """The member's newest checkpoint is where it stopped early: it resumes there, frozen."""
  step = setup.checkpoints.latest_step()
  try:
    return step is not None and setup.checkpoints.meta(step).get('stopped_early') is not None
  except Exception:  # pylint: disable=broad-except  (a damaged one: the restore sets it aside)
    return False


def _diverged(workdir: str) -> Optional[str]:
  """The line of a member that diverged in its population (``DIVERGED``, read bounded), else None."""
  path = os.path.join(workdir, DIVERGED)
  if not os.path.lexists(path):
    return None
  try:
    return str(json.loads(workdir_lib.read_bounded(path))['error'])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise workdir_lib.RunError(f'{path} does not read ({e}); move it aside') from None
