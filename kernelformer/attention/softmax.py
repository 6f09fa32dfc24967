"""Softmax attention, the "original Transformer" baseline (Vaswani et al. 2017, eq. 1).

``softmax(Q K^T / sqrt(d)) V`` with a key padding mask and an optional causal mask. Without dropout it
calls ``jax.nn.dot_product_attention``: on a GPU with bf16/fp16 inputs the cuDNN flash kernel (key padding
expressed as ``key_value_seq_lengths``, which assumes right padding, as every ``lra_tasks`` pipeline
produces), elsewhere XLA. With attention dropout in training the weights are formed explicitly, as the
fused kernels take no dropout.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from kernelformer import registry


def softmax_attention(q, k, v, *, mask=None, causal=False, implementation=None):
  """Pure softmax attention on ``[B, L, H, D]`` inputs; ``implementation`` as in jax."""
  if implementation is None:
    on_gpu = jax.default_backend() == 'gpu'
    implementation = 'cudnn' if on_gpu and q.dtype in (jnp.bfloat16, jnp.float16) else 'xla'
  if implementation == 'cudnn':
    lengths = None
    if mask is not None:
      lengths = jnp.sum(mask, axis=-1).astype(jnp.int32)
      lengths_q = jnp.full_like(lengths, q.shape[1])
    return jax.nn.dot_product_attention(
        q, k, v, is_causal=causal, implementation='cudnn',
        query_seq_lengths=None if lengths is None else lengths_q,
        key_value_seq_lengths=lengths)
  bias_mask = None if mask is None else mask[:, None, None, :]
  return jax.nn.dot_product_attention(q, k, v, mask=bias_mask, is_causal=causal,
                                      implementation=implementation)


def softmax_weights(q, k, *, mask=None, causal=False):
  """The explicit ``[B, H, L, S]`` attention matrix (float32), for dropout and for tests."""
  logits = jnp.einsum('blhd,bshd->bhls', q.astype(jnp.float32), k.astype(jnp.float32))
  logits = logits / jnp.sqrt(q.shape[-1]).astype(jnp.float32)
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
  def __call__(self, q, k, v, *, mask=None, causal=False, step=None, deterministic=True):
    del step  # no random features
    if self.attention_dropout > 0.0 and not deterministic:
      w = softmax_weights(q, k, mask=mask, causal=causal)
      w = nn.Dropout(rate=self.attention_dropout)(w, deterministic=False)
      return jnp.einsum('bhls,bshd->blhd', w, v.astype(jnp.float32)).astype(v.dtype)
    return softmax_attention(q, k, v, mask=mask, causal=causal,
                             implementation=self.implementation)


registry.register(registry.AttentionSpec(
    name='softmax', module=SoftmaxAttention,
    paper='Vaswani et al. 2017, eq. 1', approximates='softmax kernel exp(q.k/sqrt(d)) (exact)',
    complexity='O(L^2 d) time, O(L^2) memory (O(L) with flash/cuDNN)',
    aliases=('ot', 'transformer', 'original')))
