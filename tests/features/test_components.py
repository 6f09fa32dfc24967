"""Tests for ``kernelformer.features.components``: kernel estimates, stabilization, masking, dtypes.

The estimators are checked against the exact kernel with a tolerance derived from their own
variance: ``phi(q).phi(k) = mean_r t_r`` with ``t_r = M c_r f_r(q) f_r(k)`` iid over r for an iid
Gaussian W, so its standard error is ``std_r(t_r) / sqrt(M)``, estimated from the same samples.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer.attention.linear import linear_attention
from kernelformer.features import catalog
from kernelformer.features import components as C
from kernelformer.features import maps
from kernelformer.features.projection import FastFoodBlocks, Projection, dense_matrix
from tests.attention import helpers

D = 8
ESTIMATORS = sorted(r.name for r in catalog.records() if r.target_kernel != 'none')
EXP_MAPS = ['trigrf', 'posrf', 'hyperbolic', 'oprf', 'saderf']


@functools.partial(jax.jit, static_argnames=('name', 'stabilize'))
def _features(name, q, k, proj, mask=None, stabilize=True):
  """The component under jit: one compile per shape instead of one per eager primitive (test time)."""
  return catalog.get(name).fn(q, k, proj, mask=mask, stabilize=stabilize)


_attention = jax.jit(linear_attention)


def _proj_for(name, m, seed):
  """W for a random-feature component; features/maps.py's own parameters for its learned maps."""
  if catalog.get(name).feature_dim is not None:
    return helpers.example_params(name, D, jax.random.PRNGKey(seed), num_features=m, map_dim=4)
  return _gauss_proj(seed, m) if catalog.get(name).uses_projection else None


def _normal(seed: int, shape) -> jax.Array:
  """iid N(0, 1) float32 from numpy: a jax.random call compiles per new shape, seconds per test."""
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _gauss_proj(seed: int, m: int, d: int = D) -> Projection:
  """A plain iid Gaussian W (Monte Carlo weights 1/M): omega_r ~ N(0, I_d)."""
  return Projection(matrix=_normal(seed, (m, d)))


