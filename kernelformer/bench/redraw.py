"""How much a trained run depends on its random draw: a checkpoint's accuracy under other draws.

``kernelformer benchmark redraw --workdir RUN [--checkpoint best|latest|STEP] [--draw_steps 0,1000]``

Restores a checkpoint of a finished or interrupted run (its ``config.json``, the task's data where the
config looks) and evaluates one split (default ``val``, every example) once with the draws evaluation
uses -- those of the checkpoint's last training step, kept in its ``features`` collection
(``attention/draws.py``) -- and once with the draws of each training step in ``--draw_steps``: the W
of random-feature kinds, a learned sampler's noise, Skyformer's landmarks. A kind without random draws
gives the same accuracy on every line.

Within a redraw window the model adapts to its draw, so the accuracy under a draw it has not trained
with is lower; measured on the Zoology panel's BaseConv + FAVOR+ point in docs/benchmarks.md ("A
trained model and its draw").
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections

from kernelformer import run_config
from kernelformer.training import checkpoint as ckpt_lib
from kernelformer.training import optim as optim_lib
from kernelformer.training import steps as steps_lib
from kernelformer.training import trainer
from kernelformer.training import workdir as workdir_lib


class RedrawError(Exception):
  """A run directory or checkpoint this benchmark cannot read (one line for the user)."""


@dataclasses.dataclass(frozen=True)
class DrawAccuracy:
  draw: str          # 'trained' (the checkpoint's own draws) or 'step N'
  accuracy: float
  loss: float
  examples: int


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's full config, as ``config.json`` recorded it."""
  path = os.path.join(workdir, 'config.json')
  if not os.path.isfile(path):
    raise RedrawError(f'{workdir} holds no config.json: not a run directory')
  try:
    return ml_collections.ConfigDict(json.loads(workdir_lib.read_bounded(path)))
  except (ValueError, TypeError) as e:
    raise RedrawError(f'{path} is damaged ({type(e).__name__})') from None


def accuracy_by_draw(workdir: str, draw_steps: Sequence[int], *, checkpoint: str = 'best',
                     split: str = 'val', log: Callable[[str], None] = lambda _: None
                     ) -> tuple[int, list[DrawAccuracy]]:
  """``(checkpoint step, [the trained draws' accuracy, then each of draw_steps'])`` on ``split``."""
  config = read_config(workdir)
  run = run_config.of(config)
  task, info = trainer.prepare_data(run, True)
  parts, state = steps_lib.build_steps(run, info, None)
  # best/ saves only improvements, so its newest checkpoint is the best; checkpoints/ holds the latest.
  which = 'best' if checkpoint == 'best' else 'checkpoints'
  if not os.path.isdir(os.path.join(workdir, which)):
    raise RedrawError(f'{os.path.join(workdir, which)} does not exist: no checkpoint to evaluate')
  manager = ckpt_lib.Checkpoints(os.path.join(workdir, which), 1, read_only=True)
  steps = manager.all_steps()
  if checkpoint in ('best', 'latest'):
    if not steps:
      raise RedrawError(f'{os.path.join(workdir, which)} holds no checkpoint')
    step = max(steps)
  else:
    step = int(checkpoint)
    if step not in steps:
      manager.close()
      if not os.path.isdir(os.path.join(workdir, 'best')):
        raise RedrawError(f'no checkpoint at step {step} in {workdir}/checkpoints')
      manager = ckpt_lib.Checkpoints(os.path.join(workdir, 'best'), 1, read_only=True)
      if step not in manager.all_steps():
        raise RedrawError(f'no checkpoint at step {step} in {workdir}/checkpoints or {workdir}/best')
  try:
    state, _ = manager.restore(ckpt_lib.abstract_like(state), step)
  except workdir_lib.RunError as e:
    raise RedrawError(f'{e} (a checkpoint of other code, or of another config)') from None
  finally:
    manager.close()
  log(f'restored step {int(state.step)} of {workdir}')

  tx, schedule = optim_lib.make_optimizer(run.optim, run.num_train_steps, run.model.dtype == 'float16')
  _, eval_step = steps_lib.make_steps(parts['model'], tx, schedule, run,
                                      steps_lib.run_keys(config.seed))
  at_draw = jax.jit(eval_step)
  source = task.source(config.data, split)
  rows = []
  for draw in [None, *draw_steps]:
    fn = (lambda s, b: at_draw(s, b)) if draw is None else (
        lambda s, b, d=jnp.int32(draw): at_draw(s, b, d))
    out = steps_lib.evaluate(fn, state, source, run, parts['mesh'], max_batches=0)
    rows.append(DrawAccuracy('trained' if draw is None else f'step {draw}', out['accuracy'],
                             out['loss'], out['examples']))
    log(f'{rows[-1].draw}: accuracy {out["accuracy"]:.4f}, loss {out["loss"]:.4f}')
  return int(state.step), rows


def markdown(workdir: str, step: int, rows: Sequence[DrawAccuracy], split: str,
             command: Optional[str] = None) -> str:
  lines = [f'Checkpoint at step {step:,} of `{workdir}`, {split} split ({rows[0].examples:,} examples)'
           + (f': `{command}`' if command else ''), '',
           '| draws of | accuracy | loss |', '|---|---|---|']
  for r in rows:
    name = "the checkpoint's last training step (evaluation's)" if r.draw == 'trained' else r.draw
    lines.append(f'| {name} | {r.accuracy:.4f} | {r.loss:.4f} |')
  return '\n'.join(lines)
