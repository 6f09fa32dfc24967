"""RPE by FFT (Luo et al. 2021, §3.2): Toeplitz products, kernelized attention with RPE, and nprf-rpe."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import registry
from kernelformer.attention import rpe
from tests.attention.helpers import fast_jit


def _naive_toeplitz(c, x, causal):
  """y_i = sum_j c[j - i + n - 1] x_j with an explicit n x n matrix, float64."""
  c, x = np.asarray(c, np.float64), np.asarray(x, np.float64)
  n = x.shape[-2]
  i, j = np.meshgrid(np.arange(n), np.arange(n), indexing='ij')
  t = c[..., j - i + n - 1]                                   # [..., n, n]
  if causal:
    t = np.where(j <= i, t, 0.0)
  return np.einsum('...ij,...jc->...ic', t, x)


@pytest.mark.parametrize('n', [1, 2, 7, 8])
def test_toeplitz_matmul_matches_naive_product(n):
  """Odd and even n, n a power of two (FFT size 2n exactly) or not, causal and not."""
  kc, kx = jax.random.split(jax.random.PRNGKey(n))
  c = jax.random.normal(kc, (3, 2 * n - 1))                    # per head, broadcast over batch
  x = jax.random.normal(kx, (2, 3, n, 4))
  toeplitz = fast_jit(rpe.toeplitz_matmul, static_argnames='causal')
  for causal in (False, True):
    y = toeplitz(c[None], x, causal=causal)
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


@functools.partial(fast_jit, static_argnames=('causal', 'feature_chunk'))
def _fast_and_reference(phi_q, phi_k, v, bias, mask, *, causal, reference_bias=None,
                        feature_chunk=None):
  """(FFT path with ``bias``, quadratic reference with ``reference_bias`` or ``bias``), one program."""
  ref_bias = bias if reference_bias is None else reference_bias
  return (rpe.rpe_linear_attention(phi_q, phi_k, v, bias, mask=mask, causal=causal,
                                   feature_chunk=feature_chunk),
          rpe.rpe_quadratic_reference(phi_q, phi_k, v, ref_bias, mask=mask, causal=causal))


@pytest.mark.parametrize('length,feature_chunk', [(1, None), (7, None), (7, 1)])
def test_rpe_linear_attention_matches_quadratic_reference(length, feature_chunk):
  """One chunk of all 5 features, and 5 chunks of one (the scan's accumulation)."""
  phi_q, phi_k, v, bias = _features(length, length=length)
  mask = jnp.arange(length)[None, :] < jnp.array([[length], [max(1, length - 2)]])
  for causal in (False, True):
    out, ref = _fast_and_reference(phi_q, phi_k, v, bias, mask, causal=causal,
                                   feature_chunk=feature_chunk)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=2e-5, atol=2e-5)


def test_rpe_linear_attention_large_biases_do_not_overflow():
  """A per-head offset of +-100 (exp overflows float32 at 88.7) changes nothing: c = exp(b - max b).

  (The FFT's round-off is relative to the largest weight, so the *spread* of exp(b) over the offsets a
  query sees must stay within float32 range; a common offset is harmless and is what this checks.)
  """
  phi_q, phi_k, v, bias = _features(3)
  shifted = bias + jnp.array([[100.0], [-100.0]])
  for causal in (False, True):
    out, ref = _fast_and_reference(phi_q, phi_k, v, shifted, None, causal=causal,
                                   reference_bias=bias)
    assert bool(jnp.all(jnp.isfinite(out)))
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=2e-5, atol=2e-5)


def test_rpe_padded_keys_drop_out_and_gradient_is_finite():
  phi_q, phi_k, v, bias = _features(5)
  mask = jnp.array([[True] * 6, [True, False, False, False, False, False]])
  attend = lambda *a: rpe.rpe_linear_attention(*a, mask=mask)
  out, grads = fast_jit(lambda *a: (attend(*a), jax.grad(lambda *b: jnp.sum(attend(*b) ** 2),
                                                         argnums=(0, 1, 2, 3))(*a)))(
                                                             phi_q, phi_k, v, bias)
  # Query rows of the second sequence see only key 0: the output is v_0 whatever the weights.
  np.testing.assert_allclose(np.asarray(out[1]), np.broadcast_to(np.asarray(v[1, 0]), out[1].shape),
                             rtol=1e-5, atol=1e-5)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)


@functools.partial(fast_jit, static_argnames=('causal', 'feature_chunk'))
def _grads_fast_and_reference(phi_q, phi_k, v, bias, mask, cot, *, causal, feature_chunk):
  """VJPs (w.r.t. phi_q, phi_k, v, bias) of the chunked FFT path and of the quadratic reference."""
  def vjp(fn):
    _, pull = jax.vjp(lambda *a: fn(*a, mask=mask, causal=causal), phi_q, phi_k, v, bias)
    return pull(cot)
  fast = functools.partial(rpe.rpe_linear_attention, feature_chunk=feature_chunk)
  return vjp(fast), vjp(rpe.rpe_quadratic_reference)


