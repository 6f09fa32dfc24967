"""Random-feature weight matrices W (samplers) for the Gaussian spectral measure N(0, I_d).

Bochner's theorem (Spectraformer eq. 9) writes a shift-invariant kernel as an expectation over
frequencies omega ~ p; a random-feature map replaces the expectation by a weighted sum over the rows
omega_r of a weight matrix W (eq. 10-11). The samplers here differ only in how the rows are chosen
(Spectraformer appendix A.3): i.i.d. ('Base'), orthogonal blocks (ORF, eq. 21), structured orthogonal
blocks (SORF, eq. 22), quasi-Monte Carlo (QMC, eq. 28), moment matching (MM), sparse-grid
quadrature (SGQ) and FastFood (eq. 17). Every sampler targets p = N(0, I_d), the spectral measure of
the Gaussian kernel exp(-|x - y|^2 / 2); the component functions (``components.py``) rescale inputs
for other kernels.

Contract (docs/extending.md, "Sampler"): ``sample(key, num_features, dim) -> Projection``, ``jax.jit``-able
with the key traced (``static_argnums=(1, 2)``) and ``jax.vmap``-able over keys (one projection per
head). A fixed table (QMC's Sobol points, SGQ's Smolyak nodes) is computed with numpy/scipy on the host
at trace time, cached per ``(num_features, dim)`` and randomized per key inside JAX.
"""
from __future__ import annotations

import functools
import itertools
import math
import warnings
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from kernelformer.features import hadamard
from kernelformer.features.projection import FastFoodBlocks, Projection

Array = jax.Array
Sampler = Callable[[Array, int, int], Projection]

# Fixed seed of the scrambled Sobol table: the table is a constant of the program (identical on every
# host and across restarts); the per-key randomness comes from the Cranley-Patterson shift.
_SOBOL_SEED = 20160101


def _check_sizes(num_features: int, dim: int) -> None:
  if int(num_features) < 1 or int(dim) < 1:
    raise ValueError(f'num_features and dim must be >= 1, got {num_features} and {dim}')


def _flat_draw(draw: Callable[..., Array], key: Array, shape: tuple[int, ...], **kwargs) -> Array:
  """``draw(key, (prod(shape),), **kwargs)`` reshaped to ``shape``: the same law as drawing ``shape``.

  With ``jax_threefry_partitionable`` on (the default in the jax versions we support) a
  multi-dimensional draw compiled in ~2 s of CPU for shape (5, 8, 9) and a flat one in ~0.25 s (jax
  0.10.2, CPU); samplers are re-traced for every (num_features, dim), so they draw flat.
  """
  return draw(key, (math.prod(shape),), **kwargs).reshape(shape)


def standard_normal(key: Array, shape: tuple[int, ...], dtype=jnp.float32) -> Array:
  return _flat_draw(jax.random.normal, key, shape, dtype=dtype)


def chi(key: Array, df: int, shape: tuple[int, ...], dtype=jnp.float32) -> Array:
  """Samples of the chi distribution with ``df`` degrees of freedom: norms of N(0, I_df) vectors.

  Computed literally as Gaussian-vector norms (O(df) normals per sample, drawn once per redraw):
  ``jax.random.gamma`` would need only O(1) per sample, but its rejection-sampling loop costs seconds
  of compilation on CPU for every new shape.
  """
  return jnp.linalg.norm(standard_normal(key, (*shape, df), dtype), axis=-1)


def serial_on_cpu(fn: Callable[[Array], object]) -> Callable[[Array], object]:
  """``fn`` (one matrix in, a pytree out) made to decompose a batch one matrix at a time on CPU.

  Why (docs/architecture.md, "LAPACK one matrix at a time on CPU"): jaxlib >= 0.10's batched LAPACK call
  (``ParallelBatchMap``) blocks a pool thread per batched decomposition, and several ready at once could
  block every thread (``BlockingCounter::Wait``, a step that never returns). A single matrix is
  decomposed inline, so ``jax.vmap`` (any batch axis) gets a ``lax.map`` over single matrices: the same
  LAPACK routine, bit-identical results (tested). Other backends keep the batched call.
  """

  @jax.custom_batching.custom_vmap
  def single(x):
    return fn(x)

  @single.def_vmap
  def _rule(axis_size, in_batched, x):  # pylint: disable=unused-argument
    if not in_batched[0]:
      x = jnp.broadcast_to(x, (axis_size, *x.shape))
    out = jax.lax.map(single, x)
    return out, jax.tree.map(lambda _: True, out)

  def apply(x: Array):
    if jax.default_backend() != 'cpu':
      return fn(x)
    if x.ndim == 2:
      return single(x)
    lead = x.shape[:-2]
    out = jax.lax.map(single, x.reshape(-1, *x.shape[-2:]))
    return jax.tree.map(lambda o: o.reshape(*lead, *o.shape[1:]), out)

  return apply


