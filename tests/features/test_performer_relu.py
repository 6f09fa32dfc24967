"""``performer-relu`` / ``grelu``: the official Performer generalized-attention features relu(W x) + 1e-3.

The reference is written here from the documented formula of google-research
``performer/fast_attention/jax/fast_attention.py`` (``generalized_kernel_feature_creator`` as called by
``make_fast_generalized_attention`` with its defaults: ``kernel_fn=relu``, ``kernel_epsilon=0.001``,
``normalize_data=False``, no ratio): ``phi(x) = relu(x W^T) + 0.001`` on the raw x, and the renormalized
bidirectional attention ``out = (phi(Q) (phi(K)^T V)) / (phi(Q) (phi(K)^T 1))``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kernelformer import registry
from kernelformer.features import catalog
from kernelformer.features import weights
from kernelformer.features.projection import dense_matrix
from tests.attention.helpers import fast_jit

D, M = 8, 16


def _official_features(x, w):
  return jnp.maximum(x @ w.T, 0.0) + 0.001


def _official_attention(phi_q, phi_k, v):
  num = phi_q @ (phi_k.T @ v)
  den = phi_q @ phi_k.sum(0)
  return num / den[:, None]


def _qk(seed, n=7):
  kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
  return (2.0 * jax.random.normal(kq, (n, D)), 2.0 * jax.random.normal(kk, (n + 2, D)),
          jax.random.normal(kv, (n + 2, 3)))


def test_features_equal_official_formula_given_the_same_w():
  """For every Monte Carlo sampler: phi * sqrt(M) = official (the row weight 1/M on both sides).

  Computed in float64 (W drawn in float32 and widened), so the comparison is of formulas, not of float32
  summation order (which alone differs by ~2 ulp ~ 2e-6 at features ~10); float32 is checked to 1e-5.
  """
  q, k, _ = _qk(0)
  for samp in ('orf', 'iid', 'sorf', 'mm', 'qmc', 'fastfood'):
    proj = weights.SAMPLERS[samp](jax.random.PRNGKey(1), M, D)
    w = np.asarray(dense_matrix(proj), np.float64)
    with jax.enable_x64(True):
      q64, k64 = jnp.asarray(np.asarray(q), jnp.float64), jnp.asarray(np.asarray(k), jnp.float64)
      proj64 = jax.tree.map(lambda a: jnp.asarray(np.asarray(a), jnp.float64)
                            if jnp.issubdtype(a.dtype, jnp.floating) else a, proj)
      pq, pk = catalog.get('grelu').fn(q64, k64, proj64)
      for got, x in ((pq, q64), (pk, k64)):
        assert got.dtype == jnp.float64
        want = _official_features(x, jnp.asarray(w))
        np.testing.assert_allclose(np.asarray(got) * np.sqrt(M), np.asarray(want), rtol=1e-6,
                                   atol=1e-6, err_msg=samp)
    pq32, _ = fast_jit(lambda q, k, p: catalog.get('grelu').fn(q, k, p))(q, k, proj)
    np.testing.assert_allclose(np.asarray(pq32) * np.sqrt(M), np.asarray(_official_features(q, w)),
                               rtol=1e-5, atol=1e-6, err_msg=samp)


def test_padded_keys_get_zero_features_not_eps():
  q, k, _ = _qk(2)
  proj = weights.SAMPLERS['orf'](jax.random.PRNGKey(1), M, D)
  mask = jnp.arange(k.shape[0]) < 4
  _, pk = catalog.get('grelu').fn(q, k, proj, mask=mask)
  np.testing.assert_array_equal(np.asarray(pk[4:]), 0.0)
  assert bool(jnp.all(pk[:4] >= 0.001 / np.sqrt(M) * (1 - 1e-6)))


def test_deterministic_module_equals_official_attention_without_input_scaling():
  """``performer-relu-det`` (features_type='deterministic', LRA's default) end to end: no d^-1/4 scale."""
  q, k, v = _qk(3, n=9)
  k, v = k[:9], v[:9]
  module = registry.build({'kind': 'performer-relu-det'})
  out = module.apply({}, q[None, :, None], k[None, :, None], v[None, :, None])[0, :, 0]
  want = _official_attention(jnp.maximum(q, 0) + 1e-3, jnp.maximum(k, 0) + 1e-3, v)
  np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_registered_names_and_spec():
  spec = registry.get('performer-relu')
  assert spec.fixed['component'] == 'grelu' and spec.fixed['weights'] == 'orf'
  assert registry.get('grelu-orf').name == 'performer-relu'
  for samp in ('iid', 'sorf', 'qmc', 'mm', 'sgq', 'fastfood'):
    s = registry.get(f'grelu-{samp}')
    assert (s.fixed['component'], s.fixed['weights']) == ('grelu', samp)
  assert registry.get('lra-performer').name == 'performer-relu-det'
  assert registry.get('performer-relu-det').fixed == {'component': 'grelu_det', 'weights': 'none'}
  # The deterministic relu stays what it was (no epsilon).
  assert registry.get('relu').fixed['component'] == 'relu'
  assert catalog.get('grelu').target_kernel == 'none'           # no d^-1/4 scaling, as normalize_data=False
