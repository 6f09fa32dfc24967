"""Softmax attention, the "original Transformer" baseline (Vaswani et al. 2017, eq. 1).

``softmax(Q K^T / sqrt(d)) V`` with a key padding mask and an optional causal mask. Without dropout it
calls ``jax.nn.dot_product_attention``: on a GPU with bf16/fp16 inputs the cuDNN flash kernel (key padding
expressed as ``key_value_seq_lengths``, which assumes right padding, as every ``lra_tasks`` pipeline
produces), elsewhere XLA. ``implementation=None`` is decided here, not passed on: jax's own ``None``
means XLA in jax 0.10 (its source: "defaults to XLA for now").

It falls back, with memory quadratic in L (docs/kernels.md, "Which softmax cases get cuDNN flash
attention"), for attention dropout in training (the ``[B, H, L, S]`` float32 weights formed explicitly,
``softmax_weights``: no fused kernel takes dropout; set ``attention_dropout=0`` for flash), for a
position bias (XLA unless ``implementation='cudnn'``) and for float32 inputs or any CPU (XLA).

Relative-position bias (Luo et al. 2021, eq. 6): with ``position_bias`` ``b [H, 2L - 1]`` the logits are
``q.k / sqrt(d) + b_{j-i}``, the exact quadratic form that ``nprf-rpe`` approximates by FFT; the bias
goes to ``jax.nn.dot_product_attention`` as a dense ``[1, H, L, L]`` array.
"""
from __future__ import annotations

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp

from kernelformer.attention.spec import AttentionSpec
from kernelformer.attention.rpe import relative_bias_matrix


def _bias_array(position_bias, length, dtype):
  """``[1, H, L, L]`` logit bias from ``b [H, 2L - 1]`` (None stays None)."""
  if position_bias is None:
    return None
  return relative_bias_matrix(position_bias, length)[None].astype(dtype)


def softmax_attention(q, k, v, *, mask=None, causal=False, implementation=None,
                      position_bias=None):
  """Pure softmax attention on ``[B, L, H, D]`` inputs; ``implementation`` as in jax.

  ``position_bias`` ``[H, 2L - 1]`` adds ``b_{j-i}`` to the logits (self-attention: L queries = L keys).
  """
  if position_bias is not None and q.shape[1] != k.shape[1]:
    raise ValueError(f'position_bias needs as many queries as keys, got {q.shape[1]} and {k.shape[1]}')
  if implementation is None:
    on_gpu = jax.default_backend() == 'gpu'
    half = q.dtype in (jnp.bfloat16, jnp.float16)
    implementation = 'cudnn' if on_gpu and half and position_bias is None else 'xla'
  bias = _bias_array(position_bias, k.shape[1], q.dtype)
  if implementation == 'cudnn':
    lengths = None
    if mask is not None:
      lengths = jnp.sum(mask, axis=-1).astype(jnp.int32)
      lengths_q = jnp.full_like(lengths, q.shape[1])
    return jax.nn.dot_product_attention(
        q, k, v, bias=bias, is_causal=causal, implementation='cudnn',
        query_seq_lengths=None if lengths is None else lengths_q,
        key_value_seq_lengths=lengths)
  bias_mask = None if mask is None else mask[:, None, None, :]
  return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=bias_mask, is_causal=causal,
                                      implementation=implementation)


def softmax_weights(q, k, *, mask=None, causal=False, position_bias=None):
  """The explicit ``[B, H, L, S]`` attention matrix (float32), for dropout and for tests.

  ``position_bias`` ``[H, 2L - 1]`` adds ``b_{j-i}`` to the logits (Luo et al. eq. 6).
  """
  logits = jnp.einsum('blhd,bshd->bhls', q.astype(jnp.float32), k.astype(jnp.float32))
  logits = logits / jnp.sqrt(q.shape[-1]).astype(jnp.float32)
  if position_bias is not None:
    logits = logits + _bias_array(position_bias, k.shape[1], jnp.float32)
  allowed = jnp.ones(logits.shape[-2:], dtype=bool)[None, None]
  if causal:
    allowed = allowed & jnp.tril(jnp.ones(logits.shape[-2:], dtype=bool))
  if mask is not None:
    allowed = allowed & mask[:, None, None, :]
  logits = jnp.where(allowed, logits, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits, axis=-1)


class SoftmaxAttention(nn.Module):
  """Exact softmax attention (quadratic)."""

  attention_dropout: float = 0.0   # dropout on the attention weights (LRA configs use 0.1)
  implementation: str | None = None  # None: cuDNN on GPU for half inputs, else XLA

  @nn.compact
  def __call__(self, q, k, v, *, mask=None, causal=False, step=None, deterministic=True,
               position_bias=None):
    del step  # no random features
    if self.attention_dropout > 0.0 and not deterministic:
      if jax.default_backend() == 'gpu':   # once per trace: the quadratic fallback (module docstring)
        logging.warning('softmax attention with attention_dropout=%g in training forms the [B, H, L, '
                        'S] weights (L=%d, no flash kernel takes dropout); attention_dropout=0 uses '
                        'cuDNN flash', self.attention_dropout, q.shape[1])
      w = softmax_weights(q, k, mask=mask, causal=causal, position_bias=position_bias)
      w = nn.Dropout(rate=self.attention_dropout)(w, deterministic=False)
      return jnp.einsum('bhls,bshd->blhd', w, v.astype(jnp.float32)).astype(v.dtype)
    return softmax_attention(q, k, v, mask=mask, causal=causal,
                             implementation=self.implementation, position_bias=position_bias)


SPECS = (AttentionSpec(
    name='softmax', module=SoftmaxAttention,
    paper='Vaswani et al. 2017, eq. 1', approximates='softmax kernel exp(q.k/sqrt(d)) (exact)',
    complexity='O(L^2 d) time, O(L^2) memory (O(L) with flash/cuDNN)',
    aliases=('ot', 'transformer', 'original'),
    supports_position_bias=True),)