@pytest.mark.parametrize('feature_chunk', [1, 5])
def test_rpe_gradients_match_quadratic_reference(feature_chunk):
  """The custom VJP of a feature chunk (recomputed spectra, real-FFT transposes, the phase-ramped bias
  gradient) against autodiff of the O(L^2) reference: 5 chunks of 1 feature (the lax.scan
  accumulation) and 1 chunk of 5, causal and bidirectional, with a padded row."""
  length = 7
  phi_q, phi_k, v, bias = _features(21, length=length)
  cot = jax.random.normal(jax.random.PRNGKey(22), v.shape)
  mask = jnp.arange(length)[None, :] < jnp.array([[length], [4]])
  for causal in (False, True):
    fast, ref = _grads_fast_and_reference(phi_q, phi_k, v, bias, mask, cot, causal=causal,
                                          feature_chunk=feature_chunk)
    for name, a, b in zip(('phi_q', 'phi_k', 'v', 'bias'), fast, ref):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5,
                                 err_msg=f'{name}, causal={causal}')


def test_features_per_chunk_is_a_divisor_within_budget():
  # one feature's spectrum: B H (Dv + 1) (N / 2 + 1) complex64 = 2 * 65 * 16385 * 8 bytes ~ 16.3 MiB
  per_feature = 2 * 65 * (32768 // 2 + 1) * 8
  assert rpe.features_per_chunk(64, 65, 32768, 2, chunk_bytes=4 * per_feature) == 4
  assert rpe.features_per_chunk(64, 65, 32768, 2, chunk_bytes=7 * per_feature) == 4   # 7 not a divisor
  assert rpe.features_per_chunk(48, 65, 32768, 2, chunk_bytes=7 * per_feature) == 6
  assert rpe.features_per_chunk(64, 65, 32768, 2, chunk_bytes=1) == 1
  assert rpe.features_per_chunk(64, 65, 1024, 2) == 64          # 34 MB: one chunk
  assert rpe.features_per_chunk(64, 65, 2048, 2) == 32          # 68 MB > 64 MiB: two
  with pytest.raises(ValueError, match='divide'):
    phi_q, phi_k, v, bias = _features(1)
    rpe.rpe_linear_attention(phi_q, phi_k, v, bias, feature_chunk=2)


def test_rpe_memory_is_bounded_by_the_chunk():
  """XLA's temp bytes of fwd+bwd at L = 2048, M = 64, Dv = 16: with 1-feature chunks the program holds
  one feature's spectra, not all 64 (the unchunked path needs > 64 * 2 * 17 * 2049 * 8 bytes = 36 MiB
  for one spectrum alone)."""
  b, length, h, m, dv = 1, 2048, 2, 64, 16
  args = (jax.ShapeDtypeStruct((b, length, h, m), jnp.float32),) * 2 + (
      jax.ShapeDtypeStruct((b, length, h, dv), jnp.float32),
      jax.ShapeDtypeStruct((h, 2 * length - 1), jnp.float32))

  def temp_bytes(chunk):
    def fb(*a):
      out, pull = jax.vjp(functools.partial(rpe.rpe_linear_attention, feature_chunk=chunk), *a)
      return pull(out)
    return jax.jit(fb).lower(*args).compile().memory_analysis().temp_size_in_bytes

  one_spectrum = b * h * (dv + 1) * (length + 1) * 8
  assert temp_bytes(1) < 24 * one_spectrum < temp_bytes(64)


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
  # Parameters only: without the 'features' collection (its stored draw) every
  # call draws W from its own key, which is what averaging over draws needs.
  variables = {'params': variables.get('params', {})}

  @fast_jit
  def one_draw(key, scale_q=1.0, scale_k=1.0):
    out, inter = module.apply(variables, scale_q * q, scale_k * k, v, position_bias=bias,
                              rngs={'features': key}, mutable=['intermediates'])
    phi_q, phi_k = inter['intermediates']['phi_q'][0], inter['intermediates']['phi_k'][0]
    return out, rpe.rpe_quadratic_reference(phi_q, phi_k, v, bias)

  draws = []
  for seed in range(16):
    out, ref = one_draw(jax.random.PRNGKey(100 + seed))
    # The module's output is exactly the RPE-weighted linear attention of its own features.
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-4, atol=1e-5)
    draws.append(np.asarray(out, np.float64))
  draws = np.stack(draws)
  mean, se = draws.mean(0), draws.std(0, ddof=1) / np.sqrt(len(draws))
  want = _exact_normalized_softmax_rpe(q, k, v, bias)
  assert np.all(np.abs(mean - want) <= 5.0 * se + 0.02), np.max(np.abs(mean - want) - 5.0 * se)
  # q and k enter only through their directions (l2 normalization, no temperature).
  out_big, _ = one_draw(jax.random.PRNGKey(100), 7.0, 0.2)
  np.testing.assert_allclose(np.asarray(out_big), draws[0], rtol=1e-4, atol=1e-5)
