"""kernelformer/encoder.py through its public outputs: pooling, padding, CLS, the dual (Retrieval) head.

Token 0 is padding and the key mask is ``inputs != 0``, so "padding must not matter" is tested by padding
the same tokens to two lengths (sinusoidal positions depend only on the index, so the real tokens get the
same embeddings at both lengths). Pooled outputs are checked against the final LayerNorm's token states,
read with Flax's ``capture_intermediates``; the head input of the dual classifier is read with
``nn.intercept_methods``.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer.encoder import Classifier, Encoder

L = 8
TOKENS = np.array([[5, 3, 9, 2, 7, 0, 0, 0],
                   [4, 4, 1, 0, 0, 0, 0, 0]], np.int32)


def _encoder_fields(pooling='mean', kind='softmax', **kw):
  fields = dict(vocab_size=12, emb_dim=8, num_layers=2, num_heads=2, qkv_dim=8, mlp_dim=16,
                attention={'kind': kind}, max_length=2 * L, dropout_rate=0.0, pooling=pooling,
                pos_encoding='sinusoidal')
  fields.update(kw)
  return fields


def _init(module, *args, **kwargs):
  rngs = {'params': jax.random.key(0), 'features': jax.random.key(1), 'dropout': jax.random.key(2)}
  variables = module.init(rngs, *args, **kwargs)
  # Nonzero CLS token, biases and LayerNorm offsets (they start at 0), so nothing is trivially equal.
  keys = iter(jax.random.split(jax.random.key(3), 200))
  return {'params': jax.tree.map(lambda p: p + 0.3 * jax.random.normal(next(keys), p.shape),
                                 variables['params'])}


def _pad(tokens, length):
  return np.pad(tokens, ((0, 0), (0, length - tokens.shape[1])))


@pytest.mark.parametrize('pooling', ['mean', 'cls'])
def test_pooled_output_does_not_depend_on_padding(pooling):
  enc = Encoder(**_encoder_fields(pooling))
  variables = _init(enc, TOKENS)
  a = enc.apply(variables, TOKENS)
  b = enc.apply(variables, _pad(TOKENS, 2 * L))
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  # ...while the real tokens do matter (the comparison above is not between constants).
  changed = TOKENS.copy()
  changed[1, 1] = 6
  c = enc.apply(variables, changed)
  assert float(jnp.max(jnp.abs(c[1] - a[1]))) > 1e-3
  np.testing.assert_allclose(c[0], a[0], rtol=1e-5, atol=1e-6)   # rows are independent


def _pooled_and_states(pooling, tokens):
  enc = Encoder(**_encoder_fields(pooling))
  variables = _init(enc, tokens)
  pooled, inter = enc.apply(variables, tokens, capture_intermediates=True, mutable=['intermediates'])
  states = inter['intermediates']['final_norm']['__call__'][0]
  return pooled, states


def test_mean_pooling_is_the_masked_mean_of_the_final_states():
  pooled, states = _pooled_and_states('mean', TOKENS)
  assert states.shape == (2, L, 8)
  mask = (TOKENS != 0)[..., None]
  want = (states * mask).sum(1) / mask.sum(1)
  np.testing.assert_allclose(pooled, want, rtol=1e-5, atol=1e-6)
  assert float(jnp.max(jnp.abs(pooled - states.mean(1)))) > 1e-3   # padding would change it


def test_cls_pooling_reads_the_prepended_token():
  pooled, states = _pooled_and_states('cls', TOKENS)
  assert states.shape == (2, L + 1, 8)   # the CLS token is prepended
  np.testing.assert_allclose(pooled, states[:, 0], rtol=1e-6, atol=1e-6)
  for other in (1, L):
    assert float(jnp.max(jnp.abs(pooled - states[:, other]))) > 1e-3


def test_all_padding_row_is_finite():
  tokens = np.zeros((1, L), np.int32)
  for pooling in ('mean', 'cls'):
    enc = Encoder(**_encoder_fields(pooling))
    assert np.all(np.isfinite(enc.apply(_init(enc, tokens), tokens)))


def test_bad_pooling_and_positions_are_clear_errors():
  with pytest.raises(ValueError, match='pooling'):
    Encoder(**_encoder_fields('max')).init(jax.random.key(0), TOKENS)
  with pytest.raises(ValueError, match='pos_encoding'):
    Encoder(**_encoder_fields(pos_encoding='rotary')).init(jax.random.key(0), TOKENS)


def _dual(kind='softmax', pooling='mean'):
  return Classifier(num_classes=2, encoder=_encoder_fields(pooling, kind), mlp_dim=8, dual=True)


def _head_input(model, variables, batch, **kwargs):
  """The classifier's call output and the input of its ``head_hidden`` Dense."""
  seen = []

  def spy(next_fun, args, kw, context):
    if context.module.name == 'head_hidden':
      seen.append(args[0])
    return next_fun(*args, **kw)

  with nn.intercept_methods(spy):
    out = model.apply(variables, batch, **kwargs)
  assert len(seen) == 1
  return out, seen[0]


def _pair(a, b):
  return {'inputs1': jnp.asarray(a), 'inputs2': jnp.asarray(b)}


def test_dual_head_features_are_u_v_product_difference():
  model = _dual()
  other = np.array([[6, 2, 0, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7, 8]], np.int32)
  variables = _init(model, _pair(TOKENS, other))
  _, h = _head_input(model, variables, _pair(TOKENS, other))
  enc = Encoder(**_encoder_fields('mean'))
  enc_vars = {'params': variables['params']['encoder']}
  u, v = enc.apply(enc_vars, TOKENS), enc.apply(enc_vars, other)
  d = u.shape[-1]
  assert h.shape == (2, 4 * d)
  for got, want in zip(jnp.split(h, 4, axis=-1), (u, v, u * v, u - v)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_swapping_the_documents_swaps_u_v_and_negates_the_difference():
  model = _dual()
  other = np.array([[6, 2, 0, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7, 8]], np.int32)
  variables = _init(model, _pair(TOKENS, other))
  _, h = _head_input(model, variables, _pair(TOKENS, other))
  _, s = _head_input(model, variables, _pair(other, TOKENS))
  u, v, p, diff = jnp.split(h, 4, axis=-1)
  for got, want in zip(jnp.split(s, 4, axis=-1), (v, u, p, -diff)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert float(jnp.max(jnp.abs(diff))) > 1e-3


@pytest.mark.parametrize('kind', ['softmax', 'posrf-orf'])
@pytest.mark.parametrize('train', [False, True], ids=['eval', 'train'])
def test_identical_documents_give_identical_embeddings(kind, train):
  """A siamese encoder: the same document in both slots gives u == v, also when features are random."""
  model = _dual(kind)
  variables = _init(model, _pair(TOKENS, TOKENS))
  kwargs = {'rngs': {'features': jax.random.key(1), 'dropout': jax.random.key(2)}, 'train': train}
  if train:
    kwargs['step'] = 3
  _, h = _head_input(model, variables, _pair(TOKENS, TOKENS), **kwargs)
  u, v, _, diff = jnp.split(h, 4, axis=-1)
  np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(diff, 0.0, atol=1e-6)
