"""Padding invariance and edge cases for EVERY registered attention mechanism (``list_kernels()``).

For each name, tiny shapes (batch 2, heads 2, head dim 4) and a length (7) that no landmark count,
projection length or chunk size used here divides:

* padding invariance: rewriting the contents of padded positions (q, k and v) changes no output of a
  valid query, with one sequence partly padded and one where all but one token is padded;
* no NaN/Inf in the forward pass or in the gradient with respect to q, k, v and the parameters, at that
  length and at length 1;
* the gradient: q, k and v each reach the output; a kind with learnable parameters (learned samplers,
  learned feature maps) gives every parameter of every head a gradient, and a kind without has none.
  The forward runs at training step 7 with redraws every 5 steps (a later redraw window);
* evaluation (``step`` None) after that training step uses its draw: the same output (``features``
  collection updated by the step, ``attention/draws.py``).

Mechanisms that need a relative-position bias get one. Randomness is fixed (``rngs={'features',
'dropout'}``), so both calls of a pair see the same random features / landmarks.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelformer
from kernelformer import registry
from kernelformer.attention import random_features as rf
from kernelformer.attention import learned

B, H, D = 2, 2, 4
LENGTH = 7
# Small options every mechanism reads (the rest are ignored by build): 3 landmarks / projected keys so
# that 7 is not a multiple; 9 random features (SGQ needs >= 2 * head_dim + 1).
OPTIONS = {'num_features': 9, 'num_landmarks': 3, 'linformer_k': 3, 'max_length': LENGTH,
           'chunk_size': 4, 'num_mixture_components': 2, 'redraw_every': 5}
NAMES = kernelformer.list_kernels()
STEP = 7


def _learnable(spec) -> bool:
  """Whether the kind owns trained parameters: a learned sampler, or a learned feature map (taylor's
  only with ``map_dim`` > 0, not set here)."""
  weights = spec.fixed.get('weights')
  return weights in learned.LEARNED or (weights == 'map' and spec.fixed.get('component') != 'taylor')


def _inputs(length: int, seed: int):
  ks = jax.random.split(jax.random.PRNGKey(seed), 3)
  q, k, v = (0.5 * jax.random.normal(kk, (B, length, H, D)) for kk in ks)
  return q, k, v


def _mask(length: int):
  valid = np.zeros((B, length), bool)
  valid[0, :max(1, length - 2)] = True     # partly padded
  valid[1, :1] = True                      # all but one token padded
  return jnp.asarray(valid)


# Compiling one small program per mechanism dominates this file's run time; XLA's CPU backend compiles
# ~3x faster without LLVM optimization and without the new fusion emitters, and speed of the compiled code
# is irrelevant at these shapes. Unknown options (other jax versions) fall back to a plain compile.
_FAST_COMPILE = {'xla_backend_optimization_level': 0, 'xla_llvm_disable_expensive_passes': True,
                 'xla_cpu_use_fusion_emitters': False}


def _compile(fn, *args):
  lowered = jax.jit(fn).trace(*args).lower()
  try:
    return lowered.compile(compiler_options=_FAST_COMPILE)
  except Exception:  # pylint: disable=broad-except  (option names differ across jax versions)
    return lowered.compile()


def _finite_tree(tree) -> bool:
  return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize('name', NAMES)
def test_padding_invariance_and_finite_edge_cases(name):
  """One compiled program per mechanism: init at length 7, the forward pass on the original and on the
  padding-rewritten inputs, the gradient at length 7 (padded) and the forward pass and gradient at
  length 1."""
  spec = registry.get(name)
  module = registry.build({'kind': name, **OPTIONS})
  key = jax.random.PRNGKey(0)
  rngs = {'features': key, 'dropout': key}

  def bias_for(length):
    if not spec.requires_position_bias:
      return {}
    return {'position_bias': 0.3 * jax.random.normal(jax.random.PRNGKey(7), (H, 2 * length - 1))}

  def forward(variables, q, k, v, mask, step=jnp.int32(STEP)):
    """The output, and the ``features`` collection as the call leaves it (None without one)."""
    call = functools.partial(module.apply, variables, q, k, v, mask=mask, deterministic=True,
                             rngs=rngs, step=step, **bias_for(q.shape[1]))
    if 'features' not in variables:
      return call(), None
    y, state = call(mutable=['features'])
    return y, state['features']

  def loss(params, state, q, k, v, mask):
    y, features = forward({**state, 'params': params} if params else state, q, k, v, mask)
    return jnp.sum(jnp.where(mask[:, :, None, None], y, 0.0) ** 2), (y, features)

  # Output and gradient from one pass (has_aux), so the forward graph is not compiled twice. The
  # gradient is taken with respect to the parameters (not to state such as the cached random
  # features, which holds integers) and to q, k, v.
  grad_fn = jax.value_and_grad(loss, argnums=(0, 2, 3, 4), has_aux=True)

  def value_and_grad(variables, q, k, v, mask):
    state = {c: x for c, x in variables.items() if c != 'params'}
    return grad_fn(variables.get('params', {}), state, q, k, v, mask)

  def init(qkv, mask):
    return module.init({'params': key, **rngs}, *qkv, mask=mask, **bias_for(LENGTH))

  def everything(variables, qkv, qkv_rewritten, mask, qkv1, mask1):
    if variables is None:                      # parameters: initialized inside the same program
      variables = init(qkv, mask)
    (_, (out, features)), grads = value_and_grad(variables, *qkv, mask)
    evaluated = out
    if features is not None:               # evaluation after the step: the step's draw
      evaluated, _ = forward({**variables, 'features': features}, *qkv, mask, step=None)
    # The parameters do not depend on the length (linformer slices its projections).
    (_, (out1, _)), grads1 = value_and_grad(variables, *qkv1, mask1)
    return out, forward(variables, *qkv_rewritten, mask)[0], grads, out1, grads1, evaluated

  qkv = _inputs(LENGTH, 1)
  mask = _mask(LENGTH)
  # Every padded position's q, k, v replaced with large unrelated values.
  pad = ~mask[:, :, None, None]
  qkv_rewritten = tuple(jnp.where(pad, 5.0 * n, x) for n, x in zip(_inputs(LENGTH, 99), qkv))
  qkv1, mask1 = _inputs(1, 2), jnp.ones((B, 1), bool)
  # Most mechanisms have no variables at all: then skip compiling an init pass.
  shapes = jax.eval_shape(init, qkv, mask)
  variables = {} if not jax.tree.leaves(shapes) else None
  args = (qkv, qkv_rewritten, mask, qkv1, mask1)
  out, out2, grads, out1, grads1, evaluated = _compile(
      lambda *a: everything(variables, *a), *args)(*args)

  assert out.shape == (B, LENGTH, H, D) and out1.shape == (B, 1, H, D)
  assert _finite_tree(out), f'{name}: non-finite forward output'
  valid = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(out2)[valid], np.asarray(out)[valid], rtol=2e-5, atol=2e-6,
                             err_msg=f'{name}: padded positions changed a valid query\'s output')
  assert _finite_tree(grads), f'{name}: non-finite gradient (length {LENGTH}, padded)'
  np.testing.assert_allclose(np.asarray(evaluated), np.asarray(out), rtol=2e-5, atol=2e-6,
                             err_msg=f'{name}: evaluation after step {STEP} used another draw')
  assert _finite_tree(out1) and _finite_tree(grads1), f'{name}: non-finite at length 1'
  assert out.dtype == qkv[2].dtype
  param_grads, *qkv_grads = grads
  for what, g in zip('qkv', qkv_grads):
    assert float(jnp.max(jnp.abs(g))) > 0, f'{name}: {what} does not reach the output'
  if spec.module is rf.RandomFeatureAttention:
    # Every learnable parameter of every head receives a gradient (sampler / map params: [H, ...]).
    assert bool(jax.tree.leaves(param_grads)) == _learnable(spec), name
    for path, leaf in jax.tree_util.tree_leaves_with_path(param_grads):
      leaf = np.asarray(leaf)
      assert leaf.shape[0] == H, (name, jax.tree_util.keystr(path))
      for h in range(H):
        assert np.any(leaf[h] != 0), (name, jax.tree_util.keystr(path), h)
