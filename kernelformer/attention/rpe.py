"""Relative-position bias (RPE) for kernelized attention by FFT (Luo et al. 2021, §3.2, Algorithm 1).

With a bias ``b_{j-i}`` added to the logits (Luo et al. eq. 6) kernelized attention becomes (eq. 10)

    z_i = phi(q_i) sum_j c_{j-i} phi(k_j)^T v_j / phi(q_i) sum_j c_{j-i} phi(k_j)^T,   c = exp(b).

The two sums are products of the Toeplitz matrix ``C = (c_{j-i})_{ij}`` with the rows
``vec(phi(k_j)^T v_j)`` (M * Dv channels) and ``phi(k_j)`` (M channels) (eqs. 11-13). A Toeplitz product
is a linear convolution, done here by FFT in O(n log n) per channel, zero-padded so the circular
convolution of the FFT does not wrap around (``toeplitz_matmul``). Causal attention sets ``c_{j-i} = 0``
for ``j > i`` (footnote 3).

Precision (FFT round-off is relative to each channel's largest term) and cost (M * (Dv + 1) channels
per head): docs/kernels.md "RPE by FFT". ``rpe_linear_attention`` pays only those FFTs: real
transforms, features in chunks, and a custom VJP that recomputes a chunk's spectra (its docstring;
``kernelformer/bench/rpe_cost.py`` measures it). A common offset of b is removed exactly
(``_position_weights``), so large biases cannot overflow exp.

Layout: ``position_bias [H, 2L - 1]``, index ``j - i + L - 1`` (the registry's convention).

Also here: ``relative_bias_matrix`` (the dense ``[H, L, L]`` bias, used by softmax + RPE and by tests),
and the quadratic reference ``rpe_quadratic_reference``. The kind ``nprf-rpe`` (Luo et al.'s normalized
PRF with RPE) is a ``RandomFeatureAttention`` and is defined in ``random_features.py``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernelformer.attention.linear import (DEFAULT_EPS, einsum_f32, mask_keys, normalize,
                                           quadratic_reference)
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

  With ``r[t] = c[2n - 2 - t]`` (c reversed), ``y_i`` is entry ``i + n - 1`` of the linear convolution
  ``r * x`` (support ``[0, 3n - 3]``); a circular one of length N = next_pow2(2n - 1) leaves the entries
  ``n - 1 .. 2n - 2`` free of wrap-around (an alias of entry t sits at ``t +- N``).
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


# Bytes of one chunk's complex spectrum (``rpe_linear_attention``): with the real input, the product and
# the inverse transform a chunk holds about four buffers of this size at once, so ~256 MiB in flight.
DEFAULT_CHUNK_BYTES = 64 * 2 ** 20


def features_per_chunk(num_features: int, channels_per_feature: int, fft_size: int, batch_heads: int,
                       chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
  """The largest divisor ``mc`` of M whose spectrum ``[B, H, mc, Dv + 1, F]`` (complex64) fits in
  ``chunk_bytes`` (at least 1): a divisor, so no chunk is padded and no FFT is wasted."""
  per_feature = batch_heads * channels_per_feature * (fft_size // 2 + 1) * 8
  best = 1
  for mc in range(1, num_features + 1):
    if num_features % mc == 0 and mc * per_feature <= chunk_bytes:
      best = mc
  return best


def rpe_linear_attention(phi_q: Array, phi_k: Array, v: Array, position_bias: Array, *,
                         mask: Array | None = None, causal: bool = False,
                         eps: float = DEFAULT_EPS, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                         feature_chunk: int | None = None) -> Array:
  """Kernelized attention with RPE (Luo et al. eq. 10, Algorithm 1) in O(L log L M Dv).

  Args:
    phi_q: ``[B, L, H, M]`` query features; phi_k ``[B, L, H, M]``; v ``[B, L, H, Dv]``.
    position_bias: ``[H, 2L - 1]`` biases b (index j - i + L - 1); the weights are ``c = exp(b)``.
    mask: ``[B, L]`` key padding mask (True = real); padded keys' features are zeroed.
    causal: keep only j <= i.
    eps: normalizer guard (``linear.safe_normalizer``).
    chunk_bytes: memory bound of one feature chunk's spectrum (``features_per_chunk``).
    feature_chunk: features per chunk (a divisor of M); None picks it from ``chunk_bytes``.

  Returns:
    ``[B, L, H, Dv]`` in ``v.dtype``; accumulation in float32.

  The Toeplitz products of eqs. 12-13 run over ``M (Dv + 1)`` channels of length ``2L`` (zero-padded
  against wrap-around, ``toeplitz_matmul``) and nothing else is paid (docs/architecture.md, "RPE by FFT
  pays only its FFTs"): ``v~ = [v, 1]`` makes D~1 (eq. 12) and D~2 (eq. 13) one transform; real FFTs
  along the last axis; the bias spectrum once per call; features ``feature_chunk`` at a time
  (``lax.scan``: memory O(B H L (M + mc Dv)), not O(B H L M Dv)), each chunk with its own VJP
  (``_rpe_chunk``) that keeps only its inputs and recomputes its spectra, transposes as real FFTs.
  """
  b, length, h, m = phi_k.shape
  dv = v.shape[-1]
  check_position_bias(position_bias, length, h)
  size = next_pow2(2 * length - 1)
  c = _position_weights(position_bias, causal)                         # [H, 2L - 1]
  if causal:
    c = jnp.where(jnp.arange(2 * length - 1) <= length - 1, c, 0.0)   # c_{j-i} = 0 for j > i
  r = jnp.pad(c[:, ::-1], ((0, 0), (0, size - (2 * length - 1))))   # r[t] = c[2L - 2 - t], [H, N]
  # Length-last layouts: [B, H, M, L] features, [B, H, Dv + 1, L] values with the ones column.
  pk = jnp.transpose(mask_keys(phi_k.astype(jnp.float32), mask), (0, 2, 3, 1))
  pq = jnp.transpose(phi_q.astype(jnp.float32), (0, 2, 3, 1))
  vt = jnp.transpose(v.astype(jnp.float32), (0, 2, 3, 1))
  va = jnp.concatenate([vt, jnp.ones_like(vt[:, :, :1])], axis=2)
  mc = feature_chunk or features_per_chunk(m, dv + 1, size, b * h, chunk_bytes)
  if m % mc:
    raise ValueError(f'feature_chunk={mc} must divide the feature count {m}')
  chunks = lambda x: jnp.moveaxis(x.reshape(b, h, m // mc, mc, length), 2, 0)

  def body(acc, xs):
    return acc + _rpe_chunk(*xs, va, r), None

  acc, _ = jax.lax.scan(body, jnp.zeros((b, h, dv + 1, length), jnp.float32),
                        (chunks(pq), chunks(pk)))
  out = normalize(jnp.moveaxis(acc[:, :, :dv], 2, -1), acc[:, :, dv], eps)   # eq. 10
  out = jnp.moveaxis(out, -1, 2)
  return jnp.transpose(out, (0, 3, 1, 2)).astype(v.dtype)


def _chunk_forward(pq_c: Array, pk_c: Array, va: Array, r: Array):
  """One feature chunk of eqs. 10-13: ``(sum_m phi_q[i, m] D~[i, m, e], X^, D~, R^)``.

  pq_c, pk_c ``[B, H, mc, L]``; va ``[B, H, E, L]`` (v with the ones column); r ``[H, N]`` the reversed,
  zero-padded Toeplitz coefficients. ``D~ = T (phi_k v~)`` is entry ``n - 1 + i`` of the circular
  convolution ``r * pad(x)`` (``toeplitz_matmul``'s derivation).
  """
  n, size = pq_c.shape[-1], r.shape[-1]
  r_hat = jnp.fft.rfft(r, axis=-1)                                     # [H, F]
  x = pk_c[:, :, :, None, :] * va[:, :, None, :, :]                   # [B, H, mc, E, L]
  x_hat = jnp.fft.rfft(x, n=size, axis=-1)
  y = jnp.fft.irfft(x_hat * r_hat[None, :, None, None, :], n=size, axis=-1)[..., n - 1:2 * n - 1]
  return einsum_f32('bhml,bhmel->bhel', pq_c, y), x_hat, y, r_hat


@jax.custom_vjp
def _rpe_chunk(pq_c: Array, pk_c: Array, va: Array, r: Array) -> Array:
  return _chunk_forward(pq_c, pk_c, va, r)[0]


def _rpe_chunk_fwd(pq_c, pk_c, va, r):
  return _chunk_forward(pq_c, pk_c, va, r)[0], (pq_c, pk_c, va, r)   # inputs only


def _rpe_chunk_bwd(res, g):
  """The transposes, with real FFTs of the same size as the forward's.

  With ``Y = r (*) pad(x)`` (circular, length N) and ``D~ = Y[n - 1 : 2n - 1]``, the cotangent of Y is
  ``G = dy`` placed at offset n - 1. Then ``dx = (G (star) r)[:n]``, the Toeplitz product with the
  transposed matrix ``(c_{j-i})^T``, i.e. the forward's algorithm with the coefficients reversed,
  ``dx = irfft(rfft(dy) rfft(pad(c)))[n - 1 : 2n - 1]`` (no shifted copy of dy is formed); and
  ``dr = G (star) x = irfft(e^{-2 pi i f (n - 1) / N} sum_channels rfft(dy) conj(X^))``: the shift
  becomes a phase ramp applied after the sum over channels, on ``[H, F]`` only.
  """
  pq_c, pk_c, va, r = res
  n, size = pq_c.shape[-1], r.shape[-1]
  _, x_hat, y, r_hat = _chunk_forward(pq_c, pk_c, va, r)              # recomputed, not stored
  d_pq = einsum_f32('bhel,bhmel->bhml', g, y)
  dy = pq_c[:, :, :, None, :] * g[:, :, None, :, :]                   # cotangent of D~
  dy_hat = jnp.fft.rfft(dy, n=size, axis=-1)
  # pad(c): c[t] = r[2n - 2 - t] for t < 2n - 1, zeros after -- r reversed, rolled into place.
  c_hat = jnp.fft.rfft(jnp.roll(r[:, ::-1], 2 * n - 1 - size, axis=-1), axis=-1)
  dx = jnp.fft.irfft(dy_hat * c_hat[None, :, None, None, :], n=size, axis=-1)[..., n - 1:2 * n - 1]
  d_pk = einsum_f32('bhmel,bhel->bhml', dx, va)
  d_va = einsum_f32('bhmel,bhml->bhel', dx, pk_c)
  freq = jnp.arange(size // 2 + 1)
  ramp = jnp.exp(-2j * jnp.pi * ((freq * (n - 1)) % size) / size).astype(x_hat.dtype)
  d_r = jnp.fft.irfft(ramp * jnp.sum(dy_hat * jnp.conj(x_hat), axis=(0, 2, 3)), n=size, axis=-1)
  return d_pq, d_pk, d_va, d_r


_rpe_chunk.defvjp(_rpe_chunk_fwd, _rpe_chunk_bwd)


def rpe_quadratic_reference(phi_q: Array, phi_k: Array, v: Array, position_bias: Array, *,
                            mask: Array | None = None, causal: bool = False,
                            eps: float = DEFAULT_EPS) -> Array:
  """``normalize((phi(Q) phi(K)^T) * exp(B)) V`` with the L x L matrix formed naively: the test oracle."""
  length = phi_k.shape[1]
  weights = jnp.exp(relative_bias_matrix(position_bias.astype(jnp.float32), length))[None]
  return quadratic_reference(phi_q, phi_k, v, mask=mask, causal=causal, eps=eps, score_weights=weights)
