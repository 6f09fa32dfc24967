"""Exact Gaussian-kernel ("kernelized") attention: Skyformer eq. 3 (Chen et al. 2021, §4.1).

``Kernelized-Attention(Q, K, V) = C V`` with ``C = kappa(Q / p^(1/4), K / p^(1/4))``,
``kappa(x, y) = exp(-||x - y||^2 / 2)`` and p the head dimension, i.e.

    C_ij = exp(-||q_i - k_j||^2 / (2 sqrt(p))).

**Normalization** (docs/kernels.md, "Kernelized attention is not row-normalized"): §4.1 argues that the
Gaussian kernel is already normalized, ``C = D_Q^{-1/2} A D_K^{-1/2}`` with ``A = exp(Q K^T / sqrt(p))``,
so this module returns exactly ``C V`` (weights in (0, 1], rows not summing to one): the quadratic
reference that Skyformer (``skyformer.py``) approximates.

Padded keys (mask False) get weight 0; ``causal`` zeroes ``C_ij`` for ``j > i``. O(L S p) time,
O(L S) memory. ``attention_dropout`` drops entries of C in training, as Skyformer's Kernelized
Attention does (``SoftmaxAttention_RBF``: ``attn = self.drop_attn(attn)`` on ``exp(...)`` before
``matmul(attn, V)``, src/models/attention.py 45, 66-69 @ 1a677cb); its Skyformer has no attention
dropout (src/models/attention_skyformer.py), so ``skyformer`` has no such option.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from kernelformer.attention.spec import AttentionSpec

Array = jax.Array


def gaussian_kernel_matrix(x: Array, y: Array) -> Array:
  """``kappa(x_i, y_j) = exp(-||x_i - y_j||^2 / 2)`` for ``x [..., n, p]``, ``y [..., m, p]``.

  Returns ``[..., n, m]`` float32. Inputs must already carry the 1/p^(1/4) scale. Computed from the
  expansion ``x.y - ||x||^2/2 - ||y||^2/2``, whose rounding can make a squared distance slightly
  negative: the exponent is clipped at 0, so 0 < kappa <= 1 holds exactly (Skyformer's iteration count
  relies on kappa <= 1).
  """
  x = x.astype(jnp.float32)
  y = y.astype(jnp.float32)
  xy = jnp.einsum('...np,...mp->...nm', x, y)
  half_x = 0.5 * jnp.sum(x * x, axis=-1)[..., :, None]
  half_y = 0.5 * jnp.sum(y * y, axis=-1)[..., None, :]
  return jnp.exp(jnp.minimum(xy - half_x - half_y, 0.0))


def input_scale(head_dim: int) -> float:
  """The 1/p^(1/4) applied to q and k before kappa (Skyformer eq. 3), from the actual head dimension."""
  return float(head_dim) ** -0.25


def gaussian_scores(q: Array, k: Array, *, mask: Array | None = None,
                    causal: bool = False) -> Array:
  """The kernelized attention matrix C, ``[B, H, L, S]`` float32, masked and causal entries set to 0."""
  s = input_scale(q.shape[-1])
  qh = jnp.swapaxes(q, 1, 2) * s                                 # [B, H, L, p]
  kh = jnp.swapaxes(k, 1, 2) * s                                 # [B, H, S, p]
  c = gaussian_kernel_matrix(qh, kh)
  if mask is not None:
    c = jnp.where(mask[:, None, None, :], c, 0.0)
  if causal:
    c = jnp.where(jnp.tril(jnp.ones(c.shape[-2:], dtype=bool)), c, 0.0)
  return c


def gaussian_attention(q: Array, k: Array, v: Array, *, mask: Array | None = None,
                       causal: bool = False) -> Array:
  """Exact kernelized attention ``C V`` (Skyformer eq. 3, no row-sum normalization); ``[B, L, H, Dv]``."""
  c = gaussian_scores(q, k, mask=mask, causal=causal)
  out = jnp.einsum('bhls,bshd->blhd', c, v.astype(jnp.float32))
  return out.astype(v.dtype)


class GaussianAttention(nn.Module):
  """Exact Gaussian-kernel attention (quadratic); no parameters."""

  attention_dropout: float = 0.0   # dropout on C in training (module docstring)

  @nn.compact
  def __call__(self, q, k, v, *, mask=None, causal=False, step=None, deterministic=True,
               position_bias=None):
    del step  # no random features
    if position_bias is not None:
      raise ValueError('gaussian attention takes no position_bias (only mechanisms whose spec says '
                       'supports_position_bias do)')
    c = nn.Dropout(self.attention_dropout)(gaussian_scores(q, k, mask=mask, causal=causal),
                                           deterministic=deterministic)
    return jnp.einsum('bhls,bshd->blhd', c, v.astype(jnp.float32)).astype(v.dtype)


SPECS = (AttentionSpec(
    name='gaussian', module=GaussianAttention,
    paper='Chen et al. 2021 (Skyformer), eq. 3',
    approximates='Gaussian kernel exp(-||q-k||^2 / (2 sqrt(p))), unnormalized C V (exact)',
    complexity='O(L^2 p) time, O(L^2) memory',
    aliases=('kernelized', 'kernelized-attention')),)
