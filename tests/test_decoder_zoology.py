"""The decoder's Zoology options (kernelformer/decoder.py): the causal short convolution (BaseConv
layers), the identity state mixer, no padding mask, query-only logits, and incremental decoding
through the convolution."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from kernelformer import decoder

V, L, D = 32, 12, 16
KEY = jax.random.key(1)


def _model(kind='linear-elu', **kw):
  args = dict(vocab_size=V, emb_dim=D, num_layers=2, num_heads=1, qkv_dim=D, mlp_dim=D,
              attention={'kind': kind}, max_length=L, pos_encoding='none', short_conv=3,
              state_mixer='identity', pad_id=None)
  args.update(kw)
  return decoder.Decoder(**args)


def _tokens(seed=0, batch=2):
  return jnp.asarray(np.random.default_rng(seed).integers(0, V, (batch, L)), jnp.int32)


def _init(model, x):
  return model.init({'params': jax.random.key(0), 'features': KEY}, x)


def test_short_conv_matches_reference_and_is_causal():
  """y_t = b + sum_j w_j u_{t-2+j} (zeros before the start), per channel; changing u_t changes no
  output before t."""
  conv = decoder.ShortConv(3)
  u = jnp.asarray(np.random.default_rng(2).normal(size=(2, L, D)), jnp.float32)
  p = conv.init(jax.random.key(0), u)
  w, b = np.asarray(p['params']['kernel']), np.asarray(p['params']['bias'])
  y = np.asarray(conv.apply(p, u))
  un = np.asarray(u)
  ref = np.zeros_like(un) + b
  for t in range(L):
    for j in range(3):
      s = t - 2 + j
      if s >= 0:
        ref[:, t] += w[j] * un[:, s]
  np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
  for t in range(L):
    y2 = np.asarray(conv.apply(p, u.at[:, t].add(1.0)))
    np.testing.assert_array_equal(y2[:, :t], y[:, :t])
    assert np.abs(y2[:, t:min(t + 3, L)] - y[:, t:min(t + 3, L)]).min() > 0


@pytest.mark.parametrize('kind', ['softmax', 'linear-elu'])
def test_model_with_short_conv_is_causal(kind):
  m = _model(kind)
  x = _tokens()
  p = _init(m, x)
  y = np.asarray(m.apply(p, x, rngs={'features': KEY}))
  for t in (0, 5, L - 1):
    y2 = np.asarray(m.apply(p, x.at[:, t].set((x[:, t] + 1) % V), rngs={'features': KEY}))
    np.testing.assert_array_equal(y2[:, :t], y[:, :t])
    assert np.abs(y2[:, t] - y[:, t]).max() > 1e-4


def test_layout_is_zoology_hybrid_and_identity_state_mixer():
  """short_conv: block 0 BaseConv, block 1 attention (Hybrid picks configs[layer % 2]); no MLP
  parameters; the identity state mixer adds LN(r): block(x) = r + LN(r), r = x + BaseConv(LN(x))."""
  m = _model()
  x = _tokens()
  params = _init(m, x)['params']
  assert set(params['block_0']) == {'LayerNorm_0', 'LayerNorm_1', 'base_conv'}
  assert set(params['block_1']) == {'LayerNorm_0', 'LayerNorm_1', 'attention'}
  block = decoder.DecoderBlock(1, D, D, {'kind': 'linear-elu'}, L, mixer='base_conv', short_conv=3,
                               state_mixer='identity')
  h = jnp.asarray(np.random.default_rng(3).normal(size=(2, L, D)), jnp.float32)
  bp = {'params': params['block_0']}
  out = np.asarray(block.apply(bp, h))

  def ln(z, pp):
    z = np.asarray(z, np.float64)
    mu, var = z.mean(-1, keepdims=True), z.var(-1, keepdims=True)
    return (z - mu) / np.sqrt(var + 1e-6) * np.asarray(pp['scale']) + np.asarray(pp['bias'])

  u = ln(h, bp['params']['LayerNorm_0'])
  cp = bp['params']['base_conv']
  conv = np.asarray(decoder.ShortConv(3).apply({'params': cp['conv']}, jnp.asarray(u, jnp.float32)))
  proj = u @ np.asarray(cp['projection']['kernel']) + np.asarray(cp['projection']['bias'])
  r = np.asarray(h) + conv * proj + u
  np.testing.assert_allclose(out, r + ln(r, bp['params']['LayerNorm_1']), rtol=1e-4, atol=1e-4)
  none = decoder.DecoderBlock(1, D, D, {'kind': 'linear-elu'}, L, mixer='base_conv', short_conv=3,
                              state_mixer='none')
  np.testing.assert_allclose(np.asarray(none.apply(bp, h)), r, rtol=1e-4, atol=1e-4)


def test_query_only_logits_same_loss_and_gradient_as_full_logits_masked():
  m = _model('softmax', pos_encoding='learned')
  x = _tokens(5)
  qp = jnp.asarray([[2, 5, 9], [0, 7, 11]], jnp.int32)
  tq = jnp.asarray([[3, 17, 30], [8, 1, 22]], jnp.int32)
  dense = jnp.zeros((2, L), jnp.int32).at[jnp.arange(2)[:, None], qp].set(tq)
  params = _init(m, x)['params']

  def full(p):
    lg = m.apply({'params': p}, x, rngs={'features': KEY})
    losses, _, w = decoder.next_token_loss(lg, dense)
    return jnp.sum(losses) / jnp.sum(w)

  def query(p):
    lg = m.apply({'params': p}, {'inputs': x, decoder.QUERY_POSITIONS_KEY: qp}, rngs={'features': KEY})
    assert lg.shape == (2, 3, V)
    losses, _, w = decoder.next_token_loss(lg, tq)
    return jnp.sum(losses) / jnp.sum(w)

  (lf, gf), (lq, gq) = jax.value_and_grad(full)(params), jax.value_and_grad(query)(params)
  np.testing.assert_allclose(lq, lf, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), gq, gf)


@pytest.mark.parametrize('kind', ['softmax', 'linear-elu', 'posrf-orf'])
def test_incremental_decoding_carries_the_conv_inputs(kind):
  m = _model(kind)
  x = _tokens(7)
  params = _init(m, x)['params']
  full = np.asarray(m.apply({'params': params}, x, rngs={'features': KEY}))
  step = np.asarray(decoder.teacher_forced_logits(m, params, x, features_key=KEY))
  np.testing.assert_allclose(step, full, rtol=2e-4, atol=2e-4)
  cache = decoder.init_cache(m, 2)
  assert cache['block_0']['base_conv']['conv']['conv_inputs'].shape == (2, 2, D)


def test_pad_id_none_attends_to_token_zero():
  x = _tokens(9).at[:, 3].set(0)
  a, b = _model('softmax', pad_id=0), _model('softmax', pad_id=None)
  p = _init(a, x)
  ya, yb = (np.asarray(mm.apply(p, x, rngs={'features': KEY})) for mm in (a, b))
  np.testing.assert_array_equal(ya[:, :3], yb[:, :3])
  assert np.abs(ya[:, 4:] - yb[:, 4:]).max() > 1e-4
  x1 = jnp.where(x == 0, 1, x)
  np.testing.assert_array_equal(*(np.asarray(mm.apply(p, x1, rngs={'features': KEY})) for mm in (a, b)))


def test_config_fields_validated_in_one_line():
  from configs import listops, mqar as mqar_config
  from kernelformer.training import validate
  c = mqar_config.get_config('tiny')
  validate.validate_config(c)
  for field, bad in (('state_mixer', 'conv'), ('short_conv', -1)):
    c2 = ml_collections.ConfigDict(c.to_dict())
    c2.model[field] = bad
    with pytest.raises(validate.ConfigError, match=f'model.{field}') as e:
      validate.validate_config(c2)
    assert '\n' not in str(e.value)
  lc = ml_collections.ConfigDict(listops.get_config('tiny').to_dict())
  lc.model.short_conv = 3
  with pytest.raises(validate.ConfigError, match='decoder of LM tasks'):
    validate.validate_config(lc)
