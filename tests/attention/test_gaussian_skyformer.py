"""Exact Gaussian-kernel attention (Skyformer eq. 3) and its Nyström approximation (eqs. 4-6)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import registry
from kernelformer.attention import gaussian, skyformer
from tests.attention.helpers import fast_jit


def _naive_kernelized(q, k, v, mask=None, causal=False):
  """C V with C_ij = exp(-|q_i - k_j|^2 / (2 sqrt(p))) by explicit differences, float64, unnormalized."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  p = q.shape[-1]
  diff = q[:, :, None, :, :] - k[:, None, :, :, :]                 # [B, L, S, H, p]
  c = np.exp(-np.sum(diff ** 2, -1) / (2.0 * np.sqrt(p)))         # [B, L, S, H]
  if mask is not None:
    c = c * np.asarray(mask)[:, None, :, None]
  if causal:
    c = c * np.tril(np.ones(c.shape[1:3]))[None, :, :, None]
  return np.einsum('blsh,bshd->blhd', c, v)


def _qkv(seed, b=2, length=6, h=2, p=8, scale=0.7):
  ks = jax.random.split(jax.random.PRNGKey(seed), 3)
  return tuple(scale * jax.random.normal(kk, (b, length, h, p)) for kk in ks)


@pytest.mark.parametrize('p', [4, 16])
def test_gaussian_attention_matches_naive(p):
  """The input scale follows the head dimension p (a constant 32^-1/4 would fail for p = 4 and 16)."""
  q, k, v = _qkv(p, p=p)
  mask = jnp.array([[True] * 6, [True, True, True, False, False, False]])
  attend = fast_jit(gaussian.gaussian_attention, static_argnames='causal')
  for causal in (False, True):
    out = attend(q, k, v, mask=mask, causal=causal)
    np.testing.assert_allclose(np.asarray(out), _naive_kernelized(q, k, v, mask, causal),
                               rtol=1e-5, atol=1e-6)


def test_gaussian_attention_is_not_row_normalized():
  """Skyformer eq. 3 is C V itself: with every key equal to the query, C = 1 and the output is sum v_j."""
  q = jnp.ones((1, 5, 1, 4))
  v = jax.random.normal(jax.random.PRNGKey(0), (1, 5, 1, 3))
  out = gaussian.gaussian_attention(q, q, v)
  np.testing.assert_allclose(np.asarray(out[0, :, 0]),
                             np.broadcast_to(np.asarray(v[0, :, 0].sum(0)), (5, 3)), rtol=1e-6)


