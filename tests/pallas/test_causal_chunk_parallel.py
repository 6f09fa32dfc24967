"""The chunk-parallel causal kernels against the XLA chunked path, CPU interpret mode.

Causal ``feature_attention`` cuts the (padded) length into P segments of G chunks: per-segment key
states on grid (B, H, P), an exclusive prefix over segments (``_segment_scan``, a log-depth associative
scan of the flash-style rescaling merge), then per-segment outputs on grid (B, H, P); the backward
does the same with query-side suffix states. These tests pin:

* outputs and gradients (q, k, v, W, feature weights) equal ``linear.linear_attention``'s chunked
  causal path on the components.py features for P = 1 (sequential), 2, and N (one chunk per program),
  with a key padding mask and L not a multiple of the chunk;
* key norms that grow along the sequence, so the running max moves between segments and every
  rescaling of the merge and of the suffix states is exercised (a missing or wrong factor is an
  O(1) error, not rounding);
* the grid: (B, H, ceil(L / (C G))) with G = 4 by default, i.e. it grows with L.

Tolerances: P > 1 against P = 1 (the same per-chunk arithmetic, only the merge order differs) at
float32 rounding of the largest entry; against the XLA path as in test_feature_attention (first-order
rounding bound, here a fixed 1e-4 of the largest gradient entry, well above the measured ~3e-5).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer.pallas import feature_attention
from kernelformer.bench import pallas_reference as reference

B, L, H, D, M, C = 2, 72, 2, 8, 16, 16          # N = 5 chunks; L = 72 is not a multiple of 16
JIT_OPTIONS = {'xla_backend_optimization_level': 0}


def _inputs(feature):
  ks = jax.random.split(jax.random.PRNGKey(7), 7)
  scale = 0.25 if feature == 'trig' else 0.5
  ramp = 1.0 + 2.0 * jnp.linspace(0.0, 1.0, L)[None, :, None, None]   # norms grow along the sequence
  q = scale * jax.random.normal(ks[0], (B, L, H, D))
  k = scale * ramp * jax.random.normal(ks[1], (B, L, H, D))
  v = jax.random.normal(ks[2], (B, L, H, D))
  g = jax.random.normal(ks[3], (B, L, H, D))
  w = fw = None
  if feature in ('exp', 'trig'):
    w = jax.random.normal(ks[4], (H, M, D))
    fw = (1.0 + 0.5 * jax.random.uniform(ks[5], (M,), minval=-1.0, maxval=1.0)) / M
  if feature == 'exp':
    # exp's log-magnitude w.k - |k|^2/2 grows for keys drifting towards a + 0.6 w_0 (not with the
    # norm alone): the running max then rises along the sequence, as trig's |k|^2/2 does.
    drift = 0.6 * jnp.linspace(0.0, 1.0, L)[None, :, None, None] * w[None, None, :, 0, :]
    k = scale * jax.random.normal(ks[1], (B, L, H, D)) + drift
  mask = jnp.arange(L)[None, :] < jnp.asarray([L, 45])[:, None]
  return q, k, v, w, fw, g, mask


@functools.lru_cache(maxsize=None)
def _grads(feature, splits):
  """Jitted (out, grads) of the kernels (``splits`` segments; None = default) or of XLA (splits=0)."""
  uses_w = feature in ('exp', 'trig')

  def attend(q, k, v, w, fw, mask):
    if splits == 0:
      return reference.xla_feature_attention(q, k, v, w, feature=feature, feature_weights=fw,
                                             mask=mask, causal=True, chunk_size=C)
    return feature_attention(q, k, v, w, feature=feature, feature_weights=fw, mask=mask,
                             causal=True, block_k=C, num_splits=splits)

  @functools.partial(jax.jit, compiler_options=JIT_OPTIONS)
  def run(q, k, v, w, fw, g, mask):
    if uses_w:
      out, vjp = jax.vjp(lambda q, k, v, w, fw: attend(q, k, v, w, fw, mask), q, k, v, w, fw)
    else:
      out, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, None, None, mask), q, k, v)
    return out, vjp(g)

  return run


def _close(a, b, tol, what):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  scale = max(float(np.max(np.abs(b))), 1e-30)
  err = float(np.max(np.abs(a - b)))
  assert err <= tol * scale, f'{what}: max err {err:.3g} > {tol:.3g} * {scale:.3g}'


@pytest.mark.parametrize('feature', ['exp', 'trig', 'elu'])
def test_chunk_parallel_equals_xla_chunked_path(feature):
  args = _inputs(feature)
  ref_out, ref_grads = _grads(feature, 0)(*args)
  seq_out, seq_grads = _grads(feature, 1)(*args)
  names = ('q', 'k', 'v', 'w', 'feature_weights')
  for splits in (2, 5):                          # 2: segments of 3 chunks (one padded); 5: one each
    out, grads = _grads(feature, splits)(*args)
    _close(out, seq_out, 1e-5, f'{feature} P={splits} output vs P=1')
    _close(out, ref_out, 1e-5, f'{feature} P={splits} output vs XLA')
    for name, gp, gs, gr in zip(names, grads, seq_grads, ref_grads):
      assert np.all(np.isfinite(np.asarray(gp))), name
      _close(gp, gs, 2e-5, f'{feature} P={splits} grad {name} vs P=1')
      _close(gp, gr, 1e-4, f'{feature} P={splits} grad {name} vs XLA')


def _grids(fn, *args):
  """The grids of every pallas_call in ``fn``'s jaxpr (forward and custom-VJP backward)."""
  grids = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == 'pallas_call':
        grids.append(tuple(eqn.params['grid_mapping'].grid))
      for p in eqn.params.values():
        for sub in (p if isinstance(p, (tuple, list)) else (p,)):
          inner = getattr(sub, 'jaxpr', None)
          if inner is not None:
            walk(getattr(inner, 'jaxpr', inner))

  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return grids


@pytest.mark.parametrize('length,segments', [(64, 1), (200, 4), (1024, 16)])
def test_grid_grows_with_length(length, segments):
  """Grid (B, H, ceil(L / (C * 4)), feature tiles) for the default G = 4 chunks per program, forward
  and backward (M' = 16 features: one tile)."""
  q = jnp.ones((B, length, H, D))
  w = jnp.ones((H, M, D))
  loss = lambda q: jnp.sum(feature_attention(q, q, q, w, causal=True, block_k=C))
  grids = _grids(jax.grad(loss), q)
  assert grids and set(grids) == {(B, H, segments, 1)}, grids
  assert segments == -(-length // (C * 4))
