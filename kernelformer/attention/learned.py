"""Learnable spectral samplers: the kernel-learning paper's GMM, FastFood and generative W (§2.1).

"On Learning the Transformer Kernel" (Chowdhury et al.; ``shared/papers/learning-the-transformer-kernel
.txt``) learns the attention kernel by learning the spectral distribution rho(omega) that the random
features sample from. Each sampler here is a Flax linen module that owns the parameters of rho and turns a
base-noise key into a ``Projection`` by reparameterization -- omega = g_theta(noise) -- so gradients of
the attention output reach theta, while the noise is redrawn like any other random feature::

  proj = GMMSampler(num_features=M, dim=d)(key)      # inside a parent module's compact __call__

Any component function (``features/components.py``) then consumes ``proj``: RKS features give the paper's
``*-RKS`` models (eqs. 5-7), positive features its ``*-PRF`` models (eqs. 8-12). ``num_features`` and
``dim`` are static fields; the parameter shapes depend only on them, never on the key.

Initialization. The paper does not state its initialization. Every sampler here starts at (or, for the
generator, as close as its architecture allows to) the spectral distribution N(0, I) of the fixed
kernels, so at step 0 a ``*-PRF`` model estimates the softmax kernel exp(q.k) like Performer's FAVOR+
and a ``*-RKS`` model the Gaussian kernel, and learning moves away from a known-good kernel.
"""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from kernelformer.features import hadamard
from kernelformer.features.projection import FastFoodBlocks, Projection
from kernelformer.features.weights import standard_normal  # float32 N(0, 1), drawn flat

Array = jax.Array


# ----------------------------------------------------------------------------------------------
# GMM: eqs. 4, 5 (RKS) and 8-10 (PRF).
# ----------------------------------------------------------------------------------------------

def component_sizes(num_features: int, num_components: int) -> np.ndarray:
  """How many of the M rows each mixture component gets: as even as possible, ``[C]`` ints.

  With equal weights pi_c = 1/C (the paper's simplification below eq. 4) a fixed, even split of the M
  samples over components is stratified sampling of the mixture: unbiased and of lower variance than
  drawing each row's component at random. When C does not divide M the split is uneven and
  ``gmm_row_weights`` reweights the rows so that every component still carries mass 1/C.
  """
  if num_components < 1 or num_features < num_components:
    raise ValueError(f'need 1 <= num_components <= num_features, got C={num_components}, '
                     f'M={num_features}')
  base, extra = divmod(num_features, num_components)
  return np.array([base + (c < extra) for c in range(num_components)], dtype=np.int64)


def component_of_row(num_features: int, num_components: int) -> np.ndarray:
  """The mixture component of each row of W, ``[M]`` ints (rows of one component are contiguous)."""
  sizes = component_sizes(num_features, num_components)
  return np.repeat(np.arange(num_components), sizes)


def gmm_row_weights(num_features: int, num_components: int) -> Optional[np.ndarray]:
  """Quadrature weights c_r = 1 / (C M_c) for an uneven split; None (Monte Carlo 1/M) for an even one."""
  sizes = component_sizes(num_features, num_components)
  if np.all(sizes == sizes[0]):
    return None
  return (1.0 / (num_components * sizes))[component_of_row(num_features, num_components)]


def gmm_sample(noise: Array, means: Array, factors: Array, covariance: str) -> Array:
  """``omega_r = Sigma_c n_r + mu_c`` (eq. 5 / eq. 10) for the component c of each row r.

  Args:
    noise: ``[M, d]`` standard normal n_r.
    means: ``[C, d]`` mu_c.
    factors: ``[C, d, d]`` (``'full'``) or ``[C, d]`` (``'diag'``) scale factors Sigma_c. As in eq. 5 the
      learnable matrix multiplies the noise, so the covariance of component c is Sigma_c Sigma_c^T.
    covariance: ``'full'`` or ``'diag'``.

  Returns:
    W, ``[M, d]``.
  """
  m, c = noise.shape[0], means.shape[0]
  comp = jnp.asarray(component_of_row(m, c))
  if covariance == 'full':
    spread = jnp.einsum('rij,rj->ri', factors[comp], noise)
  elif covariance == 'diag':
    spread = factors[comp] * noise
  else:
    raise ValueError(f"covariance must be 'full' or 'diag', got {covariance!r}")
  return means[comp] + spread


def _eye_factors(key, shape, dtype=jnp.float32):
  del key  # deterministic: Sigma_c = I
  c, d, _ = shape
  return jnp.broadcast_to(jnp.eye(d, dtype=dtype), (c, d, d))


