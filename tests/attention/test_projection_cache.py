"""Redraw only when due: the ``features`` collection of RandomFeatureAttention.

A fixed sampler's W is drawn once per redraw window and kept in the ``features`` collection; the train
step reuses it while ``step // redraw_every`` is unchanged and draws anew when it changes; evaluation
reads the stored W, the last training step's draw (``attention/draws.py``). These tests pin (a) the
same draws as drawing at every call, across windows, (b) that the stored W really is what a step
inside its window uses (so the sampler is not run there), (c) that a new window replaces it, and (d)
that evaluation uses the draw of the last training step, and draw 0 before any.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import registry
from tests.attention.helpers import fast_jit

B, L, H, D = 2, 6, 2, 8
REDRAW = 3


def _setup(kind: str):
  module = registry.build({'kind': kind, 'num_features': 17, 'redraw_every': REDRAW})
  ks = jax.random.split(jax.random.PRNGKey(0), 3)
  q, k, v = (jax.random.normal(kk, (B, L, H, D)) for kk in ks)
  rngs = {'features': jax.random.PRNGKey(5)}
  variables = module.init({'params': jax.random.PRNGKey(1), **rngs}, q, k, v)
  return module, (q, k, v), rngs, variables


def _cached_step(module, rngs):
  def run(variables, qkv, step):
    out, state = module.apply(variables, *qkv, step=step, rngs=rngs, mutable=['features'])
    return out, state['features']
  return fast_jit(run)


def _ulp_sensitivity(cached, state, qkv, step):
  """Per query row, how far the output of ``step`` moves when the stored draw it reuses is perturbed
  by one float32 ulp (relative 2^-23, random signs): the precision the math guarantees for "the same
  draw, rounded differently" -- it scales with the row's conditioning (trigonometric features can
  cancel in the normalizer, making rows of |out| ~ 200 whose float32 error is ~1e-3)."""
  signs = jax.random.rademacher(jax.random.PRNGKey(9), (), jnp.float32)
  def nudge(x):
    if not jnp.issubdtype(x.dtype, jnp.floating):
      return x
    noise = jax.random.rademacher(jax.random.PRNGKey(x.size), x.shape, x.dtype) * signs
    return x * (1 + noise * 2.0 ** -23)
  base, _ = cached(state, qkv, step)
  nudged, _ = cached({**state, 'features': _replace_train(state['features'], nudge)}, qkv, step)
  return np.max(np.abs(np.asarray(nudged) - np.asarray(base)), axis=-1, keepdims=True)


def _assert_same_draw(got, want, sensitivity, what):
  """``got`` equals ``want`` within 16 ulps' worth of the draw (``_ulp_sensitivity``) per row: a
  different draw moves the output by O(1) of its size, 10^5+ times more."""
  got, want = np.asarray(got), np.asarray(want)
  bound = 16 * sensitivity + 1e-6 * np.max(np.abs(want), axis=-1, keepdims=True)
  excess = np.abs(got - want) - bound
  assert (excess <= 0).all(), (f'{what}: max |difference| {np.abs(got - want).max():.3g}, '
                               f'exceeds 16 ulps of the draw by {excess.max():.3g}')


@pytest.mark.parametrize('kind', ['posrf-orf', 'posrf-mm', 'trigrf-fastfood', 'posrf-sgq'])
def test_cached_draws_are_bit_identical_to_drawing_every_step(kind):
  module, qkv, rngs, variables = _setup(kind)
  assert 'features' in variables
  params_only = {c: x for c, x in variables.items() if c != 'features'}
  fresh = fast_jit(lambda qkv, step: module.apply(params_only, *qkv, step=step, rngs=rngs))
  cached = _cached_step(module, rngs)
  state = variables
  for step in range(2 * REDRAW + 1):       # three windows
    out, features = cached(state, qkv, jnp.int32(step))
    state = {**state, 'features': features}
    # The same draws; equal to float32 rounding, not always bitwise: drawn inside the attention
    # program, XLA may fuse the sampler's last arithmetic (MM's U V^T, FastFood's scalings) with its
    # consumers, while the cached draw is computed on its own -- how, depends on the CPU's vector ISA
    # (observed: bitwise under SSE4.2; 1e-6 for mm, and 1e-5 relative for fastfood's large rows,
    # under AVX2 and AVX-512). So compared at the precision the draw's rounding allows.
    window_step = jnp.int32(step // REDRAW * REDRAW + 1)   # reuses the draw just stored
    _assert_same_draw(out, fresh(qkv, jnp.int32(step)),
                      _ulp_sensitivity(cached, state, qkv, window_step), f'{kind} step {step}')
    assert _index(features) == step // REDRAW


def _index(features) -> int:
  """The stored training-draw index (every layer holds the same one)."""
  return int(next(x for p, x in jax.tree_util.tree_leaves_with_path(features)
                  if 'train_index' in jax.tree_util.keystr(p)))


def _replace_train(features, fn):
  """``features`` with every stored training-draw leaf replaced by ``fn(leaf)``."""
  def swap(path, x):
    return fn(x) if "'train'" in jax.tree_util.keystr(path) else x
  return jax.tree_util.tree_map_with_path(swap, features)


def test_a_step_inside_its_window_uses_the_stored_draw_and_a_new_window_replaces_it():
  module, qkv, rngs, variables = _setup('posrf-orf')
  cached = _cached_step(module, rngs)
  out0, features = cached(variables, qkv, jnp.int32(0))
  # Tamper with the stored W: a step of the same window must use it (the sampler did not run) ...
  tampered = {**variables, 'features': _replace_train(features, lambda w: 0.5 * w)}
  out1, kept = cached(tampered, qkv, jnp.int32(1))
  assert not np.allclose(out1, out0)
  out1_again, _ = cached(tampered, qkv, jnp.int32(2))
  np.testing.assert_array_equal(out1, out1_again)
  for got, want in zip(jax.tree.leaves(kept), jax.tree.leaves(tampered['features'])):
    np.testing.assert_array_equal(got, want)
  # ... and the first step of the next window draws anew, as if nothing had been stored.
  out3, renewed = cached(tampered, qkv, jnp.int32(REDRAW))
  fresh3, _ = cached(variables, qkv, jnp.int32(REDRAW))
  np.testing.assert_array_equal(out3, fresh3)
  assert _index(renewed) == 1


def test_evaluation_reads_the_last_training_draw():
  module, qkv, rngs, variables = _setup('posrf-orf')
  cached = _cached_step(module, rngs)
  evaluate = fast_jit(lambda v, qkv: module.apply(v, *qkv, step=None, rngs=rngs))
  later = jnp.int32(2 * REDRAW + 1)                                    # a later window
  train_later, features = cached(variables, qkv, later)
  after = evaluate({**variables, 'features': features}, qkv)
  # The same stored W in both calls, rounded as each program's fusion makes it.
  sensitivity = _ulp_sensitivity(cached, {**variables, 'features': features}, qkv, later)
  _assert_same_draw(after, train_later, sensitivity, 'evaluation after a later step')
  # Before any training step: draw 0, the same as drawn fresh with parameters only.
  before = evaluate(variables, qkv)
  assert not np.allclose(before, after)
  params_only = {c: x for c, x in variables.items() if c != 'features'}
  sensitivity0 = _ulp_sensitivity(cached, variables, qkv, jnp.int32(1))
  _assert_same_draw(before, evaluate(params_only, qkv), sensitivity0, 'evaluation, drawn fresh')
  train0, _ = cached(variables, qkv, jnp.int32(0))
  _assert_same_draw(before, train0, sensitivity0, 'train step 0')        # index 0 is the same draw


def test_learned_samplers_keep_only_the_draw_index():
  # Their W depends on the parameters, so it is drawn inside every differentiated step; the
  # collection holds the index evaluation draws with.
  module, qkv, rngs, variables = _setup('gmm-rks')
  assert jax.tree.map(jnp.shape, variables['features']) == {'train_index': ()}
  cached = _cached_step(module, rngs)
  train_later, features = cached(variables, qkv, jnp.int32(2 * REDRAW))
  assert _index(features) == 2
  after = fast_jit(lambda v, qkv: module.apply(v, *qkv, step=None, rngs=rngs))(
      {**variables, 'features': features}, qkv)
  np.testing.assert_allclose(after, train_later, rtol=1e-5, atol=1e-6)
