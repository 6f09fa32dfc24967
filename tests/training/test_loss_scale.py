"""torch's dynamic loss scale under ``model.dtype='float16'`` (``optim.loss_scaled``, ``steps.value_and_grad``).

On the tiny ListOps config: a non-finite step halves the scale and leaves parameters and AdamW's state
bitwise as they were while the step counter and the schedule's count advance (torch steps its LR
scheduler on a skipped step); ``LOSS_SCALE_GROWTH_INTERVAL`` finite steps double it; too many skips in a
row stop the run; the float16 gradient under the scale is float32's to float16 accuracy; a resumed run
restores the scale; float32 and bfloat16 have no scale.
"""
from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kernelformer import run_config
from kernelformer.training import input_pipeline
from kernelformer.training import optim as optim_lib
from kernelformer.training import steps as steps_lib
from kernelformer.training import trainer
from kernelformer.training import workdir as workdir_lib
from tests.training import helpers

SCHEDULE_STATES = (optax.ScaleByScheduleState, optax.InjectStatefulHyperparamsState)


def _setup(tmp_path, **overrides):
  c = helpers.tiny_config(tmp_path / 'data', **{'model.dtype': 'float16', **overrides})
  run = run_config.of(c)
  task, info = trainer.prepare_data(run, True)
  parts, state = steps_lib.build_steps(run, info, jax.devices()[:1])
  return parts, state, input_pipeline.TrainBatches(task.source(c.data, 'train'), c.batch_size, c.seed)


def _of(tree, classes):
  return [x for x in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, classes))
          if isinstance(x, classes)]


def _host(tree):
  return jax.tree.map(np.asarray, tree)


@pytest.mark.parametrize('schedule', ['rsqrt', 'onecycle-linear'])
def test_a_non_finite_step_halves_the_scale_and_skips_the_update(tmp_path, schedule):
  parts, state, batches = _setup(tmp_path, **{'optim.schedule': schedule})
  # 2^120 * the loss's cotangent overflows float16's activations' gradients: a non-finite step.
  state = state.replace(opt_state=state.opt_state._replace(scale=jnp.float32(2.0 ** 120)))
  before = _host(state)
  state, window = parts['loop_step'](state, steps_lib.empty_window(), batches.batch(0))
  after, w = _host(state), steps_lib.window_values(window)
  assert (w['skipped'], w['applied'], w['bad_step']) == (1, 0, -1)
  assert int(after.step) == 1 and float(after.opt_state.scale) == 2.0 ** 119
  jax.tree.map(np.testing.assert_array_equal, after.params, before.params)
  adam = _of(after.opt_state.inner, optax.ScaleByAdamState)
  jax.tree.map(np.testing.assert_array_equal, adam, _of(before.opt_state.inner, optax.ScaleByAdamState))
  assert len(adam) == 1 and int(adam[0].count) == 0
  counts = [int(s.count) for s in _of(after.opt_state.inner, SCHEDULE_STATES)]
  assert counts == [1], counts      # the LR schedule advanced
  # The next step, at 2^119, is skipped too; at the trainer's first scale the tiny model's is not.
  state = state.replace(opt_state=state.opt_state._replace(scale=jnp.float32(2.0 ** 16)))
  state, window = parts['loop_step'](state, window, batches.batch(1))
  assert steps_lib.window_values(window)['applied'] == 1 and int(state.opt_state.good_steps) == 1
  assert not np.array_equal(np.asarray(state.params['head_out']['kernel']),
                            before.params['head_out']['kernel'])


def test_growth_interval_finite_steps_double_the_scale(tmp_path, monkeypatch):
  monkeypatch.setattr(optim_lib, 'LOSS_SCALE_GROWTH_INTERVAL', 3)
  parts, state, batches = _setup(tmp_path)
  window, seen = steps_lib.empty_window(), []
  for s in range(7):
    state, window = parts['loop_step'](state, window, batches.batch(s))
    seen.append((float(state.opt_state.scale) / 2 ** 16, int(state.opt_state.good_steps)))
  assert seen == [(1, 1), (1, 2), (2, 0), (2, 1), (2, 2), (4, 0), (4, 1)], seen


