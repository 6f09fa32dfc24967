"""``linear.causal_exp_feature_attention``: causal exp-feature attention in one scan over chunks.

It must equal the stored-features causal path -- ``catalog.get(name).fn(..., causal_chunk=C)`` and
``linear_attention(..., causal=True, key_shift=)``, the same per-row running stabilizer -- in value and
in every gradient (q, k, v, the floating leaves of W), with masks, a chunk that does not divide L, inputs
of large norm, a fully padded row and a large later key; inside the module (learned samplers included);
and its compiled fwd+bwd must not hold the [L, M] features.
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

B, L, D, M, DV, C = 2, 37, 8, 16, 5, 8


def _inputs(seed=0, scale=0.8):
  ks = jax.random.split(jax.random.PRNGKey(seed), 4)
  q = scale * jax.random.normal(ks[0], (B, L, D))
  k = scale * jax.random.normal(ks[1], (B, L, D))
  v = jax.random.normal(ks[2], (B, L, DV))
  g = jax.random.normal(ks[3], (B, L, DV))
  return q, k, v, g


def _stored(name, mask, chunk=C):
  def f(q, k, v, proj):
    pq, pk, shift = catalog.get(name).fn(q, k, proj, mask=mask, causal_chunk=chunk)
    return linear.linear_attention(pq[:, :, None], pk[:, :, None], v[:, :, None], mask=mask,
                                   causal=True, chunk_size=chunk, key_shift=shift[:, :, None])[:, :, 0]
  return f


def _lean(name, mask, chunk=C):
  def f(q, k, v, proj):
    return linear.causal_exp_feature_attention(catalog.get(name).log_space, q, k, v, proj,
                                               mask=mask, chunk_size=chunk)
  return f


def _value_and_grads(f, q, k, v, proj, g):
  def loss(q, k, v, proj):
    return jnp.sum(f(q, k, v, proj) * g)
  out = f(q, k, v, proj)
  grads = jax.grad(loss, argnums=(0, 1, 2, 3), allow_int=True)(q, k, v, proj)
  floats = [x for x in jax.tree.leaves(grads) if x.dtype != jax.dtypes.float0]
  return out, floats


def _assert_grads_close(grads_l, grads_s, atol):
  assert len(grads_s) == len(grads_l) >= 4            # q, k, v and at least one leaf of W
  for a, b in zip(grads_l, grads_s):
    assert np.all(np.isfinite(a))
    scale = float(jnp.max(jnp.abs(b))) + 1e-6
    np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, atol=atol)


@pytest.mark.parametrize('name,sampler', [('posrf', 'orf'), ('hyperbolic', 'orf'), ('posrf', 'sgq'),
                                          ('posrf', 'fastfood')])
def test_causal_lean_equals_stored_values_and_gradients(name, sampler):
  q, k, v, g = _inputs()
  # Row 0 has 7 padded keys, row 1 none; chunk 8 does not divide L = 37 (padding inside the path).
  mask = jnp.arange(L)[None, :] < jnp.array([[L - 7], [L]])
  proj = weights.SAMPLERS[sampler](jax.random.PRNGKey(3), M, D)

  def both(q, k, v, proj):
    return (_value_and_grads(_stored(name, mask), q, k, v, proj, g),
            _value_and_grads(_lean(name, mask), q, k, v, proj, g))

  (out_s, grads_s), (out_l, grads_l) = fast_jit(both)(q, k, v, proj)
  np.testing.assert_allclose(out_l, out_s, rtol=1e-5, atol=1e-5)
  _assert_grads_close(grads_l, grads_s, 2e-5)


def test_causal_lean_large_norms_padded_row_and_large_later_key():
  """Exponents ~ +-100 (unshifted they overflow), a row with no valid key, and a key at the column
  maximum (~e^32 above the others at this scale) starting the third chunk of the second row."""
  q, k, v, g = _inputs(seed=1, scale=4.0)
  proj = weights.SAMPLERS['orf'](jax.random.PRNGKey(4), M, D)
  k = k.at[1, :].multiply(0.05).at[1, 2 * C].set(2.0 * proj.matrix[0])
  mask = jnp.stack([jnp.zeros((L,), bool), jnp.arange(L) < L - 3])

  def both(q, k, v, proj):
    return (_value_and_grads(_stored('posrf', mask), q, k, v, proj, g),
            _value_and_grads(_lean('posrf', mask), q, k, v, proj, g))

  (out_s, grads_s), (out_l, grads_l) = fast_jit(both)(q, k, v, proj)
  assert np.all(np.isfinite(out_l))
  np.testing.assert_allclose(out_l, out_s, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(out_l[0], 0.0)          # no valid key: numerator 0 over eps
  _assert_grads_close(grads_l, grads_s, 1e-4)


def test_causal_lean_past_ignores_the_future_and_chunk_size_only_moves_shifts():
  """Outputs before a chunk boundary are bitwise independent of later keys and values (huge ones
  included); other chunk sizes give the same values to float32 rounding (the shifts do not depend on
  the chunk size)."""
  q, k, v, _ = _inputs(seed=2)
  proj = weights.SAMPLERS['orf'](jax.random.PRNGKey(5), M, D)
  t = 2 * C
  k2 = k.at[:, t:].set(jnp.broadcast_to(3.0 * proj.matrix[jnp.arange(L - t) % M], (B, L - t, D)))
  v2 = v.at[:, t:].multiply(1e4)
  f = fast_jit(lambda q, k, v, chunk: _lean('posrf', None, chunk)(q, k, v, proj),
               static_argnums=3)
  out, out2 = f(q, k, v, C), f(q, k2, v2, C)
  assert np.all(np.isfinite(out2))
  np.testing.assert_array_equal(np.asarray(out[:, :t]), np.asarray(out2[:, :t]))
  for chunk in (1, 5, 64):
    np.testing.assert_allclose(f(q, k, v, chunk), out, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize('kind', ['posrf-orf', 'gmm-prf'])
def test_module_causal_matches_stored_path(kind, monkeypatch):
  """The module takes the scan path for causal posrf; outputs and gradients wrt q, k, v and the
  learned sampler's parameters equal those of the stored path (forced by STORED_FEATURES_ONLY)."""
  h, n = 2, 24
  ks = jax.random.split(jax.random.PRNGKey(5), 4)
  q, k, v, g = (jax.random.normal(kk, (1, n, h, D)) for kk in ks)
  mask = jnp.arange(n)[None, :] < 20
  module = registry.build({'kind': kind, 'num_features': M, 'max_length': n}, chunk_size=C,
                          impl='xla')
  rngs = {'params': jax.random.PRNGKey(6), 'features': jax.random.PRNGKey(7)}
  variables = module.init(rngs, q, k, v, mask=mask, causal=True)

  def loss(variables, q, k, v):
    out = module.apply(variables, q, k, v, mask=mask, causal=True,
                       rngs={'features': rngs['features']})
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
  assert len(pairs) == 3 + len([x for x in jax.tree.leaves(variables) if x.dtype != jnp.int32])
  if kind == 'gmm-prf':
    assert len(jax.tree.leaves(variables.get('params', {}))) > 0
  for a, b in pairs:
    scale = float(jnp.max(jnp.abs(b))) + 1e-6
    np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, atol=3e-5)


