"""``bench/official_favor.py``: the re-implemented official Performer FAVOR+ computes what it claims.

* its features, with ``eps = 0``, are the project's posrf features up to the shifts, so both
  attentions agree to rounding from one W (the benchmark compares equal work);
* its causal prefix sums (``lax.scan`` with the official hand-written reverse-scan backward) equal a
  quadratic masked computation in value and gradient;
* the bidirectional numerator/denominator equal the quadratic ``phi(Q) phi(K)^T`` forms.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import registry
from kernelformer.bench import official_favor as of

B, L, H, D, M = 2, 24, 2, 16, 32


def _qkv(seed=0):
  ks = jax.random.split(jax.random.PRNGKey(seed), 4)
  return tuple(jax.random.normal(kk, (B, L, H, D)) for kk in ks)


def _quadratic(qp, kp, v, causal):
  a = jnp.einsum('blhm,bshm->bhls', qp, kp)
  if causal:
    a = jnp.where(jnp.tril(jnp.ones((L, L), bool)), a, 0.0)
  return jnp.einsum('bhls,bshd->blhd', a / a.sum(-1, keepdims=True), v)


@pytest.mark.parametrize('causal', [False, True])
def test_official_equals_ours_without_eps(causal):
  q, k, v, _ = _qkv()
  mask = jnp.arange(L)[None, :] < jnp.array([[L - 5], [L]])
  module = registry.build({'kind': 'posrf-orf', 'num_features': M, 'max_length': L},
                          share_heads=True, impl='xla')
  key = jax.random.PRNGKey(1)
  variables = module.init({'params': key, 'features': key}, q, k, v, mask=mask, causal=causal)
  w = variables['features']['train'][0]        # the draw before training (index 0)
  ours = module.apply(variables, q, k, v, mask=mask, causal=causal, rngs={'features': key})
  theirs = of.favor_attention(q, k, v, w, mask=mask, causal=causal, eps=0.0)
  np.testing.assert_allclose(theirs, ours, rtol=2e-5, atol=2e-5)
  # The official eps = 1e-4 is a real (biasing) difference, not rounding.
  with_eps = of.favor_attention(q, k, v, w, mask=mask, causal=causal)
  assert float(jnp.max(jnp.abs(with_eps - ours))) > 1e-3


def test_features_shifts():
  q, k, _, _ = _qkv(1)
  w = jax.random.normal(jax.random.PRNGKey(2), (M, D))
  c = D ** -0.25
  dash = jnp.einsum('blhd,md->blhm', c * q, w)
  qp = of.softmax_kernel_features(q, w, is_query=True, eps=0.0)
  kp = of.softmax_kernel_features(k, w, is_query=False, eps=0.0)
  # Every query row's largest feature is exp(-|x|^2 c^2 / 2) / sqrt(M): the row max was subtracted.
  np.testing.assert_allclose(jnp.max(qp, -1) * np.sqrt(M),
                             jnp.exp(-0.5 * c * c * jnp.sum(q * q, -1)), rtol=1e-5)
  # Keys share one global shift: ratios between any two key features are the unshifted ones.
  kdash = jnp.einsum('blhd,md->blhm', c * k, w) - 0.5 * c * c * jnp.sum(k * k, -1, keepdims=True)
  np.testing.assert_allclose(jnp.log(kp[0, 0, 0] / kp[1, 3, 1]),
                             kdash[0, 0, 0] - kdash[1, 3, 1], rtol=1e-4, atol=1e-4)
  del dash


@pytest.mark.parametrize('causal', [False, True])
def test_numerator_denominator_value_and_gradients(causal):
  ks = jax.random.split(jax.random.PRNGKey(3), 4)
  qp = jax.random.uniform(ks[0], (B, L, H, M), minval=0.1)
  kp = jax.random.uniform(ks[1], (B, L, H, M), minval=0.1)
  v = jax.random.normal(ks[2], (B, L, H, D))
  g = jax.random.normal(ks[3], (B, L, H, D))

  def official(qp, kp, v):
    qt, kt, vt = (jnp.moveaxis(x, 1, 0) for x in (qp, kp, v))
    if causal:
      num, den = of.causal_numerator(qt, kt, vt), of.causal_denominator(qt, kt)
    else:
      num, den = of.noncausal_numerator(qt, kt, vt), of.noncausal_denominator(qt, kt)
    return jnp.moveaxis(num / den[..., None], 0, 1)

  ref = lambda qp, kp, v: _quadratic(qp, kp, v, causal)
  np.testing.assert_allclose(official(qp, kp, v), ref(qp, kp, v), rtol=1e-5, atol=1e-5)
  loss = lambda f: (lambda *a: jnp.sum(f(*a) * g))
  got = jax.grad(loss(official), argnums=(0, 1, 2))(qp, kp, v)
  want = jax.grad(loss(ref), argnums=(0, 1, 2))(qp, kp, v)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
