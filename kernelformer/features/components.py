"""Random-feature component functions f_r(omega_r, x): the phi of ``D^-1 phi(Q) (phi(K)^T V)``.

Spectraformer (eq. 11) writes every random-feature map as a weight matrix W (``projection.py``) combined
with a component function: ``phi(x) = [c_r^(1/2) f_1(omega_r, x)]_r ++ ... ++ [c_r^(1/2) f_l(omega_r, x)]_r``
with l = 1 or 2 parts laid out part by part. This module holds the component functions and exports one
record per map (``FEATURE_MAPS``, ``feature_map.FeatureMap``; ``catalog.get(name)`` finds any)::

  phi_q, phi_k = catalog.get(name).fn(q, k, proj, mask=mask, stabilize=True)

* ``q [..., L, d]``, ``k [..., S, d]``, ``mask`` broadcastable to ``[..., S]`` (True = real key) or None,
  ``proj`` a ``Projection`` (None for the maps without W: ``elu``, ``relu``, ``grelu_det``). Returns
  ``phi_q [..., L, M']`` and ``phi_k [..., S, M']`` in the input dtypes (computed in at least float32).
* What each map estimates is its record's ``target_kernel``, computed exactly by ``exact_kernel``. The
  d^-1/4 input scaling of softmax attention belongs to the attention module: a component estimates
  exp(q.k) (or exp(-|q-k|^2/2)) for exactly the q and k it receives.
* Row weights c_r come from ``row_weights(proj)`` (1/M for Monte Carlo, signed quadrature weights
  otherwise). sqrt|c_r| goes on both sides and sign(c_r) on the query side, so
  ``phi(q).phi(k) = sum_r c_r f_r(q) f_r(k)`` exactly: this is the 1/sqrt(M) normalization too.

Stabilization (``stabilize=True``; docs/kernels.md "Degenerate rows", docs/pallas.md "Stabilizer"): exp-based
features are formed in log space (``phi(q_i)_r = s'_r exp(zq_ir)``, ``phi(k_j)_r = s_r exp(zk_jr)``) and
shifted before ``exp``: key column r by ``beta_r = max_j zk_jr`` over the valid keys, with the same
``beta_r`` *added* to the query exponents, then query row i by ``a_i = max_r (zq_ir + beta_r)``. Every
product is the exact one times ``e^(-a_i)``, which cancels in ``num / den`` (a shift per key would not);
all exponents are <= 0 and the largest term of every bidirectional normalizer is one weight ``|c_r|``, so
it cannot underflow at any norm (the Pallas kernel's convention). Causal callers pass ``causal_chunk=C``
and get per-row running maxima (over keys 0..i, never a later key) plus ``key_shift`` for the core
(``_exp_shifted``; records with ``causal_shift``). Padded keys are left out of ``beta`` and get zero
features; the shifts go through ``stop_gradient`` (they cancel; this avoids NaN from ties in the max).
``stabilize=False`` gives the exact, unbiased features (to test the kernel estimates).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from kernelformer.features.feature_map import SHIFTED_EPS, FeatureMap
from kernelformer.features.projection import Projection, dense_matrix, project, row_weights

Array = jax.Array
ComponentFn = Callable[..., tuple[Array, Array]]

# A guard for the SADERF ratio of second moments: a coordinate that is zero in every query (or key)
# would give Psi = 0 or inf. Any positive Psi keeps the estimator unbiased, so the guard biases nothing.
_SADERF_EPS = 1e-6


# ----------------------------------------------------------------------------------------------
# Shared helpers.
# ----------------------------------------------------------------------------------------------

def compute_dtype(x: Array):
  """float32 for bf16/fp16 inputs (exp in half precision loses everything), else the input dtype."""
  return jnp.promote_types(x.dtype, jnp.float32)


def _cast(q: Array, k: Array, mask: Optional[Array]):
  """``(q.dtype, k.dtype), q, k, mask, dt``: q and k in the compute dtype ``dt``, the mask as ``key_mask``."""
  dt = compute_dtype(q)
  return (q.dtype, k.dtype), q.astype(dt), k.astype(dt), key_mask(mask, k), dt


def key_mask(mask: Optional[Array], k: Array) -> Optional[Array]:
  """The key mask broadcast to ``k.shape[:-1]`` (``[..., S]``), or None."""
  if mask is None:
    return None
  return jnp.broadcast_to(jnp.asarray(mask, bool), k.shape[:-1])


def _sq_norm(x: Array) -> Array:
  """``|x|^2`` over the last axis, keeping it: ``[..., n, 1]``."""
  return jnp.sum(x * x, axis=-1, keepdims=True)


def _side_scales(proj: Projection, parts: int, dtype) -> tuple[Array, Array]:
  """Per-feature multipliers (query, key): ``sign(c_r) sqrt|c_r|`` and ``sqrt|c_r|``, tiled per part.

  Spectraformer eq. 11: the feature of part p and row r is ``sqrt(c_r) f_p(omega_r, x)``; signed
  quadrature weights put their sign on the query side only so the product carries ``c_r`` itself.
  """
  c = row_weights(proj, dtype)
  mag = jnp.sqrt(jnp.abs(c))
  q_scale = jnp.where(c < 0, -mag, mag)
  return jnp.tile(q_scale, parts), jnp.tile(mag, parts)


def _chunk_prefix_max(zk: Array, chunk: int, init: Optional[Array] = None) -> Array:
  """``beta_nr = max {zk_jr : j in chunks 0..n}``, ``[..., N, F]`` for chunks of ``chunk`` rows.

  The running (prefix) maximum over chunks of the key log-magnitudes (masked keys are ``-inf``); a
  column with no valid key yet gets 0 (its features are all 0, any shift is correct). ``init``
  (broadcastable to ``[..., 1, F]``, may be ``-inf``): the running maximum carried in from keys before
  this block (incremental decoding, stateful evaluation), included in every ``beta_n``.
  """
  s, f = zk.shape[-2], zk.shape[-1]
  c = max(1, min(chunk, s))
  n = -(-s // c)
  z = jnp.pad(zk, [(0, 0)] * (zk.ndim - 2) + [(0, n * c - s), (0, 0)], constant_values=-jnp.inf)
  m = jnp.max(z.reshape(zk.shape[:-2] + (n, c, f)), axis=-2)
  m = jax.lax.cummax(m, axis=m.ndim - 2)
  if init is not None:
    m = jnp.maximum(m, init)
  return jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))


def _exp_shifted(zq: Array, zk: Array, mask: Optional[Array], stabilize: bool,
                 causal_chunk: Optional[int] = None, shift_init: Optional[Array] = None):
  """``exp`` of query and key log-magnitudes ``zq [..., L, F]``, ``zk [..., S, F]`` (F = M' or 1 for a
  per-row factor), shifted as the module docstring explains. Masked keys get ``-inf`` before the max, so
  they never set the shift and come out as exactly 0 (``exp(-inf) = 0`` has zero derivative).

  ``causal_chunk`` (causal self-attention, L = S; any C >= 1, which does not enter the features): key j
  and query j are both shifted by ``beta_j``, the running max over the valid keys 0..j; returns ``(exp_q,
  exp_k, beta [..., S, F])`` for the core (``linear.linear_attention(..., key_shift=beta)``).
  ``shift_init`` (with ``causal_chunk`` only; broadcastable to ``[..., 1, F]``, ``-inf`` = no key yet):
  the running max carried in from earlier blocks (decoding, stateful evaluation).
  """
  if mask is not None:
    zk = jnp.where(mask[..., None], zk, -jnp.inf)
  if shift_init is not None and causal_chunk is None:
    raise ValueError('shift_init (a carried running key max) needs causal_chunk')
  if causal_chunk is not None:
    if zq.shape[-2] != zk.shape[-2]:
      raise ValueError(f'causal features need as many queries as keys; got {zq.shape[-2]} and '
                       f'{zk.shape[-2]}')
    beta = _chunk_prefix_max(zk, 1, shift_init)                          # [..., S, F]: per row
    zq = zq + beta
    return jnp.exp(zq - _finite_max(zq, -1)), jnp.exp(zk - beta), beta
  if stabilize:
    # Every key masked: the max is -inf; any finite shift is correct (all key features are 0).
    beta = _finite_max(zk, -2)                                            # [..., 1, F]
    zq = zq + beta
    zq, zk = zq - _finite_max(zq, -1), zk - beta                          # a: [..., L, 1]
  return jnp.exp(zq), jnp.exp(zk)


def _finite_max(x: Array, axis: int) -> Array:
  """The max over ``axis`` (kept) under ``stop_gradient``, 0 where it is not finite."""
  m = jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True))
  return jnp.where(jnp.isfinite(m), m, 0.0)


def _with_shift(phi_q: Array, phi_k: Array, shift: list) -> tuple[Array, ...]:
  """``(phi_q, phi_k)``, plus the causal key shift broadcast to M' columns when one was formed."""
  if not shift:
    return phi_q, phi_k
  beta = shift[0]
  return phi_q, phi_k, jnp.broadcast_to(beta, beta.shape[:-1] + phi_k.shape[-1:])