def test_a_collapsing_scale_stops_the_run_with_one_line(tmp_path, monkeypatch):
  monkeypatch.setattr(optim_lib, 'LOSS_SCALE_INIT', 2.0 ** 126)   # every step overflows
  parts, state, batches = _setup(tmp_path)
  window = steps_lib.empty_window()
  for s in range(steps_lib.MAX_CONSECUTIVE_SKIPS + 2):
    state, window = parts['loop_step'](state, window, batches.batch(s))
  w = steps_lib.window_values(window)
  assert w['bad_step'] == steps_lib.MAX_CONSECUTIVE_SKIPS and int(state.step) == w['bad_step'] - 1
  c = helpers.tiny_config(tmp_path / 'data', **{'model.dtype': 'float16'})
  with pytest.raises(workdir_lib.RunError) as e:
    trainer.train_and_evaluate(c, str(tmp_path / 'run'))
  assert e.value.exit_code == workdir_lib.EXIT_DIVERGED and '\n' not in str(e.value)
  assert '10 non-finite steps (loss or gradient norm) in a row' in str(e.value), str(e.value)


def test_the_scaled_float16_gradient_is_float32s_to_float16_accuracy(tmp_path):
  """The first step's gradient, float16 with the scale against float32 (same parameters and batch):
  relative global error below 1e-2 (float16's unit roundoff is 2^-11 ~ 5e-4; the backward pass through
  two blocks rounds a few dozen times; an unscaled or twice-scaled gradient is off by far more), and
  no entry that float32 has is lost to float16's underflow, as some are without the scale."""
  parts16, state16, batches = _setup(tmp_path)
  c32 = helpers.tiny_config(tmp_path / 'data')
  run32, run16 = run_config.of(c32), run_config.of(helpers.tiny_config(tmp_path / 'data',
                                                                       **{'model.dtype': 'float16'}))
  info = trainer.prepare_data(run32, True)[1]
  batch = {k: jnp.asarray(v) for k, v in batches.batch(0).items()}

  def grads(run, opt_state):
    model, keys = steps_lib.build_model(run, info), steps_lib.run_keys(run.seed)
    loss_fn = functools.partial(steps_lib.step_loss, model, keys['features'], False, ())
    return steps_lib.value_and_grad(loss_fn, opt_state)(
        state16.params, state16.model_state, batch, jnp.int32(0), keys['dropout'])[1]

  def rel(g):
    return float(optax.global_norm(jax.tree.map(jnp.subtract, g, want)) / optax.global_norm(want))

  want = grads(run32, None)
  scaled, plain = rel(grads(run16, state16.opt_state)), rel(grads(run16, None))
  lost = lambda g: sum(int(np.sum((np.asarray(a) == 0) & (np.asarray(b) != 0)))
                       for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(want)))
  assert scaled < 1e-2, scaled
  # Measured: 0 of 3402 entries lost under the scale, 2 without it (relative error 8e-4 either way:
  # the tiny model's gradients are mostly above float16's smallest normal, 6e-5).
  assert lost(grads(run16, state16.opt_state)) == 0 < lost(grads(run16, None)), plain


def test_float32_and_bfloat16_have_no_scale(tmp_path):
  for dtype in ('float32', 'bfloat16'):
    _, state, _ = _setup(tmp_path, **{'model.dtype': dtype})
    assert not _of(state.opt_state, optim_lib.LossScaleState)


def test_a_resumed_float16_run_restores_the_scale_bitwise(tmp_path, monkeypatch):
  monkeypatch.setattr(optim_lib, 'LOSS_SCALE_GROWTH_INTERVAL', 3)   # the scale at step 4 is not 2^16
  c = helpers.tiny_config(tmp_path / 'data', checkpoint_every=4, **{'model.dtype': 'float16'})
  ends = {}

  def keep(name):
    return lambda step, state: ends.update({name: _host(state)}) if step == c.num_train_steps else None
  trainer.train_and_evaluate(c, str(tmp_path / 'full'), hooks=[keep('full')])

  class Crash(Exception):
    pass

  def crash(step, state):
    if step == 7:
      raise Crash()
  with pytest.raises(Crash):
    trainer.train_and_evaluate(c, str(tmp_path / 'resumed'), hooks=[crash])
  trainer.train_and_evaluate(c, str(tmp_path / 'resumed'), hooks=[keep('resumed')])
  assert float(ends['full'].opt_state.scale) != 2.0 ** 16   # it grew (and backed off)
  jax.tree.map(np.testing.assert_array_equal, ends['resumed'], ends['full'])


def test_the_gpu_table_names_float16_rows_amp(tmp_path):
  from kernelformer.reproduce import gpu_table  # pylint: disable=g-import-not-at-top
  for dtype, shown in (('float16', 'float16 AMP'), ('float32', 'float32')):
    (tmp_path / dtype).mkdir()
    (tmp_path / dtype / 'results.json').write_text(json.dumps(
        {'config': {'model': {'dtype': dtype}, 'num_train_steps': 4}, 'final_step': 4}))
    assert gpu_table.row('g', dtype, str(tmp_path / dtype))['precision'] == shown
