"""Tests of the learnable spectral samplers (kernelformer/attention/learned.py).

Moment checks use tolerances derived from the samples: k standard errors of the mean, the standard error
estimated from independent replicates (rows of one FastFood block or one batch-normed generator draw are
not independent of each other, replicates are).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer.attention import learned
from kernelformer.features.projection import dense_matrix, project, row_weights

K_SIGMA = 5.0  # standard errors allowed: a false alarm over ~100 checked entries is < 1e-4

# Test-only XLA options: tiny programs that run once, so LLVM optimization time is wasted.
_FAST_COMPILE = {'xla_backend_optimization_level': 0, 'xla_llvm_disable_expensive_passes': True}


def _jit_fast(fn, *args):
  """``jax.jit(fn)(*args)``, compiled with ``_FAST_COMPILE``."""
  return jax.jit(fn).lower(*args).compile(_FAST_COMPILE)(*args)


def _second_moment_check(samples: np.ndarray, k: float = K_SIGMA):
  """``samples [R, N, d]`` (R independent replicates): E[w] = 0 and E[w w^T] = I within k SE."""
  r = samples.shape[0]
  mean_per_rep = samples.mean(axis=1)                                   # [R, d]
  outer_per_rep = np.einsum('rni,rnj->rij', samples, samples) / samples.shape[1]   # [R, d, d]
  for stat, target in ((mean_per_rep, 0.0), (outer_per_rep, np.eye(samples.shape[-1]))):
    est = stat.mean(axis=0)
    se = stat.std(axis=0, ddof=1) / np.sqrt(r)
    err = np.abs(est - target)
    assert np.all(err <= k * se + 1e-6), (np.max(err / (se + 1e-12)), est)


# ----------------------------------------------------------------------------------------------
# GMM.
# ----------------------------------------------------------------------------------------------

def test_component_split_and_row_weights():
  assert learned.component_sizes(10, 3).tolist() == [4, 3, 3]
  assert learned.component_of_row(5, 2).tolist() == [0, 0, 0, 1, 1]
  assert learned.gmm_row_weights(8, 2) is None       # even split: Monte Carlo 1/M
  w = learned.gmm_row_weights(10, 3)
  comp = learned.component_of_row(10, 3)
  # Every component carries mass exactly 1/C (equal mixture weights) and the weights sum to 1.
  np.testing.assert_allclose([w[comp == c].sum() for c in range(3)], [1 / 3] * 3, rtol=1e-12)
  with pytest.raises(ValueError):
    learned.component_sizes(2, 3)


@pytest.mark.parametrize('covariance', ['full', 'diag'])
def test_gmm_init_is_standard_normal(covariance):
  m, d, reps = 256, 5, 40
  sampler = learned.GMMSampler(num_features=m, dim=d, num_components=2, covariance=covariance)
  params = jax.jit(sampler.init)(jax.random.key(0), jax.random.key(1))
  draw = jax.vmap(lambda key: sampler.apply(params, key).matrix)
  samples = np.asarray(_jit_fast(draw, jax.random.split(jax.random.key(2), reps)))
  _second_moment_check(samples)


def test_gmm_samples_follow_learned_parameters():
  """Non-trivial mu_c and Sigma_c: each component's rows have mean mu_c and covariance Sigma_c Sigma_c^T."""
  m, d = 4000, 3
  sampler = learned.GMMSampler(num_features=m, dim=d, num_components=2, covariance='full')
  means = jnp.array([[2.0, 0.0, -1.0], [-3.0, 1.0, 0.5]])
  factors = jnp.array([[[1.0, 0, 0], [0.5, 2.0, 0], [0, 0, 0.3]],
                       [[0.2, 0, 0], [0, 1.0, 0], [1.0, 0, 1.0]]])
  params = {'params': {'means': means, 'factors': factors}}
  w = np.asarray(jax.jit(sampler.apply)(params, jax.random.key(3)).matrix)
  comp = learned.component_of_row(m, 2)
  for c in range(2):
    x = w[comp == c]
    n = len(x)
    cov = np.asarray(factors[c] @ factors[c].T)
    se_mean = np.sqrt(np.diag(cov) / n)
    assert np.all(np.abs(x.mean(0) - np.asarray(means[c])) <= K_SIGMA * se_mean)
    centered = x - np.asarray(means[c])
    prods = np.einsum('ni,nj->nij', centered, centered)
    se_cov = prods.std(0, ddof=1) / np.sqrt(n)
    assert np.all(np.abs(prods.mean(0) - cov) <= K_SIGMA * se_cov + 1e-9)


