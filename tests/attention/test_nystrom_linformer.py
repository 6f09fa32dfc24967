"""Nyströmformer (segment means + iterative pseudo-inverse) and Linformer (learned length projections)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import registry
from kernelformer.attention import linformer, nystrom
from tests.attention.helpers import fast_jit


def _softmax_ref(q, k, v, mask=None):
  """softmax(q k^T / sqrt(d)) v over valid keys, float64."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  logits = np.einsum('blhd,bshd->bhls', q, k) / np.sqrt(q.shape[-1])
  if mask is not None:
    logits = np.where(np.asarray(mask)[:, None, None, :], logits, -np.inf)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  return np.einsum('bhls,bshd->blhd', w / w.sum(-1, keepdims=True), v)


def _qkv(seed, b=2, length=6, h=2, d=4, scale=0.5):
  ks = jax.random.split(jax.random.PRNGKey(seed), 3)
  return tuple(scale * jax.random.normal(kk, (b, length, h, d)) for kk in ks)


def test_iterative_pinv_matches_pinv_with_per_matrix_start():
  """A row-stochastic, well-conditioned A: 6 iterations reach the inverse. The batch also holds 100 A,
  which a batch-wide start scale would leave 100x too small for the first matrix."""
  logits = jax.random.normal(jax.random.PRNGKey(0), (5, 5)) + 3.0 * jnp.eye(5)
  a = jax.nn.softmax(logits, axis=-1)
  batch = jnp.stack([a, 100.0 * a])
  z = fast_jit(nystrom.iterative_pinv, static_argnames='num_iterations')(batch, num_iterations=6)
  np.testing.assert_allclose(np.asarray(z[0]), np.linalg.pinv(np.asarray(a, np.float64)), atol=1e-4)
  np.testing.assert_allclose(np.asarray(z[1]), np.linalg.pinv(np.asarray(a, np.float64)) / 100.0,
                             atol=1e-6)


def test_segment_layout_and_masked_means():
  assert nystrom.segment_layout(7, 3) == (3, 3)          # segments of 3: [0-2] [3-5] [6]
  assert nystrom.segment_layout(9, 4) == (3, 3)          # no all-padding segment
  assert nystrom.segment_layout(1, 64) == (1, 1)
  x = jnp.arange(7, dtype=jnp.float32).reshape(1, 7, 1, 1)
  mask = jnp.array([[True, True, False, True, True, False, False]])
  means, valid = fast_jit(nystrom.segment_means, static_argnames='num_landmarks')(
      x, mask, num_landmarks=3)
  np.testing.assert_allclose(np.asarray(means[0, :, 0, 0]), [0.5, 3.5, 0.0])
  np.testing.assert_array_equal(np.asarray(valid[0]), [True, True, False])


def test_nystrom_with_a_landmark_per_token_is_softmax():
  """L <= m: every token is its own landmark, F = A = B and F A^+ B V = softmax attention.

  k = q with norms ~3 makes A diagonally dominant (well conditioned), so the iteration converges fully.
  """
  q, _, v = _qkv(1, scale=1.5)
  k = q
  mask = jnp.array([[True] * 6, [True, True, True, True, False, False]])
  out = fast_jit(nystrom.nystrom_attention, static_argnames=('num_landmarks', 'num_iterations'))(
      q, k, v, mask=mask, num_landmarks=8, num_iterations=12)
  want = _softmax_ref(q, k, v, mask)
  valid = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(out)[valid], want[valid], rtol=1e-4, atol=1e-4)


def test_nystrom_approximates_softmax_on_odd_lengths():
  """m = 4 landmarks over L = 13 (segments of 4, the last one short): close to softmax on smooth inputs,
  and the module matches the pure function."""
  q, k, v = _qkv(2, b=1, length=13, scale=0.3)
  module = registry.build({'kind': 'nystrom', 'num_landmarks': 4})
  out, via_module = fast_jit(lambda q, k, v: (nystrom.nystrom_attention(q, k, v, num_landmarks=4),
                                              module.apply({}, q, k, v)))(q, k, v)
  err = np.abs(np.asarray(out) - _softmax_ref(q, k, v)).max()
  # Weights are nearly uniform at this scale; a mean-field error of a few percent of |v| is expected.
  assert err < 0.05 * float(jnp.abs(v).max()), err
  np.testing.assert_allclose(np.asarray(via_module), np.asarray(out), rtol=1e-6)
  with pytest.raises(ValueError, match='causal'):
    module.apply({}, q, k, v, causal=True)


# ------------------------------------------------------------------------------------------------
# Linformer.
# ------------------------------------------------------------------------------------------------

def test_linformer_with_identity_projections_is_softmax():
  q, k, v = _qkv(3)
  eye = jnp.eye(6)
  mask = jnp.array([[True] * 6, [True, True, False, False, False, False]])
  out = fast_jit(linformer.linformer_attention)(q, k, v, eye, eye, mask=mask)
  # Zeroed padded keys still receive logit 0 after projection: with E = I the reference is softmax over
  # all keys where padded keys have k = 0 and v = 0.
  keep = np.asarray(mask)[:, :, None, None]
  want = _softmax_ref(q, np.asarray(k) * keep, np.asarray(v) * keep)
  np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-6)


def test_linformer_module_params_slicing_and_errors():
  module = registry.build({'kind': 'linformer', 'linformer_k': 3, 'max_length': 10,
                           'num_features': 99})                 # unrelated options are ignored
  q, k, v = _qkv(4, length=7)
  variables = module.init(jax.random.PRNGKey(0), q, k, v)
  e, f = variables['params']['e'], variables['params']['f']
  assert e.shape == f.shape == (3, 10)
  # N(0, 1/k) initialization (Linformer Theorem 1): sample variance within 5 standard errors.
  both = np.concatenate([np.asarray(e).ravel(), np.asarray(f).ravel()])
  se = np.sqrt(2.0 / len(both)) * (1 / 3)
  assert abs(both.var() - 1 / 3) < 5 * se
  out, want = fast_jit(lambda variables, q, k, v: (
      module.apply(variables, q, k, v),
      linformer.linformer_attention(q, k, v, e[:, :7], f[:, :7])))(variables, q, k, v)
  np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-6)
  with pytest.raises(ValueError, match='causal'):
    module.apply(variables, q, k, v, causal=True)
  long = _qkv(5, length=11)
  with pytest.raises(ValueError, match='max_length'):
    module.apply(variables, *long)
  with pytest.raises(ValueError, match='max_length'):
    registry.build({'kind': 'linformer'}).init(jax.random.PRNGKey(0), q, k, v)
