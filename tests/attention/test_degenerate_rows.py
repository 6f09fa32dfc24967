"""One valid key, q/k norms 1, 10 and 100: EVERY registered mechanism gives its documented answer.

With a single valid key k_0 every output row is ``c_i v_0`` (the values enter linearly and only v_0 is
visible). What c_i is (docs/kernels.md, "Degenerate rows"):

* normalized attention with positive weights -- softmax, nystromformer, every random-feature kind
  whose component is positive (posrf, oprf, saderf, hyperbolic and their learned forms, nprf-rpe, the
  grelu / performer-relu family): ``c_i = 1``, the output is v_0 exactly, at any norm. Before per-feature
  key shifts (components.py) posrf-orf gave 0 and oprf-orf wrong values at norm 10+;
* signed features -- trigrf, rks (and their learned forms fastfood-rks, gmm-rks, generative-rks,
  trigrf-fastfoodl) -- and the deterministic maps relu and linear-elu: ``c_i = D_i / safe(D_i) in
  [0, 1]``: v_0 whenever the normalizer ``|D_i| >= feature_eps``, shrunk towards 0 where it is smaller
  (relu: D_i = 0 when relu(q_i) and relu(k_0) share no positive coordinate; linear-elu: its unshifted
  features exp(x) underflow at norm ~100, D_i = 0 in float32 although positive in exact arithmetic;
  performer-lra-listops: LRA's shifts leave out |x|^2/2, so at norm 10+ every feature is its 1e-6 floor
  and D_i ~ 1e-12 is below the guard);
* gaussian: ``c_i = exp(-|q_i - k_0|^2 / (2 sqrt(d)))`` (not normalized, Skyformer eq. 3);
* skyformer: its Nyström estimate of that weight, |c_i| <= 1;
* linformer: ``c_i = sum_c softmax_c(q_i.(E_c0 k_0)/sqrt(d)) F_c0`` (the only visible column of E, F).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelformer
from kernelformer import registry
from kernelformer.features import catalog
from tests.attention.helpers import fast_jit

NORMS = (1.0, 10.0, 100.0)
L, H, D = 4, 1, 8
OPTIONS = {'num_features': 16, 'num_landmarks': 3, 'linformer_k': 3, 'max_length': L, 'chunk_size': 4}
NAMES = kernelformer.list_kernels()


def _kind(name):
  spec = registry.get(name)
  if name == 'gaussian':
    return 'gaussian'
  if name in ('skyformer', 'linformer'):
    return name
  component = spec.fixed.get('component')
  if component in ('elu', 'posrf_lra'):                  # positive, but not stabilized (see docstring)
    return 'bounded'
  if component is None or catalog.get(component).positive:       # softmax, nystromformer, positive maps
    return 'exact'
  return 'bounded'


def _inputs():
  """One batch element per norm: q rows and k_0 of that norm, v random."""
  ks = jax.random.split(jax.random.PRNGKey(3), 3)
  unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)
  n = jnp.asarray(NORMS)[:, None, None, None]
  q = n * unit(jax.random.normal(ks[0], (len(NORMS), L, H, D)))
  k = n * unit(jax.random.normal(ks[1], (len(NORMS), L, H, D)))
  v = jax.random.normal(ks[2], (len(NORMS), L, H, D))
  mask = jnp.broadcast_to(jnp.arange(L) == 0, (len(NORMS), L))
  return q, k, v, mask


@pytest.mark.parametrize('name', NAMES)
def test_single_valid_key(name):
  spec = registry.get(name)
  module = registry.build({'kind': name, **OPTIONS})
  q, k, v, mask = _inputs()
  key = jax.random.PRNGKey(0)
  rngs = {'features': key, 'dropout': key}
  extra = {'position_bias': 0.1 * jnp.ones((H, 2 * L - 1))} if spec.requires_position_bias else {}

  def run(q, k, v, mask):
    variables = module.init({'params': key, **rngs}, q, k, v, mask=mask, **extra)
    return module.apply(variables, q, k, v, mask=mask, rngs=rngs, **extra), variables

  out, variables = fast_jit(run)(q, k, v, mask)
  out, v0 = np.asarray(out, np.float64), np.asarray(v[:, :1], np.float64)     # [N, L, H, D], [N, 1, H, D]
  assert np.all(np.isfinite(out)), name
  # Every row is c_i v_0.
  c = np.sum(out * v0, axis=-1) / np.sum(v0 * v0, axis=-1)                    # [N, L, H]
  np.testing.assert_allclose(out, c[..., None] * v0, atol=1e-4 * np.abs(v0).max(), err_msg=name)
  kind = _kind(name)
  if kind == 'exact':
    np.testing.assert_allclose(out, np.broadcast_to(v0, out.shape), rtol=1e-5, atol=1e-5,
                               err_msg=f'{name}: one valid key must give v_0 exactly')
  elif kind == 'bounded':
    assert np.all(c >= -1e-5) and np.all(c <= 1 + 1e-3), (name, c)
  elif kind == 'gaussian':
    s = D ** -0.25
    dist2 = np.sum((np.asarray(q) * s - np.asarray(k[:, :1]) * s) ** 2, axis=-1)
    np.testing.assert_allclose(c, np.exp(-0.5 * dist2), rtol=1e-4, atol=1e-6)
  elif kind == 'skyformer':
    assert np.all(np.abs(c) <= 1 + 1e-3), c
  else:                                                       # linformer
    e = np.asarray(variables['params']['e'])[:, 0]
    f = np.asarray(variables['params']['f'])[:, 0]
    logits = np.einsum('nlhd,nhd,c->nlhc', np.asarray(q), np.asarray(k[:, 0]), e) / math.sqrt(D)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    np.testing.assert_allclose(c, w @ f, rtol=1e-4, atol=1e-5)