_qr = serial_on_cpu(jnp.linalg.qr)
_thin_svd = serial_on_cpu(lambda a: jnp.linalg.svd(a, full_matrices=False))


def haar_orthogonal(key: Array, num: int, dim: int, dtype=jnp.float32) -> Array:
  """``num`` Haar-distributed orthogonal matrices ``[num, dim, dim]`` (QR of Gaussian matrices).

  ``G = QR`` alone does not give Haar Q: the signs of diag(R) are left to the QR algorithm's
  convention, which biases Q (LAPACK's Householder QR makes Q[0, 0] always <= 0; the Performer
  reference's bug). Multiplying column j of Q by sign(R_jj) makes the
  factorization the unique one with a positive diagonal, and that Q is Haar (Mezzadri 2007).
  """
  g = standard_normal(key, (num, dim, dim), dtype)
  q, r = _qr(g)
  signs = jnp.where(jnp.diagonal(r, axis1=-2, axis2=-1) < 0, -1.0, 1.0).astype(dtype)
  return q * signs[..., None, :]


# ---------------------------------------------------------------------------------------------------
# Base (i.i.d.)
# ---------------------------------------------------------------------------------------------------


def iid_gaussian(key: Array, num_features: int, dim: int) -> Projection:
  """'Base' (Rahimi & Recht 2007; Spectraformer eq. 10): rows omega_r ~ N(0, I_d) independently."""
  _check_sizes(num_features, dim)
  return Projection(matrix=standard_normal(key, (num_features, dim)))


# ---------------------------------------------------------------------------------------------------
# ORF
# ---------------------------------------------------------------------------------------------------