class GMMSampler(nn.Module):
  """Spectral distribution ``sum_c (1/C) N(mu_c, Sigma_c Sigma_c^T)`` (eqs. 4-5, 8-10), learnable.

  ``covariance='full'``: a full d x d factor per component, as GMM-RKS (eq. 5: "Sigma_c in R^{d_q^2}");
  it needs no triangular or positive constraint, since any real factor gives a valid covariance.
  ``covariance='diag'``: a per-coordinate scale, which is what GMM-PRF uses ("GMM-PRF avoids this [the
  d_q^2 cost] by the use of a diagonal covariance matrix", §2.2). The M rows are split evenly over
  components (``component_sizes``).

  Init: mu_c = 0, Sigma_c = I for every c, so the mixture is exactly N(0, I) and GMM-PRF starts as
  PRF (Performer) and GMM-RKS as RKS. Components start identical; their independent noise breaks the
  symmetry from the first gradient step.

  Params: ``means [C, d]`` and ``factors`` (``[C, d, d]`` or ``[C, d]``).
  """

  num_features: int
  dim: int
  num_components: int = 2
  covariance: str = 'full'

  @nn.compact
  def __call__(self, key: Array) -> Projection:
    c, d, m = self.num_components, self.dim, self.num_features
    component_sizes(m, c)  # validates C against M before any parameter is created
    means = self.param('means', nn.initializers.zeros, (c, d), jnp.float32)
    if self.covariance == 'full':
      factors = self.param('factors', _eye_factors, (c, d, d), jnp.float32)
    elif self.covariance == 'diag':
      factors = self.param('factors', nn.initializers.ones, (c, d), jnp.float32)
    else:
      raise ValueError(f"covariance must be 'full' or 'diag', got {self.covariance!r}")
    noise = standard_normal(key, (m, d))
    w = gmm_sample(noise, means, factors, self.covariance)
    row_w = gmm_row_weights(m, c)
    return Projection(matrix=w, feature_weights=None if row_w is None else jnp.asarray(
        row_w, jnp.float32))


# ----------------------------------------------------------------------------------------------
# FastFood: eqs. 6 and 12, appendix C.1.
# ----------------------------------------------------------------------------------------------

FASTFOOD_VARIANTS = ('fixed', 's', 'sgb')


