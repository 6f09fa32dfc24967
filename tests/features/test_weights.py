"""Tests of the weight-matrix samplers: structure, the jit/vmap contract, moments and kernel estimates.

Statistical checks use fixed seeds and tolerances derived from the samples themselves: many independent
draws (keys) of one sampler give a mean and its standard error, and the check allows 5 standard errors
(plus a float32 floor). Samplers whose rows are not exactly N(0, I) (SORF, MM, SGQ) also get a bias
allowance from a Taylor remainder bound, computed from the draws (see ``_bias_bound``).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from kernelformer.features import hadamard, projection, weights

NAMES = ('iid', 'orf', 'sorf', 'qmc', 'mm', 'sgq', 'fastfood')
FLOOR = 1e-4          # float32 round-off allowance on O(1) quantities


def _dense(proj):
  return projection.dense_matrix(proj), projection.row_weights(proj)


def _draws(name, num_features, dim, num_draws, seed=0):
  """``num_draws`` independent draws: dense matrices ``[K, M, d]`` and row weights ``[K, M]`` (numpy)."""
  sampler = weights.SAMPLERS[name]
  keys = jax.random.split(jax.random.key(seed), num_draws)
  mats, wts = jax.jit(jax.vmap(lambda k: _dense(sampler(k, num_features, dim))))(keys)
  return np.asarray(mats, np.float64), np.asarray(wts, np.float64)


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
  sampler = weights.SAMPLERS[name]
  jitted = jax.jit(sampler, static_argnums=(1, 2))
  keys = jax.random.split(jax.random.PRNGKey(11), 3)           # raw uint32 keys work too
  batched = jax.vmap(lambda k: jitted(k, m, d))(keys)
  mats, wts = jax.vmap(_dense)(batched)
  assert mats.shape == (3, m, d) and wts.shape == (3, m)
  assert np.all(np.isfinite(np.asarray(mats)))
  np.testing.assert_allclose(np.asarray(jnp.sum(wts, -1)), 1.0, rtol=1e-5)
  for i in range(3):
    single = jitted(keys[i], m, d)
    assert single.num_features == m and single.dim == d
    mat, wt = _dense(single)
    np.testing.assert_allclose(np.asarray(mat), np.asarray(mats[i]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(wt), np.asarray(wts[i]), rtol=1e-6)
    again, _ = _dense(jitted(keys[i], m, d))
    np.testing.assert_array_equal(np.asarray(again), np.asarray(mat))
  # Different keys, different draws (every entry of the difference being ~0 would be a failure).
  assert np.max(np.abs(np.asarray(mats[0] - mats[1]))) > 1e-2
  assert np.max(np.abs(np.asarray(mats[1] - mats[2]))) > 1e-2


def test_fastfood_never_builds_a_dense_matrix():
  proj = weights.fastfood(jax.random.key(0), 40, 12)
  assert proj.matrix is None and proj.fastfood is not None
  assert proj.fastfood.s.shape == (3, 16)        # ceil(40 / 16) blocks of n = next_pow2(12) = 16
  assert proj.num_features == 40 and proj.dim == 12


def test_unknown_sampler_name_is_loud():
  with pytest.raises(ValueError, match="Did you mean 'sorf'"):
    weights.get_sampler('sorff')
  assert weights.get_sampler('ORF') is weights.orthogonal


# --------------------------------------------------------------------------------------------------
# ORF
# --------------------------------------------------------------------------------------------------


def test_orf_blocks_are_orthogonal_with_chi_norms():
  d, m = 8, 8 * 64 + 5                             # last block truncated to 5 rows
  w = np.asarray(weights.orthogonal(jax.random.key(1), m, d).matrix, np.float64)
  norms = np.linalg.norm(w, axis=1)
  for start in range(0, m, d):
    block = w[start:start + d] / norms[start:start + d, None]
    np.testing.assert_allclose(block @ block.T, np.eye(len(block)), atol=1e-5)
  # Squared norms are chi^2_d: mean d, variance 2d; 5 standard errors.
  _within(np.mean(norms ** 2), math.sqrt(2 * d / m), d)


def test_haar_orthogonal_has_unbiased_entries():
  # Without the sign correction, Q[0, 0] = -|G00| / |G[:, 0]| under LAPACK's convention: always
  # negative. Haar entries have mean 0 and variance 1 / d.
  d, num = 4, 2048
  q = np.asarray(weights.haar_orthogonal(jax.random.key(2), num, d), np.float64)
  diag = q[:, np.arange(d), np.arange(d)]
  _within(diag.mean(0), diag.std(0) / math.sqrt(num), 0.0, floor=0.0)
  _within((q ** 2).mean(0), (q ** 2).std(0) / math.sqrt(num), 1.0 / d, floor=0.0)


def test_orf_mse_below_iid():
  # Yu et al. 2016: orthogonal blocks reduce the Gaussian-kernel estimator's MSE at equal M.
  d, m, draws = 16, 32, 20
  rng = np.random.default_rng(5)
  dirs = rng.normal(size=(6, d))
  deltas = dirs / np.linalg.norm(dirs, axis=1, keepdims=True) * np.repeat([1.0, 1.5], 3)[:, None]
  exact = np.exp(-np.sum(deltas ** 2, 1) / 2)
  mse = {}
  for name in ('iid', 'orf'):
    mats, wts = _draws(name, m, d, draws, seed=6)
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
  signs = np.asarray(jax.random.rademacher(jax.random.key(d), (blocks, 3, n), dtype=jnp.float32))
  fast = np.asarray(weights.sorf_matrix(jnp.asarray(signs), d), np.float64)
  h = hadamard.hadamard_matrix(n) / math.sqrt(n)                   # normalized Hadamard
  dense = [math.sqrt(n) * h @ np.diag(s[0]) @ h @ np.diag(s[1]) @ h @ np.diag(s[2]) for s in signs]
  expected = np.concatenate(dense)[:, :d]                           # zero-padded inputs: first d cols
  np.testing.assert_allclose(fast, expected, atol=1e-5)


@pytest.mark.parametrize('d', [5, 12, 48])
def test_sorf_row_norms(d):
  n = hadamard.next_pow2(d)
  # Full-width rows (dim = n) have norm exactly sqrt(n) -- not ~n^2 as with an unnormalized H.
  full = np.asarray(weights.structured_orthogonal(jax.random.key(3), 2 * n, n).matrix)
  np.testing.assert_allclose(np.linalg.norm(full, axis=1), math.sqrt(n), rtol=1e-5)
  # Truncated to d columns: the block's columns are orthogonal with norm^2 n, so the mean squared row
  # norm over whole blocks is exactly d.
  w = np.asarray(weights.structured_orthogonal(jax.random.key(3), 2 * n, d).matrix)
  assert w.shape == (2 * n, d)
  np.testing.assert_allclose(np.mean(np.sum(w.astype(np.float64) ** 2, 1)), d, rtol=1e-5)


# --------------------------------------------------------------------------------------------------
# FastFood
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize('d, m', [(5, 20), (12, 40), (48, 100)])
def test_fastfood_apply_equals_dense_product(d, m):
  proj = weights.fastfood(jax.random.key(d), m, d)
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
  np.testing.assert_allclose(np.asarray(projection.project(jnp.asarray(x), proj)), x @ expected.T,
                             rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(np.asarray(projection.dense_matrix(proj)), expected, rtol=1e-4,
                             atol=1e-4)
  # Full rows of each n x n block have norm s_i ||g|| = chi_n sample: check against s, g directly.
  full = np.concatenate(blocks)
  np.testing.assert_allclose(np.linalg.norm(full, axis=1),
                             (np.asarray(ff.s) * np.linalg.norm(np.asarray(ff.g), axis=1,
                                                                keepdims=True)).reshape(-1),
                             rtol=1e-4)


# --------------------------------------------------------------------------------------------------
# Second moments against N(0, I)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize('name', NAMES)
def test_second_moment_is_identity(name):
  # E[sum_r c_r w_r w_r^T] = I_d; 32 draws x 1024 rows, d = 8. For i.i.d. rows the standard error of a
  # diagonal entry is sqrt(2 / 32768) ~ 0.008, so 5 sigma resolves a 4% error in the scale of W.
  d, m, draws = 8, 1024, 32
  mats, wts = _draws(name, m, d, draws, seed=7)
  second = np.einsum('kmi,kmj,km->kij', mats, mats, wts)
  _within(second.mean(0), second.std(0, ddof=1) / math.sqrt(draws), np.eye(d))
  first = np.einsum('kmi,km->ki', mats, wts)
  _within(first.mean(0), first.std(0, ddof=1) / math.sqrt(draws), 0.0)


def test_moment_matching_is_exact():
  for m, d in [(64, 8), (9, 8), (200, 16)]:            # M = d + 1: the worst-conditioned case
    w = np.asarray(weights.moment_matched(jax.random.key(m), m, d).matrix, np.float64)
    np.testing.assert_allclose(w.mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(w.T @ w / m, np.eye(d), atol=1e-4)


def test_moment_matching_falls_back_to_orthogonal_rows_when_m_le_d():
  for m, d in [(8, 8), (5, 8)]:
    w = np.asarray(weights.moment_matched(jax.random.key(0), m, d).matrix, np.float64)
    u = w / np.linalg.norm(w, axis=1, keepdims=True)
    np.testing.assert_allclose(u @ u.T, np.eye(m), atol=1e-5)


def test_qmc_rows_are_shifted_sobol_points():
  m, d = 64, 6
  key = jax.random.key(4)
  w = np.asarray(weights.quasi_monte_carlo(key, m, d).matrix, np.float64)
  shift = np.asarray(jax.random.uniform(key, (d,), jnp.float32), np.float64)
  u = special.ndtr(w)
  np.testing.assert_allclose(u, np.mod(weights.sobol_points(m, d) + shift, 1.0), atol=1e-5)
  # Rows are the points (not the transpose): each coordinate of 64 Sobol points hits every one of 64
  # equal bins exactly once before the shift, and a shift mod 1 keeps 63 or 64 of them distinct.
  for j in range(d):
    assert len(np.unique(np.floor(u[:, j] * m))) >= m - 1


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
    np.testing.assert_allclose(value, _gaussian_moment((p,)), rtol=1e-9, err_msg=str(p))


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
    assert weights._sparse_grid_size_lower_bound(d, level + 1) > m or (  # pylint: disable=protected-access
        len(weights.sparse_grid(d, level + 1)[1]) > m)
  assert weights.sparse_grid_level(161, 8) == 3 and weights.sparse_grid_level(160, 8) == 2
  with pytest.raises(ValueError, match='2 \\* dim \\+ 1'):
    weights.sparse_grid_quadrature(jax.random.key(0), 16, 8)


@pytest.mark.parametrize('m', [40, 62])
def test_sgq_rotated_rule_stays_exact(m):
  # d = 3: level 3 has 31 nodes; M = 40 is one copy and 9 zero-weight rows, M = 62 two rotated copies.
  d = 3
  proj = weights.sparse_grid_quadrature(jax.random.key(m), m, d)
  w = np.asarray(proj.matrix, np.float64)
  c = np.asarray(proj.feature_weights, np.float64)
  assert weights.sparse_grid_level(m, d) == 3
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


@pytest.mark.parametrize('name, d, m', [('iid', 8, 64), ('orf', 8, 64), ('sorf', 8, 64),
                                        ('qmc', 8, 64), ('mm', 8, 64), ('sgq', 4, 256),
                                        ('fastfood', 12, 64)])
def test_gaussian_kernel_estimate(name, d, m):
  draws = 32
  norms = [0.5, 1.0] if name != 'sgq' else [0.5, 1.0, 1.5]
  if name in ('sorf', 'mm'):
    norms = [0.3, 0.6]          # where the degree-3 Taylor bound on their bias is informative
  deltas = _deltas(d, norms, seed=len(name))
  exact = np.exp(-np.sum(deltas ** 2, 1) / 2)
  mats, wts = _draws(name, m, d, draws, seed=8)
  est = np.einsum('kmj,km->kj', np.cos(mats @ deltas.T), wts)        # one estimate per draw
  allowance = _bias_bound(name, mats, wts, deltas, d, m)
  _within(est.mean(0), est.std(0, ddof=1) / math.sqrt(draws), exact, floor=1e-5,
          allowance=allowance)


def test_sgq_estimate_matches_its_rotation_average():
  # Averaged over Haar rotations, node x contributes E_u cos(|x| |delta| u_1) with u uniform on the
  # sphere: Gamma(d/2) (2/z)^(d/2-1) J_(d/2-1)(z). So the mean over draws must match
  # sum_j c_j f(|x_j| |delta|) exactly -- a check on the rotation and the weights, not only the table.
  d, m, draws = 8, 64, 32
  nodes, c = weights.sparse_grid(d, weights.sparse_grid_level(m, d))
  deltas = _deltas(d, [0.5, 1.0, 1.5], seed=9)
  z = np.linalg.norm(nodes, axis=1)[:, None] * np.linalg.norm(deltas, axis=1)[None, :]
  nu = d / 2 - 1
  safe = np.maximum(z, 1e-12)
  f = np.where(z > 1e-12, special.gamma(d / 2) * (2 / safe) ** nu * special.jv(nu, safe), 1.0)
  expected = c @ f
  mats, wts = _draws('sgq', m, d, draws, seed=10)
  est = np.einsum('kmj,km->kj', np.cos(mats @ deltas.T), wts)
  _within(est.mean(0), est.std(0, ddof=1) / math.sqrt(draws), expected, floor=1e-5)
  # ... and that average is a biased estimate of the Gaussian kernel (a fixed low-degree rule).
  assert abs(expected[1] - math.exp(-0.5)) > 1e-2
