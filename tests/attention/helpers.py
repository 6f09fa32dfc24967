"""Shared by the attention tests: a jit that compiles with XLA's cheapest CPU settings.

These tests are dominated by XLA compile time, not run time, so each test's computation is compiled
once with no LLVM optimization and no fusion emitters (~3x faster to compile; numerics we assert on
are unchanged). Import as ``from tests.attention.helpers import fast_jit``: ``tests`` is a namespace
package found through pytest.ini's ``pythonpath = .``, and the qualified name keeps this module apart
from the other test directories' helpers.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernelformer.features import projection

# Option names unknown to another jax version fall back to a plain jit (see fast_jit).
FAST_COMPILE = {'xla_backend_optimization_level': 0, 'xla_llvm_disable_expensive_passes': True,
                'xla_cpu_use_fusion_emitters': False}


def fast_jit(fn, **jit_kwargs):
  """``jax.jit(fn, **jit_kwargs)`` compiled with ``FAST_COMPILE``, or plainly if jax rejects an option."""
  fast = jax.jit(fn, compiler_options=FAST_COMPILE, **jit_kwargs)
  plain = jax.jit(fn, **jit_kwargs)

  def call(*args, **kwargs):
    try:
      return fast(*args, **kwargs)
    except Exception as e:  # pylint: disable=broad-except
      if 'compile option' not in str(e):
        raise
      return plain(*args, **kwargs)

  return call


def example_params(component: str, head_dim: int, key, *, num_features: int = 16,
                   map_dim: int = 4, scale: float = 0.5):
  """One head's parameters of ``component`` away from their initial values (tests)."""
  d = head_dim
  k1, k2 = jax.random.split(key)
  if component == 'taylor':
    return (jax.random.normal(k1, (map_dim, d)) * d ** -0.5,)
  if component == 'hedgehog':
    return (jnp.eye(d) + scale * jax.random.normal(k1, (d, d)) * d ** -0.5,)
  if component == 't2r':
    return (jax.random.normal(k1, (num_features, d)) * d ** -0.5, scale * jax.random.normal(k2, (num_features,)))
  if component == 'rebased':
    return (1.0 + scale * jax.random.normal(k1, (d,)), scale * jax.random.normal(k2, (d,)))
  if component == 'polysketch':
    return projection.Projection(matrix=jax.random.normal(k1, (num_features + num_features % 2, d)))
  if component == 'polysketch_learned':
    k3, k4 = jax.random.split(k2)
    return (1.0 + scale * jax.random.normal(k1, (d,)), scale * jax.random.normal(k2, (d,)),
            jax.random.normal(k3, (map_dim, d)) * d ** -0.5, jax.random.normal(k4, (map_dim, d)) * d ** -0.5)
  return None
