"""Nyströmformer: Nyström approximation of softmax attention, segment-means landmarks (Xiong et al. 2021).

With landmarks ``Q_tilde, K_tilde`` (m rows each: means of consecutive segments of Q and K) and
``s(X) = softmax(X / sqrt(d))`` row-wise,

    F = s(Q K_tilde^T)  [n, m],   A = s(Q_tilde K_tilde^T)  [m, m],   B = s(Q_tilde K^T)  [m, n],
    softmax(Q K^T / sqrt(d)) V  ~  F A^+ (B V),

in O(n m (d + Dv) + m^3). ``A^+`` is the iterative Moore-Penrose approximation of Xiong et al. (after
Razavi et al.): ``Z_0 = A^T / (||A||_1 ||A||_inf)``, ``Z_{j+1} = Z_j (13 I - A Z_j (15 I - A Z_j (7 I -
A Z_j))) / 4``, 6 iterations by default as in the paper. The start scale is computed **per matrix**
(the public code takes one max over the whole batch and all heads, which slows the convergence of every
other matrix).

Landmarks (Xiong et al. 2021, §3.3, "segment-means", ``q_tilde_j`` the mean of segment j of ``l = n / m``
tokens) over each example's **real** length n (its valid tokens, from the mask; docs/kernels.md
"Nyströmformer"): the valid tokens are cut into segments of ``ceil(n / m)`` (``segment_means``), so no
landmark is spent on padding and the same real tokens padded to L or 4L give the same outputs
(``tests/attention/test_padding_invariance.py``). Unused landmarks are removed exactly (zero column of
F, identity row of A); padded keys are masked out of B. Without a mask n = L (``segment_layout``).
``L <= m`` gives exact softmax up to the pseudo-inverse iteration. Causal masking is not defined
(landmarks mix all positions): ``causal=True`` raises. The authors' depthwise-convolution skip on V is
not included.
"""
from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from kernelformer.attention.spec import AttentionSpec

Array = jax.Array

_NEG = jnp.finfo(jnp.float32).min


def segment_layout(length: int, num_landmarks: int) -> tuple[int, int]:
  """``(segments, segment_size)``: ``ceil(L / m)`` positions per segment, as few segments as cover L."""
  size = max(1, math.ceil(length / max(1, num_landmarks)))
  return math.ceil(length / size), size


