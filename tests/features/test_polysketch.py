"""The random PolySketch map (Kacham, Mirrokni & Zhong 2023) in float64: what its sketch estimates.

``polysketch``: ``x^ = LN(x)/sqrt(d)``, ``s(x) = (G1 x^) * (G2 x^) / sqrt(r)`` with ``[G1; G2]`` the drawn W
(iid Gaussian rows), ``phi(x) = s(x) (x) s(x)`` (self-tensoring, stored as an upper triangle). Checked:
the features entry by entry against a numpy transcription; ``phi(q).phi(k) = (s(q).s(k))^2 >= 0``
exactly; the degree-2 sketch is unbiased for ``(q^.k^)^2`` (mean over draws within 4 standard errors);
the degree-4 estimate ``phi(q).phi(k)`` of ``(q^.k^)^4`` has an error that shrinks with the sketch size r
(its bias, ``Var(s.s')``, too); the module draws W with the iid sampler and attends like the reference.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from kernelformer import registry
from kernelformer.features import catalog
from kernelformer.features import maps
from kernelformer.features.projection import Projection

D = 6


def _unit_ln(x):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + maps.LAYER_NORM_EPS) / math.sqrt(x.shape[-1])


def ref_sketch(x, w):
  """The degree-2 sketch s(x), float64, from the definition."""
  r = w.shape[0] // 2
  xh = _unit_ln(np.asarray(x, np.float64))
  return (xh @ w[:r].T) * (xh @ w[r:].T) / math.sqrt(r)


def ref_phi(x, w):
  s = ref_sketch(x, w)
  r = s.shape[-1]
  return np.stack([s[..., i] * s[..., j] * (1.0 if i == j else math.sqrt(2.0))
                   for i in range(r) for j in range(i, r)], -1)


def test_features_equal_the_definition_and_are_a_non_negative_kernel():
  rng = np.random.default_rng(0)
  q, k = 2.0 * rng.standard_normal((2, 5, D)), 2.0 * rng.standard_normal((2, 7, D))
  w = rng.standard_normal((10, D))
  with jax.enable_x64(True):
    pq, pk = catalog.get('polysketch').fn(jnp.asarray(q), jnp.asarray(k), Projection(matrix=jnp.asarray(w)))
  pq, pk = np.asarray(pq), np.asarray(pk)
  assert pq.dtype == np.float64 and pq.shape[-1] == 15 == catalog.get('polysketch').feature_count(10, D)
  np.testing.assert_allclose(pq, ref_phi(q, w), rtol=1e-12, atol=1e-15)
  np.testing.assert_allclose(pk, ref_phi(k, w), rtol=1e-12, atol=1e-15)
  kern = np.einsum('blm,bsm->bls', pq, pk)
  want = np.einsum('blr,bsr->bls', ref_sketch(q, w), ref_sketch(k, w)) ** 2
  np.testing.assert_allclose(kern, want, rtol=1e-11, atol=1e-15)
  assert kern.min() >= 0.0
  # An odd num_features: r = floor(M/2), the last row unused (the registry-wide suites use M = 9).
  w11 = np.concatenate([w, rng.standard_normal((1, D))])
  with jax.enable_x64(True):
    pq11, _ = catalog.get('polysketch').fn(jnp.asarray(q), jnp.asarray(k), Projection(matrix=jnp.asarray(w11)))
  np.testing.assert_array_equal(np.asarray(pq11), pq)
  assert catalog.get('polysketch').feature_count(11, D) == 15


def _draws(r, n, seed):
  return np.random.default_rng(seed).standard_normal((n, 2 * r, D))


def _estimates(q, k, ws):
  """(s(q).s(k), phi(q).phi(k)) for each draw W in ``ws`` [n, 2r, d], by the library (float64).

  The degree-2 sketch s is the library's too (``maps.polysketch_sketch``); ``phi`` is checked against the
  definition in the test above.
  """
  with jax.enable_x64(True):
    def one(w):
      proj = Projection(matrix=w)
      pq, pk = catalog.get('polysketch').fn(jnp.asarray(q), jnp.asarray(k), proj)
      sq, sk = maps.polysketch_sketch(jnp.asarray(q), proj), maps.polysketch_sketch(jnp.asarray(k), proj)
      return jnp.sum(sq * sk), jnp.sum(pq * pk)
    deg2, deg4 = jax.jit(jax.vmap(one))(jnp.asarray(ws))
  return np.asarray(deg2), np.asarray(deg4)


def test_degree_two_sketch_is_unbiased_and_degree_four_error_shrinks_with_r():
  rng = np.random.default_rng(1)
  q, k = rng.standard_normal(D), rng.standard_normal(D)
  k = 0.6 * k + 0.8 * q                                     # a pair with a sizeable q^.k^
  cos = float(_unit_ln(q) @ _unit_ln(k))
  assert abs(cos) > 0.5
  n = 4000
  rmse, bias = {}, {}
  for r in (4, 16, 64):
    deg2, deg4 = _estimates(q, k, _draws(r, n, seed=r))
    # E[s(q).s(k)] = (q^.k^)^2: the mean over n draws within 4 standard errors.
    assert abs(deg2.mean() - cos ** 2) < 4 * deg2.std() / math.sqrt(n), (r, deg2.mean(), cos ** 2)
    rmse[r] = float(np.sqrt(np.mean((deg4 - cos ** 4) ** 2)))
    bias[r] = float(deg4.mean() - cos ** 4)                 # = Var(s.s') >= 0 (self-tensoring is biased)
    assert bias[r] > -4 * deg4.std() / math.sqrt(n)
  # Error and bias fall like 1/sqrt(r) and 1/r: 16x the sketch, at most 1/2.5 the error, 1/6 the bias.
  assert rmse[64] < rmse[16] < rmse[4] and rmse[64] < rmse[4] / 2.5, rmse
  assert bias[64] < bias[4] / 6, bias


def test_module_draws_w_and_attends_as_the_reference():
  b, l, h = 2, 7, 2
  rng = np.random.default_rng(2)
  q, k = rng.standard_normal((b, l, h, D)), rng.standard_normal((b, l, h, D))
  v = rng.standard_normal((b, l, h, 3))
  mask = np.arange(l)[None, :] < np.array([[l], [4]])
  module = registry.build({'kind': 'polysketch', 'num_features': 12, 'chunk_size': 3})
  args = [jnp.asarray(a, jnp.float32) for a in (q, k, v)]
  rngs = {'features': jax.random.PRNGKey(1)}
  variables = module.init({'params': jax.random.PRNGKey(0), **rngs}, *args, mask=jnp.asarray(mask))
  w = np.asarray(variables['features']['train'][0], np.float64)             # [H, 2r, d], one draw per head
  assert w.shape == (h, 12, D) and not np.allclose(w[0], w[1])
  for causal in (False, True):
    out = module.apply(variables, *args, mask=jnp.asarray(mask), causal=causal, rngs=rngs)
    pq = np.stack([ref_phi(q[:, :, hh], w[hh]) for hh in range(h)], 2)
    pk = np.stack([ref_phi(k[:, :, hh], w[hh]) for hh in range(h)], 2)
    s = np.einsum('blhm,bshm->bhls', pq, pk) * mask[:, None, None, :]
    if causal:
      s = s * np.tril(np.ones((l, l)))
    ref = np.einsum('bhls,bshd->blhd', s, v) / s.sum(-1).transpose(0, 2, 1)[..., None]
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=5e-4,
                               atol=5e-5 * np.abs(ref).max(), err_msg=f'causal={causal}')
