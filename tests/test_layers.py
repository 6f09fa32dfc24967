"""kernelformer/layers.py against references written from the parameters.

``MultiHeadAttention`` with softmax is Vaswani et al. 2017 eq. 1 around q/k/v/out projections;
``EncoderBlock`` is the pre-LN block x + Attn(LN(x)), then x + MLP(LN(x)) (Xiong et al. 2020, fig. 1b).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer.layers import EncoderBlock, MultiHeadAttention

B, L, E, H, QKV, MLP = 2, 5, 8, 2, 8, 12
MASK = jnp.array([[True] * 5, [True, True, True, False, False]])


def _x(seed=0):
  return jax.random.normal(jax.random.key(seed), (B, L, E))


def _randomize(params, seed=1):
  """Nonzero biases and non-unit LayerNorm scales, so the reference must place every parameter."""
  keys = iter(jax.random.split(jax.random.key(seed), 100))
  return jax.tree.map(lambda p: p + 0.3 * jax.random.normal(next(keys), p.shape), params)


def _dense(p, x, contract=1):
  """DenseGeneral: contract the last ``contract`` axes of x with the first of the kernel, add bias."""
  k = p['kernel']
  xs = 'abcd'[:x.ndim - contract]
  xc = 'wxyz'[:contract]
  ko = 'pq'[:k.ndim - contract]
  return jnp.einsum(f'{xs}{xc},{xc}{ko}->{xs}{ko}', x, k) + p['bias']


def _mha_reference(p, x, mask):
  q, k, v = (_dense(p[n], x) for n in ('query', 'key', 'value'))      # [B, L, H, D]
  logits = jnp.einsum('blhd,bshd->bhls', q, k) / np.sqrt(q.shape[-1])
  if mask is not None:
    logits = jnp.where(mask[:, None, None, :], logits, -jnp.inf)
  out = jnp.einsum('bhls,bshd->blhd', jax.nn.softmax(logits, axis=-1), v)
  return _dense(p['out'], out, contract=2)


def _layer_norm(p, x, eps=1e-6):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / jnp.sqrt(var + eps) * p['scale'] + p['bias']


@pytest.mark.parametrize('mask', [None, MASK], ids=['nomask', 'mask'])
def test_softmax_multi_head_attention_equals_reference(mask):
  mha = MultiHeadAttention(H, QKV, {'kind': 'softmax'})
  x = _x()
  params = _randomize(mha.init(jax.random.key(0), x, mask=mask)['params'])
  got = mha.apply({'params': params}, x, mask=mask)
  np.testing.assert_allclose(got, _mha_reference(params, x, mask), rtol=1e-5, atol=1e-5)


def test_masked_keys_do_not_reach_real_queries():
  mha = MultiHeadAttention(H, QKV, {'kind': 'softmax'})
  x = _x()
  params = mha.init(jax.random.key(0), x, mask=MASK)['params']
  x2 = x.at[1, 3:].set(100.0)   # change only the padded positions of row 1
  a = mha.apply({'params': params}, x, mask=MASK)
  b = mha.apply({'params': params}, x2, mask=MASK)
  np.testing.assert_allclose(a[1, :3], b[1, :3], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(a[0], b[0])


def test_qkv_dim_not_divisible_by_heads_raises():
  with pytest.raises(ValueError, match='divisible'):
    MultiHeadAttention(3, QKV, {'kind': 'softmax'}).init(jax.random.key(0), _x())


def _block(dropout_rate=0.0):
  return EncoderBlock(H, QKV, MLP, {'kind': 'softmax'}, dropout_rate=dropout_rate)


def test_encoder_block_is_pre_layer_norm_residual():
  x = _x()
  block = _block()
  params = _randomize(block.init(jax.random.key(0), x, mask=MASK)['params'])
  got = block.apply({'params': params}, x, mask=MASK)
  h = x + _mha_reference(params['attention'], _layer_norm(params['LayerNorm_0'], x), MASK)
  mlp = params['MlpBlock_0']
  y = _dense(mlp['Dense_1'], jax.nn.gelu(_dense(mlp['Dense_0'], _layer_norm(params['LayerNorm_1'], h))))
  np.testing.assert_allclose(got, h + y, rtol=1e-5, atol=1e-5)


def test_dropout_only_in_training():
  x = _x()
  block = _block(dropout_rate=0.5)
  variables = block.init(jax.random.key(0), x, mask=MASK)
  run = lambda det, seed: block.apply(variables, x, mask=MASK, deterministic=det,
                                      rngs={'dropout': jax.random.key(seed)})
  no_dropout = _block(0.0).apply(variables, x, mask=MASK)
  np.testing.assert_array_equal(run(True, 1), run(True, 2))
  np.testing.assert_allclose(run(True, 1), no_dropout, rtol=1e-6, atol=1e-6)
  train1, train2 = run(False, 1), run(False, 2)
  assert float(jnp.max(jnp.abs(train1 - no_dropout))) > 1e-2
  assert float(jnp.max(jnp.abs(train1 - train2))) > 1e-2
  np.testing.assert_array_equal(train1, run(False, 1))   # a function of its key
