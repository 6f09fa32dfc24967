"""Shared by the attention tests: a jit that compiles with XLA's cheapest CPU settings.

These tests are dominated by XLA compile time, not run time, so each test's computation is compiled
once with no LLVM optimization and no fusion emitters (~3x faster to compile; numerics we assert on
are unchanged). Import as ``from tests.attention.helpers import fast_jit``: ``tests`` is a namespace
package found through pytest.ini's ``pythonpath = .``, and the qualified name keeps this module apart
from the other test directories' helpers.
"""
from __future__ import annotations

import jax

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
