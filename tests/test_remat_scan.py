"""config.model.remat and config.model.scan_layers (kernelformer/layers.py, encoder.py).

Remat must change memory only: same parameter tree, same outputs and gradients. The layer scan must
keep every layer's random features independent, thread the 'features' collection through the scan,
and compute the same function as the unrolled blocks for the same parameters.
"""
from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from kernelformer import run_config
from kernelformer import layers
from kernelformer.encoder import Classifier
from kernelformer.training import validate
from tests.attention.helpers import fast_jit

TOKENS = jnp.array([[1, 2, 3, 4, 5, 0, 0, 0], [3, 4, 5, 6, 7, 8, 9, 1]])
LABELS = jnp.array([0, 2])


def _model(attention=None, num_layers=3, **kw):
  encoder = dict(vocab_size=11, emb_dim=16, num_layers=num_layers, num_heads=2, qkv_dim=16,
                 mlp_dim=32, attention=attention or {'kind': 'posrf-orf', 'num_features': 8,
                                                     'redraw_every': 2},
                 max_length=12, dropout_rate=0.1, **kw)
  return Classifier(num_classes=3, encoder=encoder, mlp_dim=8)


def _init(model):
  rngs = {'params': jax.random.key(0), 'dropout': jax.random.key(1), 'features': jax.random.key(2)}
  return model.init(rngs, {'inputs': TOKENS})


def _loss_and_grads(model, variables, step=3):
  """Train-mode loss (dropout on, features redrawn at ``step``) and its gradient w.r.t. params."""
  def loss(params):
    logits, state = model.apply({**variables, 'params': params}, {'inputs': TOKENS}, train=True,
                                step=jnp.int32(step), mutable=['features'],
                                rngs={'dropout': jax.random.key(5), 'features': jax.random.key(2)})
    return optax.softmax_cross_entropy_with_integer_labels(logits, LABELS).mean(), (logits, state)
  return fast_jit(jax.value_and_grad(loss, has_aux=True))(variables['params'])


@pytest.mark.parametrize('scan,remats', [(False, ('block', 'dots_saveable')),
                                          (True, ('nothing_saveable',))])
def test_remat_variants_equal_the_plain_model(scan, remats):
  """'block' and policies: same variables at init (names and values), same logits, loss, updated
  'features' state and gradients in a train step (dropout and a feature redraw included)."""
  plain = _model(scan_layers=scan, num_layers=2)
  variables = _init(plain)
  (loss0, (logits0, state0)), grads0 = _loss_and_grads(plain, variables)
  for remat in remats:
    model = _model(remat=remat, scan_layers=scan, num_layers=2)
    v = _init(model)
    assert jax.tree.structure(v) == jax.tree.structure(variables)
    jax.tree.map(np.testing.assert_array_equal, v, variables)
    (loss, (logits, state)), grads = _loss_and_grads(model, variables)
    np.testing.assert_allclose(loss, loss0, rtol=1e-6)
    np.testing.assert_allclose(logits, logits0, rtol=1e-5, atol=1e-6)
    jax.tree.map(np.testing.assert_array_equal, state, state0)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads, grads0)


def test_unrolled_parameter_names_unchanged():
  """scan_layers=False keeps 'block_i' (existing checkpoints restore); remat does not rename."""
  for remat in ('none', 'block'):
    names = set(flax.traverse_util.flatten_dict(_init(_model(remat=remat))['params'], sep='/'))
    assert {n.split('/')[1] for n in names if n.startswith('encoder/block')} == {
        'block_0', 'block_1', 'block_2'}
    assert 'encoder/block_0/attention/query/kernel' in names


def _stack_unrolled(params, num_layers):
  """The unrolled model's 'block_i' parameters stacked into the scanned model's 'layers/block'."""
  enc = dict(params['encoder'])
  blocks = [enc.pop(f'block_{i}') for i in range(num_layers)]
  enc['layers'] = {'block': jax.tree.map(lambda *x: jnp.stack(x), *blocks)}
  return {**params, 'encoder': enc}


@pytest.mark.parametrize('attention', [{'kind': 'softmax'}, {'kind': 'linear-elu', 'rpe': True}])
def test_scan_computes_the_unrolled_function(attention):
  """Same parameters (stacked) -> same logits, for a deterministic kernel; with 'rpe' the shared
  relative-position bias is broadcast to every scanned layer and the padding mask reaches each."""
  unrolled, scanned = _model(attention), _model(attention, scan_layers=True)
  params = _init(unrolled)['params']
  stacked = _stack_unrolled(params, 3)
  assert (jax.tree.structure(stacked) ==
          jax.tree.structure(_init(scanned)['params']))
  apply = lambda m, p: fast_jit(lambda p: m.apply({'params': p}, {'inputs': TOKENS}))(p)
  np.testing.assert_allclose(apply(scanned, stacked), apply(unrolled, params), rtol=1e-5,
                             atol=1e-6)


