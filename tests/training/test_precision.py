"""Precision and scale options of the trainer: bfloat16 compute, gradient accumulation, profiler traces.

* ``model.dtype='bfloat16'``: activations and matmuls in bf16, parameters float32. Against the float32
  run of the same config every logged loss (train per step, validation, test) must agree to 2% relative.
  Why 2%: bf16 keeps 8 significand bits (unit roundoff u = 2^-9 ~ 2e-3 per rounding); the loss of this
  1-layer model goes through a few dozen roundings whose errors mostly average out, and over 8 steps the
  parameter trajectories drift apart by about as much again. Measured: <= 6e-4, so 2% (~10 u) is loose
  enough to be stable and tight enough to catch a bf16 path that is wrong (e.g. an overflowing exp, a
  mask lost in a cast), which moves the loss by far more or gives NaN.
* ``optim.grad_accum_steps=k``: the gradient averaged over k micro-batches must equal the gradient of the
  whole batch (dropout 0), up to float32 summation-order error.
* ``profile_steps``: a jax.profiler trace lands in ``workdir/profile``.
"""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lra_tasks
from kernelformer import run_config
from kernelformer.training import input_pipeline
from kernelformer.training import sharding
from kernelformer.training import steps as steps_lib
from kernelformer.training import trainer
from tests.training import helpers

KIND = 'posrf-orf'  # positive random features: exp() of projections, the most bf16-sensitive path
ACCUM = 4         # micro-batches of 2 rows from the tiny batch of 8


def tiny_config(data_dir, **overrides):
  """8 steps of the tiny ListOps run with ``KIND``, logging every step, one evaluation at the end."""
  return helpers.tiny_config(data_dir, **{'model.attention.kind': KIND, 'num_train_steps': 8,
                                          'log_every': 1, 'eval_every': 8, 'checkpoint_every': 8,
                                          **overrides})


def losses(workdir):
  events = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  return {(e['split'], e['step']): e['loss'] for e in events}


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp('data')


@pytest.fixture(scope='module')
def runs(tmp_path_factory, data_dir):
  """The same tiny run in float32 and in bfloat16 (the latter also traced by the profiler)."""
  root = tmp_path_factory.mktemp('precision')
  out = {}
  for dtype in ('float32', 'bfloat16'):
    config = tiny_config(data_dir, **{'model.dtype': dtype},
                         profile_steps=2 if dtype == 'bfloat16' else 0)
    dtypes = set()
    results = trainer.train_and_evaluate(config, str(root / dtype), hooks=[
        lambda step, state: dtypes.update(str(p.dtype) for p in jax.tree.leaves(state.params))])
    out[dtype] = {'workdir': root / dtype, 'results': results, 'param_dtypes': dtypes,
                  'config': config}
  return out


def test_bfloat16_losses_match_float32(runs):
  f32, bf16 = losses(runs['float32']['workdir']), losses(runs['bfloat16']['workdir'])
  assert f32.keys() == bf16.keys() and len(f32) == 8 + 2  # 8 train steps, val, test
  a = np.array([f32[k] for k in sorted(f32)])
  b = np.array([bf16[k] for k in sorted(f32)])
  assert np.all(np.isfinite(b))
  rel = np.abs(a - b) / np.abs(a)
  assert rel.max() < 2e-2, rel
  assert rel.max() > 0.0  # bf16 really ran: identical losses would mean the dtype was ignored
  # Parameters stay float32 whatever the compute dtype.
  assert runs['bfloat16']['param_dtypes'] == {'float32'}
  assert np.isfinite(runs['bfloat16']['results']['test_loss'])


def test_bfloat16_computes_in_bfloat16(runs):
  config = runs['bfloat16']['config']
  info = lra_tasks.get('listops').info(config.data)
  run = run_config.of(config)
  model = steps_lib.build_model(run, info)
  keys = steps_lib.run_keys(0)
  x = jnp.ones((2, info.max_length), jnp.int32)
  # Shapes only (no computation): the lowered forward pass of the bf16 model.
  variables = jax.eval_shape(
      lambda: model.init({'params': keys['init'], 'features': keys['features']}, {'inputs': x}))
  assert {str(v.dtype) for v in jax.tree.leaves(variables['params'])} == {'float32'}
  # Other collections (cached random features) hold float32 draws and int32 draw indices only.
  assert {str(v.dtype) for v in jax.tree.leaves(variables)} <= {'float32', 'int32'}
  hlo = jax.jit(lambda v: model.apply(v, {'inputs': x}, rngs={'features': keys['features']})) \
      .lower(variables).as_text()
  assert 'bf16' in hlo


def test_profile_steps_writes_a_trace(runs):
  files = [p for p in (runs['bfloat16']['workdir'] / 'profile').rglob('*') if p.is_file()]
  assert any(p.name.endswith('.xplane.pb') for p in files), files
  assert all(p.stat().st_size > 0 for p in files)
  assert not (runs['float32']['workdir'] / 'profile').exists()


def test_gradient_accumulation_equals_one_batch(data_dir):
  """One train step with k micro-batches gives the whole-batch gradient.

  The optimizer is a probe that keeps the gradient it receives as its state (and updates nothing), so
  the gradient is compared exactly as the train step hands it to the optimizer.
  """
  config = tiny_config(data_dir)
  task = lra_tasks.get('listops')
  task.prepare(config.data)
  info = task.info(config.data)
  run = run_config.of(config)
  model = steps_lib.build_model(run, info)
  keys = steps_lib.run_keys(config.seed)
  tx = optax.GradientTransformation(
      init=lambda params: jax.tree.map(jnp.zeros_like, params),
      update=lambda grads, state, params=None: (jax.tree.map(jnp.zeros_like, grads), grads))
  mesh = sharding.make_mesh(jax.devices()[:2])
  state = steps_lib.init_state(model, tx, info, run, keys, mesh)
  batch = input_pipeline.TrainBatches(task.source(config.data, 'train'), config.batch_size,
                                      config.seed).batch(3)
  batch = sharding.shard_batch(batch, mesh)
  out = {}
  for k in (1, ACCUM):
    config.optim.grad_accum_steps = k
    train_step, _ = steps_lib.make_steps(model, tx, lambda s: 1.0, run_config.of(config), keys)
    new_state, metrics = jax.jit(train_step)(state, batch)
    grads = jax.tree.map(np.asarray, new_state.opt_state)
    out[k] = (grads, {m: float(v) for m, v in metrics.items()})
  g1, m1 = out[1]
  gk, mk = out[ACCUM]
  scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(g1))
  assert scale > 0
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(gk)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5 * scale)
  np.testing.assert_allclose(mk['loss'], m1['loss'], rtol=1e-5)
  np.testing.assert_allclose(mk['grad_norm'], m1['grad_norm'], rtol=1e-4)
