"""``linear.exp_feature_attention``: features recomputed in the backward, not stored.

The lean path must equal the stored-features path (``catalog.get(name).fn`` + ``linear_attention``)
in value and in every gradient -- q, k, v and the floating leaves of W (dense, quadrature weights,
FastFood's diagonals) -- with masks, ragged chunks and fully padded rows; inside the module it must
give the same parameter gradients for learned samplers; and its compiled backward must not hold
[L, M] features (temp memory, measured on a small shape).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import registry
from kernelformer.attention import linear
from kernelformer.attention import random_features as rf
from kernelformer.features import catalog
from kernelformer.features import weights
from tests.attention.helpers import fast_jit

B, L, D, M, DV = 2, 37, 8, 16, 5


def _inputs(seed=0, scale=0.8):
  ks = jax.random.split(jax.random.PRNGKey(seed), 4)
  q = scale * jax.random.normal(ks[0], (B, L, D))
  k = scale * jax.random.normal(ks[1], (B, L, D))
  v = jax.random.normal(ks[2], (B, L, DV))
  g = jax.random.normal(ks[3], (B, L, DV))
  return q, k, v, g


def _stored(name, mask):
  def f(q, k, v, proj):
    pq, pk = catalog.get(name).fn(q, k, proj, mask=mask)
    return linear.linear_attention(pq[:, :, None], pk[:, :, None], v[:, :, None],
                                   mask=mask)[:, :, 0]
  return f


def _lean(name, mask, chunk):
  def f(q, k, v, proj):
    return linear.exp_feature_attention(catalog.get(name).log_space, q, k, v, proj, mask=mask,
                                        chunk_size=chunk)
  return f


def _value_and_grads(f, q, k, v, proj, g):
  def loss(q, k, v, proj):
    return jnp.sum(f(q, k, v, proj) * g)
  out = f(q, k, v, proj)
  grads = jax.grad(loss, argnums=(0, 1, 2, 3), allow_int=True)(q, k, v, proj)
  floats = [x for x in jax.tree.leaves(grads) if x.dtype != jax.dtypes.float0]
  return out, floats


@pytest.mark.parametrize('name', [n for n in catalog.names() if catalog.get(n).log_space])
@pytest.mark.parametrize('sampler', ['orf', 'sgq', 'fastfood'])
def test_lean_equals_stored_values_and_gradients(name, sampler):
  q, k, v, g = _inputs()
  # Row 0 has 7 padded keys, row 1 none; chunk 8 does not divide L = 37 (padding inside the path).
  mask = jnp.arange(L)[None, :] < jnp.array([[L - 7], [L]])
  proj = weights.SAMPLERS[sampler](jax.random.PRNGKey(3), M, D)

  def both(q, k, v, proj):
    return (_value_and_grads(_stored(name, mask), q, k, v, proj, g),
            _value_and_grads(_lean(name, mask, 8), q, k, v, proj, g))

  (out_s, grads_s), (out_l, grads_l) = fast_jit(both)(q, k, v, proj)
  np.testing.assert_allclose(out_l, out_s, rtol=1e-5, atol=1e-5)
  assert len(grads_s) == len(grads_l) >= 4            # q, k, v and at least one leaf of W
  for a, b in zip(grads_l, grads_s):
    scale = float(jnp.max(jnp.abs(b))) + 1e-6
    np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, atol=2e-5)


def test_lean_large_norms_and_fully_padded_row():
  """Inputs of large norm (exponents ~ +-100: unshifted they overflow) and a row with no valid key."""
  q, k, v, g = _inputs(seed=1, scale=4.0)
  mask = jnp.stack([jnp.zeros((L,), bool), jnp.arange(L) < 5])
  proj = weights.SAMPLERS['orf'](jax.random.PRNGKey(4), M, D)

  def both(q, k, v, proj):
    return (_value_and_grads(_stored('posrf', mask), q, k, v, proj, g),
            _value_and_grads(_lean('posrf', mask, 16), q, k, v, proj, g))

  (out_s, grads_s), (out_l, grads_l) = fast_jit(both)(q, k, v, proj)
  assert np.all(np.isfinite(out_l)) and all(np.all(np.isfinite(x)) for x in grads_l)
  np.testing.assert_allclose(out_l, out_s, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(out_l[0], 0.0)          # no valid key: numerator 0 over eps
  for a, b in zip(grads_l, grads_s):
    scale = float(jnp.max(jnp.abs(b))) + 1e-6
    np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, atol=1e-4)


@pytest.mark.parametrize('kind', ['gmm-prf', 'fastfood-prf', 'posrf-sgq'])
def test_module_gradients_match_stored_path(kind, monkeypatch):
  """The module takes the lean path for posrf; its gradients wrt q, k, v and the learned sampler's
  parameters equal those of the stored path (forced by ``STORED_FEATURES_ONLY``)."""
  h = 2
  ks = jax.random.split(jax.random.PRNGKey(5), 4)
  q, k, v, g = (jax.random.normal(kk, (1, 24, h, D)) for kk in ks)
  mask = jnp.arange(24)[None, :] < 20
  module = registry.build({'kind': kind, 'num_features': M, 'max_length': 24})
  rngs = {'params': jax.random.PRNGKey(6), 'features': jax.random.PRNGKey(7)}
  variables = module.init(rngs, q, k, v, mask=mask)

  def loss(variables, q, k, v):
    out = module.apply(variables, q, k, v, mask=mask, rngs={'features': rngs['features']})
    return jnp.sum(out * g), out

  def run():
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True, allow_int=True))(
        variables, q, k, v)

  lean_grads, lean_out = run()
  monkeypatch.setattr(rf, 'STORED_FEATURES_ONLY', True)
  stored_grads, stored_out = run()
  np.testing.assert_allclose(lean_out, stored_out, rtol=1e-5, atol=1e-5)
  pairs = [(a, b) for a, b in zip(jax.tree.leaves(lean_grads), jax.tree.leaves(stored_grads))
           if a.dtype != jax.dtypes.float0]
  n_params = len(jax.tree.leaves(variables.get('params', {})))
  assert len(pairs) == 3 + len([x for x in jax.tree.leaves(variables) if x.dtype != jnp.int32])
  if kind != 'posrf-sgq':
    assert n_params > 0
  for a, b in pairs:
    scale = float(jnp.max(jnp.abs(b))) + 1e-6
    np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, atol=3e-5)


def test_backward_does_not_store_features():
  """Compiled temp memory of fwd+bwd at L=2048, M=128: the stored path keeps several [L, M] arrays
  (1 MiB each), the lean one chunks of 256 rows and O(L d) residuals."""
  n, m, d = 2048, 128, 16
  ks = jax.random.split(jax.random.PRNGKey(0), 4)
  q, k, v, g = (jax.random.normal(kk, (1, n, d)) for kk in ks)
  proj = weights.SAMPLERS['orf'](jax.random.PRNGKey(1), m, d)

  def temp(f):
    def fb(q, k, v):
      _, vjp = jax.vjp(lambda *a: f(*a, proj), q, k, v)
      return vjp(g)
    return jax.jit(fb).lower(q, k, v).compile().memory_analysis().temp_size_in_bytes

  stored = temp(_stored('posrf', None))
  lean = temp(_lean('posrf', None, 256))
  feature_bytes = n * m * 4
  assert stored >= 3 * feature_bytes, stored
  assert lean <= feature_bytes, (lean, stored)