def orthogonal(key: Array, num_features: int, dim: int) -> Projection:
  """ORF (Yu et al. 2016; Spectraformer eq. 21): ``W = S Q`` in blocks of d exactly orthogonal rows.

  Each block is a Haar orthogonal matrix Q (sign-corrected QR, see ``haar_orthogonal``) whose rows are
  rescaled by independent chi_d norms S, so every row has the law of a N(0, I_d) vector while the rows
  of one block are orthogonal. Blocks are independent; ``ceil(M / d)`` blocks are drawn and the last one
  is truncated when d does not divide M.
  """
  _check_sizes(num_features, dim)
  blocks = -(-num_features // dim)
  k_rot, k_norm = jax.random.split(key)
  q = haar_orthogonal(k_rot, blocks, dim).reshape(blocks * dim, dim)
  norms = chi(k_norm, dim, (blocks * dim,))
  return Projection(matrix=(norms[:, None] * q)[:num_features])


# ---------------------------------------------------------------------------------------------------
# SORF
# ---------------------------------------------------------------------------------------------------


def sorf_matrix(signs: Array, dim: int) -> Array:
  """SORF rows from Rademacher diagonals: ``sqrt(n) Hn D1 Hn D2 Hn D3`` per block, first ``dim`` columns.

  Spectraformer eq. 22 with the *normalized* Hadamard matrix ``Hn = H / sqrt(n)``, so each block
  ``Hn D1 Hn D2 Hn D3`` is orthogonal and every full row of ``sqrt(n) Hn D1 Hn D2 Hn D3`` has norm
  exactly sqrt(n) (an unnormalized H, as in the Spectraformer code, gives n^{3/2}: ~500 at d = 64).

  Args:
    signs: ``[blocks, 3, n]`` entries +-1 (D1, D2, D3), n a power of two >= dim.
    dim: the input dimension d. Inputs are zero-padded from d to n, which is exact: the padded
      coordinates multiply zeros, so only the first d columns of each block are ever used and only
      those are built.

  Returns:
    ``[blocks * n, dim]``. Each entry has mean 0 and variance 1 over the signs, so E[w w^T] = I_d.
    Built with three FWHTs of the ``d`` needed columns: ``W^T = D3 H D2 H D1 H`` (H symmetric), so
    column c of W is ``((e_c D3) H D2) H D1) H / n``; cost O(blocks d n log n), once per redraw.
  """
  blocks, _, n = signs.shape
  d1, d2, d3 = signs[:, 0, None, :], signs[:, 1, None, :], signs[:, 2, None, :]
  x = jnp.broadcast_to(jnp.eye(dim, n, dtype=signs.dtype), (blocks, dim, n))
  x = hadamard.fwht(x * d3)
  x = hadamard.fwht(x * d2)
  x = hadamard.fwht(x * d1)
  # sqrt(n) * (1 / sqrt(n))^3 = 1 / n for the three unnormalized transforms.
  w = jnp.swapaxes(x, -1, -2) / n                                   # [blocks, n, dim]
  return w.reshape(blocks * n, dim)


def structured_orthogonal(key: Array, num_features: int, dim: int) -> Projection:
  """SORF (Yu et al. 2016; Spectraformer eq. 22), ``ceil(M / n)`` independent blocks, n = 2^ceil(log2 d).

  Returned as a dense ``[M, d]`` matrix (``sorf_matrix``): it is built in O(M d log d) once per redraw,
  and the hot path ``x W^T`` is then a plain matmul. d that is not a power of two is handled by
  zero-padding the inputs to n (exact; the padded columns of W are simply not built).
  """
  _check_sizes(num_features, dim)
  n = hadamard.next_pow2(dim)
  blocks = -(-num_features // n)
  signs = _flat_draw(jax.random.rademacher, key, (blocks, 3, n), dtype=jnp.float32)
  return Projection(matrix=sorf_matrix(signs, dim)[:num_features])


# ---------------------------------------------------------------------------------------------------
# QMC
# ---------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def sobol_points(num_points: int, dim: int) -> np.ndarray:
  """A fixed scrambled Sobol point set ``[num_points, dim]`` in [0, 1)^dim (points are rows).

  The first ``num_points`` points of one scrambled sequence (fixed seed); scipy warns that the balance
  properties need a power-of-two count, which a prefix of the sequence forgoes, so that warning is
  silenced here on purpose: feature counts are a model hyperparameter, not a power of two in general.
  """
  from scipy.stats import qmc as scipy_qmc  # pylint: disable=g-import-not-at-top  (seconds to import)
  sampler = scipy_qmc.Sobol(d=dim, scramble=True, seed=_SOBOL_SEED)
  with warnings.catch_warnings():
    warnings.filterwarnings('ignore', message='.*balance properties.*')
    points = sampler.random(num_points)
  points.setflags(write=False)
  return points


def quasi_monte_carlo(key: Array, num_features: int, dim: int) -> Projection:
  """QMC (Avron et al. 2016; Spectraformer eq. 28): ``omega_r = Phi^-1(t_r)`` for a low-discrepancy t.

  t is a fixed scrambled Sobol set (``sobol_points``) randomized per key by a Cranley-Patterson
  rotation, ``u_r = (t_r + U) mod 1`` with one ``U ~ Uniform[0, 1)^d`` per draw: each u_r is then exactly
  uniform (so each row is exactly N(0, I_d) and the estimator is unbiased) while the set keeps its low
  discrepancy on the torus. ``Phi^-1`` is ``jax.scipy.special.ndtri`` coordinate-wise. u is clipped to
  [2^-24, 1 - 2^-24] so float32 rounding cannot reach ndtri(0) = -inf (|omega| <= 5.3 there).
  """
  _check_sizes(num_features, dim)
  table = jnp.asarray(sobol_points(num_features, dim), jnp.float32)
  shift = jax.random.uniform(key, (dim,), jnp.float32)
  u = jnp.mod(table + shift, 1.0)
  eps = 2.0 ** -24
  u = jnp.clip(u, eps, 1.0 - eps)
  return Projection(matrix=jax.scipy.special.ndtri(u))


# ---------------------------------------------------------------------------------------------------
# Moment matching
# ---------------------------------------------------------------------------------------------------


def moment_matched(key: Array, num_features: int, dim: int) -> Projection:
  """MM (Shen et al. 2017; Spectraformer appendix A.3, W_MM = A^-1 (Phi^-1(t) - mu)).

  For M > d: Gaussian rows G, centered (``Gc = G - mean``), then whitened with the *symmetric* inverse
  square root of the sample second moment ``C = Gc^T Gc / M``: ``W = Gc C^-1/2``. Then exactly
  ``sum_r w_r = 0`` and ``(1 / M) sum_r w_r w_r^T = I_d``, the first two moments of N(0, I_d) under the
  Monte Carlo weights 1/M that the feature average uses. It is computed from the thin SVD
  ``Gc = U S V^T`` as ``W = sqrt(M) U V^T`` (the same matrix), which conditions as Gc rather than as
  C = Gc^T Gc. The symmetric root (rather than a Cholesky factor) keeps the law of W rotation-invariant.

  For M <= d the centered sample has rank < d and no whitening exists; the sampler then falls back to
  one ORF block (orthogonal rows with chi_d norms, ``orthogonal``), the closest moment-controlled
  alternative.
  """
  _check_sizes(num_features, dim)
  if num_features <= dim:
    return orthogonal(key, num_features, dim)
  g = standard_normal(key, (num_features, dim))
  gc = g - jnp.mean(g, axis=0, keepdims=True)
  u, _, vt = _thin_svd(gc)
  return Projection(matrix=math.sqrt(num_features) * (u @ vt))


# ---------------------------------------------------------------------------------------------------
# Sparse-grid quadrature
# ---------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def gauss_hermite_rule(level: int) -> tuple[np.ndarray, np.ndarray]:
  """The 1-D rule U^level: ``2 level - 1`` Gauss-Hermite nodes for N(0, 1), weights summing to 1.

  Probabilists' Hermite (``hermegauss``, weight exp(-x^2/2)), exact for degree ``4 level - 3``. Odd
  sizes make every rule contain the origin, which the Smolyak sum then merges across levels.
  """
  nodes, weights = np.polynomial.hermite_e.hermegauss(2 * level - 1)
  nodes = np.where(np.abs(nodes) < 1e-13, 0.0, nodes)
  return nodes, weights / weights.sum()


def _smolyak_terms(dim: int, level: int):
  """Yields ``(excess, coefficient)`` of the Smolyak sum; excess maps axis -> i_axis - 1 (> 0 only).

  A(q, d) = sum_{q-d+1 <= |i| <= q} (-1)^(q-|i|) C(d-1, q-|i|) U^i1 x ... x U^id, q = d + level - 1,
  i_j >= 1 (Smolyak 1963; Gerstner & Griebel 1998; Heiss & Winschel 2008 for Gaussian weights).
  Axes with i_j = 1 use U^1 = {0}, weight 1, so a term only needs its axes with positive excess
  e_j = i_j - 1, and sum_j e_j = |i| - d.
  """
  for total in range(max(0, level - dim), level):          # total = |i| - d
    coefficient = (-1) ** (level - 1 - total) * math.comb(dim - 1, level - 1 - total)
    for axes in itertools.combinations_with_replacement(range(dim), total):
      excess: dict[int, int] = {}
      for a in axes:
        excess[a] = excess.get(a, 0) + 1
      yield excess, coefficient


@functools.lru_cache(maxsize=64)
def sparse_grid(dim: int, level: int) -> tuple[np.ndarray, np.ndarray]:
  """Smolyak sparse grid of Gauss-Hermite rules for N(0, I_dim): nodes ``[N, dim]``, weights ``[N]``.

  Spectraformer appendix A.3 (W_SGQ is the level-2 case: the origin and +-p e_i) built with the
  Smolyak combination of ``gauss_hermite_rule``. Coinciding nodes of different terms are merged (their
  weights added) and nodes whose weights cancel are dropped. Weights sum to 1 and may be negative.
  Exact for every polynomial of total degree <= 2 level - 1 under N(0, I) (and for each single
  coordinate up to degree 4 level - 3), because each U^i is exact for degree 2 i - 1 or more
  (Novak & Ritter 1999).
  """
  if level < 1:
    raise ValueError(f'sparse-grid level must be >= 1, got {level}')
  all_nodes, all_weights = [], []
  for excess, coefficient in _smolyak_terms(dim, level):
    axes = sorted(excess)
    rules = [gauss_hermite_rule(excess[a] + 1) for a in axes]
    count = int(np.prod([len(r[0]) for r in rules])) if rules else 1
    nodes = np.zeros((count, dim))
    weights = np.full((count,), float(coefficient))
    if rules:
      grids = np.meshgrid(*[r[0] for r in rules], indexing='ij')
      wgrids = np.meshgrid(*[r[1] for r in rules], indexing='ij')
      for axis, g in zip(axes, grids):
        nodes[:, axis] = g.reshape(-1)
      weights = weights * np.prod([w.reshape(-1) for w in wgrids], axis=0)
    all_nodes.append(nodes)
    all_weights.append(weights)
  nodes = np.concatenate(all_nodes)
  weights = np.concatenate(all_weights)
  # Merge coinciding nodes: node values come from a finite set of 1-D rules, so rounding far below
  # their spacing identifies equal nodes exactly (+ 0.0 turns -0.0 into 0.0).
  keys = np.round(nodes, 10) + 0.0
  unique, inverse = np.unique(keys, axis=0, return_inverse=True)
  merged = np.bincount(inverse.reshape(-1), weights=weights, minlength=len(unique))
  keep = np.abs(merged) > 1e-12
  unique, merged = unique[keep], merged[keep]
  unique.setflags(write=False)
  merged.setflags(write=False)
  return unique, merged


def _sparse_grid_size_lower_bound(dim: int, level: int) -> int:
  # Nodes with exactly level-1 coordinates equal to +-sqrt(3) (U^2) on distinct axes come from one
  # Smolyak term only (coefficient +1, positive weights), so they are distinct surviving nodes; a
  # product of 3-point rules on min(level-1, dim) axes is one term's grid of distinct nodes.
  k = level - 1
  bound = 3 ** min(k, dim)
  if k <= dim:
    bound = max(bound, math.comb(dim, k) * 2 ** k)
  return bound


@functools.lru_cache(maxsize=64)
def sparse_grid_level(num_features: int, dim: int) -> int:
  """The largest exactness level (>= 2) whose rule has at most ``num_features`` nodes.

  Level 2 (exact for total degree 3) is served by the symmetric 2d-point rule (``degree3_rule``);
  levels >= 3 by Smolyak grids. Level 1 is the single node 0 (a degenerate feature map), so SGQ needs
  ``num_features >= 2 dim``; smaller values raise a ValueError.
  """
  if num_features < 2 * dim:
    raise ValueError(
        f'SGQ needs num_features >= 2 * dim = {2 * dim} (the degree-3 rule +-sqrt(d) e_i) for '
        f'dim={dim}; got num_features={num_features}. Use more features or another sampler (orf, qmc).')
  level = 2
  while (_sparse_grid_size_lower_bound(dim, level + 1) <= num_features
         and len(sparse_grid(dim, level + 1)[1]) <= num_features):
    level += 1
  return level


def degree3_rule(dim: int) -> tuple[np.ndarray, np.ndarray]:
  """Nodes +-sqrt(d) e_i with weights 1/(2d): exact for total degree <= 3 under N(0, I_d).

  Same exactness as the level-2 Smolyak grid but with 2d nodes and *positive* weights: the Smolyak
  level-2 grid puts weight 1 - d/3 on the origin (-20 at d = 64), which makes positive feature maps
  signed and their normalizer unstable. Odd moments vanish by symmetry; E[x_i^2] = 2 d / (2 d) = 1 and
  E[x_i x_j] = 0.
  """
  eye = np.sqrt(dim) * np.eye(dim)
  return np.concatenate([eye, -eye]), np.full((2 * dim,), 1.0 / (2 * dim))


def sgq_rule(num_features: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
  """The unrotated rule SGQ uses for (M, d): nodes ``[N, d]`` and weights ``[N]`` summing to 1."""
  level = sparse_grid_level(num_features, dim)
  return degree3_rule(dim) if level == 2 else sparse_grid(dim, level)


def sparse_grid_quadrature(key: Array, num_features: int, dim: int) -> Projection:
  """SGQ (Dao et al. 2017; Spectraformer appendix A.3): randomly rotated Smolyak Gauss-Hermite grids.

  The level is the largest whose rule (N nodes, ``sparse_grid_level``) fits in M rows: the positive
  2d-point rule ``degree3_rule`` at level 2, Smolyak grids above. The rule is
  repeated ``R = floor(M / N)`` times, each copy rotated by an independent Haar orthogonal matrix (a
  rotation maps N(0, I) to itself and polynomials of degree p to polynomials of degree p, so each copy
  is still exact for total degree <= 2 level - 1) with weights ``c_j / R``: the average of R exact
  rules. The ``M - R N`` remaining rows carry weight 0 (their nodes are the first rows of one more
  rotated copy, so they stay finite and non-degenerate); they contribute nothing to the estimate and
  keep the rule exact for every M. Weights (``Projection.feature_weights``) sum to 1 and may be
  negative.
  """
  _check_sizes(num_features, dim)
  nodes_np, weights_np = sgq_rule(num_features, dim)
  size = len(weights_np)
  copies = num_features // size
  drawn = -(-num_features // size)
  nodes = jnp.asarray(nodes_np, jnp.float32)
  rotations = haar_orthogonal(key, drawn, dim)                       # [drawn, d, d]
  rows = jnp.einsum('nd,ced->cne', nodes, rotations).reshape(drawn * size, dim)
  weights = np.zeros((drawn * size,))
  weights[:copies * size] = np.tile(weights_np, copies) / copies
  return Projection(matrix=rows[:num_features],
                    feature_weights=jnp.asarray(weights[:num_features], jnp.float32))


# ---------------------------------------------------------------------------------------------------
# FastFood
# ---------------------------------------------------------------------------------------------------


def fastfood(key: Array, num_features: int, dim: int) -> Projection:
  """FastFood (Le et al. 2013; Spectraformer eq. 17; kernel-learning paper eq. 6), structured form.

  ``V = (1 / sqrt(n)) S H G Pi H B`` per block of n = 2^ceil(log2 d) rows, ``ceil(M / n)`` independent
  blocks; b Rademacher, g Gaussian, Pi a uniform permutation, and ``s = chi_n / ||g||_2`` (the block's
  g). Row i of ``H G Pi H B / sqrt(n)`` is ``(h_i * g)^T O`` with O = Pi H B / sqrt(n) orthogonal and
  ``h_i * g ~ N(0, I_n)``: an isotropic vector of norm ||g||, so after S each full row is exactly
  N(0, I_n) (rows of one block are dependent through g), E[v v^T] = I and cos features are unbiased.
  The dense matrix is never built: ``FastFoodBlocks.apply`` zero-pads inputs from d to n (exact, the
  padded coordinates multiply zeros) and costs O(M log d) per input.
  """
  _check_sizes(num_features, dim)
  n = hadamard.next_pow2(dim)
  blocks = -(-num_features // n)
  k_b, k_g, k_perm, k_s = jax.random.split(key, 4)
  b = _flat_draw(jax.random.rademacher, k_b, (blocks, n), dtype=jnp.float32)
  g = standard_normal(k_g, (blocks, n))
  # A uniform permutation per block as the argsort of i.i.d. 32-bit keys (ties, probability < n^2 / 2^33,
  # only make it slightly non-uniform); one batched sort instead of a vmapped jax.random.permutation.
  perm = jnp.argsort(_flat_draw(jax.random.bits, k_perm, (blocks, n), dtype=jnp.uint32), axis=-1)
  s = chi(k_s, n, (blocks, n)) / jnp.linalg.norm(g, axis=-1, keepdims=True)
  return Projection(fastfood=FastFoodBlocks(s=s, g=g, b=b, perm=perm.astype(jnp.int32),
                                            num_features=num_features, dim=dim))


SAMPLERS: dict[str, Sampler] = {
    'iid': iid_gaussian,
    'orf': orthogonal,
    'sorf': structured_orthogonal,
    'qmc': quasi_monte_carlo,
    'mm': moment_matched,
    'sgq': sparse_grid_quadrature,
    'fastfood': fastfood,
}


def register_sampler(name: str, fn: Sampler) -> str:
  """Adds ``fn(key, num_features, dim) -> Projection`` to ``SAMPLERS`` as ``name``; returns the name.

  Like the built-in samplers it must be ``jax.jit``-able with the key traced and the sizes static, and
  draw rows whose distribution is the spectral measure N(0, I_d) the components assume (or set
  ``feature_weights`` for a quadrature rule). Used by ``kernelformer.plugins.register_sampler``.
  """
  if not isinstance(name, str) or not name or name != name.lower() or '-' in name:
    raise ValueError(f'sampler name {name!r}: use lowercase letters, digits and _ (no "-": kernels '
                     'are named <component>-<sampler>)')
  if name in SAMPLERS:
    raise ValueError(f'weight sampler {name!r} is registered twice')
  if not callable(fn):
    raise TypeError(f'weight sampler {name!r}: {fn!r} is not callable')
  SAMPLERS[name] = fn
  return name
