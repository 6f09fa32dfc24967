"""Learned samplers redraw their noise when ``step // redraw_every`` changes.

GMM (omega = mu + Sigma^(1/2) eps) and learnable FastFood (learned S, G, B; fresh Pi and noise) keep
their parameters across steps but must draw new noise in each redraw window, like every fixed sampler:
the same window gives the same output, the next window another; evaluation (step None) the draw of
the last training step stored in the ``features`` collection (the first before any).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import registry

B, L, H, D = 2, 12, 2, 8
REDRAW = 10


@pytest.mark.parametrize('name', ['gmm-rks', 'gmm-prf', 'trigrf-fastfoodl'])
def test_learned_sampler_redraws_per_window(name):
  module = registry.build({'kind': name, 'num_features': 8, 'redraw_every': REDRAW})
  kq, kk, kv = jax.random.split(jax.random.key(0), 3)
  q, k, v = (jax.random.normal(x, (B, L, H, D)) for x in (kq, kk, kv))
  rngs = {'params': jax.random.key(1), 'features': jax.random.key(2)}
  variables = module.init(rngs, q, k, v)
  feats = {'features': rngs['features']}

  def at(step):
    return module.apply(variables, q, k, v, step=step, rngs=feats)

  out = jax.jit(lambda: {'0': at(jnp.int32(0)), 'last': at(jnp.int32(REDRAW - 1)),
                         'next': at(jnp.int32(REDRAW)), 'eval': at(None)})()
  out = jax.tree.map(np.asarray, out)
  np.testing.assert_array_equal(out['0'], out['last'])       # one window: one draw
  assert not np.allclose(out['0'], out['next'], atol=1e-6)  # the next window: a new draw
  np.testing.assert_array_equal(out['eval'], out['0'])       # evaluation before training: draw 0
  # After a step of the next window (the collection updated), evaluation uses that window's draw.
  _, state = jax.jit(lambda: module.apply(variables, q, k, v, step=jnp.int32(REDRAW), rngs=feats,
                                          mutable=['features']))()
  after = jax.jit(lambda: module.apply({**variables, **state}, q, k, v, step=None, rngs=feats))()
  np.testing.assert_allclose(np.asarray(after), out['next'], rtol=1e-5, atol=1e-6)