def fastfood_shape(num_features: int, dim: int) -> tuple[int, int]:
  """``(blocks, n)``: n = 2^ceil(log2 d) (inputs zero-padded, exact) and enough blocks for M rows."""
  n = hadamard.next_pow2(dim)
  return -(-num_features // n), n


def fastfood_noise(key: Array, num_features: int, dim: int) -> dict[str, Array]:
  """Fresh random diagonals of FastFood (Le et al. 2013): row lengths, G, B and the permutation Pi.

  ``row_len`` [blocks, n] ~ chi_n are the desired row norms of V (the norms of Gaussian rows in R^n, so
  that the rows are marginally like N(0, I_n) rows); ``g`` ~ N(0, 1); ``b`` ~ Rademacher; ``perm`` a
  uniform permutation per block.

  All four come from ONE ``[blocks, n, n + 3]`` array of standard normals: g is one slice, b the signs
  of another, Pi the argsort of a third (i.i.d. continuous keys give a uniform permutation) and chi_n
  the norm of the remaining n. Each separate PRNG call (and ``jax.random.gamma``'s rejection loop, the
  usual chi sampler) adds seconds of XLA compile time per head-vmapped layer; the n extra normals per
  row are negligible next to the attention itself.
  """
  blocks, n = fastfood_shape(num_features, dim)
  z = standard_normal(key, (blocks, n, n + 3))
  return {
      'row_len': jnp.sqrt(jnp.sum(jnp.square(z[..., 3:]), axis=-1)),
      'g': z[..., 0],
      'b': jnp.where(z[..., 1] < 0, -1.0, 1.0).astype(jnp.float32),
      'perm': jnp.argsort(z[..., 2], axis=-1).astype(jnp.int32),
  }


def fastfood_blocks(row_len: Array, g: Array, b: Array, perm: Array, num_features: int,
                    dim: int) -> FastFoodBlocks:
  """``V = (1/sqrt(n)) S H G Pi H B`` with ``S = diag(row_len) / |G|_F`` per block (eq. 6, sigma = 1).

  ``FastFoodBlocks.apply`` computes ``diag(s) H G Pi H B x / sqrt(n)``, whose row r has norm
  ``s_r |g|`` when B is +-1: row r of ``H G Pi H B`` is ``sum_j H_rj g_j (Pi H B)_j`` and the rows of
  ``Pi H B`` are orthogonal with norm sqrt(n), so its norm is ``sqrt(n) |g|``. Le et al. therefore set
  ``S_rr = s_r / |G|_F``, making the row norms exactly ``row_len``. (Spectraformer
  eq. 17 prints ``|G|_F^{-1/2}``, which does not give chi-distributed row norms; we follow Le et al.)
  The kernel bandwidth sigma of eq. 6 is 1: the attention module scales q and k instead.
  """
  g_norm = jnp.sqrt(jnp.sum(g * g, axis=-1, keepdims=True))
  return FastFoodBlocks(s=row_len / g_norm, g=g, b=b, perm=perm, num_features=num_features,
                        dim=dim)


def _chi_init(n: int):
  """Initializer: chi_n samples (norms of n-dim standard normal vectors)."""
  def init(key, shape, dtype=jnp.float32):
    z = standard_normal(key, (*shape, n))
    return jnp.sqrt(jnp.sum(z * z, axis=-1)).astype(dtype)
  return init


def _rademacher_init(key, shape, dtype=jnp.float32):
  """Initializer: +-1 with equal probability (the signs of flat-drawn normals, see ``standard_normal``)."""
  return jnp.where(standard_normal(key, shape) < 0, -1.0, 1.0).astype(dtype)


class FastFoodLearnable(nn.Module):
  """FastFood W with learnable diagonals (eqs. 6, 12; Yang et al. 2015 "A la Carte"; appendix C.1).

  The three ablation variants of appendix C.1 (Table 7):

  * ``'fixed'``: "everything fixed" -- S, G, B and Pi all drawn from the key at every redraw (no
    parameters; plain random FastFood).
  * ``'s'`` (FastFood-S): the row lengths S are a parameter; G, B, Pi are redrawn.
  * ``'sgb'`` (FastFood-SGB, the paper's main model): S, G and B are parameters, B relaxed from
    +-1 to a real learnable diagonal as the paper does; only Pi is redrawn. The spectral distribution
    is then that of the rows of V over random permutations -- the noise of the reparameterization.

  S is parameterized as the row lengths ``row_len`` and divided by |G|_F per block (see
  ``fastfood_blocks``), so learning G does not also rescale every row.

  Init: learnable diagonals start as one draw of the fixed FastFood distribution (``row_len`` ~ chi_n,
  G ~ N(0, 1), B ~ +-1; from the 'params' RNG), so over initializations the rows have the second
  moments of N(0, I). Params (per variant): ``row_len``, ``g``, ``b``, each ``[blocks, n]``.
  """

  num_features: int
  dim: int
  variant: str = 'sgb'

  @nn.compact
  def __call__(self, key: Array) -> Projection:
    if self.variant not in FASTFOOD_VARIANTS:
      raise ValueError(f'FastFood variant must be one of {FASTFOOD_VARIANTS}, got {self.variant!r}')
    shape = fastfood_shape(self.num_features, self.dim)
    noise = fastfood_noise(key, self.num_features, self.dim)
    row_len, g, b = noise['row_len'], noise['g'], noise['b']
    if self.variant in ('s', 'sgb'):
      row_len = self.param('row_len', _chi_init(shape[1]), shape, jnp.float32)
    if self.variant == 'sgb':
      g = self.param('g', nn.initializers.normal(1.0), shape, jnp.float32)
      b = self.param('b', _rademacher_init, shape, jnp.float32)
    return Projection(fastfood=fastfood_blocks(row_len, g, b, noise['perm'], self.num_features,
                                               self.dim))


# ----------------------------------------------------------------------------------------------
# Deep generative sampler: eqs. 7 and 11.
# ----------------------------------------------------------------------------------------------

def batch_standardize(x: Array, eps: float = 1e-5) -> Array:
  """``(x - mean) / sqrt(var + eps)`` over axis 0, the batch of M samples (batch norm, training mode)."""
  mean = jnp.mean(x, axis=0, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=0, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps)


class SampleBatchNorm(nn.Module):
  """Batch norm over the M noise samples, always with the statistics of the current batch.

  Why not ``flax.linen.BatchNorm``: its running averages would need a mutable ``batch_stats``
  collection in every apply, and they would buy nothing here -- the "batch" is the sample set itself,
  drawn fresh from a fixed noise distribution at each redraw, so its statistics are always available
  and the same computation runs in training and evaluation. Learnable ``scale`` (init 1) and ``bias``
  (init 0), as in batch norm.
  """

  eps: float = 1e-5

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale = self.param('scale', nn.initializers.ones, (x.shape[-1],), jnp.float32)
    bias = self.param('bias', nn.initializers.zeros, (x.shape[-1],), jnp.float32)
    return batch_standardize(x, self.eps) * scale + bias


class GenerativeSampler(nn.Module):
  """A generator network omega_m = g(n_m), n_m ~ N(0, I_d) (eqs. 7, 11; "GENERATIVE-RKS/PRF").

  Architecture (§2.1): "4 fully connected layers with batch normalisation and LeakyReLU activation,
  followed by a single fully connected layer with tanh activation", noise of dimension d_q. The paper
  gives neither widths nor the LeakyReLU slope; we use width ``hidden_dim`` = d (Table 1 charges the
  generator O(M d_q^2), i.e. width proportional to d_q) and slope 0.2. Batch norm is over the M samples
  of one draw (``SampleBatchNorm``).

  Output scale (our addition, documented deviation): tanh bounds omega to (-1, 1)^d, a far narrower
  spectrum than N(0, I); the paper leaves the scale to W_Q, W_K ("any required scalar factor can be
  incorporated into them", appendix A.3). We end the generator with one more ``SampleBatchNorm`` on
  the tanh output, so at init every coordinate of omega has mean 0 and variance 1 over the M samples
  -- the diagonal second moments of N(0, I), the kernel's bandwidth at the standard scale -- and its
  learnable scale/bias set bandwidth and location per coordinate. The init is otherwise not N(0, I):
  coordinates are non-Gaussian (standardized tanh, lighter tails) and weakly correlated through the
  random layers. Params: ``dense_{0..4}`` kernels (hidden ones without bias: batch norm removes it),
  ``norm_{0..4}`` scales and biases.
  """

  num_features: int
  dim: int
  hidden_dim: Optional[int] = None
  num_hidden_layers: int = 4
  negative_slope: float = 0.2

  @nn.compact
  def __call__(self, key: Array) -> Projection:
    width = self.hidden_dim or self.dim
    h = standard_normal(key, (self.num_features, self.dim))
    for i in range(self.num_hidden_layers):
      h = nn.Dense(width, use_bias=False, name=f'dense_{i}')(h)
      h = SampleBatchNorm(name=f'norm_{i}')(h)
      h = nn.leaky_relu(h, self.negative_slope)
    h = jnp.tanh(nn.Dense(self.dim, name=f'dense_{self.num_hidden_layers}')(h))
    w = SampleBatchNorm(name=f'norm_{self.num_hidden_layers}')(h)
    return Projection(matrix=w)


# The learnable ``weights`` names of the attention config -> sampler class. 'fastfoodl' is
# Spectraformer's name for the learnable FastFood.
LEARNED: dict[str, type[nn.Module]] = {
    'gmm': GMMSampler,
    'fastfoodl': FastFoodLearnable,
    'fastfood-learned': FastFoodLearnable,
    'generative': GenerativeSampler,
}


def build_learned(weights: str, num_features: int, dim: int, *, num_components: int = 2,
                  covariance: str = 'full', fastfood_variant: str = 'sgb',
                  name: Optional[str] = None, parent_vmap_heads: bool = False) -> nn.Module:
  """The sampler module for ``weights`` with its options (unused options are ignored).

  With ``parent_vmap_heads`` the module is wrapped in ``nn.vmap`` over a leading axis of keys, one
  parameter set per entry (each attention head owns its learned spectral distribution).
  """
  cls = LEARNED[weights]
  kwargs = {'num_features': num_features, 'dim': dim}
  if cls is GMMSampler:
    kwargs.update(num_components=num_components, covariance=covariance)
  elif cls is FastFoodLearnable:
    kwargs['variant'] = fastfood_variant
  if parent_vmap_heads:
    cls = nn.vmap(cls, in_axes=0, out_axes=0, variable_axes={'params': 0},
                  split_rngs={'params': True})
  return cls(name=name, **kwargs)


__all__ = [
    'standard_normal',
    'GMMSampler', 'FastFoodLearnable', 'GenerativeSampler', 'SampleBatchNorm', 'LEARNED',
    'FASTFOOD_VARIANTS', 'build_learned', 'component_sizes', 'component_of_row', 'gmm_row_weights',
    'gmm_sample', 'fastfood_shape', 'fastfood_noise', 'fastfood_blocks',
    'batch_standardize',
]
