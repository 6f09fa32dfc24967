"""Relative-position bias (RPE) for kernelized attention by FFT (Luo et al. 2021, §3.2, Algorithm 1).

With a bias ``b_{j-i}`` added to the logits (Luo et al. eq. 6) kernelized attention becomes (eq. 10)

    z_i = phi(q_i) sum_j c_{j-i} phi(k_j)^T v_j / phi(q_i) sum_j c_{j-i} phi(k_j)^T,   c = exp(b).

The two sums are products of the Toeplitz matrix ``C = (c_{j-i})_{ij}`` with the rows
``vec(phi(k_j)^T v_j)`` (M * Dv channels) and ``phi(k_j)`` (M channels) (eqs. 11-13). A Toeplitz product
is a linear convolution, done here by FFT in O(n log n) per channel, zero-padded so the circular
convolution of the FFT does not wrap around (``toeplitz_matmul``). Causal attention sets ``c_{j-i} = 0``
for ``j > i`` (footnote 3).

Precision: float32 FFT round-off (~1e-7 times log n) is relative to the largest term of each channel, so
a query all of whose visible weights ``c_{j-i}`` are tiny next to the largest ``c`` of its head (say
below 1e-4 of it: a bias peaked at a far offset that the query cannot see) loses accuracy. Biases peaked
near offset 0, which every query sees, are unaffected. A common offset of b is removed exactly
(``_position_weights``), so large biases cannot overflow exp.

Cost: the FFT runs over M * (Dv + 1) channels per head, which dominates everything at large M
(``shared/reference/attention-facts.md`` §7: M = 256, d = 64 is 16K channels); Luo et al. use M = 16..64.

Layout: ``position_bias [H, 2L - 1]``, index ``j - i + L - 1`` (the registry's convention).

Also here: ``relative_bias_matrix`` (the dense ``[H, L, L]`` bias, used by softmax + RPE and by tests),
the quadratic reference ``rpe_quadratic_reference``, and the registration of ``nprf-rpe`` (Luo et al.'s
normalized PRF with RPE) at the end of the file.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernelformer import registry
from kernelformer.attention.linear import (DEFAULT_EPS, einsum_f32, mask_keys, quadratic_reference,
                                           safe_normalizer)
from kernelformer.features.hadamard import next_pow2

Array = jax.Array


def check_position_bias(position_bias: Array, length: int, num_heads: int | None = None) -> None:
  """Raises a one-line error unless ``position_bias`` is ``[H, 2 * length - 1]``."""
  if position_bias.ndim != 2 or position_bias.shape[-1] != 2 * length - 1:
    raise ValueError(f'position_bias must be [heads, 2 * length - 1] = [H, {2 * length - 1}] for '
                     f'length {length}, got shape {tuple(position_bias.shape)}')
  if num_heads is not None and position_bias.shape[0] != num_heads:
    raise ValueError(f'position_bias has {position_bias.shape[0]} heads, the attention has {num_heads}')


def relative_bias_matrix(position_bias: Array, length: int) -> Array:
  """``B[h, i, j] = b[h, j - i + L - 1]``: the dense ``[H, L, L]`` relative-position bias."""
  check_position_bias(position_bias, length)
  pos = jnp.arange(length)
  return position_bias[:, pos[None, :] - pos[:, None] + length - 1]


def toeplitz_matmul(c: Array, x: Array, causal: bool = False) -> Array:
  """``y_i = sum_j c_{j-i} x_j`` for all i, by FFT in O(n log n).

  Args:
    c: ``[..., 2n - 1]`` Toeplitz coefficients, ``c[..., j - i + n - 1]`` = c_{j-i}; leading axes
      broadcast against those of ``x``.
    x: ``[..., n, channels]``.
    causal: drop the terms with ``j > i`` (coefficients with index > n - 1).

  Returns:
    ``[..., n, channels]`` float32.

  With ``r[t] = c[2n - 2 - t]`` (c reversed), ``y_i = sum_j r[i + n - 1 - j] x_j`` is entry ``i + n - 1``
  of the linear convolution ``r * x``, whose support is ``[0, 3n - 3]``. A circular convolution of
  length N >= 2n - 1 leaves the entries ``n - 1 .. 2n - 2`` free of wrap-around: an alias of entry t sits
  at ``t +- N``, outside ``[0, 3n - 3]`` for those t. N is the next power of two (fast FFT sizes).
  """
  n = x.shape[-2]
  if c.shape[-1] != 2 * n - 1:
    raise ValueError(f'toeplitz_matmul needs 2n - 1 = {2 * n - 1} coefficients for n = {n}, '
                     f'got {c.shape[-1]}')
  c = c.astype(jnp.float32)
  x = x.astype(jnp.float32)
  if causal:
    c = jnp.where(jnp.arange(2 * n - 1) <= n - 1, c, 0.0)       # c_{j-i} = 0 for j > i
  size = next_pow2(2 * n - 1)
  r_hat = jnp.fft.rfft(c[..., ::-1], n=size, axis=-1)           # [..., F]
  x_hat = jnp.fft.rfft(x, n=size, axis=-2)                      # [..., F, ch]
  y = jnp.fft.irfft(r_hat[..., :, None] * x_hat, n=size, axis=-2)
  return y[..., n - 1:2 * n - 1, :]


def _position_weights(position_bias: Array, causal: bool) -> Array:
  """``c = exp(b - max b)`` per head, float32, ``[H, 2L - 1]``.

  Subtracting a per-head constant scales numerator and normalizer of eq. 10 alike and cancels, and it
  keeps exp from overflowing for large learned biases. Under ``causal`` the max is over the offsets that
  are kept (j <= i), so the surviving weights cannot all underflow.
  """
  b = position_bias.astype(jnp.float32)
  n = (b.shape[-1] + 1) // 2
  if causal:
    kept = jnp.arange(b.shape[-1]) <= n - 1
    shift = jnp.max(jnp.where(kept, b, -jnp.inf), axis=-1, keepdims=True)
  else:
    shift = jnp.max(b, axis=-1, keepdims=True)
  return jnp.exp(b - jax.lax.stop_gradient(shift))


def rpe_linear_attention(phi_q: Array, phi_k: Array, v: Array, position_bias: Array, *,
                         mask: Array | None = None, causal: bool = False,
                         eps: float = DEFAULT_EPS) -> Array:
  """Kernelized attention with RPE (Luo et al. eq. 10, Algorithm 1) in O(L log L M Dv).

  Args:
    phi_q: ``[B, L, H, M]`` query features; phi_k ``[B, L, H, M]``; v ``[B, L, H, Dv]``.
    position_bias: ``[H, 2L - 1]`` biases b (index j - i + L - 1); the weights are ``c = exp(b)``.
    mask: ``[B, L]`` key padding mask (True = real); padded keys' features are zeroed.
    causal: keep only j <= i.
    eps: normalizer guard (``linear.safe_normalizer``).

  Returns:
    ``[B, L, H, Dv]`` in ``v.dtype``; accumulation in float32.
  """
  b, length, h, m = phi_k.shape
  dv = v.shape[-1]
  check_position_bias(position_bias, length, h)
  phi_k = mask_keys(phi_k.astype(jnp.float32), mask)
  kv = phi_k[..., :, None] * v.astype(jnp.float32)[..., None, :]      # [B, L, H, M, Dv]
  channels = jnp.concatenate([kv.reshape(b, length, h, m * dv), phi_k], axis=-1)
  channels = jnp.transpose(channels, (0, 2, 1, 3))                     # [B, H, L, M (Dv + 1)]
  c = _position_weights(position_bias, causal)                         # [H, 2L - 1]
  mixed = toeplitz_matmul(c[None], channels, causal=causal)            # D~1 and D~2 of eqs. 12-13
  d1 = mixed[..., :m * dv].reshape(b, h, length, m, dv)
  d2 = mixed[..., m * dv:]
  num = einsum_f32('blhm,bhlmd->blhd', phi_q, d1)
  den = einsum_f32('blhm,bhlm->blh', phi_q, d2)
  return (num / safe_normalizer(den, eps)[..., None]).astype(v.dtype)


def rpe_quadratic_reference(phi_q: Array, phi_k: Array, v: Array, position_bias: Array, *,
                            mask: Array | None = None, causal: bool = False,
                            eps: float = DEFAULT_EPS) -> Array:
  """``normalize((phi(Q) phi(K)^T) * exp(B)) V`` with the L x L matrix formed naively: the test oracle."""
  length = phi_k.shape[1]
  weights = jnp.exp(relative_bias_matrix(position_bias.astype(jnp.float32), length))[None]
  return quadratic_reference(phi_q, phi_k, v, mask=mask, causal=causal, eps=eps, score_weights=weights)


def _register_nprf_rpe() -> None:
  """Registers ``nprf-rpe``: Luo et al.'s NPRF-Transformer with RPE, if random_features.py is present.

  The mechanism is ``RandomFeatureAttention`` with
  * ``component='posrf'``: the positive random features of eq. 5;
  * ``weights='iid'``: eq. 5 draws every w_i independently from N(0, I_d) (ORF and Sphere-PRF are only
    ablations, §4.5, with equal results);
  * ``normalize_qk=True``: §3.3 normalizes queries and keys by their l2 norms, so ``phi(q).phi(k)``
    estimates ``exp(q.k / (|q| |k|))`` and its variance (eq. 14) stays bounded. The paper applies no
    temperature to the normalized vectors (q.k lies in [-1, 1]); the sharpness that normalization removes
    comes back through the unbounded RPE ``b_{j-i}`` - hence ``requires_position_bias``.
  The feature dimension stays the ``num_features`` option: Luo et al. use 16-64 (64 for language
  modelling, 32 for images, 16/24 for translation), and the FFT cost grows with M * Dv.
  """
  try:
    # Imported at call time so that rpe.py loads even without random_features.py (which imports rpe
    # lazily inside its __call__, so there is no import cycle).
    from kernelformer.attention import random_features  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  registry.register(registry.AttentionSpec(
      name='nprf-rpe', module=random_features.RandomFeatureAttention,
      fixed={'component': 'posrf', 'weights': 'iid', 'normalize_qk': True},
      paper='Luo et al. 2021, eqs. 5, 10 and §3.3 (Algorithm 1)',
      approximates='softmax with RPE, exp(q.k/(|q||k|) + b_{j-i}), on l2-normalized q, k',
      complexity='O(L log L M d) time, O(L M d) memory (FFT over M (d + 1) channels)',
      learnable='b_{j-i} (owned by the encoder, shared across layers)',
      aliases=('nprf', 'luo-rpe'),
      supports_position_bias=True, requires_position_bias=True))


_register_nprf_rpe()