def test_causal_backward_does_not_store_features():
  """Compiled temp memory of fwd+bwd at L=2048, M=128: the stored path keeps several [L, M] arrays
  (1 MiB each); the scan saves one [M, Dv] carry per chunk of 64 (L/64 x M x Dv = 0.25 MiB here)."""
  n, m, d = 2048, 128, 16
  ks = jax.random.split(jax.random.PRNGKey(0), 4)
  q, k, v, g = (jax.random.normal(kk, (1, n, d)) for kk in ks)
  proj = weights.SAMPLERS['orf'](jax.random.PRNGKey(1), m, d)

  def temp(f):
    def fb(q, k, v):
      _, vjp = jax.vjp(lambda q_, k_, v_: f(q_, k_, v_, proj), q, k, v)
      return vjp(g)
    return jax.jit(fb).lower(q, k, v).compile().memory_analysis().temp_size_in_bytes

  lean, stored = temp(_lean('posrf', None, 64)), temp(_stored('posrf', None, 64))
  assert lean < 1.5 * 2**20 < 3 * 2**20 < stored, (lean, stored)


def test_padded_peak_key_sets_no_shift():
  """A padded key at a feature's column maximum (d = 64: ~e^32 above the small real keys) must not
  enter the running max: if it did, the later rows' normalizers would fall under eps (the 0.52 case)."""
  n, d, m = 16, 64, 16
  ks = jax.random.split(jax.random.PRNGKey(7), 3)
  proj = weights.SAMPLERS['orf'](jax.random.PRNGKey(8), m, d)
  q = jax.random.normal(ks[0], (1, n, d)) / 8.0
  k = (0.1 / 8.0) * jax.random.normal(ks[1], (1, n, d))
  k = k.at[0, 5].set(proj.matrix[0])
  v = jax.random.normal(ks[2], (1, n, DV))
  mask = jnp.arange(n)[None, :] != 5
  f = fast_jit(lambda q, k, v: (_lean('posrf', mask, 4)(q, k, v, proj),
                                _stored('posrf', mask, 4)(q, k, v, proj)))
  out_l, out_s = f(q, k, v)
  np.testing.assert_allclose(out_l, out_s, rtol=1e-5, atol=1e-5)


def _exact_posrf_causal(q, k, v, w):
  """float64 causal attention with the unshifted FAVOR+ kernel sum_r exp(w_r.q - |q|^2/2) exp(w_r.k - |k|^2/2)."""
  q, k, v, w = (np.asarray(x, np.float64) for x in (q, k, v, w))
  fq = np.exp(q @ w.T - 0.5 * np.sum(q * q, -1, keepdims=True))
  fk = np.exp(k @ w.T - 0.5 * np.sum(k * k, -1, keepdims=True))
  kappa = np.tril(fq @ fk.T)
  return (kappa @ v) / kappa.sum(-1, keepdims=True)


