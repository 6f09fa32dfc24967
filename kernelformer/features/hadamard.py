"""Fast Walsh-Hadamard transform (FWHT), used by FastFood (Le et al. 2013) and SORF (Yu et al. 2016).

``fwht(x)`` computes ``x @ H_n`` over the last axis for the unnormalized Sylvester Hadamard matrix
``H_n`` (entries +-1, ``H_n H_n = n I``) in O(n log n) with n a power of two. Inputs whose last axis is
not a power of two are zero-padded to the next one by ``pad_to_pow2``: padding the *input* with zeros
is exact (the extra coordinates contribute nothing to ``w . x``), which is why FastFood and SORF may
pad d up to 2^ceil(log2 d) without changing the kernel they estimate.

Below ``DENSE_MAX`` the transform is one small dense matmul ``x @ H_n`` instead of log2(n) butterfly
stages: on CPU each stage is a memory-bound reshape/stack pass, so for n <= 128 the O(n^2) matmul is
faster (measured, docs/benchmarks.md "Structured projections": n = 64, 32K rows: butterfly 6.5 ms, dense
1.2 ms; from n = 256 the butterfly wins). The matmul runs at ``Precision.HIGHEST`` so accelerators
that default to bf16 passes for float32 keep full precision; H has entries +-1, so the two forms
differ only in the order of the float additions.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

# Largest n transformed by a dense matmul with H_n (see the module docstring); above it, the butterfly.
DENSE_MAX = 128


def next_pow2(n: int) -> int:
  return 1 << max(0, (int(n) - 1).bit_length())


def pad_to_pow2(x, axis: int = -1):
  """Zero-pads ``axis`` of ``x`` to the next power of two."""
  n = x.shape[axis]
  p = next_pow2(n)
  if p == n:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, p - n)
  return jnp.pad(x, widths)


def fwht(x, *, method: str = 'auto'):
  """Unnormalized Walsh-Hadamard transform over the last axis (length must be a power of two).

  ``method``: 'auto' (dense matmul for n <= ``DENSE_MAX``, else butterfly), 'dense' or 'butterfly'.
  """
  n = x.shape[-1]
  if n & (n - 1):
    raise ValueError(f'fwht needs a power-of-two length, got {n}; pad with pad_to_pow2 first')
  if method not in ('auto', 'dense', 'butterfly'):
    raise ValueError(f"fwht method must be 'auto', 'dense' or 'butterfly', got {method!r}")
  if method == 'dense' or (method == 'auto' and n <= DENSE_MAX):
    h = jnp.asarray(_hadamard_f32(n), dtype=jnp.promote_types(x.dtype, jnp.float32))
    return jnp.matmul(x, h, precision=jax.lax.Precision.HIGHEST).astype(x.dtype)
  lead = x.shape[:-1]
  h = 1
  while h < n:
    # Butterfly on pairs (i, i + h) inside blocks of 2h: reshape so the pair is one axis.
    y = x.reshape(*lead, n // (2 * h), 2, h)
    a, b = y[..., 0, :], y[..., 1, :]
    x = jnp.stack([a + b, a - b], axis=-2).reshape(*lead, n)
    h *= 2
  return x


@functools.lru_cache(maxsize=16)
def _hadamard_f32(n: int) -> np.ndarray:
  return hadamard_matrix(n).astype(np.float32)


def hadamard_matrix(n: int) -> np.ndarray:
  """The dense Sylvester Hadamard matrix ``H_n`` (test oracle; ``fwht`` multiplies by it for n <= DENSE_MAX)."""
  if n & (n - 1):
    raise ValueError(f'Hadamard size must be a power of two, got {n}')
  h = np.ones((1, 1))
  while h.shape[0] < n:
    h = np.block([[h, h], [h, -h]])
  return h
