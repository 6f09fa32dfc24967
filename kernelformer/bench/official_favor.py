"""A re-implementation of the official Performer JAX FAVOR+ (for ``benchmark attention --compare official``).

Written from the Performer paper (Choromanski et al. 2021, "Rethinking Attention with Performers",
Lemma 1 and eq. 7, Algorithm 1 / appendix B.1 for the causal prefix sums) and the documentation of the
google-research ``performer/fast_attention/jax/fast_attention.py`` module, to measure the project's
attention against the algorithm as its authors run it, at equal shapes, in one process. It reproduces
that code's choices, not the project's:

* **Features** (``softmax_kernel_features``; the official ``nonnegative_softmax_kernel_feature_creator``):
  ``phi(x)_r = M^-1/2 (exp(c w_r.x - c^2 |x|^2 / 2 - s) + eps)``, ``c = d^-1/4``, ``eps = 1e-4``; s the
  max of ``c w_r.x`` over the row's features for queries and over the whole key tensor for keys, not
  under ``stop_gradient``;
* length-first ``[L, B, H, M]`` einsums (``noncausal_numerator`` / ``noncausal_denominator``, ``ksum``
  against a ones vector), ``out = num / den`` with no guard;
* causal: prefix sums by ``lax.scan`` over positions with the official hand-written ``custom_vjp``
  (a reverse scan subtracting each position's ``k v^T`` from the final state);
* masks: none in the official module; here padded keys get zero features (eps included), the minimal
  change that gives it the project's semantics (docs/benchmarks.md, "Against the official FAVOR+").

W is passed in (``[M, d]``, one matrix for all heads, as the official ``projection_matrix``); the
benchmark draws it with the project's ORF sampler so both sides use the same matrix.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

Array = jax.Array

NUMERICAL_STABILIZER = 1e-4


def softmax_kernel_features(x: Array, w: Array, *, is_query: bool, normalize_data: bool = True,
                            eps: float = NUMERICAL_STABILIZER) -> Array:
  """Positive softmax-kernel features of ``x [B, L, H, d]`` for ``w [M, d]``: ``[B, L, H, M]``."""
  d = x.shape[-1]
  m = w.shape[0]
  c = d ** -0.25 if normalize_data else 1.0
  dash = jnp.einsum('blhd,md->blhm', c * x, w)
  diag = 0.5 * (c * c) * jnp.sum(x * x, axis=-1, keepdims=True)
  shift = jnp.max(dash, axis=-1, keepdims=True) if is_query else jnp.max(dash)
  return m ** -0.5 * (jnp.exp(dash - diag - shift) + eps)


def noncausal_numerator(qs: Array, ks: Array, vs: Array) -> Array:
  """``phi(Q) (phi(K)^T V)`` in length-first layout: ``qs, ks [L, B, H, M]``, ``vs [L, B, H, D]``."""
  kvs = jnp.einsum('lbhm,lbhd->bhmd', ks, vs)
  return jnp.einsum('lbhm,bhmd->lbhd', qs, kvs)


def noncausal_denominator(qs: Array, ks: Array) -> Array:
  """``phi(Q) phi(K)^T 1``: the key features summed by an einsum against a ones vector, ``[L, B, H]``."""
  ones = jnp.ones((ks.shape[0],), ks.dtype)
  ks_sum = jnp.einsum('lbhm,l->bhm', ks, ones)
  return jnp.einsum('lbhm,bhm->lbh', qs, ks_sum)


@jax.custom_vjp
def causal_numerator(qs: Array, ks: Array, vs: Array) -> Array:
  """``out_i = phi(q_i) sum_{j<=i} phi(k_j) v_j^T``: prefix sums by ``lax.scan`` over positions."""
  return _causal_numerator_fwd(qs, ks, vs)[0]


def _causal_numerator_fwd(qs, ks, vs):
  def step(state, x):
    q, k, v = x
    state = state + jnp.einsum('bhm,bhd->bhmd', k, v)
    return state, jnp.einsum('bhm,bhmd->bhd', q, state)

  init = jnp.zeros(qs.shape[1:] + vs.shape[-1:], qs.dtype)
  final, out = jax.lax.scan(step, init, (qs, ks, vs))
  return out, (final, qs, ks, vs)


def _causal_numerator_bwd(res, g):
  final, qs, ks, vs = res

  def step(carry, x):
    state, grad_state = carry
    q, k, v, gi = x
    grad_state = grad_state + jnp.einsum('bhm,bhd->bhmd', q, gi)
    grad_q = jnp.einsum('bhd,bhmd->bhm', gi, state)
    grad_k = jnp.einsum('bhmd,bhd->bhm', grad_state, v)
    grad_v = jnp.einsum('bhmd,bhm->bhd', grad_state, k)
    state = state - jnp.einsum('bhm,bhd->bhmd', k, v)
    return (state, grad_state), (grad_q, grad_k, grad_v)

  _, (gq, gk, gv) = jax.lax.scan(step, (final, jnp.zeros_like(final)), (qs, ks, vs, g),
                                 reverse=True)
  return gq, gk, gv


causal_numerator.defvjp(_causal_numerator_fwd, _causal_numerator_bwd)


@jax.custom_vjp
def causal_denominator(qs: Array, ks: Array) -> Array:
  """``den_i = phi(q_i). sum_{j<=i} phi(k_j)``: prefix sums by ``lax.scan``, ``[L, B, H]``."""
  return _causal_denominator_fwd(qs, ks)[0]


def _causal_denominator_fwd(qs, ks):
  def step(state, x):
    q, k = x
    state = state + k
    return state, jnp.sum(q * state, axis=-1)

  final, out = jax.lax.scan(step, jnp.zeros(qs.shape[1:], qs.dtype), (qs, ks))
  return out, (final, qs, ks)


def _causal_denominator_bwd(res, g):
  final, qs, ks = res

  def step(carry, x):
    state, grad_state = carry
    q, k, gi = x
    grad_state = grad_state + q * gi[..., None]
    grad_q = state * gi[..., None]
    grad_k = grad_state
    state = state - k
    return (state, grad_state), (grad_q, grad_k)

  _, (gq, gk) = jax.lax.scan(step, (final, jnp.zeros_like(final)), (qs, ks, g), reverse=True)
  return gq, gk


causal_denominator.defvjp(_causal_denominator_fwd, _causal_denominator_bwd)


def favor_attention(q: Array, k: Array, v: Array, w: Array, *, mask: Optional[Array] = None,
                    causal: bool = False, eps: float = NUMERICAL_STABILIZER) -> Array:
  """Official-style FAVOR+ softmax attention: ``q, k, v [B, L, H, d]``, ``w [M, d]`` -> ``[B, L, H, d]``.

  ``mask [B, S]`` (True = real key) zeroes padded keys' features (see the module docstring).
  """
  qp = softmax_kernel_features(q, w, is_query=True, eps=eps)
  kp = softmax_kernel_features(k, w, is_query=False, eps=eps)
  if mask is not None:
    kp = kp * mask[:, :, None, None].astype(kp.dtype)
  # Length first, as the official code lays the attention dimensions out.
  qp, kp, vt = (jnp.moveaxis(x, 1, 0) for x in (qp, kp, v))
  if causal:
    num, den = causal_numerator(qp, kp, vt), causal_denominator(qp, kp)
  else:
    num, den = noncausal_numerator(qp, kp, vt), noncausal_denominator(qp, kp)
  out = num / den[..., None]
  return jnp.moveaxis(out, 0, 1)