def test_gmm_diag_uses_per_coordinate_scale_and_rejects_bad_options():
  sampler = learned.GMMSampler(num_features=6, dim=2, num_components=3, covariance='diag')
  params = jax.eval_shape(sampler.init, jax.random.key(0), jax.random.key(1))
  assert params['params']['factors'].shape == (3, 2)
  zero_scale = {'params': {'means': jnp.arange(6.0).reshape(3, 2),
                           'factors': jnp.zeros((3, 2))}}
  w = jax.jit(sampler.apply)(zero_scale, jax.random.key(2)).matrix
  np.testing.assert_array_equal(np.asarray(w), np.repeat(np.arange(6.0).reshape(3, 2), 2, axis=0))
  with pytest.raises(ValueError, match='covariance'):
    learned.GMMSampler(num_features=4, dim=2, covariance='spherical').init(
        jax.random.key(0), jax.random.key(1))


def test_gmm_uneven_split_carries_row_weights():
  proj = jax.eval_shape(learned.GMMSampler(num_features=5, dim=2, num_components=2).apply,
                        {'params': {'means': jnp.zeros((2, 2)), 'factors': jnp.zeros((2, 2, 2))}},
                        jax.random.key(0))
  assert proj.feature_weights is not None and proj.feature_weights.shape == (5,)
  np.testing.assert_allclose(np.asarray(row_weights(
      learned.Projection(matrix=jnp.zeros((5, 2)),
                         feature_weights=jnp.asarray(learned.gmm_row_weights(5, 2))))),
      [1 / 6] * 3 + [1 / 4] * 2, rtol=1e-6)


# ----------------------------------------------------------------------------------------------
# FastFood.
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize('variant', ['fixed', 's', 'sgb'])
def test_fastfood_params_per_variant(variant):
  sampler = learned.FastFoodLearnable(num_features=20, dim=6, variant=variant)
  params = jax.eval_shape(sampler.init, jax.random.key(0), jax.random.key(1))
  expected = {'fixed': set(), 's': {'row_len'}, 'sgb': {'row_len', 'g', 'b'}}[variant]
  assert set(params.get('params', {})) == expected
  for leaf in jax.tree.leaves(params):
    assert leaf.shape == (3, 8)       # ceil(20 / 8) blocks of n = next_pow2(6) = 8
  proj = jax.eval_shape(sampler.apply, params, jax.random.key(2))
  assert proj.num_features == 20 and proj.dim == 6
  assert jax.eval_shape(dense_matrix, proj).shape == (20, 6)


def test_fastfood_row_norms_equal_row_lengths():
  """S = diag(row_len) / |G|_F makes every row of V have norm row_len exactly (B = +-1, d = n)."""
  sampler = learned.FastFoodLearnable(num_features=16, dim=8, variant='s')
  params = jax.jit(sampler.init)(jax.random.key(0), jax.random.key(1))
  dense = _jit_fast(lambda p, key: dense_matrix(sampler.apply(p, key)), params, jax.random.key(5))
  norms = np.linalg.norm(np.asarray(dense), axis=-1)
  np.testing.assert_allclose(norms, np.asarray(params['params']['row_len']).reshape(-1), rtol=1e-5)


