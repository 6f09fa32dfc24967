"""Linformer: softmax attention over learned length projections of K and V (Wang et al. 2020).

    out = softmax(Q (E K)^T / sqrt(d)) (F V),   E, F in R^{k x n},

so every query attends to k projected "keys" instead of n tokens: O(n k d) time and memory. E and F are
learned parameters of shape ``[linformer_k, max_length]``, shared across heads (Linformer's "headwise
sharing"), initialized N(0, 1/k) - the Johnson-Lindenstrauss projection of Linformer's Theorem 1. A
shorter input (L < max_length) uses the first L columns; a longer one is an error.

Padding: padded keys and values are zeroed *before* the projection, so their contents cannot reach any
output. (A projected key is a weighted sum over positions and cannot be "masked" afterwards.) Causal
attention is not defined: a projected key mixes all positions, so ``causal=True`` raises.

Length dependence (``AttentionSpec.length_dependent``; docs/kernels.md, "Length-dependent mechanisms"):
column i of E and F belongs to position i, so the same tokens at other positions give other outputs;
padding at the *end* is harmless (the same real tokens padded to L or 4L give the same outputs).
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from kernelformer.attention.spec import AttentionSpec

Array = jax.Array


def linformer_attention(q: Array, k: Array, v: Array, e: Array, f: Array, *,
                        mask: Array | None = None) -> Array:
  """``softmax(Q (E K)^T / sqrt(d)) (F V)``, ``e, f [k_proj, L]``; ``[B, L, H, Dv]`` in ``v.dtype``."""
  length = k.shape[1]
  if e.shape[-1] != length or f.shape[-1] != length:
    raise ValueError(f'projections must have {length} columns, got {e.shape} and {f.shape}')
  kf, vf = k.astype(jnp.float32), v.astype(jnp.float32)
  if mask is not None:
    keep = mask[:, :, None, None].astype(jnp.float32)
    kf, vf = kf * keep, vf * keep
  k_proj = jnp.einsum('cl,blhd->bchd', e.astype(jnp.float32), kf)      # [B, k, H, d]
  v_proj = jnp.einsum('cl,blhd->bchd', f.astype(jnp.float32), vf)
  logits = jnp.einsum('blhd,bchd->bhlc', q.astype(jnp.float32), k_proj) / math.sqrt(q.shape[-1])
  w = jax.nn.softmax(logits, axis=-1)
  return jnp.einsum('bhlc,bchd->blhd', w, v_proj).astype(v.dtype)


class LinformerAttention(nn.Module):
  """Linformer attention with learned E, F (``[linformer_k, max_length]``, shared across heads)."""

  linformer_k: int = 128          # projected length k; 128 as in the Skyformer LRA comparison
  max_length: int | None = None   # the task's maximum length (the encoder passes the config's)

  @nn.compact
  def __call__(self, q, k, v, *, mask=None, causal=False, step=None, deterministic=True,
               position_bias=None):
    del step, deterministic
    if causal:
      raise ValueError('linformer has no causal form: each projected key mixes all positions')
    if position_bias is not None:
      raise ValueError('linformer takes no position_bias')
    if self.max_length is None:
      raise ValueError('linformer needs max_length (its E, F projections are [linformer_k, '
                       'max_length]); set config.model.attention.max_length')
    length = k.shape[1]
    if length > self.max_length:
      raise ValueError(f'linformer got length {length} > max_length {self.max_length}')
    init = nn.initializers.normal(stddev=1.0 / math.sqrt(self.linformer_k))
    e = self.param('e', init, (self.linformer_k, self.max_length), jnp.float32)
    f = self.param('f', init, (self.linformer_k, self.max_length), jnp.float32)
    return linformer_attention(q, k, v, e[:, :length], f[:, :length], mask=mask)


SPECS = (AttentionSpec(
    name='linformer', module=LinformerAttention,
    paper='Wang et al. 2020 (Linformer), §4 (E, F length projections)',
    approximates='softmax attention through learned low-rank length projections (not a kernel estimate)',
    complexity='O(L k d) time, O(L k) memory (k = linformer_k)',
    learnable='E, F [linformer_k, max_length] (shared across heads)',
    length_dependent=('E, F have one column per absolute position: outputs depend on where the real '
                      'tokens sit, and lengths above max_length are errors (end padding is zeroed before '
                      'the projection, so padding to any length <= max_length changes nothing)')),)