def zero_masked(phi_k: Array, mask: Optional[Array]) -> Array:
  if mask is None:
    return phi_k
  return jnp.where(mask[..., None], phi_k, 0.0)


def _masked_mean(x: Array, mask: Optional[Array]) -> Array:
  """Mean over axis -2 of ``x [..., n, c]`` restricted to ``mask [..., n]``: ``[..., c]``."""
  if mask is None:
    return jnp.mean(x, axis=-2)
  m = mask[..., None]
  count = jnp.maximum(jnp.sum(m, axis=-2), 1).astype(x.dtype)
  # ``where`` rather than multiplying by the mask: a padded key of infinite entries must not give NaN.
  return jnp.sum(jnp.where(m, x, 0.0), axis=-2) / count


def _row_sq_norms(proj: Projection, dtype) -> Array:
  """``|omega_r|^2`` for every row of W, ``[M]`` (FastFood materialized, O(M d) once per call)."""
  w = dense_matrix(proj).astype(dtype)
  return jnp.sum(w * w, axis=-1)


# ----------------------------------------------------------------------------------------------
# Component functions.
# ----------------------------------------------------------------------------------------------

def trigrf(q: Array, k: Array, proj: Projection, *, mask: Optional[Array] = None,
           stabilize: bool = True, causal_chunk: Optional[int] = None,
           shift_init: Optional[Array] = None) -> tuple[Array, ...]:
  """TrigRF for the softmax kernel: ``exp(|x|^2/2) [cos(W x), sin(W x)]``, estimates ``exp(q.k)``.

  Rahimi-Recht features (Spectraformer eq. 10, kernel-learning paper eq. 3) estimate the Gaussian
  kernel; ``exp(q.k) = exp(|q|^2/2) exp(-|q-k|^2/2) exp(|k|^2/2)`` (Performer, Lemma 1) turns them into
  a softmax-kernel estimate: ``phi(q).phi(k) = e^{(|q|^2+|k|^2)/2} sum_r c_r cos(omega_r.(q-k))``.
  The scale is ``exp(|x|^2/2)``, not ``exp(|x|)`` as in public code. Returns M' = 2M features.

  Stabilized, the query factor ``exp(|q_i|^2/2)`` is a per-row constant and is divided out entirely;
  keys keep ``exp(|k_j|^2/2 - max_valid |k|^2/2)``. Both cancel in the normalization (module docstring).
  Unlike the exp-maps the features are signed, so the normalizer may be small or negative.
  """
  (out_q, out_k), q, k, mask, dt = _cast(q, k, mask)
  pq, pk = project(q, proj), project(k, proj)
  eq, ek, *shift = _exp_shifted(0.5 * _sq_norm(q), 0.5 * _sq_norm(k), mask, stabilize, causal_chunk,
                               shift_init)
  sq, sk = _side_scales(proj, 2, dt)
  phi_q = eq * jnp.concatenate([jnp.cos(pq), jnp.sin(pq)], axis=-1) * sq
  phi_k = ek * jnp.concatenate([jnp.cos(pk), jnp.sin(pk)], axis=-1) * sk
  return _with_shift(phi_q.astype(out_q), zero_masked(phi_k, mask).astype(out_k), shift)


