"""Flax building blocks: multi-head attention around any registered mechanism, and the encoder block.

``MultiHeadAttention`` owns the query/key/value/output projections and hands ``[B, L, H, D]`` tensors to the
mechanism named by ``attention['kind']`` (kernelformer.registry). It never special-cases a mechanism: the
mechanism's own options come from the same attention mapping.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import flax.linen as nn
import jax.numpy as jnp

from kernelformer import registry

Array = Any


def _attention_options(attention: Mapping[str, Any]) -> dict[str, Any]:
  # Unset (None) options fall back to the mechanism's own default, so one config serves every kind.
  return {k: v for k, v in dict(attention).items() if v is not None}


class MultiHeadAttention(nn.Module):
  """Projections + a registered attention mechanism."""

  num_heads: int
  qkv_dim: int                        # total width of q/k/v over all heads
  attention: Mapping[str, Any]        # config.model.attention as a dict (must contain 'kind')
  causal: bool = False
  dtype: Any = jnp.float32            # compute dtype; parameters stay float32

  @nn.compact
  def __call__(self, x, *, mask=None, step=None, deterministic=True, position_bias=None):
    if self.qkv_dim % self.num_heads:
      raise ValueError(f'qkv_dim={self.qkv_dim} is not divisible by num_heads={self.num_heads}')
    head_dim = self.qkv_dim // self.num_heads
    dense = lambda name: nn.DenseGeneral(
        (self.num_heads, head_dim), dtype=self.dtype, name=name,
        kernel_init=nn.initializers.xavier_uniform())
    q, k, v = dense('query')(x), dense('key')(x), dense('value')(x)
    mechanism = registry.build(_attention_options(self.attention))
    extra = {} if position_bias is None else {'position_bias': position_bias}
    out = mechanism(q, k, v, mask=mask, causal=self.causal, step=step,
                    deterministic=deterministic, **extra)
    return nn.DenseGeneral(x.shape[-1], axis=(-2, -1), dtype=self.dtype, name='out',
                           kernel_init=nn.initializers.xavier_uniform())(out)


class MlpBlock(nn.Module):
  mlp_dim: int
  dropout_rate: float = 0.1
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, *, deterministic=True):
    y = nn.Dense(self.mlp_dim, dtype=self.dtype)(x)
    y = nn.gelu(y)
    y = nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    return nn.Dense(x.shape[-1], dtype=self.dtype)(y)


class EncoderBlock(nn.Module):
  """Pre-LayerNorm Transformer block: x + Attn(LN(x)), then x + MLP(LN(x))."""

  num_heads: int
  qkv_dim: int
  mlp_dim: int
  attention: Mapping[str, Any]
  dropout_rate: float = 0.1
  causal: bool = False
  per_layer_position_bias: bool = False   # Luo et al. share b across layers; True gives each layer its own
  max_length: Optional[int] = None
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, *, mask=None, step=None, deterministic=True, position_bias=None):
    if self.per_layer_position_bias:
      position_bias = RelativePositionBias(self.num_heads, name='position_bias')(x.shape[1])
    y = nn.LayerNorm(dtype=self.dtype)(x)
    y = MultiHeadAttention(self.num_heads, self.qkv_dim, self.attention, causal=self.causal,
                           dtype=self.dtype, name='attention')(
                               y, mask=mask, step=step, deterministic=deterministic,
                               position_bias=position_bias)
    x = x + nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    y = nn.LayerNorm(dtype=self.dtype)(x)
    y = MlpBlock(self.mlp_dim, self.dropout_rate, dtype=self.dtype)(y, deterministic=deterministic)
    return x + nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)


class RelativePositionBias(nn.Module):
  """Learnable b_{j-i}, one per head and offset (Luo et al. 2021, §3.3): ``[H, 2L - 1]``.

  Index ``j - i + L - 1`` holds the bias for key j and query i. Initialized to zero, so training starts
  from the position-free kernel.
  """

  num_heads: int

  @nn.compact
  def __call__(self, length: int):
    return self.param('bias', nn.initializers.zeros, (self.num_heads, 2 * length - 1), jnp.float32)