def test_shifted_normalizer_is_not_clamped_by_a_fixed_eps():
  """A key aligned with w_0 at the end of the first chunk has exponent |w_0|^2 / 2 = 32 in feature 0,
  where every earlier query of the chunk puts its mass. A shift per chunk (the chunk's running max)
  included that later key, so those rows' normalizers were ~e^-30 in its units and a fixed guard of
  1e-6 replaced them (off by O(1)); the default guard of the shifted components
  (``normalizer_eps('posrf')`` = 1e-30) was chosen for that. With each row shifted by the running max
  over its own keys, the largest term of every normalizer is one weight c_r, so the lean and stored
  paths equal the float64 estimator to 1e-5 with either guard, and the module uses the default."""
  from kernelformer.attention import random_features as rf
  from kernelformer.features import projection as projection_lib
  n, d, m, c = 32, 64, 64, 16
  ks = jax.random.split(jax.random.PRNGKey(11), 3)
  w = weights.SAMPLERS['orf'](ks[0], m, d)
  wd = np.asarray(projection_lib.dense_matrix(w))
  q = jax.random.normal(ks[1], (1, n, d)) * d ** -0.25
  k = (jax.random.normal(ks[2], (1, n, d)) * d ** -0.25).at[0, c - 1].set(jnp.asarray(wd[0]))
  v = jax.random.normal(jax.random.PRNGKey(12), (1, n, DV))
  exact = _exact_posrf_causal(q[0], k[0], v[0], wd)
  eps = rf.normalizer_eps('posrf')
  assert eps < 1e-20 and rf.normalizer_eps('trigrf') == linear.DEFAULT_EPS
  assert rf.normalizer_eps('posrf', 1e-3) == 1e-3
  form = catalog.get('posrf').log_space
  lean = linear.causal_exp_feature_attention(form, q, k, v, w, eps=eps, chunk_size=c)[0]
  pq, pk, shift = catalog.get('posrf').fn(q, k, w, causal_chunk=c)
  stored = linear.linear_attention(pq[:, :, None], pk[:, :, None], v[:, :, None], causal=True,
                                   chunk_size=c, key_shift=shift[:, :, None], eps=eps)[0, :, 0]
  np.testing.assert_allclose(lean, exact, atol=1e-5)
  np.testing.assert_allclose(stored, exact, atol=1e-5)
  fixed = linear.causal_exp_feature_attention(form, q, k, v, w, eps=1e-6, chunk_size=c)[0]
  np.testing.assert_allclose(fixed, exact, atol=1e-5)     # off by > 0.1 with a per-chunk shift
  # The module's default guard is the component's: the same output as an explicit 1e-30.
  qm, km, vm = q[:, :, None], k[:, :, None], v[:, :, None]
  outs = {}
  for eps_opt in (None, 1e-30):
    extra = {} if eps_opt is None else {'feature_eps': eps_opt}
    module = registry.build({'kind': 'posrf-orf', 'num_features': m, 'max_length': n, **extra},
                            chunk_size=c, impl='xla')
    rngs = {'params': jax.random.PRNGKey(6), 'features': jax.random.PRNGKey(7)}
    variables = module.init(rngs, qm, km, vm, causal=True)
    outs[eps_opt] = np.asarray(module.apply(variables, qm, km, vm, causal=True,
                                            rngs={'features': rngs['features']}))
  np.testing.assert_array_equal(outs[None], outs[1e-30])


def test_cond_every_keeps_one_branch_under_vmap():
  """``linear._cond_every``: one branch for the whole batch (the first only if every predicate holds),
  nested vmaps and unbatched predicates included, and a ``cond`` in the batched program, not a select
  of both branches."""
  f = lambda pred, x: linear._cond_every(pred, lambda x: x + 1.0, lambda x: x + 2.0, x)
  x = jnp.zeros(3)
  assert float(f(jnp.bool_(True), 0.0)) == 1.0 and float(f(jnp.bool_(False), 0.0)) == 2.0
  np.testing.assert_array_equal(jax.vmap(f)(jnp.array([True, True, True]), x), [1.0, 1.0, 1.0])
  np.testing.assert_array_equal(jax.vmap(f)(jnp.array([True, False, True]), x), [2.0, 2.0, 2.0])
  np.testing.assert_array_equal(jax.vmap(f, in_axes=(None, 0))(jnp.bool_(True), x), [1.0, 1.0, 1.0])
  np.testing.assert_array_equal(jax.vmap(f, in_axes=(0, None))(jnp.array([True, False]), 0.0),
                                [2.0, 2.0])
  preds = jnp.array([[True, True], [True, False]])
  np.testing.assert_array_equal(jax.jit(jax.vmap(jax.vmap(f)))(preds, jnp.zeros((2, 2))),
                                [[2.0, 2.0], [2.0, 2.0]])
  np.testing.assert_array_equal(jax.vmap(jax.vmap(f))(preds[:1], jnp.zeros((1, 2))), [[1.0, 1.0]])
  program = str(jax.make_jaxpr(jax.vmap(f))(jnp.array([True, False]), jnp.zeros(2)))
  assert 'cond[' in program and 'select_n' not in program, program
