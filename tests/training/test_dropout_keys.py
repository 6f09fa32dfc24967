"""The dropout key changes from step to step and is a function of the step.

The same parameters and batch at two different steps must give two different training losses (only the
dropout mask differs: the schedule enters after the loss), and the same step twice the same loss.
"""
from __future__ import annotations

import jax
import lra_tasks
import numpy as np

from kernelformer import run_config
from kernelformer.training import input_pipeline
from kernelformer.training import optim as optim_lib
from kernelformer.training import sharding
from kernelformer.training import steps as steps_lib
from tests.training import helpers


def test_dropout_key_is_folded_with_the_step(tmp_path):
  config = helpers.tiny_config(tmp_path / 'data', **{'model.dropout_rate': 0.5})
  task = lra_tasks.get('listops')
  task.prepare(config.data)
  info = task.info(config.data)
  run = run_config.of(config)
  model = steps_lib.build_model(run, info)
  keys = steps_lib.run_keys(config.seed)
  tx, schedule = optim_lib.make_optimizer(run.optim, run.num_train_steps)
  mesh = sharding.make_mesh(jax.devices()[:1])
  state = steps_lib.init_state(model, tx, info, run, keys, mesh)
  batch = input_pipeline.TrainBatches(task.source(config.data, 'train'), config.batch_size,
                                      config.seed).batch(0)
  batch = sharding.shard_batch(batch, mesh)
  train_step, _ = steps_lib.make_steps(model, tx, schedule, run, keys)
  step = jax.jit(train_step)
  loss = {s: float(step(state.replace(step=jax.numpy.int32(s)), batch)[1]['loss']) for s in (0, 1, 7)}
  again = float(step(state.replace(step=jax.numpy.int32(1)), batch)[1]['loss'])
  assert np.isfinite(list(loss.values())).all()
  assert len(set(loss.values())) == 3, loss      # each step its own dropout mask
  assert again == loss[1]                         # a function of the step (resumes are exact)
