"""Padding invariance and edge cases for EVERY registered attention mechanism (``list_kernels()``).

For each name, tiny shapes (batch 2, heads 2, head dim 4) and a length (7) that no landmark count,
projection length or chunk size used here divides:

* padding invariance: rewriting the contents of padded positions (q, k and v) changes no output of a
  valid query, with one sequence partly padded and one where all but one token is padded;
* no NaN/Inf in the forward pass or in the gradient with respect to q, k, v and the parameters, at that
  length and at length 1.

Mechanisms that need a relative-position bias get one. Randomness is fixed (``rngs={'features',
'dropout'}``), so both calls of a pair see the same random features / landmarks.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelformer
from kernelformer import registry

B, H, D = 2, 2, 4
LENGTH = 7
# Small options every mechanism reads (the rest are ignored by build): 3 landmarks / projected keys so
# that 7 is not a multiple, 8 random features.
OPTIONS = {'num_features': 8, 'num_landmarks': 3, 'linformer_k': 3, 'max_length': LENGTH,
           'chunk_size': 4, 'num_mixture_components': 2}
NAMES = kernelformer.list_kernels()


def _inputs(length: int, seed: int):
  ks = jax.random.split(jax.random.PRNGKey(seed), 3)
  q, k, v = (0.5 * jax.random.normal(kk, (B, length, H, D)) for kk in ks)
  return q, k, v


def _mask(length: int):
  valid = np.zeros((B, length), bool)
  valid[0, :max(1, length - 2)] = True     # partly padded
  valid[1, :1] = True                      # all but one token padded
  return jnp.asarray(valid)


def _setup(name: str, length: int):
  spec = registry.get(name)
  module = registry.build({'kind': name, **OPTIONS})
  bias = None
  if spec.requires_position_bias:
    bias = 0.3 * jax.random.normal(jax.random.PRNGKey(7), (H, 2 * length - 1))
  key = jax.random.PRNGKey(0)
  rngs = {'features': key, 'dropout': key}
  q, k, v = _inputs(length, 1)
  mask = _mask(length)
  variables = module.init({'params': key, **rngs}, q, k, v, mask=mask, position_bias=bias)

  @jax.jit
  def forward(variables, q, k, v):
    extra = {} if bias is None else {'position_bias': bias}
    return module.apply(variables, q, k, v, mask=mask, deterministic=True, rngs=rngs,
                        mutable=False, **extra)

  return forward, variables, (q, k, v), mask


def _finite_tree(tree) -> bool:
  return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize('name', NAMES)
def test_padding_invariance_and_finite_gradients(name):
  forward, variables, (q, k, v), mask = _setup(name, LENGTH)
  out = forward(variables, q, k, v)
  assert out.shape == (B, LENGTH, H, D)
  assert _finite_tree(out), f'{name}: non-finite forward output'

  # Replace every padded position's q, k, v with large unrelated values.
  pad = ~mask[:, :, None, None]
  noise = _inputs(LENGTH, 99)
  q2, k2, v2 = (jnp.where(pad, 5.0 * n, x) for n, x in zip(noise, (q, k, v)))
  out2 = forward(variables, q2, k2, v2)
  valid = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(out2)[valid], np.asarray(out)[valid], rtol=2e-5, atol=2e-6,
                             err_msg=f'{name}: padded positions changed a valid query\'s output')

  def loss(variables, q, k, v):
    y = forward(variables, q, k, v)
    return jnp.sum(jnp.where(mask[:, :, None, None], y, 0.0) ** 2)

  grads = jax.grad(loss, argnums=(0, 1, 2, 3))(variables, q, k, v)
  assert _finite_tree(grads), f'{name}: non-finite gradient'


@pytest.mark.parametrize('name', NAMES)
def test_length_one(name):
  forward, variables, (q, k, v), _ = _setup(name, 1)
  out = forward(variables, q, k, v)
  assert out.shape == (B, 1, H, D)
  grads = jax.grad(lambda *a: jnp.sum(forward(*a) ** 2), argnums=(0, 1, 2, 3))(variables, q, k, v)
  assert _finite_tree(out) and _finite_tree(grads), f'{name}: non-finite at length 1'