def segment_means(x: Array, mask: Array | None, num_landmarks: int) -> tuple[Array, Array]:
  """Segment-means landmarks from each example's real length: ``x [B, L, H, d]`` -> ``([B, m', H, d] f32,
  valid [B, m'])`` with ``m' = min(m, L)`` (static).

  Example b has ``n_b`` valid tokens; its r-th valid token (in position order, ``r = 0 .. n_b - 1``)
  belongs to segment ``r // l_b`` with ``l_b = ceil(n_b / m)`` (Xiong et al. §3.3 with n = n_b). A segment
  with no valid token gets a zero mean and ``valid = False``. O(B L H d) time and memory (segment sum).
  """
  b, length, h, d = x.shape
  slots = max(1, min(num_landmarks, length))                 # ceil(n / ceil(n / m)) <= min(m, n)
  valid = jnp.ones((b, length), bool) if mask is None else jnp.asarray(mask, bool)
  n = jnp.sum(valid, axis=1, dtype=jnp.int32)                 # [B] real lengths
  size = jnp.maximum((n + num_landmarks - 1) // num_landmarks, 1)  # l_b = ceil(n_b / m)
  rank = jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1       # index among the valid tokens
  seg = jnp.where(valid, rank // size[:, None], slots)        # padded tokens -> out of range (dropped)
  ids = (seg + slots * jnp.arange(b, dtype=jnp.int32)[:, None]).reshape(-1)
  ids = jnp.where(valid.reshape(-1), ids, b * slots)
  xf = jnp.where(valid[:, :, None, None], x.astype(jnp.float32), 0.0).reshape(b * length, h * d)
  sums = jax.ops.segment_sum(xf, ids, num_segments=b * slots + 1)[:-1].reshape(b, slots, h, d)
  counts = jax.ops.segment_sum(valid.reshape(-1).astype(jnp.float32), ids,
                               num_segments=b * slots + 1)[:-1].reshape(b, slots)
  means = sums / jnp.maximum(counts, 1.0)[:, :, None, None]
  return means, counts > 0


def _masked_softmax(logits: Array, allowed: Array) -> Array:
  return jax.nn.softmax(jnp.where(allowed, logits, _NEG), axis=-1)


@functools.partial(jax.jit, static_argnames='num_iterations')
def iterative_pinv(a: Array, num_iterations: int = 6) -> Array:
  """Xiong et al.'s iterative Moore-Penrose pseudo-inverse of ``a [..., m, m]`` (start scale per matrix).

  Jitted so that eager (op-by-op) callers do not retrace the loop every call.
  """
  a = a.astype(jnp.float32)
  eye = jnp.eye(a.shape[-1], dtype=a.dtype)
  norm_1 = jnp.max(jnp.sum(jnp.abs(a), axis=-2), axis=-1)        # max column sum
  norm_inf = jnp.max(jnp.sum(jnp.abs(a), axis=-1), axis=-1)      # max row sum
  z = jnp.swapaxes(a, -1, -2) / (norm_1 * norm_inf)[..., None, None]

  def body(_, z):
    az = a @ z
    return 0.25 * z @ (13.0 * eye - az @ (15.0 * eye - az @ (7.0 * eye - az)))

  return jax.lax.fori_loop(0, num_iterations, body, z)


def nystrom_attention(q: Array, k: Array, v: Array, *, mask: Array | None = None,
                      num_landmarks: int = 128, num_iterations: int = 6) -> Array:
  """``F A^+ (B V)`` (Xiong et al. 2021, §3); ``[B, L, H, Dv]`` in ``v.dtype``."""
  length, d = q.shape[1], q.shape[-1]
  if k.shape[1] != length:
    raise ValueError(f'nystromformer uses the same segments for queries and keys and needs as many of '
                     f'each, got {length} queries and {k.shape[1]} keys')
  scale = 1.0 / math.sqrt(d)
  q_lm, lm_valid = segment_means(q, mask, num_landmarks)       # [B, m, H, d], [B, m]
  k_lm, _ = segment_means(k, mask, num_landmarks)
  qf, kf = q.astype(jnp.float32), k.astype(jnp.float32)
  key_valid = jnp.ones(k.shape[:2], bool) if mask is None else mask.astype(bool)
  lm_cols = lm_valid[:, None, None, :]                          # [B, 1, 1, m]
  f = _masked_softmax(jnp.einsum('blhd,bmhd->bhlm', qf, k_lm) * scale, lm_cols)
  a = _masked_softmax(jnp.einsum('bmhd,bnhd->bhmn', q_lm, k_lm) * scale, lm_cols)
  # Invalid landmark rows become identity rows: A is then block diagonal over valid / invalid.
  eye = jnp.eye(a.shape[-1], dtype=a.dtype)
  a = jnp.where(lm_valid[:, None, :, None], a, eye)
  bmat = _masked_softmax(jnp.einsum('bmhd,blhd->bhml', q_lm, kf) * scale,
                         key_valid[:, None, None, :])
  bv = jnp.einsum('bhml,blhe->bhme', bmat, v.astype(jnp.float32))
  z = iterative_pinv(a, num_iterations)
  out = jnp.einsum('bhlm,bhme->blhe', f, z @ bv)
  return out.astype(v.dtype)


class NystromAttention(nn.Module):
  """Nyströmformer attention (no parameters, no randomness)."""

  num_landmarks: int = 128   # m; 128 as in the Skyformer LRA comparison ("128 features in all methods")
  num_iterations: int = 6    # pseudo-inverse iterations (Xiong et al.)

  @nn.compact
  def __call__(self, q, k, v, *, mask=None, causal=False, step=None, deterministic=True,
               position_bias=None):
    del step, deterministic
    if causal:
      raise ValueError('nystromformer has no causal form: segment-means landmarks mix all positions. '
                       'Use softmax or a random-feature kernel for causal attention.')
    if position_bias is not None:
      raise ValueError('nystromformer takes no position_bias')
    return nystrom_attention(q, k, v, mask=mask, num_landmarks=self.num_landmarks,
                             num_iterations=self.num_iterations)


SPECS = (AttentionSpec(
    name='nystromformer', module=NystromAttention,
    paper='Xiong et al. 2021 (Nyströmformer), segment means + iterative pseudo-inverse',
    approximates='softmax exp(q.k/sqrt(d)) attention (Nyström, not a kernel estimate)',
    complexity='O(L m d + m^3) time, O(L m) memory (m = num_landmarks)',
    aliases=('nystrom',)),)