def rks(q: Array, k: Array, proj: Projection, *, mask: Optional[Array] = None,
        stabilize: bool = True) -> tuple[Array, Array]:
  """Random kitchen sinks ``[cos(W x), sin(W x)]``: estimates the Gaussian kernel ``exp(-|q-k|^2/2)``.

  Rahimi and Recht (2007); kernel-learning paper eq. 3; Spectraformer eq. 10 (real part, paired with
  sin rather than a random phase, which removes the phase's variance). ``phi(q).phi(k) =
  sum_r c_r cos(omega_r.(q - k))``, with ``omega ~ N(0, I)`` an unbiased estimate of the Gaussian kernel.
  Bounded features: ``stabilize`` has nothing to do. Returns M' = 2M features.
  """
  del stabilize  # Bounded by sqrt|c_r|: no exponent to shift.
  (out_q, out_k), q, k, mask, dt = _cast(q, k, mask)
  pq, pk = project(q, proj), project(k, proj)
  sq, sk = _side_scales(proj, 2, dt)
  phi_q = jnp.concatenate([jnp.cos(pq), jnp.sin(pq)], axis=-1) * sq
  phi_k = jnp.concatenate([jnp.cos(pk), jnp.sin(pk)], axis=-1) * sk
  return phi_q.astype(out_q), zero_masked(phi_k, mask).astype(out_k)


def posrf(q: Array, k: Array, proj: Projection, *, mask: Optional[Array] = None,
          stabilize: bool = True, causal_chunk: Optional[int] = None,
          shift_init: Optional[Array] = None) -> tuple[Array, ...]:
  """Positive random features ``exp(omega_r.x - |x|^2/2)`` (Performer FAVOR+; Spectraformer eq. 32).

  ``E_omega[exp(omega.q - |q|^2/2) exp(omega.k - |k|^2/2)] = exp(|q+k|^2/2 - |q|^2/2 - |k|^2/2) =
  exp(q.k)`` for ``omega ~ N(0, I)`` (kernel-learning paper §2.3). Returns M' = M positive features.
  Stabilized (module docstring): ``omega_r.k_j - |k_j|^2/2`` minus its max over valid keys per feature r,
  that max added to the query exponent ``omega_r.q_i - |q_i|^2/2``, then each query row minus its max
  over r: all of it cancels, and no normalizer underflows.
  """
  (out_q, out_k), q, k, mask, dt = _cast(q, k, mask)
  zq = project(q, proj) - 0.5 * _sq_norm(q)
  zk = project(k, proj) - 0.5 * _sq_norm(k)
  eq, ek, *shift = _exp_shifted(zq, zk, mask, stabilize, causal_chunk, shift_init)
  sq, sk = _side_scales(proj, 1, dt)
  return _with_shift((eq * sq).astype(out_q), zero_masked(ek * sk, mask).astype(out_k), shift)


def _max_shifted_favor(q: Array, k: Array, proj: Projection, mask: Optional[Array], stabilize: bool,
                       key_axes: Optional[tuple[int, ...]], eps: float,
                       out_dtypes: tuple) -> tuple[Array, Array]:
  """``(exp(omega_r.x - |x|^2/2 - m) + eps)`` times the row scales (``1/sqrt(M)``: Monte Carlo), as the
  Performer codebases compute them (``posrf_lra``, ``performer_skyformer``).

  ``q`` and ``k`` are already in the compute dtype (and scaled as the codebase scales them). With
  ``stabilize``, ``m`` is the max over the features of each query row, and for the keys one max over
  ``key_axes`` of the unpadded keys' logits (``None``: the whole tensor), 0 where every key is
  padded; padded keys get zero features. ``out_dtypes``: the dtypes of the returned (phi_q, phi_k).
  """
  mask = key_mask(mask, k)
  pq, pk = project(q, proj), project(k, proj)
  if stabilize:
    shift_q = jnp.max(pq, axis=-1, keepdims=True)
    pk_valid = pk if mask is None else jnp.where(mask[..., None], pk, -jnp.inf)
    shift_k = jnp.max(pk_valid, axis=key_axes, keepdims=key_axes is not None)
    shift_k = jnp.where(jnp.isfinite(shift_k), shift_k, 0.0)     # every key padded: features are 0
  else:
    shift_q = shift_k = 0.0
  sq, sk = _side_scales(proj, 1, q.dtype)
  phi_q = (jnp.exp(pq - 0.5 * _sq_norm(q) - shift_q) + eps) * sq
  phi_k = (jnp.exp(pk - 0.5 * _sq_norm(k) - shift_k) + eps) * sk
  return phi_q.astype(out_dtypes[0]), zero_masked(phi_k, mask).astype(out_dtypes[1])