def test_scanned_layers_draw_independent_features_and_train():
  """Per-layer feature draws differ (split 'features' rngs), the 'features' state is stacked and
  updated through the scan at a redraw, and a few optimizer steps reduce the loss."""
  model = _model(scan_layers=True, remat='block')
  variables = _init(model)
  feats = variables['features']['encoder']['layers']['block']['attention'][
      'RandomFeatureAttention_0']
  w = np.asarray(feats['train'][0])                        # draw 0, before any step
  assert w.shape[0] == 3                                   # [layers, heads, M, d]
  for i in range(3):
    for j in range(i):
      assert not np.allclose(w[i], w[j])
  tx = optax.adam(1e-2)
  params, opt = variables['params'], tx.init(variables['params'])
  model_state = {'features': variables['features']}

  @fast_jit
  def step(params, opt, model_state, i):
    def loss(p):
      logits, st = model.apply({'params': p, **model_state}, {'inputs': TOKENS}, train=True,
                               step=i, mutable=['features'],
                               rngs={'dropout': jax.random.fold_in(jax.random.key(5), i),
                                     'features': jax.random.key(2)})
      return optax.softmax_cross_entropy_with_integer_labels(logits, LABELS).mean(), st
    (l, st), g = jax.value_and_grad(loss, has_aux=True)(params)
    updates, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, updates), opt, st, l

  losses = []
  for i in range(6):
    params, opt, model_state, l = step(params, opt, model_state, jnp.int32(i))
    losses.append(float(l))
  assert all(np.isfinite(losses)) and losses[-1] < losses[0]
  trained = model_state['features']['encoder']['layers']['block']['attention'][
      'RandomFeatureAttention_0']
  np.testing.assert_array_equal(trained['train_index'], [2, 2, 2])   # step 5 // redraw_every 2
  tw = np.asarray(trained['train'][0])
  assert not np.allclose(tw[0], w[0]) and not np.allclose(tw[0], tw[1])
  # Evaluation through the scan reads each layer's stored draw: the model after step 5 evaluates as
  # the train-mode call at step 5 without dropout would (unrolled scan state, same W per layer).
  evaluate = fast_jit(lambda p, st, i: model.apply({'params': p, **st}, {'inputs': TOKENS},
                                                   train=False, step=i,
                                                   rngs={'features': jax.random.key(2)}))
  np.testing.assert_allclose(evaluate(params, model_state, None),
                             evaluate(params, model_state, jnp.int32(5)), rtol=1e-5, atol=1e-6)


def _temp_bytes(remat, length=256):
  model = _model({'kind': 'softmax'}, num_layers=4, remat=remat, scan_layers=True)
  tokens = jnp.ones((2, length), jnp.int32)
  params = jax.eval_shape(lambda: model.init(
      {'params': jax.random.key(0)}, {'inputs': tokens}))['params']

  def grad(p, x):
    return jax.grad(lambda p: jnp.sum(model.apply({'params': p}, {'inputs': x})))(p)
  return jax.jit(grad).lower(params, tokens).compile().memory_analysis().temp_size_in_bytes


def test_remat_lowers_compiled_memory():
  """XLA's temp bytes of a scanned 4-layer softmax encoder's gradient at L = 256: remat keeps one
  block's L x L attention for the backward instead of four. (Unrolled blocks under nn.remat do not
  lower XLA-CPU's temp bytes: its scheduler hoists the recomputations; docs/benchmarks.md.)"""
  none, block = _temp_bytes('none'), _temp_bytes('block')
  assert block < 0.6 * none, (block, none)


def test_config_fields_validated_and_passed():
  """Defaults in configs/common.py; a bad value is a one-line ConfigError naming the field; the
  trainer hands both fields to the encoder (and refuses them for the LM decoder)."""
  import lra_tasks  # pylint: disable=g-import-not-at-top
  from configs import text  # pylint: disable=g-import-not-at-top
  from kernelformer.training import steps as steps_lib  # pylint: disable=g-import-not-at-top
  c = text.get_config('lra')
  assert c.model.remat == 'none' and c.model.scan_layers is False
  validate.validate_config(c)
  for field, bad in (('remat', 'blocks'), ('remat', True), ('scan_layers', 'yes')):
    c2 = ml_collections.ConfigDict(c.to_dict(), type_safe=False)
    c2.model[field] = bad
    with pytest.raises(validate.ConfigError, match=f'model.{field}'):
      validate.validate_config(c2)
  with pytest.raises(ValueError, match='model.remat'):
    layers.remat_block('dots')
  c.model.remat, c.model.scan_layers = 'dots_saveable', True
  validate.validate_config(c)
  run = run_config.of(c)
  model = steps_lib.build_model(run, lra_tasks.get('text').info(c.data))
  assert model.encoder['remat'] == 'dots_saveable' and model.encoder['scan_layers'] is True
  # The LM decoder takes neither: refused before anything is built.
  from configs import mqar  # pylint: disable=g-import-not-at-top
  lm = mqar.get_config()
  lm.model.scan_layers = True
  with pytest.raises(validate.ConfigError, match='scan_layers'):
    validate.validate_config(lm)
