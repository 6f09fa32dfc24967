"""Feature tiling (``block_m``): programs over column tiles of the features, merged by XLA, give the
same outputs and gradients as one tile holding every feature (CPU, Pallas interpret mode).

M = 24 features: exp pads to M' = 32 (two tiles of 16, the second partly padding); trig has 2M = 48
features padded to 64 (four tiles, the last all padding); elu / relu (M = d) at d = 24, padded to 32:
two tiles of 16 columns, each program reading and differentiating only its tile's columns of q, k
(the second tile partly padding). L = 40 with blocks of 16 (padding rows),
a masked batch (all, 23 and 1 valid keys). One tile is the configuration the
rest of tests/pallas checks against the XLA path; the tiled one must agree with it to float32
rounding of the changed summation order (the tiles' merge rescales by exp(a_T - a) <= 1).
"""
from __future__ import annotations

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer.pallas import feature_attention

B, L, H, D, DV, M = 3, 40, 2, 8, 8, 24
D_PLAIN = 24        # elu / relu: the features are the (padded) head dim
JIT_OPTIONS = {'xla_backend_optimization_level': 0}


@functools.lru_cache(maxsize=None)
def _run(feature):
  def grads(block_m, q, k, v, w, fw, mask, g):
    def f(q, k, v, w, fw):
      return feature_attention(q, k, v, w, feature=feature, feature_weights=fw, mask=mask,
                               block_q=16, block_k=16, num_splits=2,
                               block_m=block_m)
    out, vjp = jax.vjp(f, q, k, v, w, fw)
    return out, vjp(g)

  @functools.partial(jax.jit, compiler_options=JIT_OPTIONS)
  def both(q, k, v, w, fw, mask, g):
    full = 64 if feature == 'trig' else 32
    return grads(16, q, k, v, w, fw, mask, g), grads(full, q, k, v, w, fw, mask, g)
  return both


@pytest.mark.parametrize('feature', ['exp', 'trig', 'elu', 'relu'])
def test_tiled_features_equal_one_tile(feature):
  ks = jax.random.split(jax.random.PRNGKey(7), 8)
  scale = 0.25 if feature == 'trig' else 0.5
  d = D if feature in ('exp', 'trig') else D_PLAIN
  q = scale * jax.random.normal(ks[0], (B, L, H, d))
  k = scale * jax.random.normal(ks[1], (B, L, H, d))
  v = jax.random.normal(ks[2], (B, L, H, DV))
  g = jax.random.normal(ks[3], (B, L, H, DV))
  w = fw = None
  if feature in ('exp', 'trig'):
    w = jax.random.normal(ks[4], (H, M, D))
    fw = (1.0 + 0.5 * jax.random.uniform(ks[5], (H, M))) / M
  mask = jnp.arange(L)[None, :] < jnp.asarray([40, 23, 1])[:, None]
  (out_t, grads_t), (out_1, grads_1) = _run(feature)(q, k, v, w, fw, mask, g)
  np.testing.assert_allclose(out_t, out_1, rtol=2e-5, atol=2e-6)
  assert len(grads_t) == 5
  for name, a, b in zip(('q', 'k', 'v', 'w', 'feature_weights'), grads_t, grads_1):
    if w is None and name in ('w', 'feature_weights'):
      assert a is None and b is None
      continue
    a, b = np.asarray(a), np.asarray(b)
    scale = np.max(np.abs(b))
    assert np.max(np.abs(a - b)) <= 1e-5 * scale, (name, np.max(np.abs(a - b)), scale)


def test_block_m_checks():
  q = jnp.zeros((1, 16, 1, 8))
  w = jnp.zeros((1, 24, 8))
  with pytest.raises(ValueError, match='divide'):
    feature_attention(q, q, q, w, block_m=64)      # M' = 32
  with pytest.raises(ValueError, match='power of two'):
    feature_attention(q, q, q, w, block_m=24)
  q = jnp.zeros((1, 16, 1, 24))                   # elu / relu: M' = padded d = 32
  with pytest.raises(ValueError, match='divide'):
    feature_attention(q, q, q, None, feature='elu', block_m=64)


@pytest.mark.parametrize('feature', ['exp', 'trig'])
def test_chunked_projection_equals_whole(feature, monkeypatch):
  """x W^T summed over column chunks loaded from the refs (``_K_CHUNK``; 16 compiled, 4 here:
  d = 8, padded to 16, in four chunks) gives the outputs and gradients of the whole-width dot."""
  fa = importlib.import_module('kernelformer.pallas.feature_attention')
  ks = jax.random.split(jax.random.PRNGKey(3), 6)
  q = 0.5 * jax.random.normal(ks[0], (2, 24, H, D))
  k = 0.5 * jax.random.normal(ks[1], (2, 24, H, D))
  v = jax.random.normal(ks[2], (2, 24, H, DV))
  g = jax.random.normal(ks[3], (2, 24, H, DV))
  w = jax.random.normal(ks[4], (H, M, D))

  def run(chunk):
    monkeypatch.setattr(fa, '_K_CHUNK', chunk)
    f = lambda q, k, v, w: feature_attention(q, k, v, w, feature=feature,
                                             block_q=16, block_k=16, num_splits=2, block_m=16)
    out, vjp = jax.vjp(f, q, k, v, w)
    return out, vjp(g)

  out_c, grads_c = run(4)
  out_1, grads_1 = run(0)
  np.testing.assert_allclose(out_c, out_1, rtol=2e-5, atol=2e-6)
  for name, a, b in zip('qkvw', grads_c, grads_1):
    a, b = np.asarray(a), np.asarray(b)
    assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b)), name
