"""RPE by FFT (Luo et al. 2021, §3.2): Toeplitz products, kernelized attention with RPE, and nprf-rpe."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import registry
from kernelformer.attention import rpe


def _naive_toeplitz(c, x, causal):
  """y_i = sum_j c[j - i + n - 1] x_j with an explicit n x n matrix, float64."""
  c, x = np.asarray(c, np.float64), np.asarray(x, np.float64)
  n = x.shape[-2]
  i, j = np.meshgrid(np.arange(n), np.arange(n), indexing='ij')
  t = c[..., j - i + n - 1]                                   # [..., n, n]
  if causal:
    t = np.where(j <= i, t, 0.0)
  return np.einsum('...ij,...jc->...ic', t, x)


@pytest.mark.parametrize('n', [1, 2, 5, 8, 13])
@pytest.mark.parametrize('causal', [False, True])
def test_toeplitz_matmul_matches_naive_product(n, causal):
  kc, kx = jax.random.split(jax.random.PRNGKey(n))
  c = jax.random.normal(kc, (3, 2 * n - 1))                    # per head, broadcast over batch
  x = jax.random.normal(kx, (2, 3, n, 4))
  y = rpe.toeplitz_matmul(c[None], x, causal=causal)
  want = _naive_toeplitz(np.asarray(c)[None], x, causal)
  # float32 FFT: error ~ eps * log(n) * sum|c||x|; the entries here are O(sqrt(n)).
  np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5 * np.sqrt(n))


def test_toeplitz_matmul_rejects_wrong_coefficient_count():
  with pytest.raises(ValueError, match='2n - 1'):
    rpe.toeplitz_matmul(jnp.ones((4,)), jnp.ones((3, 2)))


def test_relative_bias_matrix_index_convention():
  length = 4
  b = jnp.arange(2 * (2 * length - 1), dtype=jnp.float32).reshape(2, 2 * length - 1)
  m = np.asarray(rpe.relative_bias_matrix(b, length))
  for h in range(2):
    for i in range(length):
      for j in range(length):
        assert m[h, i, j] == b[h, j - i + length - 1]
  with pytest.raises(ValueError, match='position_bias'):
    rpe.relative_bias_matrix(b, length + 1)


def _features(seed, b=2, length=6, h=2, m=5, dv=3):
  ks = jax.random.split(jax.random.PRNGKey(seed), 4)
  phi_q = jnp.exp(0.5 * jax.random.normal(ks[0], (b, length, h, m)))   # positive features
  phi_k = jnp.exp(0.5 * jax.random.normal(ks[1], (b, length, h, m)))
  v = jax.random.normal(ks[2], (b, length, h, dv))
  bias = jax.random.normal(ks[3], (h, 2 * length - 1))
  return phi_q, phi_k, v, bias


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('length', [1, 6, 7])
def test_rpe_linear_attention_matches_quadratic_reference(causal, length):
  phi_q, phi_k, v, bias = _features(length, length=length)
  mask = jnp.arange(length)[None, :] < jnp.array([[length], [max(1, length - 2)]])
  out = rpe.rpe_linear_attention(phi_q, phi_k, v, bias, mask=mask, causal=causal)
  ref = rpe.rpe_quadratic_reference(phi_q, phi_k, v, bias, mask=mask, causal=causal)
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=2e-5, atol=2e-5)


def test_rpe_linear_attention_large_biases_do_not_overflow():
  """A per-head offset of +-100 (exp overflows float32 at 88.7) changes nothing: c = exp(b - max b).

  (The FFT's round-off is relative to the largest weight, so the *spread* of exp(b) over the offsets a
  query sees must stay within float32 range; a common offset is harmless and is what this checks.)
  """
  phi_q, phi_k, v, bias = _features(3)
  for causal in (False, True):
    shifted = bias + jnp.array([[100.0], [-100.0]])
    out = rpe.rpe_linear_attention(phi_q, phi_k, v, shifted, causal=causal)
    ref = rpe.rpe_quadratic_reference(phi_q, phi_k, v, bias, causal=causal)
    assert bool(jnp.all(jnp.isfinite(out)))
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=2e-5, atol=2e-5)


def test_rpe_padded_keys_drop_out_and_gradient_is_finite():
  phi_q, phi_k, v, bias = _features(5)
  mask = jnp.array([[True] * 6, [True, False, False, False, False, False]])
  out = rpe.rpe_linear_attention(phi_q, phi_k, v, bias, mask=mask)
  # Query rows of the second sequence see only key 0: the output is v_0 whatever the weights.
  np.testing.assert_allclose(np.asarray(out[1]), np.broadcast_to(np.asarray(v[1, 0]), out[1].shape),
                             rtol=1e-5, atol=1e-5)
  grads = jax.grad(lambda *a: jnp.sum(rpe.rpe_linear_attention(*a, mask=mask) ** 2),
                   argnums=(0, 1, 2, 3))(phi_q, phi_k, v, bias)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)


# ------------------------------------------------------------------------------------------------
# nprf-rpe: Luo et al.'s normalized PRF with RPE, end to end through the registry.
# ------------------------------------------------------------------------------------------------

def test_nprf_rpe_spec():
  spec = registry.get('luo-rpe')
  assert spec.name == 'nprf-rpe' and registry.get('nprf') is spec
  assert spec.supports_position_bias and spec.requires_position_bias
  assert spec.fixed == {'component': 'posrf', 'weights': 'iid', 'normalize_qk': True}


def _nprf_inputs(length=6, h=2, d=4):
  ks = jax.random.split(jax.random.PRNGKey(11), 4)
  q, k, v = (jax.random.normal(kk, (1, length, h, d)) for kk in ks[:3])
  bias = 1.5 * jax.random.normal(ks[3], (h, 2 * length - 1))
  return q, k, v, bias


def _exact_normalized_softmax_rpe(q, k, v, bias):
  """softmax(q^.k^ + b_{j-i}) V with l2-normalized q, k and no temperature (Luo et al. §3.3), float64."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  qn = q / np.linalg.norm(q, axis=-1, keepdims=True)
  kn = k / np.linalg.norm(k, axis=-1, keepdims=True)
  logits = np.einsum('blhd,bshd->bhls', qn, kn) + np.asarray(
      rpe.relative_bias_matrix(bias, q.shape[1]), np.float64)[None]
  w = np.exp(logits - logits.max(-1, keepdims=True))
  return np.einsum('bhls,bshd->blhd', w / w.sum(-1, keepdims=True), v)


