"""Hedgehog's attention distillation (Zhang et al. 2024, "The Hedgehog & the Porcupine", section 4.1).

A learned feature map is trained to mimic softmax attention: for the same queries and keys, the teacher
is softmax attention ``T = softmax(q k^T / sqrt(d))`` (under ``stop_gradient``), the student the map's
normalised linear-attention weights ``A_ij = phi(q_i).phi(k_j) / sum_j' phi(q_i).phi(k_j')``, and the loss
the cross-entropy ``-sum_j T_ij log A_ij`` averaged over the (valid) query rows, heads and batch. Masked
keys (and, causally, later keys) are excluded from both distributions; rows of padded queries from the
mean. The student sees q and k under ``stop_gradient`` too, so this loss trains only the map's own
parameters (Hedgehog's W), as the paper's distillation stage does (the rest of the model frozen).

``RandomFeatureAttention`` computes it only when ``distill_weight > 0`` *and* the trainer asks for the
``DISTILL_COLLECTION`` collection (``mutable``), and sows ``distill_weight * loss`` there; the trainer adds
the sown values of all layers to the task loss and logs their sum as ``aux_loss``. It forms the [L, S]
matrices, O(L^2) per head, so it is meant for short training sequences; off (weight 0, the default) it
costs nothing and the train step is unchanged.
"""
from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp

Array = jax.Array

DISTILL_COLLECTION = 'aux_loss'
_TINY = 1e-30


def attention_distillation_loss(q: Array, k: Array, phi_q: Array, phi_k: Array, *,
                                mask: Optional[Array] = None, causal: bool = False) -> Array:
  """Mean cross-entropy between softmax attention of (q, k) and the map's normalised attention.

  ``q [B, L, H, d]``, ``k [B, S, H, d]`` (the map's inputs), ``phi_q [B, L, H, M']``, ``phi_k [B, S, H, M']``,
  ``mask [B, S]`` (True = real key; with L = S also the real queries). Computed in float32 (or wider).
  """
  dt = jnp.promote_types(q.dtype, jnp.float32)
  q, k = jax.lax.stop_gradient(q.astype(dt)), jax.lax.stop_gradient(k.astype(dt))
  b, l, _, d = q.shape
  s = k.shape[1]
  valid = jnp.ones((b, 1, l, s), bool)
  if mask is not None:
    valid = valid & jnp.asarray(mask, bool)[:, None, None, :]
  if causal:
    valid = valid & jnp.tril(jnp.ones((l, s), bool))
  logits = jnp.einsum('blhd,bshd->bhls', q, k) / math.sqrt(d)
  logits = jnp.where(valid, logits, jnp.finfo(dt).min)
  teacher = jnp.where(valid, jax.nn.softmax(logits, axis=-1), 0.0)
  scores = jnp.einsum('blhm,bshm->bhls', phi_q.astype(dt), phi_k.astype(dt))
  scores = jnp.where(valid, scores, 0.0)
  student = scores / jnp.maximum(jnp.sum(scores, axis=-1, keepdims=True), _TINY)
  ce = -jnp.sum(jnp.where(valid, teacher * jnp.log(jnp.maximum(student, _TINY)), 0.0), axis=-1)
  rows = jnp.any(valid, axis=-1)                                        # [B, 1|H, L]
  if mask is not None and l == s:
    rows = rows & jnp.asarray(mask, bool)[:, None, :]
  rows = jnp.broadcast_to(rows, ce.shape)
  return jnp.sum(jnp.where(rows, ce, 0.0)) / jnp.maximum(jnp.sum(rows), 1)
