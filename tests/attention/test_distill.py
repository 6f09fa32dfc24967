"""Hedgehog's attention-distillation loss (Zhang et al. 2024, section 4.1) as an auxiliary training loss.

* the sown value equals ``distill_weight`` x a float64 numpy cross-entropy between softmax attention and
  the normalised Hedgehog attention, masked (padded keys, padded query rows, causal);
* with the task loss zeroed its gradient reaches only the map's parameters (``map_w``), none of the
  encoder's (embeddings, q/k/v projections, MLPs);
* weight 0 (the default) sows nothing, the train step reports no ``aux_loss`` and its loss is the task
  loss; weight > 0 makes the train step's loss = task loss + the logged ``aux_loss``;
* kinds without a learned map refuse a weight in one line.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import lra_tasks
import numpy as np
import pytest

from kernelformer import run_config
from kernelformer import registry
from kernelformer.attention import distill
from kernelformer.training import input_pipeline
from kernelformer.training import optim as optim_lib
from kernelformer.training import sharding
from kernelformer.training import steps as steps_lib
from tests.training import helpers

B, L, H, D = 2, 6, 2, 4


def _np_softmax(z):
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _ref_loss(q, k, w, mask, causal):
  """Float64: mean over valid query rows of -sum_j T_ij log A_ij (Hedgehog sec. 4.1)."""
  total, rows = 0.0, 0
  for b in range(q.shape[0]):
    for h in range(q.shape[2]):
      qh, kh = q[b, :, h], k[b, :, h]
      feat = lambda x: np.concatenate([_np_softmax(x @ w[h].T), _np_softmax(-x @ w[h].T)], -1)
      for i in range(q.shape[1]):
        if not mask[b, i]:
          continue
        keys = [j for j in range(k.shape[1]) if mask[b, j] and (not causal or j <= i)]
        t = _np_softmax(np.array([qh[i] @ kh[j] / math.sqrt(q.shape[-1]) for j in keys]))
        s = np.array([feat(qh[i]) @ feat(kh[j]) for j in keys])
        total += -np.sum(t * np.log(s / s.sum()))
        rows += 1
  return total / rows


def test_sown_loss_equals_the_float64_reference():
  rng = np.random.default_rng(0)
  q, k, v = (rng.standard_normal((B, L, H, D)) for _ in range(3))
  mask = np.arange(L)[None, :] < np.array([[L], [4]])
  module = registry.build({'kind': 'hedgehog', 'distill_weight': 0.3, 'chunk_size': 4})
  args = [jnp.asarray(a, jnp.float32) for a in (q, k, v)]
  variables = module.init(jax.random.PRNGKey(0), *args, mask=jnp.asarray(mask))
  assert set(variables) == {'params'}         # init sows nothing (it would become model state)
  params = jax.tree.map(lambda a: a + 0.4 * jax.random.normal(jax.random.PRNGKey(1), a.shape),
                        variables['params'])
  w = np.asarray(params['map_w'], np.float64)
  for causal in (False, True):
    _, sown = module.apply({'params': params}, *args, mask=jnp.asarray(mask), causal=causal,
                           mutable=[distill.DISTILL_COLLECTION])
    (value,) = sown[distill.DISTILL_COLLECTION]['distill']
    ref = 0.3 * _ref_loss(q, k, w, mask, causal)
    np.testing.assert_allclose(float(value), ref, rtol=2e-5, err_msg=f'causal={causal}')
  # Not asked for (no mutable collection): nothing is computed or sown.
  assert set(module.apply({'params': params}, *args, mask=jnp.asarray(mask), mutable=['intermediates'])[1]) \
      <= {'intermediates'}


def _setup(tmp_path, **overrides):
  config = helpers.tiny_config(tmp_path / 'data', **{'model.attention.kind': 'hedgehog', **overrides})
  task = lra_tasks.get('listops')
  task.prepare(config.data)
  info = task.info(config.data)
  run = run_config.of(config)
  model = steps_lib.build_model(run, info)
  keys = steps_lib.run_keys(config.seed)
  mesh = sharding.make_mesh(jax.devices()[:1])
  tx, schedule = optim_lib.make_optimizer(run.optim, run.num_train_steps)
  state = steps_lib.init_state(model, tx, info, run, keys, mesh)
  batch = input_pipeline.TrainBatches(task.source(config.data, 'train'), config.batch_size,
                                      config.seed).batch(0)
  return config, model, keys, tx, schedule, state, sharding.shard_batch(batch, mesh)


def test_gradient_reaches_only_the_map_and_the_step_adds_and_logs_it(tmp_path):
  config, model, keys, tx, schedule, state, batch = _setup(
      tmp_path, **{'model.attention.distill_weight': 0.5})
  inputs = {k: v for k, v in batch.items() if k.startswith('inputs')}

  def aux_only(params):
    _, sown = model.apply({'params': params, **state.model_state}, inputs, train=True, step=0,
                          rngs={'dropout': keys['dropout'], 'features': keys['features']},
                          mutable=list(state.model_state) + [distill.DISTILL_COLLECTION])
    return sum(jnp.sum(x) for x in jax.tree.leaves(sown[distill.DISTILL_COLLECTION]))

  grads = jax.grad(aux_only)(state.params)
  flat = jax.tree_util.tree_flatten_with_path(grads)[0]
  names = {jax.tree_util.keystr(p): float(jnp.max(jnp.abs(g))) for p, g in flat}
  map_w = {n for n in names if n.endswith("['map_w']")}
  assert map_w and all(names[n] > 0 for n in map_w), names
  assert all(names[n] == 0.0 for n in names if n not in map_w), {n: g for n, g in names.items() if g}

  # The train step: loss = task + aux, aux logged on its own.
  _, metrics = jax.jit(steps_lib.make_steps(model, tx, schedule, run_config.of(config), keys)[0])(state, batch)
  aux = float(aux_only(state.params))
  assert aux > 0 and 'aux_loss' in metrics
  np.testing.assert_allclose(float(metrics['aux_loss']), aux, rtol=1e-5)
  config0, model0, *_ = _setup(tmp_path, **{'model.attention.distill_weight': 0.0})
  _, m0 = jax.jit(steps_lib.make_steps(model0, tx, schedule, run_config.of(config0), keys)[0])(state, batch)
  np.testing.assert_allclose(float(metrics['loss']), float(m0['loss']) + aux, rtol=1e-5)


def test_weight_zero_leaves_the_step_unchanged(tmp_path):
  """Weight 0 or unset (the default, None in the config): no collection asked for, nothing sown, no aux
  metric, and bit for bit the same update either way (the code path of the plain step)."""
  config, model, keys, tx, schedule, state, batch = _setup(tmp_path)
  assert config.model.attention.distill_weight is None           # unset: the module's default, 0
  plain_state, plain = jax.jit(steps_lib.make_steps(model, tx, schedule, run_config.of(config), keys)[0])(state, batch)
  assert set(plain) == {'loss', 'accuracy', 'learning_rate', 'grad_norm'}
  config0, model0, *_ = _setup(tmp_path, **{'model.attention.distill_weight': 0.0})
  new_state, metrics = jax.jit(steps_lib.make_steps(model0, tx, schedule, run_config.of(config0), keys)[0])(state, batch)
  assert set(metrics) == set(plain) and float(plain['loss']) == float(metrics['loss'])
  for a, b in zip(jax.tree.leaves(plain_state.params), jax.tree.leaves(new_state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  inputs = {k: v for k, v in batch.items() if k.startswith('inputs')}
  _, sown = model0.apply({'params': state.params, **state.model_state}, inputs, train=True, step=0,
                         rngs={'dropout': keys['dropout'], 'features': keys['features']},
                         mutable=list(state.model_state) + [distill.DISTILL_COLLECTION])
  assert not jax.tree.leaves(sown.get(distill.DISTILL_COLLECTION, {}))


def test_kinds_without_a_learned_map_refuse_a_weight():
  module = registry.build({'kind': 'relu', 'distill_weight': 0.1})
  x = jnp.ones((1, 3, 2, D))
  with pytest.raises(ValueError, match='distill_weight trains a learned feature map'):
    module.init(jax.random.PRNGKey(0), x, x, x)


def test_gradient_accumulation_carries_the_aux_loss(tmp_path):
  """With micro-batches the aux loss is averaged like the task loss and logged (same value as the
  micro-batches' own aux losses averaged)."""
  config, model, keys, tx, schedule, state, batch = _setup(
      tmp_path, **{'model.attention.distill_weight': 0.5, 'optim.grad_accum_steps': 2})
  _, metrics = jax.jit(steps_lib.make_steps(model, tx, schedule, run_config.of(config), keys)[0])(state, batch)
  inputs = {k: v for k, v in batch.items() if k.startswith('inputs')}
  dropout = jax.random.fold_in(keys['dropout'], 0)
  parts = []
  for i in range(2):
    micro = jax.tree.map(lambda x: x[i::2], inputs)        # the trainer's strided micro-batches
    _, sown = model.apply({'params': state.params, **state.model_state}, micro, train=True, step=0,
                          rngs={'dropout': jax.random.fold_in(dropout, i), 'features': keys['features']},
                          mutable=list(state.model_state) + [distill.DISTILL_COLLECTION])
    parts.append(float(sum(jnp.sum(x) for x in jax.tree.leaves(sown[distill.DISTILL_COLLECTION]))))
  np.testing.assert_allclose(float(metrics['aux_loss']), np.mean(parts), rtol=1e-5)


def test_decoder_layers_sow_the_causal_loss():
  """The LM decoder (causal) sows one finite positive term per attention layer (the value itself, causal
  included, is checked against the float64 reference above) and nothing at init."""
  from kernelformer import decoder  # pylint: disable=g-import-not-at-top
  model = decoder.Decoder(vocab_size=7, emb_dim=8, num_layers=2, num_heads=2, qkv_dim=8, mlp_dim=16,
                          attention={'kind': 'hedgehog', 'distill_weight': 0.2, 'chunk_size': 2},
                          max_length=5)
  tokens = jax.random.randint(jax.random.key(0), (2, 5), 1, 7)
  variables = model.init({'params': jax.random.key(1), 'features': jax.random.key(2)}, tokens)
  assert set(variables) == {'params'}
  _, state = model.apply(variables, tokens, rngs={'features': jax.random.key(2)},
                         mutable=[distill.DISTILL_COLLECTION, 'intermediates'])
  terms = jax.tree.leaves(state[distill.DISTILL_COLLECTION])
  assert len(terms) == 2 and all(np.isfinite(float(t)) and float(t) > 0 for t in terms)