# ``make_fast_softmax_attention``'s ``numerical_stabilizer`` default (LRA performer_attention.py line 203),
# which ``nonnegative_softmax_kernel_feature_creator`` adds to every feature after the exp.
LRA_FAVOR_EPSILON = 1e-6


def posrf_lra(q: Array, k: Array, proj: Projection, *, mask: Optional[Array] = None,
              stabilize: bool = True) -> tuple[Array, Array]:
  """LRA's FAVOR+ features: ``(exp(omega_r.x - |x|^2/2 - m) + 1e-6) / sqrt(M)``, as LRA computes them.

  google-research/long-range-arena ``lra_benchmarks/models/performer/performer_attention.py``
  (unchanged since a2e5057; HEAD cd31e5c), ``nonnegative_softmax_kernel_feature_creator`` (lines 50-108)
  as ``make_fast_softmax_attention`` (lines 200-259) uses it: ``data_dash = omega_r . x'`` (``x' = d^-1/4
  x``, the attention module's scale), ``diag = |x'|^2 / 2``; queries shifted by ``max_r data_dash``
  (lines 99-101), keys by one max over every key and feature (lines 103-106), not under
  ``stop_gradient``; the ``eps`` added after the shift does not cancel. Deliberate differences
  (docs/kernels.md, "LRA's ListOps Performer"): padded keys are left out of the key max and get zero
  features; ``stabilize=False`` drops both maxima; the normalizer guard is the core's, not LRA's
  ``R + 2e-6`` (line 695). The key max depends on every key: no causal form (``non_causal``).
  """
  dt = compute_dtype(q)
  return _max_shifted_favor(q.astype(dt), k.astype(dt), proj, mask, stabilize, (-2, -1),
                            LRA_FAVOR_EPSILON, (q.dtype, k.dtype))


# ``softmax_kernel``'s ``eps`` default in Skyformer's Performer (src/models/performer.py line 50), added to
# every feature after the exp.
SKYFORMER_FAVOR_EPSILON = 1e-4


def performer_skyformer(q: Array, k: Array, proj: Projection, *, mask: Optional[Array] = None,
                        stabilize: bool = True) -> tuple[Array, Array]:
  """Skyformer's Performer features, as pkuzengqi/Skyformer computes them (exp(q.k/d) by FAVOR+).

  pkuzengqi/Skyformer @ 1a677cb (files unchanged since cfe8c8c): ``PerformerAttention``
  (src/models/attention_performer.py lines 9-25) calls ``FastAttention`` (src/models/performer.py lines
  174-227; one ORF draw kept as a buffer, rp_dim = 128) on ``Q / d^(1/4)``, ``K / d^(1/4) * mask``, whose
  ``softmax_kernel`` (lines 50-75, ``normalize_data=True``) scales by d^-1/4 *again*: ``x' = x / sqrt(d)``,
  queries ``M^-1/2 (exp(data_dash - diag - max_r data_dash) + 1e-4)`` (lines 67-70), keys the same with
  ONE max over the whole ``[B, H, S, M]`` tensor (``torch.max(data_dash)``, line 73). So it estimates
  ``exp(q.k / d)`` up to the shifts and the floor; this function applies the ``1/sqrt(d)`` itself
  (``target_kernel`` 'none') and, called with ``[B, H, S, d]`` (``whole_tensor``), takes the key max
  over all heads. Maxima not under ``stop_gradient``. Deliberate differences (docs/kernels.md, "Two
  public codes' Performers"): padded keys get zero features and are left out of the key max;
  ``stabilize=False`` drops both maxima.
  """
  dt = compute_dtype(q)
  s = q.shape[-1] ** -0.5
  return _max_shifted_favor(q.astype(dt) * s, k.astype(dt) * s, proj, mask, stabilize, None,
                            SKYFORMER_FAVOR_EPSILON, (q.dtype, k.dtype))


def hyperbolic(q: Array, k: Array, proj: Projection, *, mask: Optional[Array] = None,
               stabilize: bool = True, causal_chunk: Optional[int] = None,
               shift_init: Optional[Array] = None) -> tuple[Array, ...]:
  """Hyperbolic positive features ``exp(+-omega_r.x - |x|^2/2) / sqrt(2)`` (Performer FAVOR+ paper).

  The two-part PRF (Spectraformer eq. 11 with l = 2, eq. 33 there with the Performer's ``|x|^2/2``):
  ``phi(q).phi(k) = sum_r c_r cosh(omega_r.(q + k)) exp(-|q|^2/2 - |k|^2/2)``; the ``+-omega`` pairing
  is an antithetic sample of ``posrf``, so it estimates ``exp(q.k)`` with lower variance. Returns
  M' = 2M positive features ``[exp(+W x ...), exp(-W x ...)]``. Stabilized as ``posrf`` (per-feature key
  maxima over both parts, then one shift per query row: both cancel).
  """
  (out_q, out_k), q, k, mask, dt = _cast(q, k, mask)
  pq, pk = project(q, proj), project(k, proj)
  half_log2 = 0.5 * math.log(2.0)   # the 1/sqrt(2) on each side, kept in the exponent
  zq = jnp.concatenate([pq, -pq], axis=-1) - 0.5 * _sq_norm(q) - half_log2
  zk = jnp.concatenate([pk, -pk], axis=-1) - 0.5 * _sq_norm(k) - half_log2
  eq, ek, *shift = _exp_shifted(zq, zk, mask, stabilize, causal_chunk, shift_init)
  sq, sk = _side_scales(proj, 2, dt)
  return _with_shift((eq * sq).astype(out_q), zero_masked(ek * sk, mask).astype(out_k), shift)


