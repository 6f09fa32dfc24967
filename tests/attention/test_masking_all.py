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
# that 7 is not a multiple; 9 random features (SGQ needs >= 2 * head_dim + 1).
OPTIONS = {'num_features': 9, 'num_landmarks': 3, 'linformer_k': 3, 'max_length': LENGTH,
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


def _setup(name: str):
  """The module, its variables (initialized at LENGTH) and an apply function for any length.

  Calls run eagerly (op by op): the ~60 mechanisms share most primitives, whose compilations JAX caches,
  which is several times cheaper than compiling one program per mechanism.
  """
  spec = registry.get(name)
  module = registry.build({'kind': name, **OPTIONS})
  key = jax.random.PRNGKey(0)
  rngs = {'features': key, 'dropout': key}

  def bias_for(length):
    if not spec.requires_position_bias:
      return {}
    return {'position_bias': 0.3 * jax.random.normal(jax.random.PRNGKey(7), (H, 2 * length - 1))}

  q, k, v = _inputs(LENGTH, 1)
  variables = module.init({'params': key, **rngs}, q, k, v, mask=_mask(LENGTH), **bias_for(LENGTH))

  def forward(variables, q, k, v, mask):
    return module.apply(variables, q, k, v, mask=mask, deterministic=True, rngs=rngs,
                        **bias_for(q.shape[1]))

  return forward, variables


def _finite_tree(tree) -> bool:
  return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize('name', NAMES)
def test_padding_invariance_and_finite_edge_cases(name):
  forward, variables = _setup(name)
  q, k, v = _inputs(LENGTH, 1)
  mask = _mask(LENGTH)
  out = forward(variables, q, k, v, mask)
  assert out.shape == (B, LENGTH, H, D)
  assert _finite_tree(out), f'{name}: non-finite forward output'

  # Replace every padded position's q, k, v with large unrelated values.
  pad = ~mask[:, :, None, None]
  noise = _inputs(LENGTH, 99)
  q2, k2, v2 = (jnp.where(pad, 5.0 * n, x) for n, x in zip(noise, (q, k, v)))
  out2 = forward(variables, q2, k2, v2, mask)
  valid = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(out2)[valid], np.asarray(out)[valid], rtol=2e-5, atol=2e-6,
                             err_msg=f'{name}: padded positions changed a valid query\'s output')

  def loss(variables, q, k, v, mask):
    y = forward(variables, q, k, v, mask)
    return jnp.sum(jnp.where(mask[:, :, None, None], y, 0.0) ** 2)

  grads = jax.grad(loss, argnums=(0, 1, 2, 3))(variables, q, k, v, mask)
  assert _finite_tree(grads), f'{name}: non-finite gradient (length {LENGTH}, padded)'

  # Length 1 (the parameters do not depend on the length; linformer slices its projections).
  q1, k1, v1 = _inputs(1, 2)
  mask1 = jnp.ones((B, 1), bool)
  out1 = forward(variables, q1, k1, v1, mask1)
  grads1 = jax.grad(loss, argnums=(0, 1, 2, 3))(variables, q1, k1, v1, mask1)
  assert out1.shape == (B, 1, H, D)
  assert _finite_tree(out1) and _finite_tree(grads1), f'{name}: non-finite at length 1'
