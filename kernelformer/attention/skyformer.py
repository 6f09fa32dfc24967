"""Skyformer: Nyström approximation of Gaussian-kernel attention (Chen et al. 2021, eqs. 4-6 and §4.4).

The kernelized attention matrix ``C = kappa(Q', K')`` (``Q' = Q / p^(1/4)``, ``K' = K / p^(1/4)``, see
``gaussian.py``) is not PSD, so the Nyström method is applied to its PSD completion over the 2n rows
``X = [Q'; K']`` (eq. 4):

    C_bar = kappa(X, X) = [[kappa(Q', Q'), C], [C^T, kappa(K', K')]].

With a uniform sub-sampling S of d rows of X (the landmarks ``X_S``) the approximation is
``C_bar S (S^T C_bar S)^+ S^T C_bar`` (eq. 5) and its off-diagonal block (eq. 6) is

    C_tilde = kappa(Q', X_S) (S^T C_bar S)^+ kappa(X_S, K'),

so ``C_tilde V`` costs O(n d p + d^3) and the n x n matrix is never formed. Like eq. 3, the output is not
normalized by row sums (the paper approximates ``C V`` itself).

Implementation choices (docs/kernels.md "Skyformer" gives the reasons and measurements; the first four
fix known defects of the public code, ``shared/reference/attention-facts.md``):

* **Input scale** ``p^(-1/4)`` from the actual head dimension (not a constant 32^(-1/4)).
* **Landmarks** uniformly *without* replacement, only among valid rows (padding cannot change any
  output); surplus landmarks are switched off exactly (``nystrom_factors``); ``d >= 2n`` uses every row.
* **Inverse** (§4.4): ``(M + gamma I)^-1`` as ``D^-1/2 Y^-1 D^-1/2`` with ``Y = D^-1/2 (M + gamma I)
  D^-1/2``, ``D = diag((M + gamma I) 1)`` (Lemma 3: spectrum of Y in (0, 1)); ``Y^-1`` by Newton-Schulz
  ``Z <- Z (2I - Y Z)`` from ``Z_0 = I / min(1, ||Y||_inf)``, the scale **per matrix**; for an SPD Y
  this identity start beats the classical ``Z_0 = alpha Y^T`` (error ``1 - alpha lambda``, not
  ``1 - alpha lambda^2``).
* **Iterations**: ``num_iterations=None`` takes ``k = ceil(log2(16 (d + gamma) / gamma))`` (15 for
  d = 128, gamma = 0.1): ``lambda_min(Y) >= gamma / (d + gamma)``, so the residual is below e^-16 for
  every input (the public code's 6 third-order steps leave ``max|I - Y Z| ~ 0.5``).
* **gamma** = 0.1, the authors' released code's (the paper names none); 1e-4 breaks float32 Newton-Schulz.

Causal masking is not defined for Skyformer (each landmark summarizes the whole sequence): ``causal=True``
raises. All arithmetic is float32.
"""
from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from kernelformer.attention import draws
from kernelformer.attention.spec import AttentionSpec
from kernelformer.attention.gaussian import gaussian_kernel_matrix, input_scale

Array = jax.Array


def sample_landmarks(key: Array, valid: Array, num_landmarks: int,
                     uniforms: Array | None = None) -> tuple[Array, Array]:
  """Draws ``num_landmarks`` row indices uniformly without replacement among the valid ones.

  Args:
    key: PRNG key (unused when ``uniforms`` is given).
    valid: ``[..., N]`` bool, which rows may be drawn.
    num_landmarks: d <= N (static).
    uniforms: optional i.i.d. U(0, 1) scores broadcastable to ``valid`` (default: drawn from ``key``
      in the shape of ``valid``).

  Returns:
    ``(indices [..., d] int32, landmark_valid [..., d] bool)``. The top d of i.i.d. uniforms is a
    uniformly random d-subset; invalid rows get -1 so they are picked only once every valid row has
    been, and those picks are reported invalid.
  """
  u = jax.random.uniform(key, valid.shape) if uniforms is None else uniforms
  u = jnp.where(valid, u, -1.0)
  _, idx = jax.lax.top_k(u, num_landmarks)
  return idx.astype(jnp.int32), jnp.take_along_axis(valid, idx, axis=-1)


