"""The weight matrix W of a random-feature map, dense or structured (Spectraformer §3, eq. 11).

Every sampler in ``weights.py`` and ``attention/learned.py`` returns a ``Projection``; every component function in
``components.py`` consumes one through ``project(x, proj) = x W^T`` and ``feature_weights``. Keeping the
structured form (FastFood's diagonals) until ``project`` is what makes FastFood O(M log d) instead of
O(M d): the dense ``[M, d]`` matrix is built only by ``dense_matrix`` (tests, Pallas kernels).

Projections are pytrees (``flax.struct.dataclass``), so they pass through ``jit``/``vmap`` (one per head).
"""
from __future__ import annotations

from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp

from kernelformer.features import hadamard

Array = jax.Array


@flax.struct.dataclass
class FastFoodBlocks:
  """``V = (1 / (sigma sqrt(n))) S H G Pi H B`` stacked in ``num_blocks`` blocks of size n = 2^k >= d.

  Le et al. 2013 (FastFood), as written in Spectraformer appendix A.3 and the kernel-learning paper
  §2.1. Each field is ``[num_blocks, n]``; ``perm`` holds integer permutations. Inputs of dimension
  d < n are zero-padded (exact, see ``hadamard``). Rows beyond ``num_features`` are dropped.
  """

  s: Array        # [blocks, n] row scaling (chi-distributed norms / learnable)
  g: Array        # [blocks, n] Gaussian diagonal
  b: Array        # [blocks, n] Rademacher (+-1) diagonal
  perm: Array     # [blocks, n] int32 permutation Pi
  num_features: int = flax.struct.field(pytree_node=False, default=0)
  dim: int = flax.struct.field(pytree_node=False, default=0)

  def apply(self, x: Array) -> Array:
    """``x V^T`` for ``x [..., d]`` -> ``[..., num_features]`` in O(blocks n log n)."""
    n = self.s.shape[-1]
    xp = hadamard.pad_to_pow2(x)
    if xp.shape[-1] != n:
      xp = jnp.pad(xp, [(0, 0)] * (x.ndim - 1) + [(0, n - xp.shape[-1])])
    y = xp[..., None, :] * self.b                              # [..., blocks, n]  B
    y = hadamard.fwht(y)                                       # H
    # Pi: one gather over the flattened (block, n) axis with a [blocks * n] index vector (a
    # take_along_axis with indices broadcast to y's full shape is several times slower on CPU).
    blocks = self.perm.shape[-2]
    flat = (self.perm + n * jnp.arange(blocks, dtype=self.perm.dtype)[:, None]).reshape(-1)
    y = jnp.take(y.reshape(*y.shape[:-2], blocks * n), flat, axis=-1).reshape(y.shape)
    y = y * self.g                                             # G
    y = hadamard.fwht(y)                                       # H
    y = y * self.s / jnp.sqrt(jnp.asarray(n, y.dtype))         # S, and 1/sqrt(n) of each H pair
    y = y.reshape(*x.shape[:-1], -1)
    return y[..., :self.num_features]


@flax.struct.dataclass
class Projection:
  """A weight matrix W with rows omega_r, r = 1..M, plus optional per-row quadrature weights.

  Exactly one of ``matrix`` (dense ``[M, d]``) and ``fastfood`` is set. ``feature_weights`` ``[M]`` are
  the weights c_r of a quadrature rule (SGQ), summing to 1; None means Monte Carlo weights 1/M. Weights
  may be negative (sparse grids): components then put sqrt|c_r| on both sides and sign(c_r) on the query
  side, so phi(q).phi(k) = sum_r c_r f_r(q) f_r(k) either way.
  """

  matrix: Optional[Array] = None
  fastfood: Optional[FastFoodBlocks] = None
  feature_weights: Optional[Array] = None

  @property
  def num_features(self) -> int:
    if self.matrix is not None:
      return self.matrix.shape[-2]
    return self.fastfood.num_features

  @property
  def dim(self) -> int:
    if self.matrix is not None:
      return self.matrix.shape[-1]
    return self.fastfood.dim


# FastFood with d up to this is projected by materializing W (``dense_matrix``: the structured
# transform applied to the d x d identity, O(M d log d) per call, independent of the sequence length)
# and one dense matmul; above it, by the structured transform of every row. Measured on CPU
# (docs/benchmarks.md "Structured projections"): at M = 256 the materialized form is 2-50x faster
# than the per-row transform for every d measured (16..2048), so the threshold is set at the largest d
# measured; a per-row transform only pays where L M d matmul FLOPs dominate, i.e. far larger d.
FASTFOOD_DENSE_MAX_DIM = 2048


def project(x: Array, proj: Projection) -> Array:
  """``x W^T``: ``[..., d] -> [..., M]``.

  FastFood (Le et al. 2013) is O(M log d) per row against O(M d) for a dense W, but at attention
  head sizes a dense matmul beats the structured transform by a wide margin on every backend's matmul
  units, so for d <= ``FASTFOOD_DENSE_MAX_DIM`` W is materialized once per call and applied densely.
  Same values to float32 rounding; gradients reach FastFood's diagonals either way.
  """
  if proj.matrix is not None:
    return jnp.einsum('...d,md->...m', x, proj.matrix.astype(x.dtype))
  if proj.fastfood.dim <= FASTFOOD_DENSE_MAX_DIM:
    return jnp.einsum('...d,md->...m', x, dense_matrix(proj).astype(x.dtype))
  return proj.fastfood.apply(x)


def dense_matrix(proj: Projection) -> Array:
  """W as a dense ``[M, d]`` matrix (FastFood materialized by projecting the identity)."""
  if proj.matrix is not None:
    return proj.matrix
  eye = jnp.eye(proj.fastfood.dim, dtype=proj.fastfood.g.dtype)
  return proj.fastfood.apply(eye).T


def row_weights(proj: Projection, dtype=jnp.float32) -> Array:
  """The quadrature weights c_r, ``[M]`` (1/M for Monte Carlo)."""
  if proj.feature_weights is not None:
    return proj.feature_weights.astype(dtype)
  return jnp.full((proj.num_features,), 1.0 / proj.num_features, dtype)