def _query_mask(mask: Optional[Array], q: Array, k: Array) -> Optional[Array]:
  """In self-attention the key padding mask also marks padded *queries*: their content must not
  enter the data-dependent statistics (else padding would change real outputs)."""
  if mask is None or q.shape[-2] != k.shape[-2]:
    return None
  return mask


def oprf_parameter(q: Array, k: Array, mask: Optional[Array] = None) -> Array:
  """OPRF's variance-optimal A (Spectraformer eq. 35; Likhosherstov et al. 2022), ``[...]``.

  ``|x + y|^2`` in eq. 35 is replaced by its mean over all (valid query, valid key) pairs, which factors
  into first and second moments: ``mean|q|^2 + 2 mean(q).mean(k) + mean|k|^2``. With u that mean and
  ``rho = (sqrt((2u + d)^2 + 8 d u) - 2u - d) / (4u)``, ``A = (1 - 1/rho) / 8 < 1/8``. rho is computed as
  the algebraically equal ``2d / (sqrt((2u + d)^2 + 8 d u) + 2u + d)``, which has no 0/0 at u = 0 (where
  A = 0: OPRF reduces to PosRF) and no cancellation for small u. A is a data-dependent constant of an
  estimator that is unbiased for every A < 1/4; it is returned under ``stop_gradient``.
  """
  _, q, k, mask, dt = _cast(q, k, mask)
  qmask = _query_mask(mask, q, k)
  d = q.shape[-1]
  mean_q = _masked_mean(q, qmask)
  mean_k = _masked_mean(k, mask)
  u = (_masked_mean(_sq_norm(q), qmask)[..., 0]
       + 2.0 * jnp.sum(mean_q * mean_k, axis=-1)
       + _masked_mean(_sq_norm(k), mask)[..., 0])
  u = jnp.maximum(u, 0.0)            # a mean of squared norms: negative only by rounding
  inv_rho = (jnp.sqrt((2 * u + d) ** 2 + 8 * d * u) + 2 * u + d) / (2 * d)
  return jax.lax.stop_gradient((1.0 - inv_rho) / 8.0)


def _gerf_features(q: Array, k: Array, proj: Projection, a: Array, mask: Optional[Array],
                   stabilize: bool, causal_chunk: Optional[int] = None,
                   shift_init: Optional[Array] = None) -> tuple[Array, ...]:
  """Positive GERF (Spectraformer eq. 34, s = +1) for the softmax kernel, given A ``[...]``.

  ``f(omega, x) = D exp(A |omega|^2 + B omega.x - |x|^2/2)`` with ``B = sqrt(1 - 4A)`` and
  ``D = (1 - 4A)^(d/4)``. Eq. 34 writes ``C = -(s + 1)/2 = -1``: with it the product estimates the
  Gaussian kernel ``exp(-|x - y|^2/2)``; multiplying by ``exp(|x|^2/2)`` on each side (Performer Lemma 1)
  gives ``C = -1/2`` and ``exp(x.y)``. Check: ``E[f(omega,x) f(omega,y)] = D^2 (1 - 4A)^(-d/2)
  exp(B^2 |x + y|^2 / (2 (1 - 4A))) exp(-|x|^2/2 - |y|^2/2) = exp(x.y)``. D is kept (in log space):
  dropping it, as public code does, scales the estimate by ``(1 - 4A)^(-d/2)``.
  """
  dt = q.dtype
  d = q.shape[-1]
  one_minus_4a = (1.0 - 4.0 * a)[..., None, None]            # [..., 1, 1] over (rows, features)
  bcoef = jnp.sqrt(one_minus_4a)
  log_d = 0.25 * d * jnp.log(one_minus_4a)
  aw = a[..., None, None] * _row_sq_norms(proj, dt)           # [..., 1, M]
  zq = aw + bcoef * project(q, proj) - 0.5 * _sq_norm(q) + log_d
  zk = aw + bcoef * project(k, proj) - 0.5 * _sq_norm(k) + log_d
  eq, ek, *shift = _exp_shifted(zq, zk, mask, stabilize, causal_chunk, shift_init)
  sq, sk = _side_scales(proj, 1, dt)
  return _with_shift(eq * sq, zero_masked(ek * sk, mask), shift)


def oprf(q: Array, k: Array, proj: Projection, *, mask: Optional[Array] = None,
         stabilize: bool = True, causal_chunk: Optional[int] = None,
         shift_init: Optional[Array] = None) -> tuple[Array, ...]:
  """Optimized positive random features (FAVOR++; Spectraformer eqs. 34-35), estimate ``exp(q.k)``.

  GERF with s = +1 and A from ``oprf_parameter`` (one A per batch element/head, from the moments of
  q and the valid keys). Positive and bounded in omega (A < 0 damps large ``|omega|``). Returns M' = M.
  Stabilized: per-feature key maxima and per-query-row maxima of the full exponent, as in ``posrf``.
  """
  (out_q, out_k), q, k, mask, dt = _cast(q, k, mask)
  a = oprf_parameter(q, k, mask)
  phi_q, phi_k, *shift = _gerf_features(q, k, proj, a, mask, stabilize, causal_chunk, shift_init)
  return _with_shift(phi_q.astype(out_q), phi_k.astype(out_k), shift)