def row_uniforms(key: Array, length: int, num_heads: int) -> Array:
  """One U(0, 1) score per (head, row of [Q; K]): ``[H, 2 * length]``, query rows then key rows.

  Drawn position-major, ``uniform(key, [length, 2, H])``: with JAX's partitionable threefry (the
  default) element (i, s, h) depends only on the key and on i * 2H + s * H + h, so the scores of real
  rows do not change when the sequence is padded to another length, and they are the same for every
  batch row. So the landmark draw is padding-invariant per draw (not only in distribution), and the two
  documents of a Retrieval pair -- encoded in one call -- get the same landmarks where they agree.
  """
  u = jax.random.uniform(key, (length, 2, num_heads))
  return jnp.concatenate([u[:, 0].T, u[:, 1].T], axis=-1)


@functools.partial(jax.jit, static_argnames='num_iterations')
def newton_schulz_inverse(y: Array, num_iterations: int) -> Array:
  """``Y^-1`` for symmetric positive definite ``y [..., d, d]`` with spectrum in (0, 1] (Lemma 3).

  ``Z_{k+1} = Z_k (2I - Y Z_k)`` from ``Z_0 = I / min(1, ||Y||_inf)`` (per matrix); ``I - Y Z_k`` equals
  ``(I - Y Z_0)^(2^k)``. Jitted so that eager (op-by-op) callers do not retrace the loop every call.
  """
  y = y.astype(jnp.float32)
  eye = jnp.eye(y.shape[-1], dtype=y.dtype)
  row_norm = jnp.max(jnp.sum(jnp.abs(y), axis=-1), axis=-1)      # ||Y||_inf >= lambda_max, per matrix
  alpha = 1.0 / jnp.minimum(row_norm, 1.0)
  z = alpha[..., None, None] * jnp.broadcast_to(eye, y.shape)

  def body(_, z):
    return z @ (2.0 * eye - y @ z)

  z = jax.lax.fori_loop(0, num_iterations, body, z)
  # Z is a polynomial in Y, hence symmetric in exact arithmetic; symmetrize away the rounding.
  return 0.5 * (z + jnp.swapaxes(z, -1, -2))


def default_iterations(num_landmarks: int, gamma: float) -> int:
  """Newton-Schulz steps that bring ``(1 - gamma / (d + gamma))^(2^k)`` below e^-16 (module docstring)."""
  return max(1, math.ceil(math.log2(16.0 * (num_landmarks + gamma) / gamma)))


def regularized_inverse(m: Array, gamma: float, num_iterations: int | None = None) -> Array:
  """``(M + gamma I)^-1`` as ``D^-1/2 Y^-1 D^-1/2``, ``Y = D^-1/2 (M + gamma I) D^-1/2`` (§4.4)."""
  w = m + gamma * jnp.eye(m.shape[-1], dtype=m.dtype)
  d_inv_sqrt = jax.lax.rsqrt(jnp.sum(w, axis=-1))                # rows of M are >= 0, so D >= gamma
  y = d_inv_sqrt[..., :, None] * w * d_inv_sqrt[..., None, :]
  if num_iterations is None:
    num_iterations = default_iterations(m.shape[-1], gamma)
  y_inv = newton_schulz_inverse(y, num_iterations)
  return d_inv_sqrt[..., :, None] * y_inv * d_inv_sqrt[..., None, :]