def test_gaussian_registry_names():
  assert registry.get('kernelized').name == 'gaussian'
  assert registry.get('kernelized-attention').name == 'gaussian'
  module = registry.build({'kind': 'gaussian'})
  q, k, v = _qkv(1)
  out = fast_jit(module.apply)({}, q, k, v)
  np.testing.assert_allclose(np.asarray(out), _naive_kernelized(q, k, v), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# Skyformer.
# ------------------------------------------------------------------------------------------------

def _low_rank_qk(seed, length, p=8, rank=3, scale=1.2):
  """q, k on a rank-3 subspace: an empirical Gaussian kernel matrix with fast eigenvalue decay."""
  ks = jax.random.split(jax.random.PRNGKey(seed), 3)
  basis = jax.random.normal(ks[0], (rank, p)) / np.sqrt(rank)
  q = scale * jax.random.normal(ks[1], (1, length, 1, rank)) @ basis
  k = scale * jax.random.normal(ks[2], (1, length, 1, rank)) @ basis
  return q, k


def _spectral(a):
  return float(np.linalg.norm(np.asarray(a, np.float64), 2))


def test_skyformer_with_every_row_as_landmark_matches_exact():
  """d = 2n: C_tilde = (I, 0) C_bar (C_bar + gamma I)^-1 C_bar (0, I)^T, within gamma of C (spectral)."""
  length, gamma = 16, 1e-3
  q, k = _low_rank_qk(0, length)
  exact, approx = fast_jit(lambda q, k: (
      gaussian.gaussian_scores(q, k)[0, 0],
      skyformer.skyformer_matrix(q, k, key=None, mask=None, num_landmarks=2 * length, gamma=gamma,
                                 num_iterations=None)[0, 0]))(q, k)
  # Theory: the eigenvalues of C_bar - C_bar (C_bar + gamma)^-1 C_bar are gamma l / (l + gamma) < gamma.
  err = _spectral(approx - exact)
  assert err <= gamma + 1e-4 * _spectral(exact), (err, _spectral(exact))


def test_skyformer_error_decreases_with_landmarks():
  """Spectral error of C_tilde against C, averaged over 3 landmark draws, falls as d grows (Figure 1)."""
  length = 32
  q, k = _low_rank_qk(1, length)
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  sizes = (2, 4, 8, 16, 64)

  @fast_jit
  def matrices(q, k, keys):
    exact = gaussian.gaussian_scores(q, k)[0, 0]
    return exact, [jax.vmap(lambda kk, d=d: skyformer.skyformer_matrix(
        q, k, key=kk, mask=None, num_landmarks=d, gamma=1e-3, num_iterations=None)[0, 0])(keys)
                   for d in sizes]

  exact, approx = matrices(q, k, keys)
  exact = np.asarray(exact)
  norm = _spectral(exact)
  errors = [float(np.mean([_spectral(np.asarray(m) - exact) / norm for m in mats]))
            for mats in approx]
  assert all(a > b for a, b in zip(errors, errors[1:])), errors
  assert errors[-1] < 1e-3, errors


def test_skyformer_output_matches_its_matrix_and_padding_equals_truncation():
  """C_tilde V computed right-to-left equals the dense C_tilde times V; padding = shorter sequence."""
  q, k, v = _qkv(3, b=1, length=8)
  mask = jnp.array([[True] * 5 + [False] * 3])
  kwargs = dict(key=None, num_landmarks=16, gamma=0.1, num_iterations=None)

  @fast_jit
  def compute(q, k, v):
    out = skyformer.skyformer_attention(q, k, v, mask=mask, **kwargs)
    mat = skyformer.skyformer_matrix(q, k, mask=mask, **kwargs)
    short = skyformer.skyformer_attention(q[:, :5], k[:, :5], v[:, :5], mask=None, **kwargs)
    return out, jnp.einsum('bhls,bshd->blhd', mat, v), short

  out, dense, short = compute(q, k, v)
  np.testing.assert_allclose(np.asarray(out), np.asarray(dense), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(out[:, :5]), np.asarray(short), rtol=1e-5, atol=1e-6)


def test_newton_schulz_converges_per_matrix():
  """Default iterations reach a float32-level residual; the start scale is per matrix (a 100x smaller
  matrix in the same batch converges too, which a batch-wide start scale would prevent)."""
  length = 64
  q, k = _low_rank_qk(2, length, scale=0.5)          # clustered: an ill-conditioned landmark matrix
  x = jnp.concatenate([q[0, :, 0], k[0, :, 0]]) * gaussian.input_scale(8)
  m = gaussian.gaussian_kernel_matrix(x, x)[:128:2, :128:2]            # 64 landmarks
  gamma = 0.1
  w = m + gamma * jnp.eye(64)
  dm = jnp.sum(w, -1)
  y = w / jnp.sqrt(dm[:, None] * dm[None, :])
  ys = jnp.stack([y, 0.01 * y])
  iters = skyformer.default_iterations(64, gamma)
  residual = fast_jit(lambda ys: jnp.max(jnp.abs(
      jnp.eye(64) - ys @ skyformer.newton_schulz_inverse(ys, iters)), axis=(-2, -1)))(ys)
  assert float(residual[0]) < 1e-3 and float(residual[1]) < 1e-3, residual
  assert skyformer.default_iterations(128, 0.1) == 15


def test_sample_landmarks_uniform_without_replacement_among_valid():
  valid = jnp.array([True] * 10 + [False] * 6)
  keys = jax.random.split(jax.random.PRNGKey(0), 2000)
  idx, ok = fast_jit(jax.vmap(lambda kk: skyformer.sample_landmarks(kk, valid, 3)))(keys)
  idx = np.asarray(idx)
  assert np.all(np.asarray(ok)) and np.all(idx < 10)
  assert all(len(set(row)) == 3 for row in idx)                      # without replacement
  # Each valid row is included with probability 3/10; 5 binomial standard errors.
  freq = np.bincount(idx.ravel(), minlength=10)[:10] / len(keys)
  se = np.sqrt(0.3 * 0.7 / len(keys))
  assert np.all(np.abs(freq - 0.3) < 5 * se), freq
  # Fewer valid rows than landmarks: every valid row is drawn, the surplus is flagged invalid.
  idx2, ok2 = skyformer.sample_landmarks(jax.random.PRNGKey(1), valid, 12)
  assert set(np.asarray(idx2)[np.asarray(ok2)]) == set(range(10)) and int(ok2.sum()) == 10


def test_skyformer_module_randomness_edge_cases_and_errors():
  module = registry.build({'kind': 'skyformer', 'num_landmarks': 4, 'redraw_every': 10})
  q, k, v = _qkv(4, length=7)
  mask = jnp.array([[True] * 7, [True] + [False] * 6])
  rngs = {'features': jax.random.PRNGKey(5)}

  def run(q, k, v, mask, step):
    return module.apply({}, q, k, v, mask=mask, step=step, rngs=rngs)

  @fast_jit
  def everything(q, k, v):
    outs = [run(q, k, v, mask, s) for s in (None, None, jnp.int32(3), jnp.int32(7), jnp.int32(12))]
    grads = jax.grad(lambda q, k, v: jnp.sum(run(q, k, v, mask, None) ** 2),
                     argnums=(0, 1, 2))(q, k, v)
    return outs, grads, run(q[:, :1], k[:, :1], v[:, :1], None, None)

  (eval_a, eval_b, s3, s7, s12), grads, one = everything(q, k, v)
  np.testing.assert_array_equal(np.asarray(eval_a), np.asarray(eval_b))       # fixed draw
  np.testing.assert_array_equal(np.asarray(s3), np.asarray(s7))               # same window
  assert not np.allclose(np.asarray(s7), np.asarray(s12))                      # redrawn
  # The second sequence has a single valid token; everything stays finite, gradients too.
  assert np.all(np.isfinite(np.asarray(s3)))
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
  # Length 1: both rows are landmarks (exact Nyström of the 2x2 C_bar), so |C_tilde - C| <= gamma.
  err = np.abs(np.asarray(one) - _naive_kernelized(q[:, :1], k[:, :1], v[:, :1]))
  assert np.all(err <= module.gamma * np.abs(np.asarray(v[:, :1])) + 1e-6)
  with pytest.raises(ValueError, match='causal'):
    module.apply({}, q, k, v, causal=True, rngs=rngs)
  with pytest.raises(ValueError, match='position_bias'):
    module.apply({}, q, k, v, position_bias=jnp.zeros((2, 13)), rngs=rngs)