def saderf_scaling(q: Array, k: Array, mask: Optional[Array] = None) -> Array:
  """SADERF's diagonal Psi (Spectraformer eq. 36; Likhosherstov et al. 2023, FAVOR#), ``[..., d]``.

  ``Psi_ll = (sum_j k_jl^2 / sum_i q_il^2)^(1/4)`` balances the per-coordinate second moments of
  ``Psi q`` and ``Psi^-1 k``. Written with means (over all queries and over valid keys): the variance
  objective sums over all (i, j) pairs, which weights each query by S and each key by L, so means are
  the pair-balanced form and equal eq. 36's sums whenever L equals the number of valid keys (self-
  attention without padding). Since ``(Psi q).(Psi^-1 k) = q.k`` for every positive diagonal Psi, the
  estimate stays unbiased for any Psi: it is returned under ``stop_gradient``, and a tiny relative
  guard keeps it finite for a coordinate that is zero throughout.
  """
  _, q, k, mask, dt = _cast(q, k, mask)
  mq = _masked_mean(q * q, _query_mask(mask, q, k))
  mk = _masked_mean(k * k, mask)
  eps = _SADERF_EPS * 0.5 * jnp.mean(mq + mk, axis=-1, keepdims=True) + jnp.finfo(dt).tiny
  return jax.lax.stop_gradient(((mk + eps) / (mq + eps)) ** 0.25)


def saderf(q: Array, k: Array, proj: Projection, *, mask: Optional[Array] = None,
           stabilize: bool = True, causal_chunk: Optional[int] = None,
           shift_init: Optional[Array] = None) -> tuple[Array, ...]:
  """Simplified asymmetric dense-exponential RF (FAVOR#; Spectraformer eq. 36), estimate ``exp(q.k)``.

  ``f^(1)(omega, q) = f_GE^(1)(omega, Psi q)`` and ``f^(2)(omega, k) = f_GE^(2)(omega, Psi^-1 k)`` with Psi
  from ``saderf_scaling`` and the positive GERF of ``oprf`` (its A from the moments of the transformed
  inputs). ``(Psi q).(Psi^-1 k) = q.k``, so the target is unchanged. Returns M' = M positive features;
  stabilized exactly like ``oprf`` (applied to the transformed inputs).
  """
  (out_q, out_k), q, k, mask, dt = _cast(q, k, mask)
  psi = saderf_scaling(q, k, mask)[..., None, :]
  qt, kt = q * psi, k / psi
  a = oprf_parameter(qt, kt, mask)
  phi_q, phi_k, *shift = _gerf_features(qt, kt, proj, a, mask, stabilize, causal_chunk, shift_init)
  return _with_shift(phi_q.astype(out_q), phi_k.astype(out_k), shift)


def elu(q: Array, k: Array, proj: Optional[Projection] = None, *, mask: Optional[Array] = None,
        stabilize: bool = True) -> tuple[Array, Array]:
  """``elu(x) + 1`` (Katharopoulos et al. 2020, the Linear Transformer): positive, no projection.

  A deterministic feature map (M' = d) that defines its own kernel ``(elu(q)+1).(elu(k)+1)``; it
  estimates nothing, so its ``target_kernel`` is 'none'. ``proj`` and ``stabilize`` are ignored
  (bounded below by 0 and linear above: nothing overflows).
  """
  del proj, stabilize
  return _elementwise(lambda x: jax.nn.elu(x) + 1.0, q, k, mask)


def relu(q: Array, k: Array, proj: Optional[Projection] = None, *, mask: Optional[Array] = None,
         stabilize: bool = True) -> tuple[Array, Array]:
  """``relu(x)``: the non-negative deterministic map of the kernel-learning literature (M' = d).

  Like ``elu`` it defines its own kernel (``target_kernel`` 'none'); ``proj`` and
  ``stabilize`` are ignored. Features may be all zero for a row: the attention core's
  ``safe_normalizer`` keeps that row finite.
  """
  del proj, stabilize
  return _elementwise(jax.nn.relu, q, k, mask)


def _elementwise(fn: Callable[[Array], Array], q: Array, k: Array, mask: Optional[Array]):
  """``fn`` of every entry (M' = d), in the compute dtype; masked keys' features 0."""
  (out_q, out_k), q, k, mask, _ = _cast(q, k, mask)
  return fn(q).astype(out_q), zero_masked(fn(k), mask).astype(out_k)


# The additive constant of the official generalized attention (``kernel_epsilon=0.001``).
GRELU_EPSILON = 1e-3


def grelu(q: Array, k: Array, proj: Optional[Projection] = None, *, mask: Optional[Array] = None,
          stabilize: bool = True) -> tuple[Array, Array]:
  """Generalized ReLU features ``relu(W x) + eps``, eps = 1e-3: the Performer's generalized attention.

  The official Performer code (google-research ``performer/fast_attention/jax/fast_attention.py``,
  ``make_fast_generalized_attention`` defaults ``kernel_fn=relu``, ``kernel_epsilon=0.001``,
  ``normalize_data=False``): ``relu(x W^T) + 0.001`` on the raw x, no 1/sqrt(M); ``proj=None`` is its
  ``features_type='deterministic'`` (M' = d), what LRA's Performer configs run. Each row here also
  carries ``sqrt|c_r|`` (sign on the query side), so ``phi(q).phi(k) = sum_r c_r (relu(w_r.q) +
  eps)(relu(w_r.k) + eps)``: for Monte Carlo weights the official features times 1/sqrt(M), which
  cancels. Its own kernel (w ~ N(0, I), M -> inf: Cho & Saul 2009's degree-1 arc-cosine kernel plus eps
  terms; docs/kernels.md, "Performer generalized ReLU features"); bounded by a linear function of |x|,
  so ``stabilize`` has nothing to do.
  """
  del stabilize
  (out_q, out_k), q, k, mask, dt = _cast(q, k, mask)
  if proj is None:
    return ((jax.nn.relu(q) + GRELU_EPSILON).astype(out_q),
            zero_masked(jax.nn.relu(k) + GRELU_EPSILON, mask).astype(out_k))
  sq, sk = _side_scales(proj, 1, dt)
  phi_q = (jax.nn.relu(project(q, proj)) + GRELU_EPSILON) * sq
  phi_k = (jax.nn.relu(project(k, proj)) + GRELU_EPSILON) * sk
  return phi_q.astype(out_q), zero_masked(phi_k, mask).astype(out_k)