def _points(seed: int, shape, norm_lo: float, norm_hi: float) -> jax.Array:
  """Random directions with norms uniform in [norm_lo, norm_hi]."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(shape)
  x /= np.linalg.norm(x, axis=-1, keepdims=True)
  return jnp.asarray(x * rng.uniform(norm_lo, norm_hi, shape[:-1] + (1,)), jnp.float32)


def _per_feature_products(name, q, k, proj):
  """``t [..., L, S, M]``: the M iid terms whose mean is the estimate (parts of a row summed)."""
  m = proj.num_features
  pq, pk = _features(name, q, k, proj, stabilize=False)
  prod = pq[..., :, None, :] * pk[..., None, :, :]
  parts = prod.shape[-1] // m
  return m * prod.reshape(*prod.shape[:-1], parts, m).sum(-2), pq, pk


def _to_blhm(x):
  """Component layout ``[B, H, L, M]`` -> attention-core layout ``[B, L, H, M]``."""
  return jnp.swapaxes(x, 1, 2)


# ------------------------------------------------------------------------------------------
# Kernel estimates.
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize('name', ESTIMATORS)
def test_estimate_converges_to_exact_kernel(name):
  q = _points(1, (2, 5, D), 0.5, 1.0)          # leading batch axis exercises the [..., L, d] contract
  k = _points(2, (2, 6, D), 0.5, 1.0)
  exact = C.exact_kernel(catalog.get(name).target_kernel, q, k)
  errors = {}
  for m, seed in ((64, 11), (4096, 12)):
    t, pq, pk = _per_feature_products(name, q, k, _gauss_proj(seed, m))
    est = jnp.einsum('...lm,...sm->...ls', pq, pk)
    np.testing.assert_allclose(est, t.mean(-1), rtol=1e-4, atol=1e-6)   # t really decomposes est
    errors[m] = jnp.abs(est - exact)
    if m == 4096:
      se = t.std(-1) / math.sqrt(m)
      # 5 standard errors per pair (60 pairs): a correct estimator fails this with prob ~ 1e-5, a
      # missing factor (1/sqrt(M), (1-4A)^(d/4), exp(|x|^2/2)) moves it by tens of errors.
      assert float(jnp.max(errors[m] / se)) < 5.0, name
  # MC error shrinks like M^-1/2: 8x from 64 to 4096 features; ask for 2x.
  assert float(errors[4096].mean()) < 0.5 * float(errors[64].mean()), name


def test_variance_reduction_oprf_saderf():
  """OPRF (variance-optimal A) beats PosRF; SADERF beats OPRF on anisotropic inputs (eqs. 35-36)."""
  m = 4096
  proj = _gauss_proj(7, m)

  def rel_std(name, q, k):
    t, _, _ = _per_feature_products(name, q, k, proj)
    return float(jnp.mean(t.std(-1) / C.exact_kernel('softmax', q, k)))

  q = _normal(1, (6, D)) * 1.5 / math.sqrt(D)
  k = _normal(2, (6, D)) * 1.5 / math.sqrt(D)
  assert rel_std('oprf', q, k) < 0.8 * rel_std('posrf', q, k)
  s = jnp.array([3.0] * 4 + [0.3] * 4)
  assert rel_std('saderf', q * s, k / s) < 0.5 * rel_std('oprf', q * s, k / s)


def _naive_products(name, q, k, w):
  """``f_r(q_i) f_r(k_j)`` ``[L, S, M]`` in float64 straight from the paper formulas (no masking)."""
  q, k, w = (np.asarray(a, np.float64) for a in (q, k, w))
  d = q.shape[-1]
  pq, pk = q @ w.T, k @ w.T                                  # [L, M], [S, M]
  nq = (q ** 2).sum(-1)[:, None, None] / 2
  nk = (k ** 2).sum(-1)[None, :, None] / 2
  diff = pq[:, None, :] - pk[None, :, :]
  summ = pq[:, None, :] + pk[None, :, :]
  if name == 'rks':
    return np.cos(diff)
  if name == 'trigrf':
    return np.exp(nq + nk) * np.cos(diff)
  if name == 'posrf':
    return np.exp(summ - nq - nk)
  if name == 'posrf_lra':
    # LRA's feature creator unstabilized: each side's FAVOR+ feature plus its 1e-6 floor.
    eps = C.LRA_FAVOR_EPSILON
    return (np.exp(pq[:, None, :] - nq) + eps) * (np.exp(pk[None, :, :] - nk) + eps)
  if name == 'hyperbolic':
    return 0.5 * (np.exp(summ) + np.exp(-summ)) * np.exp(-nq - nk)
  if name == 'saderf':
    # Eq. 36 with sums; here L = S and no padding, where it equals the pair-mean form.
    psi = ((k ** 2).sum(0) / (q ** 2).sum(0)) ** 0.25
    return _naive_products('oprf', q * psi, k / psi, w)
  if name == 'oprf':
    pairs = q[:, None, :] + k[None, :, :]
    u = (pairs ** 2).sum(-1).mean()                          # mean over pairs of |x + y|^2
    p = (math.sqrt((2 * u + d) ** 2 + 8 * d * u) - 2 * u - d) / (4 * u)   # eq. 35 as printed
    a = (1 - 1 / p) / 8
    b = math.sqrt(1 - 4 * a)
    dd = (1 - 4 * a) ** (d / 4)
    wn = (w ** 2).sum(-1)
    return dd ** 2 * np.exp(2 * a * wn + b * summ - nq - nk)
  raise ValueError(name)


@pytest.mark.parametrize('name', ESTIMATORS)
def test_signed_quadrature_weights(name):
  """``phi(q).phi(k) = sum_r c_r f_r(q) f_r(k)`` for weights of both signs (SGQ-like rules)."""
  m = 32
  w = _normal(3, (m, D))
  c = _normal(4, (m,))
  c = c / c.sum()
  assert bool(jnp.any(c < 0)) and bool(jnp.any(c > 0))
  proj = Projection(matrix=w, feature_weights=c)
  q = _points(5, (6, D), 0.3, 1.2)
  k = _points(6, (6, D), 0.3, 1.2)
  pq, pk = _features(name, q, k, proj, stabilize=False)
  want = (_naive_products(name, q, k, w) * np.asarray(c, np.float64)).sum(-1)
  np.testing.assert_allclose(pq @ pk.T, want, rtol=2e-5, atol=1e-6)


def test_oprf_parameter_limits():
  """A = 0 (PosRF) for zero inputs; A < 0 and decreasing as |q + k| grows; always < 1/8."""
  z = jnp.zeros((4, D))
  assert float(C.oprf_parameter(z, z)) == 0.0
  a = [float(C.oprf_parameter(_points(1, (4, D), s, s), _points(1, (4, D), s, s)))
       for s in (0.5, 2.0, 100.0)]
  assert 0.0 > a[0] > a[1] > a[2]
  assert all(math.isfinite(x) for x in a)


def test_fastfood_projection_matches_dense():
  """A structured (FastFood) W gives the features of its dense matrix, row norms included."""
  n, blocks, m = 8, 2, 12
  rng = np.random.default_rng(0)
  ff = FastFoodBlocks(
      s=jnp.asarray(np.abs(rng.standard_normal((blocks, n))) + 0.5, jnp.float32),
      g=jnp.asarray(rng.standard_normal((blocks, n)), jnp.float32),
      b=jnp.asarray(rng.choice([-1.0, 1.0], (blocks, n)), jnp.float32),
      perm=jnp.asarray(np.stack([rng.permutation(n) for _ in range(blocks)]), jnp.int32),
      num_features=m, dim=6)
  structured = Projection(fastfood=ff)
  dense = Projection(matrix=jax.jit(dense_matrix)(structured))
  q = _points(1, (5, 6), 0.5, 1.0)
  k = _points(2, (5, 6), 0.5, 1.0)
  # trigrf exercises ``project``; oprf also the row norms |omega_r|^2 that need W materialized.
  for name in ('trigrf', 'oprf'):
    for a, b in zip(_features(name, q, k, structured), _features(name, q, k, dense)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


# ------------------------------------------------------------------------------------------
# Signs, shapes and the registry tables.
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize('name', sorted(catalog.names()))
def test_feature_signs_and_shapes(name):
  q = _points(1, (2, 7, D), 0.5, 3.0)
  k = -_points(2, (2, 9, D), 0.5, 3.0)
  m = 16
  proj = _proj_for(name, m, 3)
  for stabilize in (True, False):
    pq, pk = _features(name, q, k, proj, stabilize=stabilize)
    width = catalog.get(name).feature_count(m, D, map_dim=4 if proj is not None and catalog.get(name).map_dim else 0)
    assert pq.shape == (2, 7, width) and pk.shape == (2, 9, width)
    if catalog.get(name).positive:
      assert bool(jnp.all(pq > 0)) and bool(jnp.all(pk > 0)), name
    if name == 'relu':
      assert bool(jnp.all(pq >= 0)) and bool(jnp.all(pk >= 0))
      np.testing.assert_array_equal(pq, jnp.maximum(q, 0.0))
    if name == 'elu':
      np.testing.assert_allclose(pq, jnp.where(q > 0, q + 1.0, jnp.exp(q)), rtol=1e-6)
  with pytest.raises(ValueError, match='unknown component'):
    catalog.get('posrf_typo')
  with pytest.raises(ValueError, match='no exact kernel'):
    C.exact_kernel('none', q, k)


# ------------------------------------------------------------------------------------------
# Stabilization and masking.
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize('name', EXP_MAPS)
@pytest.mark.parametrize('masked', [False, True])
def test_stabilized_attention_equals_unstabilized(name, masked):
  """The shifts cancel in ``D^-1 phi(Q) (phi(K)^T V)``: same normalized attention, with padding."""
  b, h, l, m = 2, 2, 6, 128
  q = _points(1, (b, h, l, D), 1.0, 2.0)
  k = _points(2, (b, h, l, D), 1.0, 2.0)
  v = _normal(3, (b, l, h, 4))
  mask = jnp.array([[True] * l, [True] * 3 + [False] * (l - 3)]) if masked else None
  kmask = None if mask is None else mask[:, None, :]       # broadcast over heads
  proj = _gauss_proj(4, m)
  outs = []
  for stabilize in (True, False):
    pq, pk = _features(name, q, k, proj, mask=kmask, stabilize=stabilize)
    outs.append(_attention(_to_blhm(pq), _to_blhm(pk), v, mask=mask))
  if catalog.get(name).positive:
    # Shifted features are only rescaled, and positive: no cancellation in the normalizer.
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-5)
  else:
    # Signed features: the normalizer is a cancelling sum, so compare relative to its output scale.
    scale = float(jnp.max(jnp.abs(outs[1])))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize('name', sorted(catalog.names()))
def test_valid_key_features_ignore_padding(name):
  """Padded keys change neither valid features nor data-dependent parameters (A, Psi), and are 0."""
  q = _points(1, (5, D), 0.5, 1.5)
  k_valid = _points(2, (4, D), 0.5, 1.5)
  k_pad = _points(3, (3, D), 50.0, 80.0)                     # garbage that would move A, Psi, the max
  k = jnp.concatenate([k_valid, k_pad])
  mask = jnp.arange(7) < 4
  proj = _proj_for(name, 16, 4)
  pq, pk = _features(name, q, k, proj, mask=mask, stabilize=False)
  pq_ref, pk_ref = _features(name, q, k_valid, proj, stabilize=False)
  np.testing.assert_allclose(pq, pq_ref, rtol=1e-6)
  np.testing.assert_allclose(pk[:4], pk_ref, rtol=1e-6)
  np.testing.assert_array_equal(pk[4:], 0.0)


@pytest.mark.parametrize('name', EXP_MAPS)
def test_single_real_key_among_huge_padded_keys(name):
  """All but one key masked, padded keys of norm 1e3: every query attends to the one real key.

  If padded keys entered the key max (e.g. ``exp(|k|^2/2)`` of trigrf) the real key would underflow to
  0 and the output would collapse to 0 instead of ``v_j``.
  """
  b, h, s = 1, 2, 5
  q = _points(1, (b, h, 4, D), 0.5, 2.0)
  k = jnp.concatenate([_points(2, (b, h, 1, D), 0.5, 2.0), _points(3, (b, h, s - 1, D), 1e3, 1e3)],
                      axis=2)
  v = _normal(4, (b, s, h, 3))
  mask = jnp.arange(s)[None, :] < 1
  proj = _gauss_proj(5, 256)
  pq, pk = _features(name, q, k, proj, mask=mask[:, None, :])
  assert bool(jnp.all(jnp.isfinite(pq))) and bool(jnp.all(jnp.isfinite(pk)))
  out = _attention(_to_blhm(pq), _to_blhm(pk), v, mask=mask)
  np.testing.assert_allclose(out, jnp.broadcast_to(v[:, :1], out.shape), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('name', sorted(catalog.names()))
def test_large_norms_finite_forward_and_backward(name):
  """Norms up to 100 (queries and keys), no padding (batch 0) and all keys but one padded (batch 1):
  no NaN/Inf in the output or in the gradients for q, k, v and W."""
  b, h, l = 2, 2, 6
  q = _points(1, (b, h, l, D), 1.0, 100.0)
  k = _points(2, (b, h, l, D), 1.0, 100.0)
  v = _normal(3, (b, l, h, 4))
  mask = jnp.stack([jnp.ones((l,), bool), jnp.arange(l) < 1])
  fn = catalog.get(name).fn
  if catalog.get(name).feature_dim is not None:        # features/maps.py: the map's own learned parameters
    matrix = helpers.example_params(name, D, jax.random.PRNGKey(4), num_features=32, map_dim=4)
    make = lambda p: p
  else:
    matrix = _normal(4, (32, D))
    make = lambda m: Projection(matrix=m) if catalog.get(name).uses_projection else None

  @jax.jit
  def loss_and_grads(q, k, v, matrix):
    def loss(q, k, v, matrix):
      proj = make(matrix)
      pq, pk = fn(q, k, proj, mask=mask[:, None, :])
      out = linear_attention(_to_blhm(pq), _to_blhm(pk), v, mask=mask)
      return jnp.sum(out ** 2), out
    return jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(q, k, v, matrix)

  (val, out), grads = loss_and_grads(q, k, v, matrix)
  assert bool(jnp.all(jnp.isfinite(out))) and math.isfinite(float(val))
  for g in jax.tree.leaves(grads):
    assert bool(jnp.all(jnp.isfinite(g))), name
  if catalog.get(name).uses_projection and matrix is not None:
    # W is learnable (FastFoodL, GMM; the maps' own parameters): it gets a gradient.
    assert all(float(jnp.max(jnp.abs(g))) > 0.0 for g in jax.tree.leaves(grads[3])), name


# ------------------------------------------------------------------------------------------
# Dtypes.
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize('name', sorted(catalog.names()))
def test_bf16_in_bf16_out(name):
  """bf16 inputs: computed in float32, returned in bf16, finite, equal to the float32 result rounded."""
  # Shapes as in test_feature_signs_and_shapes, so the float32 reference reuses its compiled function.
  q = _points(1, (2, 7, D), 0.5, 30.0).astype(jnp.bfloat16)
  k = _points(2, (2, 9, D), 0.5, 30.0).astype(jnp.bfloat16)
  proj = _proj_for(name, 16, 3)
  pq, pk = _features(name, q, k, proj)
  assert pq.dtype == jnp.bfloat16 and pk.dtype == jnp.bfloat16
  assert bool(jnp.all(jnp.isfinite(pq))) and bool(jnp.all(jnp.isfinite(pk)))
  rq, rk = _features(name, q.astype(jnp.float32), k.astype(jnp.float32), proj)
  # bf16 keeps 8 mantissa bits: relative rounding error <= 2^-8.
  np.testing.assert_allclose(pq.astype(jnp.float32), rq, rtol=2 ** -8, atol=1e-30)
  np.testing.assert_allclose(pk.astype(jnp.float32), rk, rtol=2 ** -8, atol=1e-30)


def test_statistic_is_the_one_path_switch_of_a_record():
  """``row_wise``, ``causal_shift`` and ``whole_tensor`` follow from ``statistic`` alone (positional
  maps are never formed a chunk at a time); an unknown statistic is refused when the record is made."""
  from kernelformer.features.feature_map import FeatureMap
  rec = {r.name: r for r in catalog.records()}
  assert [n for n in ('trigrf', 'posrf', 'hyperbolic') if not rec[n].causal_shift] == []
  assert rec['relu'].row_wise and rec['taylor'].row_wise and not rec['relu'].causal_shift
  assert rec['cosformer'].statistic == 'row' and not rec['cosformer'].row_wise      # positional
  assert not (rec['posrf_lra'].row_wise or rec['posrf_lra'].causal_shift or rec['posrf_lra'].whole_tensor)
  assert rec['performer_skyformer'].whole_tensor and not rec['performer_skyformer'].row_wise
  with pytest.raises(ValueError, match='statistic must be one of'):
    FeatureMap('odd', lambda q, k, p: (q, k), 'none', parts=0, statistic='rows')