def nystrom_factors(q: Array, k: Array, *, key: Array | None, mask: Array | None,
                    num_landmarks: int, gamma: float, num_iterations: int | None):
  """The three factors of ``C_tilde = left @ middle @ right`` (eq. 6), head-major, float32.

  Args:
    q: ``[B, L, H, p]``; k: ``[B, L, H, p]`` (self-attention: the 2n rows of eq. 4 need both).
    key: PRNG key for the landmark draw (unused when every row is a landmark).
    mask: ``[B, L]`` bool or None.

  Returns:
    ``left [B, H, L, d]`` = kappa(Q', X_S), ``middle [B, H, d, d]`` ~ (M + gamma I)^-1,
    ``right [B, H, d, L]`` = kappa(X_S, K') with padded keys' columns zeroed. A landmark that is switched
    off (fewer valid rows than d) has its row and column of M zeroed, so ``M + gamma I`` is block diagonal
    with a lone gamma for it, and its columns of ``left`` are zeroed: it contributes exactly nothing.
  """
  b, length, h, p = q.shape
  if k.shape[1] != length:
    raise ValueError(f'skyformer completes [Q; K] into one PSD matrix and needs as many keys as queries, '
                     f'got {length} queries and {k.shape[1]} keys')
  s = input_scale(p)
  x = jnp.concatenate([jnp.swapaxes(q, 1, 2), jnp.swapaxes(k, 1, 2)], axis=2).astype(jnp.float32) * s
  valid = jnp.ones((b, length), dtype=bool) if mask is None else mask.astype(bool)
  valid_rows = jnp.broadcast_to(jnp.concatenate([valid, valid], axis=1)[:, None, :], (b, h, 2 * length))
  n_rows = 2 * length
  if num_landmarks >= n_rows:
    landmarks, lm_valid = x, valid_rows                         # every row: deterministic, exact Nyström
  else:
    if key is None:
      raise ValueError('skyformer needs a PRNG key to draw landmarks')
    idx, lm_valid = sample_landmarks(key, valid_rows, num_landmarks,
                                     uniforms=row_uniforms(key, length, h))
    landmarks = jnp.take_along_axis(x, idx[..., None], axis=2)  # [B, H, d, p]
  lm_f = lm_valid.astype(jnp.float32)
  qs, ks = x[:, :, :length], x[:, :, length:]
  left = gaussian_kernel_matrix(qs, landmarks) * lm_f[:, :, None, :]
  right = gaussian_kernel_matrix(landmarks, ks) * valid[:, None, None, :].astype(jnp.float32)
  m = gaussian_kernel_matrix(landmarks, landmarks) * lm_f[..., :, None] * lm_f[..., None, :]
  middle = regularized_inverse(m, gamma, num_iterations)
  return left, middle, right


def skyformer_matrix(q: Array, k: Array, **kwargs) -> Array:
  """The dense approximation ``C_tilde`` ``[B, H, L, L]`` (tests and diagnostics only)."""
  left, middle, right = nystrom_factors(q, k, **kwargs)
  return left @ middle @ right


def skyformer_attention(q: Array, k: Array, v: Array, *, key: Array | None, mask: Array | None = None,
                        num_landmarks: int = 128, gamma: float = 0.1,
                        num_iterations: int | None = None) -> Array:
  """``C_tilde V`` (Skyformer eqs. 4-6), ``[B, L, H, Dv]`` in ``v.dtype``; O(n d (p + Dv))."""
  left, middle, right = nystrom_factors(q, k, key=key, mask=mask, num_landmarks=num_landmarks,
                                        gamma=gamma, num_iterations=num_iterations)
  rv = jnp.einsum('bhds,bshe->bhde', right, v.astype(jnp.float32))
  out = jnp.einsum('bhld,bhde->blhe', left, middle @ rv)
  return out.astype(v.dtype)


class SkyformerAttention(nn.Module):
  """Skyformer (Chen et al. 2021): Nyström on the PSD completion of the Gaussian-kernel matrix.

  Landmarks are redrawn every ``redraw_every`` training steps from ``fold_in(make_rng('features'),
  step // redraw_every)``; evaluation (``step`` None) uses the last training step's draw, whose index
  the ``features`` collection keeps (``attention/draws.py``).
  """

  num_landmarks: int = 128      # d; 128 in the paper's LRA runs ("the number of features to be 128")
  gamma: float = 0.1            # §4.4's constant; the paper gives none, 0.1 is the authors' code's
  num_iterations: int | None = None  # Newton-Schulz steps; None: enough for any input (docstring)
  redraw_every: int = 1         # a fresh uniform sub-sampling S every step; 0: never redraw

  @nn.compact
  def __call__(self, q, k, v, *, mask=None, causal=False, step=None, deterministic=True,
               position_bias=None):
    del deterministic  # no dropout
    if causal:
      raise ValueError('skyformer has no causal form: every landmark mixes all positions. '
                       'Use gaussian, softmax or a random-feature kernel for causal attention.')
    if position_bias is not None:
      raise ValueError('skyformer takes no position_bias')
    key = None
    if self.num_landmarks < 2 * q.shape[1]:
      key = jax.random.fold_in(self.make_rng('features'),
                               draws.current_draw_index(self, step, self.redraw_every))
    return skyformer_attention(q, k, v, key=key, mask=mask, num_landmarks=self.num_landmarks,
                               gamma=self.gamma, num_iterations=self.num_iterations)


SPECS = (AttentionSpec(
    name='skyformer', module=SkyformerAttention,
    paper='Chen et al. 2021 (Skyformer), eqs. 4-6 and §4.4',
    approximates='Gaussian-kernel attention C V (gaussian), Nyström on the PSD completion of [Q; K]',
    complexity='O(L d p + d^3) time, O(L d) memory (d = num_landmarks)'),)
