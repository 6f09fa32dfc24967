"""Tests of RandomFeatureAttention and the random-feature registry names.

Shapes are tiny ([2, 12, 2, 8]) and every module call is jitted (eager flax is slower still): XLA
compile time dominates on CPU, so each test compiles once where it can. Statistical checks derive their
tolerance from the spread of independent replicates.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import registry
from kernelformer.attention import linear
from kernelformer.attention import random_features as rf
from kernelformer.attention import rpe
from kernelformer.attention import softmax
from kernelformer.features import catalog
from kernelformer.features import maps
from kernelformer.features import weights as weights_lib

B, L, H, D = 2, 12, 2, 8
RNGS = {'params': jax.random.key(0), 'features': jax.random.key(1)}

# Test-only XLA options: these programs run once on tiny shapes, so LLVM optimization is wasted time
# (compiling at -O0 roughly halves the per-name cost, which dominates this file).
_FAST_COMPILE = {'xla_backend_optimization_level': 0, 'xla_llvm_disable_expensive_passes': True}


def _jit_fast(fn, *args):
  """``jax.jit(fn)(*args)``, compiled with ``_FAST_COMPILE``."""
  return jax.jit(fn).lower(*args).compile(_FAST_COMPILE)(*args)


def _inputs(seed=0, scale=1.0):
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  q = scale * jax.random.normal(kq, (B, L, H, D))
  k = scale * jax.random.normal(kk, (B, L, H, D))
  v = jax.random.normal(kv, (B, L, H, D))
  mask = jnp.arange(L)[None, :] < jnp.array([[L], [L - 4]])     # second sequence right-padded
  return q, k, v, mask


def _rf_names():
  return [s.name for s in registry.specs() if s.module is rf.RandomFeatureAttention]


def _num_features(name):
  # SGQ needs M >= 2 d + 1 rows for its smallest non-degenerate sparse grid.
  return 24 if name.endswith('-sgq') else 16


def test_registry_grid_and_aliases():
  names = set(_rf_names())
  assert set(rf.FIXED_SAMPLERS) == set(weights_lib.SAMPLERS)
  for comp in rf.RF_COMPONENTS:
    for samp in rf.FIXED_SAMPLERS:
      assert f'{comp}-{samp}' in names
  # Spectraformer Table 2: {PosRF, OPRF, SADERF} x {ORF, SORF, QMC, MM, SGQ, FastFoodL}, by its names.
  for comp in ('posrf', 'oprf', 'saderf'):
    for samp in ('orf', 'sorf', 'qmc', 'mm', 'sgq', 'fastfoodl'):
      spec = registry.get(f'{comp}-{samp}')
      assert spec.fixed['component'] == comp
      assert spec.fixed['weights'] == samp
  assert registry.get('PosRF-FastFoodL').name == 'fastfood-prf'
  assert registry.get('rks-fastfoodl').name == 'fastfood-rks'
  assert registry.get('FAVOR+').name == registry.get('performer').name == 'posrf-orf'
  assert registry.get('posrf-base').name == 'posrf-iid'
  for name in ('GMM-RKS', 'gmm-prf', 'FASTFOOD-RKS', 'fastfood-prf', 'Generative-RKS',
               'generative-prf'):
    assert registry.get(name).module is rf.RandomFeatureAttention
  assert registry.get('gmm-rks').fixed['covariance'] == 'full'
  assert registry.get('gmm-prf').fixed['covariance'] == 'diag'
  assert registry.get('linear').name == registry.get('elu').name == 'linear-elu'
  assert registry.get('linear-relu').name == 'relu'
  for name in names:
    spec = registry.get(name)
    assert spec.supports_position_bias and spec.paper and spec.complexity and spec.approximates
  assert 'num_features' in registry.option_names('posrf-orf')
  assert 'component' not in registry.option_names('posrf-orf')


def _apply_with_features(module, q, k, v, mask, causal, step=None):
  variables = module.init(RNGS, q, k, v, mask=mask, causal=causal)
  out, state = module.apply(variables, q, k, v, mask=mask, causal=causal, step=step,
                            rngs={'features': RNGS['features']}, mutable=['intermediates'])
  inter = state['intermediates']
  return out, inter['phi_q'][0], inter['phi_k'][0]


@pytest.mark.parametrize('name', ['posrf-iid', 'trigrf-sgq', 'fastfood-prf', 'linear-elu'])
def test_matches_quadratic_reference(name):
  """The linear-time output equals normalize(phi(Q) phi(K)^T) V formed naively, masked and causal."""
  module = registry.build({'kind': name, 'num_features': _num_features(name), 'chunk_size': 5})
  q, k, v, mask = _inputs(seed=1)

  def both(q, k, v):
    res = []
    for causal in (False, True):
      out, phi_q, phi_k = _apply_with_features(module, q, k, v, mask, causal)
      ref = linear.quadratic_reference(phi_q, phi_k, v, mask=mask, causal=causal)
      res.append((out, ref, phi_q))
    return res

  for out, ref, phi_q in _jit_fast(both, q, k, v):
    assert phi_q.shape[:3] == (B, L, H)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=2e-4, atol=2e-5)


def test_position_bias_uses_the_rpe_core():
  """With a relative-position bias the output is normalize((phi(Q) phi(K)^T) * exp(B)) V."""
  module = registry.build({'kind': 'posrf-orf', 'num_features': 16})
  q, k, v, mask = _inputs(seed=8)
  bias = 0.5 * jax.random.normal(jax.random.key(3), (H, 2 * L - 1))

  def both(q, k, v, bias):
    res = []
    for causal in (False, True):
      variables = module.init(RNGS, q, k, v, mask=mask, causal=causal, position_bias=bias)
      out, state = module.apply(variables, q, k, v, mask=mask, causal=causal, position_bias=bias,
                                rngs={'features': RNGS['features']}, mutable=['intermediates'])
      phi_q, phi_k = state['intermediates']['phi_q'][0], state['intermediates']['phi_k'][0]
      res.append((out, rpe.rpe_quadratic_reference(phi_q, phi_k, v, bias, mask=mask,
                                                    causal=causal)))
    return res

  for out, ref in _jit_fast(both, q, k, v, bias):
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-4, atol=1e-5)


def test_redraw_schedule_layers_and_heads():
  q, k, v, mask = _inputs(seed=2)
  # Identical q, k, v in both heads: only the per-head draw can make the heads differ.
  q, k, v = (jnp.repeat(x[:, :, :1], H, axis=2) for x in (q, k, v))
  feats = {'features': RNGS['features']}

  def make(**kw):
    return rf.RandomFeatureAttention(component='posrf', weights='iid', num_features=8, **kw)

  class TwoLayers(nn.Module):
    @nn.compact
    def __call__(self, q, k, v):
      return make(name='a')(q, k, v, mask=mask), make(name='b')(q, k, v, mask=mask)

  def everything(q, k, v):
    every10, shared, never = make(redraw_every=10), make(share_heads=True), make(redraw_every=0)
    at = {f'step{s}': every10.apply({}, q, k, v, mask=mask, step=jnp.int32(s), rngs=feats)
          for s in (0, 9, 10, 25)}
    at['eval'] = every10.apply({}, q, k, v, mask=mask, step=None, rngs=feats)
    return {
        'at': at,
        'shared': shared.apply({}, q, k, v, mask=mask, step=jnp.int32(3), rngs=feats),
        'never': [never.apply({}, q, k, v, mask=mask, step=jnp.int32(s), rngs=feats)
                  for s in (0, 1000)],
        'layers': TwoLayers().apply({}, q, k, v, rngs=feats),
    }

  res = jax.tree.map(np.asarray, _jit_fast(everything, q, k, v))
  at = res['at']
  np.testing.assert_array_equal(at['step0'], at['step9'])            # same window: same draw
  assert not np.allclose(at['step0'], at['step10'])                  # new windows, new draws
  assert not np.allclose(at['step10'], at['step25'])
  np.testing.assert_array_equal(at['eval'], at['step0'])             # no collection: draw 0
  assert not np.allclose(at['step0'][:, :, 0], at['step0'][:, :, 1])   # heads draw independently
  np.testing.assert_array_equal(res['shared'][:, :, 0], res['shared'][:, :, 1])   # ... or share
  np.testing.assert_array_equal(res['never'][0], res['never'][1])    # redraw_every=0: never
  assert not np.allclose(*res['layers'])                             # layers draw independently


@pytest.mark.parametrize('name', ['trigrf-orf', 'saderf-qmc', 'gmm-prf'])
def test_padded_keys_do_not_change_real_outputs(name):
  module = registry.build({'kind': name, 'num_features': 16})
  q, k, v, mask = _inputs(seed=3)
  pad = ~mask[:, :, None, None]
  k2 = jnp.where(pad, 50.0 * jax.random.normal(jax.random.key(9), k.shape), k)
  v2 = jnp.where(pad, 1e3, v)

  def run(q, k, v):
    variables = module.init(RNGS, q, k, v, mask=mask)
    return [module.apply(variables, q, k, v, mask=mask, causal=c,
                         rngs={'features': RNGS['features']}) for c in (False, True)]

  compiled = jax.jit(run).lower(q, k, v).compile(_FAST_COMPILE)
  for a, b in zip(compiled(q, k, v), compiled(q, k2, v2)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('variant,expected', [('fixed', set()), ('s', {'row_len'})])
def test_fastfood_variants_learn_only_their_diagonals(variant, expected):
  """'fixed' has nothing to learn; 's' learns S alone (G, B redrawn). 'sgb' and the GMM/generative
  samplers are covered by the every-name test, which checks per-head gradients of every parameter."""
  module = registry.build({'kind': 'fastfood-prf', 'num_features': 16,
                           'fastfood_variant': variant})
  q, k, v, mask = _inputs(seed=4)

  def grads(q):
    params = module.init(RNGS, q, k, v, mask=mask).get('params', {})

    def loss(p):
      out = module.apply({'params': p}, q, k, v, mask=mask, rngs={'features': RNGS['features']})
      return jnp.sum(out * jnp.sin(jnp.arange(D, dtype=out.dtype)))

    return jax.grad(loss)(params)

  g = _jit_fast(grads, q)
  assert set(g.get('sampler', {})) == expected
  for leaf in jax.tree.leaves(g):
    assert np.all(np.abs(np.asarray(leaf)) > 0)


def test_learned_parameter_structure():
  q, k, v, mask = _inputs()
  shapes = {}
  for name in ('gmm-rks', 'gmm-prf', 'fastfood-rks', 'generative-prf'):
    module = registry.build({'kind': name, 'num_features': 16})
    shapes[name] = jax.tree.map(lambda x: x.shape, jax.eval_shape(
        module.init, RNGS, q, k, v)['params']['sampler'])
  assert shapes['gmm-rks'] == {'means': (H, 2, D), 'factors': (H, 2, D, D)}   # full covariance
  assert shapes['gmm-prf'] == {'means': (H, 2, D), 'factors': (H, 2, D)}      # diagonal
  assert shapes['fastfood-rks'] == {'row_len': (H, 2, D), 'g': (H, 2, D), 'b': (H, 2, D)}
  assert {f'dense_{i}' for i in range(5)} | {f'norm_{i}' for i in range(5)} == set(
      shapes['generative-prf'])
  shared = registry.build({'kind': 'gmm-rks', 'num_features': 16, 'share_heads': True})
  shared_shapes = jax.tree.map(lambda x: x.shape, jax.eval_shape(
      shared.init, RNGS, q, k, v)['params']['sampler'])
  assert shared_shapes == {'means': (2, D), 'factors': (2, D, D)}           # one sampler, all heads


def _softmax_reference(q, k, v, mask):
  return softmax.softmax_attention(q, k, v, mask=mask, implementation='xla')


def _gaussian_reference(q, k, v, mask):
  """Normalized attention with the Gaussian kernel exp(-|q-k|^2/(2 sqrt d)) (the rks target)."""
  s = D ** -0.25
  diff = q[:, :, None] * s - k[:, None] * s                      # [B, L, S, H, D]
  a = jnp.exp(-0.5 * jnp.sum(diff * diff, axis=-1))
  a = jnp.where(mask[:, None, :, None], a, 0.0)
  return jnp.einsum('blsh,bshd->blhd', a / a.sum(2, keepdims=True), v)


@pytest.mark.parametrize('name,reference', [('gmm-prf', _softmax_reference),
                                            ('gmm-rks', _gaussian_reference),
                                            ('fastfood-prf', _softmax_reference)])
def test_learned_samplers_at_init_estimate_their_target_attention(name, reference):
  """At init (N(0, I) spectrum) *-PRF estimates softmax attention and *-RKS Gaussian attention.

  R replicates, each with its own parameter init and feature draw. T = mean squared error of the
  replicate mean over mean squared standard error (estimated from the replicates) is ~1 for an
  unbiased estimate; T <= 3 leaves room for the O(1/M) bias of the ratio (normalized) estimator.
  Against the wrong target kernel T is ~100-400 at these settings, so the test has power. Inputs are
  kept small (|q| ~ 0.4 sqrt(d)): PRF weights are log-normal, and at large norms their heavy tails
  make 32-sample standard errors unreliable.
  """
  reps, m = 32, 256
  module = registry.build({'kind': name, 'num_features': m})
  q, k, v, mask = _inputs(seed=5, scale=0.4)

  def draws(keys):
    def one(key):
      k_init, k_feat = jax.random.split(key)
      variables = module.init({'params': k_init, 'features': k_feat}, q, k, v, mask=mask)
      return module.apply(variables, q, k, v, mask=mask, rngs={'features': k_feat})
    return jax.vmap(one)(keys)

  outs = np.asarray(_jit_fast(draws, jax.random.split(jax.random.key(11), reps)))
  exact = np.asarray(reference(q, k, v, mask))
  se2 = outs.var(0, ddof=1) / reps
  t_stat = np.mean((outs.mean(0) - exact) ** 2) / np.mean(se2)
  assert t_stat <= 3.0, t_stat


def test_normalize_qk_and_bf16():
  q, k, v, mask = _inputs(seed=6)
  module = rf.RandomFeatureAttention(component='posrf', weights='orf', num_features=16,
                                     normalize_qk=True)
  run = lambda q, k, v: module.apply({}, q, k, v, mask=mask, rngs={'features': RNGS['features']})
  compiled = jax.jit(run).lower(q, k, v).compile(_FAST_COMPILE)
  out = compiled(q, k, v)
  # l2-normalized inputs: rescaling q and k changes nothing.
  np.testing.assert_allclose(np.asarray(compiled(3.0 * q, 0.5 * k, v)), np.asarray(out),
                             rtol=1e-5, atol=1e-6)
  out_bf16 = _jit_fast(run, q.astype(jnp.bfloat16), k.astype(jnp.bfloat16),
                       v.astype(jnp.bfloat16))
  assert out_bf16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out_bf16, np.float32), np.asarray(out), atol=5e-2)


def test_unknown_options_fail_loudly():
  q, k, v, mask = _inputs()
  with pytest.raises(ValueError, match='unknown weights'):
    rf.RandomFeatureAttention(component='posrf', weights='gaussian').init(RNGS, q, k, v)
  with pytest.raises(ValueError, match='unknown component'):
    rf.RandomFeatureAttention(component='softmax', weights='iid').init(RNGS, q, k, v)


@pytest.mark.parametrize('component,bias,want', [
    ('posrf', False, 'exp'), ('hyperbolic', False, 'exp'), ('relu', False, 'row_wise'),
    ('taylor', False, 'row_wise'), ('trigrf', False, 'stored'), ('oprf', False, 'stored'),
    ('cosformer', False, 'stored'), ('posrf', True, 'stored')])
def test_the_module_picks_one_path_up_front(component, bias, want, monkeypatch):
  """``_path``: one core per call from the record and the call (XLA here; a bias forces stored)."""
  module = rf.RandomFeatureAttention(component=component, impl='xla')
  bias = jnp.zeros((1, 2, 8)) if bias else None
  for causal in (False, True):
    assert module._path(catalog.get(component), bias, (1, 8, 2, 4), jnp.float32, causal) == want
  monkeypatch.setattr(rf, 'STORED_FEATURES_ONLY', True)
  assert module._path(catalog.get(component), None, (1, 8, 2, 4), jnp.float32, False) == 'stored'