def test_fastfood_projection_matches_dense_matrix():
  sampler = learned.FastFoodLearnable(num_features=12, dim=6, variant='sgb')
  x = jax.random.normal(jax.random.key(3), (4, 6))

  def both(key):
    proj = sampler.apply(sampler.init(key, key), key)
    return project(x, proj), x @ dense_matrix(proj).T

  fast, dense = _jit_fast(both, jax.random.key(0))
  np.testing.assert_allclose(np.asarray(fast), np.asarray(dense), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('variant', ['fixed', 's', 'sgb'])
def test_fastfood_init_has_standard_normal_second_moments(variant):
  """Over initializations and draws, rows of V have E[w] = 0, E[w w^T] = I (d = 6 padded to n = 8)."""
  m, d, reps = 32, 6, 300
  sampler = learned.FastFoodLearnable(num_features=m, dim=d, variant=variant)

  def one_replicate(key):
    k_init, k_draw = jax.random.split(key)
    params = sampler.init(k_init, k_draw)
    return dense_matrix(sampler.apply(params, k_draw))

  samples = np.asarray(_jit_fast(jax.vmap(one_replicate), jax.random.split(jax.random.key(7), reps)))
  _second_moment_check(samples)


def test_fastfood_rejects_unknown_variant():
  with pytest.raises(ValueError, match='variant'):
    learned.FastFoodLearnable(num_features=8, dim=4, variant='g').init(
        jax.random.key(0), jax.random.key(1))


# ----------------------------------------------------------------------------------------------
# Generator.
# ----------------------------------------------------------------------------------------------

def test_generator_architecture_and_init_moments():
  m, d = 64, 6
  sampler = learned.GenerativeSampler(num_features=m, dim=d)
  params = jax.jit(sampler.init)(jax.random.key(0), jax.random.key(1))['params']
  # 4 hidden dense layers (no bias: batch norm follows) + the output dense layer with bias.
  for i in range(4):
    assert set(params[f'dense_{i}']) == {'kernel'} and params[f'dense_{i}']['kernel'].shape == (d, d)
  assert set(params['dense_4']) == {'kernel', 'bias'}
  assert set(params) == {f'dense_{i}' for i in range(5)} | {f'norm_{i}' for i in range(5)}
  draw = jax.jit(lambda key: sampler.apply({'params': params}, key).matrix).lower(
      jax.random.key(2)).compile(_FAST_COMPILE)
  w1, w2 = np.asarray(draw(jax.random.key(2))), np.asarray(draw(jax.random.key(3)))
  assert w1.shape == (m, d)
  # Output batch norm at init: every coordinate has mean 0 and variance 1 over the M samples.
  np.testing.assert_allclose(w1.mean(0), 0.0, atol=1e-5)
  np.testing.assert_allclose(w1.var(0), 1.0, rtol=1e-3)
  assert not np.allclose(w1, w2)                      # fresh noise, fresh frequencies


def test_generator_output_scale_and_bias_are_the_final_affine():
  sampler = learned.GenerativeSampler(num_features=32, dim=4)
  params = jax.jit(sampler.init)(jax.random.key(0), jax.random.key(1))['params']
  draw = jax.jit(lambda p: sampler.apply({'params': p}, jax.random.key(2)).matrix).lower(
      params).compile(_FAST_COMPILE)
  base = np.asarray(draw(params))
  scaled = dict(params)
  scaled['norm_4'] = {'scale': jnp.full((4,), 3.0), 'bias': jnp.arange(4.0)}
  out = np.asarray(draw(scaled))
  np.testing.assert_allclose(out, 3.0 * base + np.arange(4.0), rtol=1e-5, atol=1e-5)


def test_learned_dispatch():
  assert learned.LEARNED['gmm'] is learned.GMMSampler
  assert learned.LEARNED['fastfoodl'] is learned.FastFoodLearnable
  assert learned.LEARNED['generative'] is learned.GenerativeSampler
  heads = learned.build_learned('gmm', 8, 3, num_components=2, covariance='diag',
                                parent_vmap_heads=True)
  keys = jax.random.split(jax.random.key(0), 4)
  params = jax.eval_shape(heads.init, jax.random.key(1), keys)
  assert params['params']['factors'].shape == (4, 2, 3)     # one parameter set per head
  assert jax.eval_shape(heads.apply, params, keys).matrix.shape == (4, 8, 3)