def grelu_det(q: Array, k: Array, proj: Optional[Projection] = None, *,
              mask: Optional[Array] = None, stabilize: bool = True) -> tuple[Array, Array]:
  """``relu(x) + 1e-3``: ``grelu`` without W (the official ``features_type='deterministic'``)."""
  del proj
  return grelu(q, k, None, mask=mask, stabilize=stabilize)


# ----------------------------------------------------------------------------------------------
# Split (log-space) forms for the memory-lean attention path (``linear.exp_feature_attention``).
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LogSpaceForm:
  """An exp-map written as per-row log-magnitudes: ``phi(q_i)_r = sq_r exp(zq_ir)``, same for keys.

  ``logits(x, proj)`` gives ``z`` for a block of rows ``[..., n, d] -> [..., n, F]`` using nothing but
  those rows and W, so ``linear.exp_feature_attention`` can form features a chunk of the sequence at a
  time, recompute them in the backward instead of storing them, and apply the stabilizer of
  ``_exp_shifted`` itself (key-column maxima beta_r over valid keys, query-row maxima a_i, both under
  ``stop_gradient``). ``scales(proj, dtype)`` are the per-feature (query, key) multipliers
  ``sign(c_r) sqrt|c_r|`` and ``sqrt|c_r|``. Query and key logits are the same function for the maps
  registered here (Performer Lemma 1 is symmetric in q and k).
  """

  logits: Callable[[Array, Projection], Array]
  parts: int

  def scales(self, proj: Projection, dtype) -> tuple[Array, Array]:
    return _side_scales(proj, self.parts, dtype)


def _posrf_logits(x: Array, proj: Projection) -> Array:
  """``omega_r.x - |x|^2/2``: the exponent of ``posrf`` (Performer Lemma 1; Spectraformer eq. 32)."""
  return project(x, proj) - 0.5 * _sq_norm(x)


def _hyperbolic_logits(x: Array, proj: Projection) -> Array:
  """``+-omega_r.x - |x|^2/2 - log(2)/2``: the exponent of ``hyperbolic`` (both parts)."""
  px = project(x, proj)
  return jnp.concatenate([px, -px], axis=-1) - 0.5 * _sq_norm(x) - 0.5 * math.log(2.0)


def _posrf_unit_key_shift(proj: Projection, dtype) -> Array:
  """``|omega_r| - 1/2 >= omega_r.k - |k|^2/2`` for every unit k (Cauchy-Schwarz), ``[..., 1, M]``."""
  return (jnp.sqrt(_row_sq_norms(proj, dtype)) - 0.5)[..., None, :]


def _hyperbolic_unit_key_shift(proj: Projection, dtype) -> Array:
  """``|omega_r| - 1/2 - log(2)/2`` for both parts ``+-omega_r``, ``[..., 1, 2M]``."""
  r = jnp.sqrt(_row_sq_norms(proj, dtype))
  return (jnp.concatenate([r, r], axis=-1) - 0.5 - 0.5 * math.log(2.0))[..., None, :]


# A relative margin on the bound: ``l2_normalize`` leaves |k| = 1 only up to rounding.
_UNIT_KEY_MARGIN = 1e-3


def _unit_key_bound(shift: Callable[[Projection, object], Array]) -> Callable[..., Array]:
  """A record's ``unit_key_shift``: a key shift for unit-norm keys (NPRF's l2-normalized k) from W alone.

  For ``|k| = 1`` the key exponents of ``posrf`` and ``hyperbolic`` are bounded by the row norms of W
  (``omega.k <= |omega|``), so ``beta_r = (1 + 1e-3) |omega_r| - 1/2 (- log(2)/2) + 1e-3`` is >= every
  key exponent: passed as ``shift_init`` (with ``causal_chunk`` the whole length) it is the shift of
  every key, no key enters any shift, and features stay <= 1 (no overflow). A visible key's exponent
  lies within ``2 |omega_r|`` of it (~2 sqrt(d) for Gaussian rows), far from float32 underflow for
  any head dimension in use. Causal RPE uses it (``random_features``): the FFT path of Luo et al.'s
  eq. 10 cannot take a per-chunk running shift (the factor ``exp(beta_n' - beta_n)`` between a key
  chunk n' and a query chunk n is not a Toeplitz weight), and a shift that no key sets needs none, so
  the full forward and the decoder's step use the very same shift.
  """
  def bound(proj: Projection, dtype=jnp.float32) -> Array:
    b = shift(proj, dtype)
    return b + _UNIT_KEY_MARGIN * (jnp.abs(b) + 1.0)
  return bound


