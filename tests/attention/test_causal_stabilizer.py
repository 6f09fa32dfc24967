"""Causal exp-feature attention: the stabilizer's key shift of row i depends on keys j <= i only.

``components._exp_shifted(causal_chunk=C)`` shifts every row by the running maximum over the keys up
to it and ``linear.linear_attention(..., key_shift=)`` forms each product on a shift both rows may see,
so (1) outputs before any row t -- inside a chunk too -- are bitwise independent of keys/values at
positions >= t, and (2) a large later key no longer underflows an early row's normalizer into the
``feature_eps`` clamp (the global key max did, and so did a per-chunk max inside its chunk).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer.attention import linear
from kernelformer.attention import random_features as rf
from kernelformer.features import catalog
from kernelformer.features import components
from kernelformer.features import projection as projection_lib
from kernelformer.features import weights as weights_lib

CHUNK = 4
RNGS = {'features': jax.random.PRNGKey(2)}
# One kind per exp-based component with a causal form (OPRF/SADERF: sequence statistics, below).
CAUSAL_KINDS = [f'{r.name}-orf' for r in catalog.records() if r.causal_shift and not r.sequence_statistics]


def _module(component, **kw):
  return rf.RandomFeatureAttention(component=component, weights='orf', num_features=16,
                                   chunk_size=CHUNK, impl='xla', **kw)


def _init(mod, q, k, v):
  return mod.init({'params': jax.random.PRNGKey(1), 'features': jax.random.PRNGKey(2)}, q, k, v,
                  causal=True)


def _peak_keys(variables, component, n, d):
  """Keys that maximize the feature exponents: ``w_r / s`` (posrf/hyperbolic), large norm (trigrf)."""
  w = variables['features']['train'][0]                     # [H, M, d] (the draw evaluation uses)
  if component == 'trigrf':
    return 6.0 * jnp.ones((1, n, w.shape[0], d))
  rows = jnp.stack([w[:, r % w.shape[1]] for r in range(n)], axis=0)   # [n, H, d]
  return rows[None] / rf.input_scale(d)


def test_causal_kinds_cover_exp_components():
  assert {'posrf-orf', 'hyperbolic-orf', 'trigrf-orf'} <= set(CAUSAL_KINDS)


@pytest.mark.parametrize('t', [6, 8])            # inside the second chunk of 4, and at its end
@pytest.mark.parametrize('kind', CAUSAL_KINDS)
def test_outputs_before_a_row_ignore_later_garbage(kind, t):
  component = kind.split('-')[0]
  b, length, h, d = 1, 16, 2, 8
  q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, b, length, h, d))
  mod = _module(component)
  variables = _init(mod, q, k, v)
  garbage_k = _peak_keys(variables, component, length - t, d)
  garbage_v = 1e4 * jax.random.normal(jax.random.PRNGKey(3), (b, length - t, h, d))
  k2 = k.at[:, t:].set(garbage_k)
  v2 = v.at[:, t:].set(garbage_v)
  out = mod.apply(variables, q, k, v, causal=True, rngs=RNGS)
  out2 = mod.apply(variables, q, k2, v2, causal=True, rngs=RNGS)
  assert np.all(np.isfinite(out2))
  np.testing.assert_array_equal(np.asarray(out[:, :t]), np.asarray(out2[:, :t]))


@pytest.mark.parametrize('t', [6, 8])
@pytest.mark.parametrize('kind', CAUSAL_KINDS)
def test_early_row_with_large_later_key_equals_prefix(kind, t):
  """The 0.52-error case: small early keys, later keys at the column maxima (d = 64: ~e^-32 apart),
  from a chunk boundary (t = 8) and from inside a chunk (t = 6, where a per-chunk shift failed)."""
  component = kind.split('-')[0]
  b, length, h, d = 1, 16, 1, 64
  q, k, v = jax.random.normal(jax.random.PRNGKey(4), (3, b, length, h, d))
  k = 0.1 * k
  mod = _module(component)
  variables = _init(mod, q, k, v)
  k = k.at[:, t:].set(_peak_keys(variables, component, length - t, d))
  out = mod.apply(variables, q, k, v, causal=True, rngs=RNGS)
  prefix = mod.apply(variables, q[:, :t], k[:, :t], v[:, :t], causal=True, rngs=RNGS)
  np.testing.assert_allclose(np.asarray(out[:, :t]), np.asarray(prefix), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('component', [n for n in catalog.names() if catalog.get(n).causal_shift])
def test_chunk_shifted_core_matches_exact_features(component):
  """Every exp map (OPRF/SADERF included): the shifted causal path equals the quadratic oracle on the
  unstabilized (exact) features, including rows whose keys lie ~e^-32 below a later key's (in a later
  chunk, and later in their own chunk)."""
  b, length, d, m = 1, 12, 64, 16
  kq, kk, kv, kw = jax.random.split(jax.random.PRNGKey(5), 4)
  proj = weights_lib.SAMPLERS['orf'](kw, m, d)
  s = rf.input_scale(d)
  q = s * jax.random.normal(kq, (b, length, d))
  k = 0.1 * s * jax.random.normal(kk, (b, length, d))
  w = projection_lib.dense_matrix(proj)
  # Keys at the column maximum (e^32 above the others): starting the third chunk, and as the second
  # row of the second chunk (after the first row, which sees only keys ~e^-32 below it).
  peak = w[0] if component != 'trigrf' else 0.75 * jnp.ones(d)
  k = k.at[:, 2 * CHUNK].set(peak).at[:, CHUNK + 1].set(peak)
  v = jax.random.normal(kv, (b, length, 1, 8))
  fn = catalog.get(component).fn
  phi_q, phi_k, shift = fn(q, k, proj, causal_chunk=CHUNK)
  out = linear.linear_attention(phi_q[:, :, None], phi_k[:, :, None], v, causal=True,
                                chunk_size=CHUNK, key_shift=shift[:, :, None])
  eq, ek = fn(q, k, proj, stabilize=False)
  ref = linear.quadratic_reference(eq[:, :, None], ek[:, :, None], v, causal=True, eps=0.0)
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=2e-4, atol=2e-5)


def test_key_shift_shape_and_mode_are_checked():
  phi = jnp.ones((1, 8, 1, 4))
  v = jnp.ones((1, 8, 1, 2))
  with pytest.raises(ValueError, match='key_shift'):
    linear.linear_attention(phi, phi, v, causal=True, chunk_size=4, key_shift=jnp.zeros((1, 3, 1, 4)))
  with pytest.raises(ValueError, match='causal'):
    linear.linear_attention(phi, phi, v, key_shift=jnp.zeros((1, 2, 1, 4)))


def test_gradients_match_the_global_shift():
  """The shifts cancel, so gradients equal those of the (moderate-input) global-shift path."""
  b, length, d, m = 1, 10, 8, 16
  kq, kv, kw = jax.random.split(jax.random.PRNGKey(6), 3)
  proj = weights_lib.SAMPLERS['orf'](kw, m, d)
  q, k = jax.random.normal(kq, (2, b, length, d)) * rf.input_scale(d)
  v = jax.random.normal(kv, (b, length, 1, 4))

  def loss(q, k, v, chunked):
    if chunked:
      pq, pk, sh = components.posrf(q, k, proj, causal_chunk=CHUNK)
      sh = sh[:, :, None]
    else:
      (pq, pk), sh = components.posrf(q, k, proj), None
    out = linear.linear_attention(pq[:, :, None], pk[:, :, None], v, causal=True, chunk_size=CHUNK,
                                  key_shift=sh)
    return jnp.sum(jnp.sin(out))

  g_new = jax.grad(loss, argnums=(0, 1, 2))(q, k, v, True)
  g_old = jax.grad(loss, argnums=(0, 1, 2))(q, k, v, False)
  for a, b_ in zip(g_new, g_old):
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b_), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('component', ['posrf', 'hyperbolic'])
def test_unit_key_shift_bounds_every_unit_key(component):
  """A record's ``unit_key_shift`` (causal RPE on l2-normalized keys, nprf-rpe): W's bound is above
  every unit key's exponent -- including the key w_r / |w_r| that attains it -- so it is the shift of
  every key (no key statistic enters), and the features stay <= sqrt|c_r| (no overflow)."""
  d, m = 16, 8
  kw, kk, kq = jax.random.split(jax.random.PRNGKey(7), 3)
  proj = weights_lib.SAMPLERS['orf'](kw, m, d)
  w = projection_lib.dense_matrix(proj)
  k = jnp.concatenate([w / jnp.linalg.norm(w, axis=-1, keepdims=True),
                       rf.l2_normalize(jax.random.normal(kk, (5, d)))])[None]     # [1, 13, d]
  q = rf.l2_normalize(jax.random.normal(kq, (1, k.shape[1], d)))
  bound = catalog.get(component).unit_key_shift(proj)
  fn = catalog.get(component).fn
  phi_q, phi_k, shift = fn(q, k, proj, causal_chunk=k.shape[1], shift_init=bound)
  np.testing.assert_array_equal(np.asarray(shift), np.asarray(jnp.broadcast_to(bound, shift.shape)))
  scale = np.sqrt(np.abs(np.asarray(projection_lib.row_weights(proj, jnp.float32)))).max()
  assert float(phi_k.max()) <= scale * (1 + 1e-6) and float(phi_q.max()) <= scale * (1 + 1e-6)
  # The keys at w_r / |w_r| come within the margin of the bound: the bound is tight, not loose.
  assert float(phi_k.max()) > 0.9 * scale
  # Same products as the unshifted features (the shift cancels).
  eq, ek = fn(q, k, proj, stabilize=False)
  v = jax.random.normal(jax.random.PRNGKey(8), (1, k.shape[1], 1, 3))
  np.testing.assert_allclose(
      np.asarray(linear.quadratic_reference(phi_q[:, :, None], phi_k[:, :, None], v, causal=True)),
      np.asarray(linear.quadratic_reference(eq[:, :, None], ek[:, :, None], v, causal=True)),
      rtol=1e-4, atol=1e-5)
