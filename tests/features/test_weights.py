"""Tests of the weight-matrix samplers: structure, the jit/vmap contract, moments and kernel estimates.

Statistical checks use fixed seeds and tolerances derived from the samples themselves: many independent
draws (keys) of one sampler give a mean and its standard error, and the check allows 5 standard errors
(plus a float32 floor). Samplers whose rows are not exactly N(0, I) (SORF, MM, SGQ) also get a bias
allowance from a Taylor remainder bound, computed from the draws (see ``_bias_bound``).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from kernelformer.features import hadamard, projection, weights

NAMES = ('iid', 'orf', 'sorf', 'qmc', 'mm', 'sgq', 'fastfood')
FLOOR = 1e-4          # float32 round-off allowance on O(1) quantities
# The shared configuration of the statistical tests: M = 256 rows in d = 12 (not a power of two, so
# SORF and FastFood pad to 16; ORF's last block is truncated), 64 independent draws, seed 7.
STATS = (256, 12, 64, 7)


def _dense(proj):
  return projection.dense_matrix(proj), projection.row_weights(proj)


@functools.lru_cache(maxsize=None)
def _jitted(name):
  return jax.jit(weights.SAMPLERS[name], static_argnums=(1, 2))


def _sample(name, key, num_features, dim):
  """One jitted draw (compiled once per shape; eager calls would compile every primitive)."""
  return _jitted(name)(key, num_features, dim)


@functools.lru_cache(maxsize=None)
def _draws(name, num_features, dim, num_draws, seed=0):
  """``num_draws`` independent draws: dense matrices ``[K, M, d]`` and row weights ``[K, M]`` (numpy).

  Cached: the moment, kernel and MSE tests share the draws of one configuration (one compilation).
  """
  sampler = weights.SAMPLERS[name]
  keys = jax.random.split(jax.random.key(seed), num_draws)
  mats, wts = jax.jit(jax.vmap(lambda k: _dense(sampler(k, num_features, dim))))(keys)
  mats, wts = np.asarray(mats, np.float64), np.asarray(wts, np.float64)
  mats.setflags(write=False)
  wts.setflags(write=False)
  return mats, wts


def _within(mean, se, target, k=5.0, floor=FLOOR, allowance=0.0):
  err = np.abs(mean - target)
  tol = k * se + floor + allowance
  assert np.all(err <= tol), f'max excess {np.max(err - tol)}; err {err}; tol {tol}'


def _double_factorial(p):
  return float(np.prod(np.arange(p, 0, -2))) if p > 0 else 1.0


# --------------------------------------------------------------------------------------------------
# Contract: shapes, jit + vmap over keys, determinism
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize('name', NAMES)
def test_contract_jit_vmap_and_keys(name):
  m, d = 24, 5
  jitted = _jitted(name)
  keys = jax.random.split(jax.random.PRNGKey(11), 3)           # raw uint32 keys work too
  batched = jax.jit(jax.vmap(lambda k: _dense(jitted(k, m, d))))
  mats, wts = (np.asarray(a) for a in batched(keys))
  assert mats.shape == (3, m, d) and wts.shape == (3, m)
  assert np.all(np.isfinite(mats))
  np.testing.assert_allclose(wts.sum(-1), 1.0, rtol=1e-5)
  # Same key, same draw, wherever the key sits in the batch and whether batched or not.
  mats_rev, wts_rev = (np.asarray(a) for a in batched(keys[::-1]))
  np.testing.assert_allclose(mats_rev[::-1], mats, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(wts_rev[::-1], wts, rtol=1e-6)
  single = jitted(keys[0], m, d)
  assert single.num_features == m and single.dim == d
  mat, wt = jax.jit(_dense)(single)
  np.testing.assert_allclose(np.asarray(mat), mats[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(wt), wts[0], rtol=1e-6)
  # Different keys, different draws.
  assert np.max(np.abs(mats[0] - mats[1])) > 1e-2
  assert np.max(np.abs(mats[1] - mats[2])) > 1e-2


def test_fastfood_never_builds_a_dense_matrix():
  proj = _sample('fastfood', jax.random.key(0), 24, 5)
  assert proj.matrix is None and proj.fastfood is not None
  assert proj.fastfood.s.shape == (3, 8)         # ceil(24 / 8) blocks of n = next_pow2(5) = 8
  assert proj.num_features == 24 and proj.dim == 5


# --------------------------------------------------------------------------------------------------
# ORF
# --------------------------------------------------------------------------------------------------


def test_orf_blocks_are_orthogonal_with_chi_norms():
  mats, _ = _draws('orf', *STATS)
  m, d = STATS[0], STATS[1]                        # 256 = 21 * 12 + 4: last block truncated
  for w in mats[:4]:
    norms = np.linalg.norm(w, axis=1)
    for start in range(0, m, d):
      block = w[start:start + d] / norms[start:start + d, None]
      np.testing.assert_allclose(block @ block.T, np.eye(len(block)), atol=1e-5)
  # Squared norms are chi^2_d (independent of the directions): mean d, variance 2d; 5 standard errors.
  sq = np.sum(mats ** 2, axis=-1).reshape(-1)
  _within(np.mean(sq), math.sqrt(2 * d / sq.size), d)
  # Their variance is 2d (norms fixed at sqrt(d) would give 0); the sample variance has standard error
  # sqrt((mu_4 - sigma^4) / N) with mu_4 = 12 d^2 + 48 d for chi^2_d.
  _within(np.var(sq), math.sqrt((8 * d * d + 48 * d) / sq.size), 2 * d, floor=0.0)


def test_haar_orthogonal_has_unbiased_entries():
  # Without the sign correction, Q[0, 0] = -|G00| / |G[:, 0]| under LAPACK's convention: always
  # negative. Haar entries have mean 0 and variance 1 / d.
  d, num = 4, 2048
  haar = jax.jit(weights.haar_orthogonal, static_argnums=(1, 2))
  q = np.asarray(haar(jax.random.key(2), num, d), np.float64)
  diag = q[:, np.arange(d), np.arange(d)]
  _within(diag.mean(0), diag.std(0) / math.sqrt(num), 0.0, floor=0.0)
  _within((q ** 2).mean(0), (q ** 2).std(0) / math.sqrt(num), 1.0 / d, floor=0.0)


def test_orf_mse_below_iid():
  # Yu et al. 2016: orthogonal blocks reduce the Gaussian-kernel estimator's MSE at equal M (here
  # d = 12, M = 256, 64 draws each; measured ratio ~ 4).
  d = STATS[1]
  deltas = _deltas(d, [1.0, 1.0, 1.0, 1.5, 1.5, 1.5], seed=5)
  exact = np.exp(-np.sum(deltas ** 2, 1) / 2)
  mse = {}
  for name in ('iid', 'orf'):
    mats, wts = _draws(name, *STATS)
    est = np.einsum('kmj,km->kj', np.cos(mats @ deltas.T), wts)
    mse[name] = np.mean((est - exact) ** 2)
  assert mse['orf'] < 0.5 * mse['iid'], mse


# --------------------------------------------------------------------------------------------------
# SORF
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize('d', [5, 8, 12, 48])
def test_sorf_fast_construction_equals_dense_product(d):
  n = hadamard.next_pow2(d)
  blocks = 2
  signs = np.random.default_rng(d).choice([-1.0, 1.0], size=(blocks, 3, n)).astype(np.float32)
  fast = np.asarray(jax.jit(weights.sorf_matrix, static_argnums=1)(jnp.asarray(signs), d), np.float64)
  h = hadamard.hadamard_matrix(n) / math.sqrt(n)                   # normalized Hadamard
  dense = [math.sqrt(n) * h @ np.diag(s[0]) @ h @ np.diag(s[1]) @ h @ np.diag(s[2]) for s in signs]
  expected = np.concatenate(dense)[:, :d]                           # zero-padded inputs: first d cols
  np.testing.assert_allclose(fast, expected, atol=1e-5)


@pytest.mark.parametrize('d', [5, 48])
def test_sorf_row_norms(d):
  n = hadamard.next_pow2(d)
  # Full-width rows (dim = n) have norm exactly sqrt(n) -- not ~n^2 as with an unnormalized H.
  full = np.asarray(_sample('sorf', jax.random.key(3), 2 * n, n).matrix)
  np.testing.assert_allclose(np.linalg.norm(full, axis=1), math.sqrt(n), rtol=1e-5)
  # Truncated to d columns: the block's columns are orthogonal with norm^2 n, so the mean squared row
  # norm over whole blocks is exactly d.
  w = np.asarray(_sample('sorf', jax.random.key(3), 2 * n, d).matrix)
  assert w.shape == (2 * n, d)
  np.testing.assert_allclose(np.mean(np.sum(w.astype(np.float64) ** 2, 1)), d, rtol=1e-5)


# --------------------------------------------------------------------------------------------------
# FastFood
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize('d, m', [(5, 20), (48, 100)])
def test_fastfood_apply_equals_dense_product(d, m):
  proj = _sample('fastfood', jax.random.key(d), m, d)
  ff = proj.fastfood
  n = hadamard.next_pow2(d)
  h = hadamard.hadamard_matrix(n)
  blocks = []
  for s, g, b, perm in zip(*(np.asarray(a, np.float64) for a in (ff.s, ff.g, ff.b, ff.perm))):
    pi = np.zeros((n, n))
    pi[np.arange(n), perm.astype(int)] = 1.0                       # (Pi y)_i = y_perm[i]
    blocks.append(np.diag(s / math.sqrt(n)) @ h @ np.diag(g) @ pi @ h @ np.diag(b))
  expected = np.concatenate(blocks)[:m, :d]
  x = np.random.default_rng(0).normal(size=(2, 3, d)).astype(np.float32)
  projected = jax.jit(projection.project)(jnp.asarray(x), proj)
  np.testing.assert_allclose(np.asarray(projected), x @ expected.T, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(np.asarray(jax.jit(projection.dense_matrix)(proj)), expected, rtol=1e-4,
                             atol=1e-4)
  # Full rows of each n x n block have norm s_i ||g|| = chi_n sample: check against s, g directly.
  full = np.concatenate(blocks)
  np.testing.assert_allclose(np.linalg.norm(full, axis=1),
                             (np.asarray(ff.s) * np.linalg.norm(np.asarray(ff.g), axis=1,
                                                                keepdims=True)).reshape(-1),
                             rtol=1e-4)


def test_fastfood_full_rows_have_chi_norms():
  # Full rows of V have norm s_i ||g|| (checked above), which must be chi_n: squared norms with mean n
  # and variance 2n. s = chi_n / sqrt(n) instead of chi_n / ||g|| keeps the mean but gives 4n + 4.
  n, m = 16, 2048
  ff = _sample('fastfood', jax.random.key(12), m, n).fastfood
  sq = (np.asarray(ff.s, np.float64) * np.linalg.norm(np.asarray(ff.g, np.float64), axis=1,
                                                      keepdims=True)).reshape(-1) ** 2
  _within(np.mean(sq), math.sqrt(2 * n / m), n)
  _within(np.var(sq), math.sqrt((8 * n * n + 48 * n) / m), 2 * n, floor=0.0)


# --------------------------------------------------------------------------------------------------
# Second moments against N(0, I)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize('name', NAMES)
def test_second_moment_is_identity(name):
  # E[sum_r c_r w_r w_r^T] = I_d and E[sum_r c_r w_r] = 0 over 64 draws x 256 rows in d = 12. For
  # i.i.d. rows the standard error of a diagonal entry is sqrt(2 / 16384) ~ 0.011: 5 sigma resolves a
  # ~6% error in the scale of W; exact samplers (MM, SGQ, SORF's full blocks) sit at the float floor.
  mats, wts = _draws(name, *STATS)
  draws, d = mats.shape[0], mats.shape[-1]
  second = np.einsum('kmi,kmj,km->kij', mats, mats, wts)
  _within(second.mean(0), second.std(0, ddof=1) / math.sqrt(draws), np.eye(d))
  first = np.einsum('kmi,km->ki', mats, wts)
  _within(first.mean(0), first.std(0, ddof=1) / math.sqrt(draws), 0.0)


def test_moment_matching_is_exact():
  mats, _ = _draws('mm', *STATS)
  m = STATS[0]
  for w in mats:
    np.testing.assert_allclose(w.mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(w.T @ w / m, np.eye(w.shape[1]), atol=1e-4)
  m, d = 9, 8                                      # M = d + 1: the worst-conditioned case
  w = np.asarray(_sample('mm', jax.random.key(m), m, d).matrix, np.float64)
  np.testing.assert_allclose(w.mean(0), 0.0, atol=1e-5)
  np.testing.assert_allclose(w.T @ w / m, np.eye(d), atol=1e-4)


def test_moment_matching_falls_back_to_orthogonal_rows_when_m_le_d():
  for m, d in [(8, 8), (5, 8)]:
    w = np.asarray(_sample('mm', jax.random.key(0), m, d).matrix, np.float64)
    u = w / np.linalg.norm(w, axis=1, keepdims=True)
    np.testing.assert_allclose(u @ u.T, np.eye(m), atol=1e-5)


def test_qmc_rows_are_shifted_sobol_points():
  m, d = 64, 6
  table = weights.sobol_points(m, d)
  assert table.shape == (m, d)
  # Rows are the points (not the transpose): 64 = 2^6 scrambled Sobol points are a (0, 6, 1)-net in
  # each coordinate, one point in each of the 64 bins [i/64, (i+1)/64).
  for j in range(d):
    assert len(np.unique(np.floor(table[:, j] * m))) == m
  key = jax.random.key(4)
  w = np.asarray(_sample('qmc', key, m, d).matrix, np.float64)
  shift = np.asarray(jax.random.uniform(key, (d,), jnp.float32), np.float64)
  gap = np.abs(special.ndtr(w) - np.mod(table + shift, 1.0))
  np.testing.assert_allclose(np.minimum(gap, 1.0 - gap), 0.0, atol=1e-5)    # distance on the torus


# --------------------------------------------------------------------------------------------------
# Sparse-grid quadrature
# --------------------------------------------------------------------------------------------------


def _gaussian_moment(alpha):
  return float(np.prod([0.0 if a % 2 else _double_factorial(a - 1) for a in alpha]))


@pytest.mark.parametrize('level', [2, 3, 4])
def test_sparse_grid_is_exact_to_its_degree(level):
  d = 3
  nodes, c = weights.sparse_grid(d, level)
  np.testing.assert_allclose(c.sum(), 1.0, atol=1e-12)
  degree = 2 * level - 1
  for alpha in np.ndindex(*(degree + 1,) * d):
    if sum(alpha) > degree:
      continue
    value = np.sum(c * np.prod(nodes ** np.asarray(alpha), axis=1))
    np.testing.assert_allclose(value, _gaussian_moment(alpha), atol=1e-9, err_msg=str(alpha))
  # Along one axis the odd-sized Gauss-Hermite rule is exact to degree 4 level - 3.
  for p in range(2 * level, 4 * level - 2):
    value = np.sum(c * nodes[:, 0] ** p)
    np.testing.assert_allclose(value, _gaussian_moment((p,)), rtol=1e-9,
                               atol=1e-12 * _double_factorial(p), err_msg=str(p))


def test_sparse_grid_level_two_is_the_third_degree_rule():
  # Spectraformer appendix A.3: the origin and +-p e_i; here p = sqrt(3) with weights 1/6 and
  # 1 - d/3 at the origin (non-degenerate: public code had only -11.6 or 0).
  d = 8
  nodes, c = weights.sparse_grid(d, 2)
  assert nodes.shape == (2 * d + 1, d)
  radii = np.linalg.norm(nodes, axis=1)
  np.testing.assert_allclose(np.sort(radii), [0.0] + [math.sqrt(3)] * (2 * d), atol=1e-12)
  np.testing.assert_allclose(c[radii < 1e-9], [1 - d / 3], atol=1e-12)
  np.testing.assert_allclose(c[radii > 1], 1 / 6, atol=1e-12)


def test_sparse_grid_level_selection():
  for m, d in [(17, 8), (160, 8), (161, 8), (300, 8), (256, 64), (64, 4)]:
    level = weights.sparse_grid_level(m, d)
    assert len(weights.sparse_grid(d, level)[1]) <= m
    # pylint: disable-next=protected-access
    assert weights._sparse_grid_size_lower_bound(d, level + 1) > m or (
        len(weights.sparse_grid(d, level + 1)[1]) > m)
  assert weights.sparse_grid_level(161, 8) == 3 and weights.sparse_grid_level(160, 8) == 2
  assert weights.sparse_grid_level(16, 8) == 2   # the 2d-point degree-3 rule fits exactly
  with pytest.raises(ValueError, match='2 \\* dim = 16'):
    weights.sparse_grid_quadrature(jax.random.key(0), 15, 8)


def test_degree3_rule_is_exact_with_positive_weights():
  # The level-2 rule SGQ uses: +-sqrt(d) e_i, weights 1/(2d) -- exact to total degree 3, all positive
  # (Smolyak's level-2 grid has a negative origin weight 1 - d/3 that makes positive features signed).
  d = 5
  nodes, c = weights.degree3_rule(d)
  assert nodes.shape == (2 * d, d) and np.all(c > 0)
  np.testing.assert_allclose(c.sum(), 1.0, atol=1e-12)
  for alpha in np.ndindex(*(4,) * d):
    if sum(alpha) > 3:
      continue
    value = np.sum(c * np.prod(nodes ** np.asarray(alpha), axis=1))
    np.testing.assert_allclose(value, _gaussian_moment(alpha), atol=1e-9, err_msg=str(alpha))
  proj = weights.sparse_grid_quadrature(jax.random.key(1), 2 * 64, 64)
  assert np.all(np.asarray(proj.feature_weights) > 0)
  np.testing.assert_allclose(np.linalg.norm(np.asarray(proj.matrix), axis=1), 8.0, rtol=1e-4)


def test_sgq_rotated_rule_stays_exact():
  # d = 3: level 3 has 31 nodes; M = 70 holds two rotated copies (weights halved) and 8 zero rows.
  m, d = 70, 3
  proj = _sample('sgq', jax.random.key(m), m, d)
  w = np.asarray(proj.matrix, np.float64)
  c = np.asarray(proj.feature_weights, np.float64)
  assert weights.sparse_grid_level(m, d) == 3
  np.testing.assert_array_equal(c[62:], 0.0)
  np.testing.assert_allclose(c[:31], c[31:62], rtol=1e-6)
  np.testing.assert_allclose(2 * c[:31], weights.sparse_grid(d, 3)[1], rtol=1e-6)
  assert np.max(np.abs(w[:31] - w[31:62])) > 1e-2            # independently rotated copies
  np.testing.assert_allclose(c.sum(), 1.0, atol=1e-6)
  np.testing.assert_allclose(np.einsum('m,mi->i', c, w), 0.0, atol=1e-5)
  np.testing.assert_allclose(np.einsum('m,mi,mj->ij', c, w, w), np.eye(d), atol=1e-4)
  # Rotation maps degree-4 polynomials to degree-4 polynomials: E[x_i^4] = 3, E[x_i^2 x_j^2] = 1.
  np.testing.assert_allclose(np.einsum('m,mi->i', c, w ** 4), 3.0, atol=1e-3)
  np.testing.assert_allclose(np.sum(c * w[:, 0] ** 2 * w[:, 1] ** 2), 1.0, atol=1e-3)
  # Non-degenerate rows: entries spread over many values, every row finite.
  assert len(np.unique(np.round(w, 4))) > 3 * d
  assert np.all(np.isfinite(w))


# --------------------------------------------------------------------------------------------------
# Gaussian-kernel estimates
# --------------------------------------------------------------------------------------------------


def _deltas(d, norms, seed):
  dirs = np.random.default_rng(seed).normal(size=(len(norms), d))
  return dirs / np.linalg.norm(dirs, axis=1, keepdims=True) * np.asarray(norms)[:, None]


def _bias_bound(name, mats, wts, deltas, dim, num_features):
  """Bound on |E estimate - exp(-|delta|^2 / 2)| for rules exact on polynomials of degree <= p.

  cos(t) minus its Taylor polynomial of degree p (odd) is at most |t|^(p+1) / (p+1)!. A rule that
  integrates degree <= p exactly under N(0, I) (SGQ per draw; SORF and MM in expectation: zero odd
  moments and E[w w^T] = I, so p = 3) then errs by at most the sum of the two remainders:
  E sum_r |c_r| |w_r.delta|^(p+1) / (p+1)! (from the draws) + p!! |delta|^(p+1) / (p+1)!.
  The Gaussian rows of iid, ORF, QMC (Cranley-Patterson) and FastFood are unbiased: bound 0.
  """
  if name in ('sorf', 'mm'):
    p = 3
  elif name == 'sgq':
    p = 2 * weights.sparse_grid_level(num_features, dim) - 1
  else:
    return 0.0
  proj_pow = np.abs(mats @ deltas.T) ** (p + 1)                      # [K, M, J]
  rule = np.einsum('kmj,km->j', proj_pow, np.abs(wts)) / len(mats)
  gauss = _double_factorial(p) * np.sum(deltas ** 2, 1) ** ((p + 1) / 2)
  return (rule + gauss) / math.factorial(p + 1)


@pytest.mark.parametrize('name', NAMES)
def test_gaussian_kernel_estimate(name):
  # E[cos(w.delta)] = exp(-|delta|^2 / 2) under N(0, I), estimated by sum_r c_r cos(w_r.delta) in each
  # of the draws; the mean over draws must be within 5 standard errors (+ the bias bound).
  config = STATS
  norms = [0.5, 1.0, 1.5]
  if name in ('sorf', 'mm'):
    norms = [0.3, 0.6]          # where the degree-3 Taylor bound on their bias is informative
  if name == 'sgq':
    config = (256, 4, 32, 8)    # level 4 in d = 4 (exact to degree 7): an informative bias bound
  m, d = config[:2]
  deltas = _deltas(d, norms, seed=len(name))
  exact = np.exp(-np.sum(deltas ** 2, 1) / 2)
  mats, wts = _draws(name, *config)
  est = np.einsum('kmj,km->kj', np.cos(mats @ deltas.T), wts)        # one estimate per draw
  allowance = _bias_bound(name, mats, wts, deltas, d, m)
  _within(est.mean(0), est.std(0, ddof=1) / math.sqrt(len(est)), exact, floor=1e-5,
          allowance=allowance)


def test_sgq_estimate_matches_its_rotation_average():
  # Averaged over Haar rotations, node x contributes E_u cos(|x| |delta| u_1) with u uniform on the
  # sphere: Gamma(d/2) (2/z)^(d/2-1) J_(d/2-1)(z). So the mean over draws must match
  # sum_j c_j f(|x_j| |delta|) exactly -- a check on the rotation and the weights, not only the table.
  m, d = STATS[:2]
  nodes, c = weights.sgq_rule(m, d)
  deltas = _deltas(d, [0.5, 1.0, 1.5], seed=9)
  z = np.linalg.norm(nodes, axis=1)[:, None] * np.linalg.norm(deltas, axis=1)[None, :]
  nu = d / 2 - 1
  safe = np.maximum(z, 1e-12)
  f = np.where(z > 1e-12, special.gamma(d / 2) * (2 / safe) ** nu * special.jv(nu, safe), 1.0)
  expected = c @ f
  mats, wts = _draws('sgq', *STATS)
  est = np.einsum('kmj,km->kj', np.cos(mats @ deltas.T), wts)
  _within(est.mean(0), est.std(0, ddof=1) / math.sqrt(len(est)), expected, floor=1e-5)
  # ... and that average is a biased estimate of the Gaussian kernel (a fixed low-degree rule).
  assert abs(expected[1] - math.exp(-0.5)) > 1e-2


@pytest.mark.parametrize('dim', [12, 64])
def test_fastfood_project_dense_equals_rowwise_transform(dim):
  """``project`` materializes FastFood's W for d <= FASTFOOD_DENSE_MAX_DIM: same values
  and same gradients wrt x and the diagonals as the row-wise structured transform."""
  from kernelformer.features import projection  # pylint: disable=g-import-not-at-top
  assert dim <= projection.FASTFOOD_DENSE_MAX_DIM
  proj = weights.SAMPLERS['fastfood'](jax.random.PRNGKey(0), 40, dim)
  x = jax.random.normal(jax.random.PRNGKey(1), (5, 3, dim))
  assert 'dot_general' in str(jax.make_jaxpr(projection.project)(x, proj))
  np.testing.assert_allclose(projection.project(x, proj), proj.fastfood.apply(x), rtol=1e-5, atol=1e-4)
  loss = lambda f: (lambda x, p: jnp.sum(jnp.sin(f(x, p))))
  dense = jax.grad(loss(projection.project), argnums=(0, 1), allow_int=True)(x, proj)
  rowwise = jax.grad(loss(lambda x, p: p.fastfood.apply(x)), argnums=(0, 1), allow_int=True)(x, proj)
  for a, b in zip(jax.tree.leaves(dense), jax.tree.leaves(rowwise)):
    if a.dtype != jax.dtypes.float0:
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