def exact_kernel(name_of_target: str, q: Array, k: Array) -> Array:
  """The kernel a component estimates, formed exactly: ``[..., L, S]`` in float32 (or wider).

  ``'softmax'``: ``exp(q.k)``; ``'gaussian'``: ``exp(-|q - k|^2 / 2)`` (from the difference itself, not
  ``|q|^2 + |k|^2 - 2 q.k``, which cancels badly for close points). For tests and benchmarks.
  """
  dt = compute_dtype(q)
  q, k = q.astype(dt), k.astype(dt)
  if name_of_target == 'softmax':
    return jnp.exp(jnp.einsum('...ld,...sd->...ls', q, k))
  if name_of_target == 'gaussian':
    diff = q[..., :, None, :] - k[..., None, :, :]
    return jnp.exp(-0.5 * jnp.sum(diff * diff, axis=-1))
  raise ValueError(f'no exact kernel for target {name_of_target!r}; expected "softmax" or "gaussian"')


# ----------------------------------------------------------------------------------------------
# The records (``feature_map.FeatureMap``; ``catalog.py`` collects them).
# ----------------------------------------------------------------------------------------------

_KL = 'Chowdhury et al. 2022, On Learning the Transformer Kernel'
_SPECTRA = 'Nguyen, Joshi & Salim, Spectraformer'
_GRELU_PAPER = ('Choromanski et al. 2021, generalized attention (official fast_attention.py '
                'make_fast_generalized_attention, kernel_fn=relu, kernel_epsilon=1e-3)')
_GRELU_KERNEL = 'its own kernel sum_r c_r (relu(w_r.q)+eps)(relu(w_r.k)+eps), no d^-1/4 scale'

# The exp-maps share one stabilizer (``_exp_shifted``): a causal form with per-chunk running key maxima,
# and a normalizer in the units of a data-dependent shift (guard ``SHIFTED_EPS``).
_EXP_MAP = dict(positive=True, statistic='key_max', normalizer_eps=SHIFTED_EPS, grid=True)

FEATURE_MAPS = (
    FeatureMap('trigrf', trigrf, 'softmax', parts=2, statistic='key_max', grid=True, pallas_feature='trig',
               paper=f'Rahimi & Recht 2007 with Performer Lemma 1; {_SPECTRA} eqs. 8, 10'),
    FeatureMap('posrf', posrf, 'softmax', parts=1, **_EXP_MAP, pallas_feature='exp',
               log_space=LogSpaceForm(_posrf_logits, parts=1),
               unit_key_shift=_unit_key_bound(_posrf_unit_key_shift),
               paper=f'Choromanski et al. 2021 (FAVOR+); {_SPECTRA} eq. 32'),
    FeatureMap('oprf', oprf, 'softmax', parts=1, **_EXP_MAP, sequence_statistics=True,
               paper=f'Likhosherstov et al. 2022 (FAVOR++); {_SPECTRA} eqs. 34-35'),
    FeatureMap('saderf', saderf, 'softmax', parts=1, **_EXP_MAP, sequence_statistics=True,
               paper=f'Likhosherstov et al. 2023 (FAVOR#); {_SPECTRA} eq. 36'),
    FeatureMap('rks', rks, 'gaussian', parts=2, statistic='row', grid=True,
               paper=f'Rahimi & Recht 2007 (RKS); {_KL} eq. 3'),
    FeatureMap('hyperbolic', hyperbolic, 'softmax', parts=2, **_EXP_MAP,
               log_space=LogSpaceForm(_hyperbolic_logits, parts=2),
               unit_key_shift=_unit_key_bound(_hyperbolic_unit_key_shift),
               paper=f'Choromanski et al. 2021 (hyperbolic PRF); {_SPECTRA} eq. 11 with l=2'),
    FeatureMap('elu', elu, 'none', parts=0, positive=True, statistic='row', pallas_feature='elu',
               paper='Katharopoulos et al. 2020 (Linear Transformer), elu(x)+1',
               approximates='its own kernel (elu(q)+1).(elu(k)+1)'),
    FeatureMap('relu', relu, 'none', parts=0, statistic='row', pallas_feature='relu',
               paper='deterministic relu(x) feature map', approximates='its own kernel relu(q).relu(k)'),
    FeatureMap('grelu', grelu, 'none', parts=1, positive=True, statistic='row', paper=_GRELU_PAPER,
               approximates=_GRELU_KERNEL),
    FeatureMap('grelu_det', grelu_det, 'none', parts=0, positive=True, statistic='row',
               paper=f'{_GRELU_PAPER}, features_type=deterministic (LRA repository default Performer)',
               approximates='its own kernel (relu(q)+eps).(relu(k)+eps), no d^-1/4 scale'),
    FeatureMap('posrf_lra', posrf_lra, 'softmax', parts=1, positive=True,
               paper=('LRA (Tay et al. 2021) FAVOR+: performer_attention.py '
                      'nonnegative_softmax_kernel_feature_creator'),
               non_causal="LRA's key features are shifted by one maximum over all keys and the +1e-6 "
                          'added after the shift does not cancel, so later keys change earlier rows'),
    FeatureMap('performer_skyformer', performer_skyformer, 'none', parts=1, positive=True,
               normalizer_eps=SHIFTED_EPS, statistic='tensor', kind='performer-skyformer', sampler='orf',
               kind_options=(('num_features', 128), ('redraw_every', 0), ('share_heads', True)),
               paper=("Skyformer's Performer (Chen et al. 2021 baseline): pkuzengqi/Skyformer @ 1a677cb "
                      'src/models/attention_performer.py 9-25, src/models/performer.py 50-75, 174-227 '
                      '(rp_dim 128, src/config.py); W drawn once'),
               approximates=('softmax exp(q.k/d) (d^-1/4 applied twice) by FAVOR+, M = 128, one key max '
                             'over the whole batch tensor and a +1e-4 floor'),
               non_causal=('its key features are shifted by one maximum over every key of the batch and the '
                           '+1e-4 added after the shift does not cancel, so later keys change earlier rows')),
)