def test_nprf_rpe_end_to_end_estimates_normalized_softmax_with_rpe():
  """Independent feature draws average to the exact normalized-softmax-with-RPE output.

  Tolerance: 5 standard errors of the mean over the draws, estimated from the draws themselves, plus
  the O(1/M) bias of a ratio estimator (bounded generously by 0.02 at M = 256).
  """
  q, k, v, bias = _nprf_inputs()
  module = registry.build({'kind': 'nprf-rpe', 'num_features': 256})
  variables = module.init({'params': jax.random.PRNGKey(0), 'features': jax.random.PRNGKey(0)},
                          q, k, v, position_bias=bias)

  @jax.jit
  def one_draw(key):
    out, inter = module.apply(variables, q, k, v, position_bias=bias, rngs={'features': key},
                              mutable=['intermediates'])
    return out, inter['intermediates']['phi_q'][0], inter['intermediates']['phi_k'][0]

  draws = []
  for seed in range(16):
    out, phi_q, phi_k = one_draw(jax.random.PRNGKey(100 + seed))
    if seed == 0:
      # The module's output is exactly the RPE-weighted linear attention of its own features.
      ref = rpe.rpe_quadratic_reference(phi_q, phi_k, v, bias)
      np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-4, atol=1e-5)
    draws.append(np.asarray(out, np.float64))
  draws = np.stack(draws)
  mean, se = draws.mean(0), draws.std(0, ddof=1) / np.sqrt(len(draws))
  want = _exact_normalized_softmax_rpe(q, k, v, bias)
  assert np.all(np.abs(mean - want) <= 5.0 * se + 0.02), np.max(np.abs(mean - want) - 5.0 * se)
  # q and k enter only through their directions (l2 normalization, no temperature).
  out_scaled, _, _ = one_draw(jax.random.PRNGKey(100))
  out_big = module.apply(variables, 7.0 * q, 0.2 * k, v, position_bias=bias,
                         rngs={'features': jax.random.PRNGKey(100)})
  np.testing.assert_allclose(np.asarray(out_big), np.asarray(out_scaled), rtol=1e-4, atol=1e-5)
