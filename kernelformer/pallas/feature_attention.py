"""Fused Pallas kernels for bidirectional random-feature attention: forward and backward, masked.

What. ``feature_attention`` computes normalized linear attention ``D^-1 phi(Q) (phi(K)^T V)``
(Spectraformer eq. 7) for the features of ``features/components.py`` -- ``exp`` (posrf, Spectraformer
eq. 32 / Performer FAVOR+), ``trig`` (trigrf: ``exp(|x|^2/2) [cos Wx, sin Wx]``, Spectraformer eq. 10 with
Performer Lemma 1), ``elu`` (elu + 1) and ``relu`` -- without ever writing the features to HBM: every
kernel recomputes ``phi`` on chip from q or k and the dense projection W.

Why. Plain-XLA linear attention materializes ``phi(Q), phi(K)`` as ``[B, L, H, M]`` arrays; it is memory
bound on them and uses more temporary memory than flash attention (attention-facts.md, "What follows"
2, 3, 6). A fused two-kernel forward ran 3x faster than plain jit in a prototype.

Kernels (grids; every tile below lives on chip, nothing of size ``L x M`` reaches HBM):

* bidirectional forward. (1) ``_fwd_kv_kernel``, grid ``(B, H, splits_k)``: each program loops over its
  key chunks, forms ``phi(K_c)`` and accumulates ``S = sum_j phi(k_j) v_j^T [M, dv]`` and
  ``z = sum_j phi(k_j) [M]``; padded keys contribute nothing. The ``splits_k`` partial states are merged
  by XLA (they are ``O(M dv)`` each). (2) ``_fwd_q_kernel``, grid ``(B, H, query chunks)``:
  ``out_i = phi(q_i) S / phi(q_i).z``.
* backward (``jax.custom_vjp``), recomputing features: a query kernel (``dq``, and the partial sums
  ``dS, dz`` and ``dW`` over its queries) and a key kernel (``dk, dv`` and ``dW``).

No causal form: a chunked causal kernel would need each row's own running key max as its shift (what
``linear.linear_attention(key_shift=)`` does); one shift per chunk lets a later key of the chunk
underflow an earlier row. ``feature_attention(causal=True)`` is refused; causal attention runs on XLA.

Stabilizer (why it cancels). With ``l_r(x)`` the log-magnitude of feature r (``w_r.x - |x|^2/2`` for exp,
``|x|^2/2`` for trig), keys are shifted per feature by a running max ``beta_r`` over the valid keys seen
so far, queries get the compensating ``+beta_r`` and then a per-row max ``a_i``:

    phi(k_j)_r = s_r exp(l_r(k_j) - beta_r) t_r(k_j)
    phi(q_i)_r = s'_r exp(l_r(q_i) + beta_r - a_i) t_r(q_i)

(``t_r`` = 1 or the cosine, ``s, s'`` the quadrature scales). Every product ``phi(q_i)_r phi(k_j)_r`` is the
exact one times ``exp(-a_i)``: one factor per query row, common to its numerator and normalizer, so it
cancels. When ``beta`` grows (flash-attention style) the accumulated state is rescaled row-wise by
``exp(beta_old - beta_new) <= 1``. All exponents are ``<= 0`` (no overflow). ``beta`` is
the max over all valid keys, so for positive features ``a_i = max_{j,r} (l_r(q_i) + l_r(k_j))`` and the
largest term of every normalizer is exactly one weight ``c_r``: the normalizer cannot underflow however
large the input norms (the prototype's fixed bound ``w.k - |k|^2/2 <= |w|^2/2`` and components.py's
single key max can). The normalizer is never smaller
than the XLA path's (``a_i <= max_r l_r(q_i) + max_{j,r} l_r(k_j)``, the XLA shift). For
trig ``l_r`` does not depend on r and this is exactly components.py's convention. Masked keys and
padded feature columns are excluded from the maxima (a finite ``-1e30`` stands for -inf, so no
``inf - inf``). The shifts are constants for differentiation (their exact contribution is zero), as in
components.py.

Gradients (per batch element and head; ``D~ = safe(D)``, ``g_i = dl/dout_i``; ``[.]`` an indicator):

    gN_i = g_i / D~_i,    gD_i = -[|D_i| >= eps] (g_i . out_i) / D~_i
    dphi(q_i) = S gN_i + z gD_i,   dS = sum_i phi(q_i) gN_i^T,   dz = sum_i phi(q_i) gD_i,
    dphi(k_j) = dS v_j + dz,        dv_j = dS^T phi(k_j)
    features (u = dphi * phi, elementwise; s the scale of that side):
      exp:  dx = u W - (sum_r u_r) x,                    dW += u^T x
      trig: dp = -dphi * s * exp(l - shift) * sin(p),    dx = dp W + (sum_r u_r) x,   dW += dp^T x
      elu:  dx = dphi * s * (1 if x > 0 else exp(x)),    relu: dx = dphi * s * [x > 0]
      the scales: ds_r = sum_rows dphi_r * phi_r / s_r  (formed from the unscaled feature).

Feature tiles. Every grid has a last axis over tiles of ``block_m`` feature columns: a
program holds only its tile of W, the states and their gradients. Sums over features (numerator,
normalizer, dq, dk, dv) become per-tile partial sums merged by XLA; the
query row shift ``a_i`` is per tile in the forward, merged as ``a = max_T a_T`` with factors
``exp(a_T - a) <= 1`` (flash-decoding), and kept as a residual so the backward recomputes the same
features tile by tile. ``tiling()`` is the block table; ``fits()`` says whether the offline resource
check (``kernelformer benchmark pallas-resources``) found every kernel of a case within an H100's
registers (no spills) and shared memory.

Numerics. Features and every accumulation are float32. The exponent ``x W^T`` is always a float32-accurate
dot (an error there is a relative error of the feature): 'highest' in interpret mode, Triton's tf32x3
compiled (IEEE float32 dots run on FMA units with the whole contraction per thread, and spilled). With bf16/f16 ``v`` the big
matmuls take operands in that dtype with float32 accumulation (tensor cores); on CPU, where a bf16 dot
with a float32 result is unsupported, interpret mode rounds the operands to bf16 and multiplies in
float32, which is the same arithmetic (a product of two bf16 values is exact in float32).

Targets and verification. The kernels are written for the Triton backend of Pallas on GPU: every tile
is 2-D with power-of-two sides >= 16 (d, dv, M and the lengths are zero-padded internally; padded keys
are masked, padded queries dropped), loops are ``fori_loop`` over ``pl.ds`` slices, no scratch memory.
They are verified on CPU in interpret mode (tests/pallas), with a check that the forward and backward
lower to Triton IR (``jax.export`` for platform 'cuda') and an offline ptxas check that every kernel fits
an H100 (docs/pallas.md, "Resources"). On an H100 (jax 0.11.2) they compiled, matched the XLA path in
the cases checked, and were slower than the XLA path at every length timed (1.2-1.5x forward,
1.9-2.8x forward+backward; docs/benchmarks.md, "GPU"); that run predates the register work
(chunked projections), which has not been timed on a GPU. So ``impl='auto'`` keeps the
XLA path (kernelformer/pallas/validated.py). The Mosaic TPU backend is not supported (docs/pallas.md).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

Array = jax.Array

FEATURES = ('exp', 'trig', 'elu', 'relu')
_PROJECTED = ('exp', 'trig')        # kinds that use the projection W
_NEG = -1e30                        # a finite -inf: max/shift arithmetic never forms inf - inf
_MIN_TILE = 16                      # Triton's smallest dot operand side
_TARGET_PROGRAMS = 256              # split heuristic: about two waves on a 132-SM GPU (not tuned)
_K_CHUNK = 16                       # column chunk of the x W^T contraction (see _projection)
# ``pl.squeezed`` (newer JAX) and ``None`` (older) both mean "block of size 1, dimension dropped".
_SQ = getattr(pl, 'squeezed', None)
_HIGHEST = lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class _Config:
  """Static configuration of one call (hashable: it is a ``nondiff_argnums`` of the custom VJP)."""

  kind: str
  block_q: int
  block_k: int
  inner_q: int       # query chunks per program in the backward query kernel (bidirectional)
  inner_k: int       # key chunks per program in the key kernels (bidirectional)
  eps: float
  interpret: bool
  operand_dtype: str
  num_warps: int = 4
  num_stages: int = 2
  block_m: int = 0   # feature columns per program (the M tile); 0 = all of them
  m_tiles: int = 1   # programs along the feature axis; > 1: outputs are partial sums merged by XLA
  k_chunk: int = 0   # x W^T summed over column chunks of this width when d exceeds it (0 = whole)

  @property
  def projected(self) -> bool:
    return self.kind in _PROJECTED


# ------------------------------------------------------------------------------------------------
# Tile math (pure jnp on values already loaded from refs; shared by all kernels).
# ------------------------------------------------------------------------------------------------

def _dot(cfg: _Config, a: Array, b: Array, dims: str, exact: bool = False) -> Array:
  """2-D matmul with a float32 result. ``dims``: 'nn' a b, 'tn' a^T b, 'nt' a b^T.

  ``exact`` (or float32 operands): float32 accuracy. Compiled, that is Triton's tf32x3 (three
  tensor-core products of the tf32 splits, ~2^-21 relative): Triton's IEEE float32 dot runs on FMA
  units holding the whole contraction per thread, which spilled every kernel (docs/pallas.md,
  "Resources"). Interpret mode (CPU): float32 'highest'. Otherwise the operands are rounded to
  ``cfg.operand_dtype`` and accumulated in float32 (see the module docstring).
  """
  contract = {'nn': ((1,), (0,)), 'tn': ((0,), (0,)), 'nt': ((1,), (1,))}[dims]
  dn = (contract, ((), ()))
  f32 = jnp.float32
  if exact or cfg.operand_dtype == 'float32':
    precision = _HIGHEST if cfg.interpret else lax.DotAlgorithmPreset.TF32_TF32_F32_X3
    return lax.dot_general(a.astype(f32), b.astype(f32), dn, precision=precision,
                           preferred_element_type=f32)
  low = jnp.dtype(cfg.operand_dtype)
  a, b = a.astype(low), b.astype(low)
  if cfg.interpret:
    return lax.dot_general(a.astype(f32), b.astype(f32), dn, precision=_HIGHEST,
                           preferred_element_type=f32)
  return lax.dot_general(a, b, dn, preferred_element_type=f32)


class _Tile(NamedTuple):
  """The features of one chunk, ``[C, M]``, and what their derivative needs."""

  phi: Array              # s * ehat: the feature as it enters the attention sums
  ehat: Array             # the feature without its scale s (0 for masked keys / zero-weight columns)
  mag: Optional[Array]    # trig: exp(l - shift), the magnitude factor; else None
  phase: Optional[Array]  # trig: w.x - theta; else None


def _projection(cfg: _Config, x: Array, w: Array, src=None) -> Array:
  """``x W^T [C, M]`` to float32 accuracy. With ``src = (x_ref, rows, w_ref)`` and d above
  ``cfg.k_chunk``, summed over column chunks of ``k_chunk`` loaded from the refs: a dot operand is
  held whole by every warp that uses it (an A operand of 16 rows by d, split into tf32 high and low
  parts, is d registers per thread), so at d = 128 the whole-width dot alone exceeded the register
  file; chunks bound it by ``k_chunk`` (docs/pallas.md, "Resources")."""
  d = x.shape[1]
  if src is None or not cfg.k_chunk or d <= cfg.k_chunk:
    return _dot(cfg, x, w, 'nt', exact=True)
  x_ref, rows, w_ref = src
  proj = None
  for c0 in range(0, d, cfg.k_chunk):
    cols = pl.ds(c0, cfg.k_chunk)
    part = _dot(cfg, x_ref[rows, cols].astype(jnp.float32), w_ref[:, cols].astype(jnp.float32),
                'nt', exact=True)
    proj = part if proj is None else proj + part
  return proj


def _log_magnitude(cfg: _Config, x: Array, w: Array, theta: Array, src=None):
  """``(l [C, M], phase [C, M] or None)`` for a chunk ``x [C, d]`` (projected kinds)."""
  proj = _projection(cfg, x, w, src)
  return _log_magnitude_of(cfg, proj, 0.5 * jnp.sum(x * x, axis=1, keepdims=True), theta)


def _log_magnitude_of(cfg: _Config, proj: Array, half_sq: Array, theta: Array):
  """``(l, phase)`` from the projection ``x W^T`` and ``|x|^2 / 2`` [C, 1]."""
  if cfg.kind == 'exp':
    return proj - half_sq, None
  phase = proj - theta[None, :]       # theta = pi/2 turns the second half's cosines into sines
  return jnp.broadcast_to(half_sq, phase.shape), phase


def _finish(cfg: _Config, shifted: Array, phase: Optional[Array], s: Array, ok: Array) -> _Tile:
  """Features from a shifted log-magnitude; ``ok`` (broadcastable) marks entries that exist."""
  mag = jnp.where(ok, jnp.exp(shifted), 0.0)
  ehat = mag if cfg.kind == 'exp' else mag * jnp.cos(phase)
  return _Tile(s[None, :] * ehat, ehat, None if cfg.kind == 'exp' else mag, phase)


def _plain_tile(cfg: _Config, x: Array, s: Array, valid: Optional[Array] = None) -> _Tile:
  """elu + 1 or relu of ``x [C, d]`` (M = d); ``s`` is 1 on real columns and 0 on padding."""
  if cfg.kind == 'elu':
    ehat = jnp.where(x > 0, x + 1.0, jnp.exp(jnp.minimum(x, 0.0)))
  else:
    ehat = jnp.maximum(x, 0.0)
  ok = (s != 0)[None, :]
  if valid is not None:
    ok = ok & valid[:, None]
  ehat = jnp.where(ok, ehat, 0.0)
  return _Tile(s[None, :] * ehat, ehat, None, None)


def _key_log_magnitude(cfg: _Config, x, valid, w, theta, s, src=None):
  """``l`` of a key chunk with masked keys and zero-weight columns set to ``_NEG``; and the phase."""
  lg, phase = _log_magnitude(cfg, x, w, theta, src)
  ok = valid[:, None] & (s != 0)[None, :]
  return jnp.where(ok, lg, _NEG), phase, ok


def _key_tile(cfg: _Config, x, valid, w, theta, s, shift, src=None) -> _Tile:
  """Key features with the per-feature shift ``shift [M]`` (the running max the forward used)."""
  if not cfg.projected:
    return _plain_tile(cfg, x, s, valid)
  lg, phase, ok = _key_log_magnitude(cfg, x, valid, w, theta, s, src)
  return _finish(cfg, lg - shift[None, :], phase, s, ok)


def _query_tile(cfg: _Config, x, w, theta, s, shift, row_shift=None, src=None):
  """Query features: ``l + shift`` (the keys' shift, compensated) minus a per-row shift ``a``.

  ``row_shift=None`` (forward): ``a`` is the max of ``l + shift`` over this tile's columns, returned
  so the feature tiles can be merged. Otherwise (backward) the forward's merged ``a`` [C] is used, so
  the recomputed features equal the forward's. Returns ``(tile, a [C])``; ``a = 0`` for elu / relu.
  """
  if not cfg.projected:
    return _plain_tile(cfg, x, s), jnp.zeros((x.shape[0],), jnp.float32)
  lg, phase = _log_magnitude(cfg, x, w, theta, src)
  ok = (s != 0)[None, :]
  u = jnp.where(ok, lg + shift[None, :], _NEG)
  a = jnp.max(u, axis=1) if row_shift is None else row_shift
  return _finish(cfg, u - a[:, None], phase, s, ok), a


def _safe(cfg: _Config, den: Array) -> Array:
  """linear.safe_normalizer: values closer to 0 than eps become +-eps (keeping the sign)."""
  return jnp.where(jnp.abs(den) < cfg.eps, jnp.where(den < 0, -cfg.eps, cfg.eps), den)


def _output_grads(cfg: _Config, g: Array, go: Array, den: Array):
  """``gN = g / D~ [C, dv]`` and ``gD = -(g . out) / D~ [C]`` (zero where the eps guard replaced D).

  ``go`` is the row dot ``g . out`` [C], formed by XLA before the backward kernels: a kernel then
  never loads the output tile (a ``[C, dv]`` block that only fed this one reduction).
  """
  dens = _safe(cfg, den)
  gn = g / dens[:, None]
  gd = jnp.where(jnp.abs(den) < cfg.eps, 0.0, -go / dens)
  return gn, gd


def _tile_grad(cfg: _Config, dphi: Array, tile: _Tile, x: Array, w, s: Array):
  """Chain rule through the features of one chunk: ``(dx [C, d], dW [M, d] or None, ds [M])``."""
  ds = jnp.sum(dphi * tile.ehat, axis=0)
  if cfg.kind == 'exp':
    u = dphi * tile.phi
    dx = _dot(cfg, u, w, 'nn', exact=True) - jnp.sum(u, axis=1, keepdims=True) * x
    return dx, _dot(cfg, u, x, 'tn', exact=True), ds
  if cfg.kind == 'trig':
    radial = jnp.sum(dphi * tile.phi, axis=1, keepdims=True)     # d/dx of exp(|x|^2/2) is x exp(.)
    dp = -dphi * s[None, :] * tile.mag * jnp.sin(tile.phase)
    dx = _dot(cfg, dp, w, 'nn', exact=True) + radial * x
    return dx, _dot(cfg, dp, x, 'tn', exact=True), ds
  if cfg.kind == 'elu':
    # For x <= 0, elu(x) + 1 = exp(x) = ehat is its own derivative.
    return dphi * s[None, :] * jnp.where(x > 0, 1.0, tile.ehat), None, ds
  return dphi * s[None, :] * (x > 0).astype(jnp.float32), None, ds


def _proj_params(w_ref, th_ref):
  """The projection rows and phases (None for elu / relu)."""
  if w_ref is None:
    return None, None
  return w_ref[...].astype(jnp.float32), th_ref[...].astype(jnp.float32)


# ------------------------------------------------------------------------------------------------
# Kernels. Refs arrive with batch and head squeezed; absent optional inputs are None.
# ------------------------------------------------------------------------------------------------

def _fwd_kv_kernel(cfg: _Config, k_ref, v_ref, mask_ref, w_ref, th_ref, s_ref,
                   kv_ref, ks_ref, m_ref):
  """Partial key state of one (b, h, split, feature tile): ``S [Mt, dv]``, ``z [Mt]`` relative to the
  running max (feature columns are independent here, so a tile is a slice of the full state)."""
  w, theta = _proj_params(w_ref, th_ref)
  s = s_ref[...].astype(jnp.float32)
  c = cfg.block_k
  nm, dv = kv_ref.shape

  def body(t, carry):
    kv, ks, m = carry
    sl = pl.ds(pl.multiple_of(t * c, c), c)
    x = k_ref[sl, :].astype(jnp.float32)
    vt = v_ref[sl, :]
    valid = mask_ref[sl] > 0
    if cfg.projected:
      lg, phase, ok = _key_log_magnitude(cfg, x, valid, w, theta, s, (k_ref, sl, w_ref))
      m_new = jnp.maximum(m, jnp.max(lg, axis=0))
      alpha = jnp.exp(m - m_new)                         # <= 1; exp(0) = 1 while nothing is valid
      kv, ks = kv * alpha[:, None], ks * alpha
      tile = _finish(cfg, lg - m_new[None, :], phase, s, ok)
    else:
      m_new, tile = m, _plain_tile(cfg, x, s, valid)
    kv = kv + _dot(cfg, tile.phi, vt, 'tn')
    ks = ks + jnp.sum(tile.phi, axis=0)
    return kv, ks, m_new

  init = (jnp.zeros((nm, dv), jnp.float32), jnp.zeros((nm,), jnp.float32),
          jnp.full((nm,), _NEG, jnp.float32))
  kv, ks, m = lax.fori_loop(0, cfg.inner_k, body, init)
  kv_ref[...] = kv
  ks_ref[...] = ks
  m_ref[...] = m


def _out_value(cfg: _Config, num, den, dtype):
  """One feature tile: the output itself; several: the tile's numerator (merged by ``_merge_rows``)."""
  if cfg.m_tiles == 1:
    return (num / _safe(cfg, den)[:, None]).astype(dtype)
  return num


def _fwd_q_kernel(cfg: _Config, q_ref, w_ref, th_ref, s_ref, beta_ref, kv_ref, ks_ref,
                  o_ref, den_ref, a_ref):
  """``out = phi(Q) S / phi(Q) z`` for one query chunk and feature tile (the key state is complete)."""
  w, theta = _proj_params(w_ref, th_ref)
  s = s_ref[...].astype(jnp.float32)
  beta = beta_ref[...]
  kv, ks = kv_ref[...], ks_ref[...]
  x = q_ref[...].astype(jnp.float32)
  tile, a = _query_tile(cfg, x, w, theta, s, beta, src=(q_ref, slice(None), w_ref))
  num = _dot(cfg, tile.phi, kv, 'nn')
  den = jnp.sum(tile.phi * ks[None, :], axis=1)
  o_ref[...] = _out_value(cfg, num, den, o_ref.dtype)
  den_ref[...] = den
  a_ref[...] = a


def _bwd_q_kernel(cfg: _Config, q_ref, go_ref, den_ref, a_ref, g_ref, w_ref, th_ref, s_ref, beta_ref,
                  kv_ref, ks_ref, dq_ref, dkv_ref, dks_ref, dw_ref, ds_ref):
  """Bidirectional backward, query side, one feature tile: its share of ``dq`` and this split's share
  of ``dS, dz, dW, ds`` for the tile's columns."""
  w, theta = _proj_params(w_ref, th_ref)
  s = s_ref[...].astype(jnp.float32)
  beta = beta_ref[...]
  kv, ks = kv_ref[...], ks_ref[...]
  c = cfg.block_q
  nm, dv = kv.shape

  def body(t, carry):
    dkv, dks, dw, ds = carry
    sl = pl.ds(pl.multiple_of(t * c, c), c)
    x = q_ref[sl, :].astype(jnp.float32)
    gn, gd = _output_grads(cfg, g_ref[sl, :].astype(jnp.float32),
                           go_ref[sl], den_ref[sl])
    tile, _ = _query_tile(cfg, x, w, theta, s, beta, a_ref[sl], (q_ref, sl, w_ref))
    dphi = _dot(cfg, gn, kv, 'nt') + gd[:, None] * ks[None, :]
    dx, dw_t, ds_t = _tile_grad(cfg, dphi, tile, x, w, s)
    dq_ref[sl, :] = dx.astype(dq_ref.dtype)
    dkv = dkv + _dot(cfg, tile.phi, gn, 'tn')
    dks = dks + jnp.sum(tile.phi * gd[:, None], axis=0)
    if cfg.projected:
      dw = dw + dw_t
    return dkv, dks, dw, ds + ds_t

  d = q_ref.shape[-1]
  init = (jnp.zeros((nm, dv), jnp.float32), jnp.zeros((nm,), jnp.float32),
          jnp.zeros((nm, d) if cfg.projected else (1, 1), jnp.float32),
          jnp.zeros((nm,), jnp.float32))
  dkv, dks, dw, ds = lax.fori_loop(0, cfg.inner_q, body, init)
  dkv_ref[...] = dkv
  dks_ref[...] = dks
  if cfg.projected:
    dw_ref[...] = dw
    ds_ref[...] = ds


def _bwd_k_kernel(cfg: _Config, k_ref, v_ref, mask_ref, w_ref, th_ref, s_ref, beta_ref,
                  dkv_ref, dks_ref, dk_ref, dv_ref, dw_ref, ds_ref):
  """Bidirectional backward, key side, one feature tile: its share of ``dk, dv`` and of ``dW, ds``."""
  w, theta = _proj_params(w_ref, th_ref)
  s = s_ref[...].astype(jnp.float32)
  beta = beta_ref[...]
  dkv, dks = dkv_ref[...], dks_ref[...]
  c = cfg.block_k
  nm = dks.shape[0]
  d = k_ref.shape[-1]

  def body(t, carry):
    dw, ds = carry
    sl = pl.ds(pl.multiple_of(t * c, c), c)
    x = k_ref[sl, :].astype(jnp.float32)
    vt = v_ref[sl, :]
    valid = mask_ref[sl] > 0
    tile = _key_tile(cfg, x, valid, w, theta, s, beta, (k_ref, sl, w_ref))
    dphi = jnp.where(valid[:, None], _dot(cfg, vt, dkv, 'nt') + dks[None, :], 0.0)
    dv_ref[sl, :] = _dot(cfg, tile.phi, dkv, 'nn').astype(dv_ref.dtype)
    dx, dw_t, ds_t = _tile_grad(cfg, dphi, tile, x, w, s)
    dk_ref[sl, :] = dx.astype(dk_ref.dtype)
    if cfg.projected:
      dw = dw + dw_t
    return dw, ds + ds_t

  init = (jnp.zeros((nm, d) if cfg.projected else (1, 1), jnp.float32),
          jnp.zeros((nm,), jnp.float32))
  dw, ds = lax.fori_loop(0, cfg.inner_k, body, init)
  if cfg.projected:
    dw_ref[...] = dw
    ds_ref[...] = ds


# ------------------------------------------------------------------------------------------------
# pallas_call plumbing.
# ------------------------------------------------------------------------------------------------

def _spec(block_shape, index_map):
  return pl.BlockSpec(tuple(_SQ if b is None else b for b in block_shape), index_map)


def _compiler_params(cfg: _Config):
  if cfg.interpret:
    return None
  try:
    from jax.experimental.pallas import triton as pl_triton  # pylint: disable=g-import-not-at-top
  except ImportError:  # pragma: no cover - older layouts
    return None
  return pl_triton.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _pallas(cfg: _Config, kernel, name: str, grid, ins, outs):
  """``pallas_call`` with optional operands.

  ``ins`` lists (array or None, block, index_map) and ``outs`` (ShapeDtypeStruct or None, block,
  index_map). The kernel receives every input slot and then every output slot in order, None where the
  entry is None (elu / relu have no W and no W gradient); the result has None in those output slots.
  """
  in_slots = [i for i, e in enumerate(ins) if e[0] is not None]
  out_slots = [i for i, e in enumerate(outs) if e[0] is not None]

  def body(*refs):
    in_refs, out_refs = [None] * len(ins), [None] * len(outs)
    for slot, ref in zip(in_slots, refs[:len(in_slots)]):
      in_refs[slot] = ref
    for slot, ref in zip(out_slots, refs[len(in_slots):]):
      out_refs[slot] = ref
    kernel(cfg, *in_refs, *out_refs)

  call = pl.pallas_call(
      body,
      out_shape=[outs[i][0] for i in out_slots],
      grid=grid,
      in_specs=[_spec(ins[i][1], ins[i][2]) for i in in_slots],
      out_specs=[_spec(outs[i][1], outs[i][2]) for i in out_slots],
      interpret=cfg.interpret,
      name=name,
      compiler_params=_compiler_params(cfg))
  results = call(*[ins[i][0] for i in in_slots])
  full = [None] * len(outs)
  for slot, r in zip(out_slots, results):
    full[slot] = r
  return full


def _f32(shape):
  return jax.ShapeDtypeStruct(shape, jnp.float32)


class _Specs:
  """Operand specs on the grid ``(B, H, S, T)``: S programs along the sequence (splits or query
  chunks), T feature tiles of ``cfg.block_m`` columns. Index maps receive ``(i, j, s, t)``."""

  def __init__(self, cfg: _Config, rows: int):
    self.cfg, self.rows, self.mt = cfg, rows, cfg.block_m

  def seq(self, x, width):            # [B, L, H, w]: the program's rows
    return (x, (None, self.rows, None, width), lambda i, j, s, t: (i, s, j, 0))

  @property
  def _col_tiles(self) -> bool:
    """elu / relu with several feature tiles: feature r is a function of column r alone, so a
    program reads (and differentiates) only its tile's columns of q, k."""
    return not self.cfg.projected and self.cfg.m_tiles > 1

  def x(self, x, width):              # q or k as the features read it: all d, or the tile's columns
    if self._col_tiles:
      return (x, (None, self.rows, None, self.mt), lambda i, j, s, t: (i, s, j, t))
    return self.seq(x, width)

  def x_out(self, shape, dtype):
    """dq or dk: per tile partial sums (``seq_out``), or for column tiles the tile's own columns."""
    if self._col_tiles:
      return (jax.ShapeDtypeStruct(shape, dtype), (None, self.rows, None, self.mt),
              lambda i, j, s, t: (i, s, j, t))
    return self.seq_out(shape, dtype)

  def rowvec(self, x):                # [B, L, H]: den, row shift
    return (x, (None, self.rows, None), lambda i, j, s, t: (i, s, j))

  def mask(self, x):                  # [B, L]
    return (x, (None, self.rows), lambda i, j, s, t: (i, s))

  def params(self, w, theta, scale):
    """W [H, M', d], theta [M'], a scale [H, M']: the program's feature tile (W, theta None for elu /
    relu)."""
    mt = self.mt
    return [(w, (None, mt, w.shape[-1]) if w is not None else None, lambda i, j, s, t: (j, t, 0)),
            (theta, (mt,), lambda i, j, s, t: (t,)),
            (scale, (None, mt), lambda i, j, s, t: (j, t))]

  def state(self, x, width=0):        # [B, H, S, M'(, w)]: per program and tile
    if width:
      return (x, (None, None, None, self.mt, width), lambda i, j, s, t: (i, j, s, t, 0))
    return (x, (None, None, None, self.mt), lambda i, j, s, t: (i, j, s, t))

  def merged(self, x, width=0):       # [B, H, M'(, w)]: one per (b, h), the tile's columns
    if width:
      return (x, (None, None, self.mt, width), lambda i, j, s, t: (i, j, t, 0))
    return (x, (None, None, self.mt), lambda i, j, s, t: (i, j, t))

  def seq_out(self, shape, dtype):
    """[B, L, H, w] in ``dtype``, or with several feature tiles [T, B, L, H, w] float32 partial sums."""
    b, l, h, width = shape
    if self.cfg.m_tiles == 1:
      return (jax.ShapeDtypeStruct(shape, dtype), (None, self.rows, None, width),
              lambda i, j, s, t: (i, s, j, 0))
    return (_f32((self.cfg.m_tiles, b, l, h, width)), (None, None, self.rows, None, width),
            lambda i, j, s, t: (t, i, s, j, 0))

  def rowvec_out(self, shape):
    """[B, L, H] float32, or per tile [T, B, L, H]."""
    if self.cfg.m_tiles == 1:
      return (_f32(shape), (None, self.rows, None), lambda i, j, s, t: (i, s, j))
    return (_f32((self.cfg.m_tiles,) + tuple(shape)), (None, None, self.rows, None),
            lambda i, j, s, t: (t, i, s, j))

  def state_out(self, b, h, n, nm, width=0, keep=True):
    """[B, H, S, M'(, w)] float32 per program (None where ``keep`` is False: elu / relu dW)."""
    shape = (b, h, n, nm) + ((width,) if width else ())
    _, block, index = self.state(None, width)
    return (_f32(shape) if keep else None, block, index)


def _tile_sum(x, dtype):
  """The tiles' partial sums (leading axis) of a gradient, or the gradient itself for one tile."""
  return x if x.ndim == 4 else jnp.sum(x, axis=0).astype(dtype)


def _merge_rows(cfg: _Config, num, den, a, dtype):
  """Outputs from the feature tiles' partial numerators and normalizers, each relative to its own
  row shift ``a_T``: the flash-decoding merge onto ``a = max_T a_T`` (factors ``exp(a_T - a) <= 1``).
  Returns ``(out, den, a)``, ``den`` relative to the merged ``a`` (what the backward recomputes)."""
  if cfg.m_tiles == 1:
    return num, den, a
  a_all = jnp.max(a, axis=0)
  f = jnp.exp(a - a_all[None])
  num = jnp.sum(f[..., None] * num, axis=0)
  den = jnp.sum(f * den, axis=0)
  return (num / _safe(cfg, den)[..., None]).astype(dtype), den, a_all


def _forward(cfg: _Config, q, k, v, w, theta, sq, sk, mask):
  """Runs the forward kernels on padded inputs; returns ``out`` and the residuals of the backward."""
  b, lq, h, d = q.shape
  lk = k.shape[1]
  dv = v.shape[-1]
  nm = sq.shape[-1]
  tiles = cfg.m_tiles
  splits_k = lk // (cfg.block_k * cfg.inner_k)
  sp = _Specs(cfg, cfg.block_k * cfg.inner_k)
  w_in = w if cfg.projected else None
  th_in = theta if cfg.projected else None

  kv_p, ks_p, m_p = _pallas(
      cfg, _fwd_kv_kernel, 'feature_attention_fwd_kv', (b, h, splits_k, tiles),
      [sp.x(k, d), sp.seq(v, dv), sp.mask(mask), *sp.params(w_in, th_in, sk)],
      [sp.state_out(b, h, splits_k, nm, dv), sp.state_out(b, h, splits_k, nm),
       sp.state_out(b, h, splits_k, nm)])
  # Merge the splits' partial states onto their common per-feature max (exp(m_s - beta) <= 1).
  beta = jnp.max(m_p, axis=2)
  scale = jnp.exp(m_p - beta[:, :, None, :])
  kv = jnp.sum(scale[..., None] * kv_p, axis=2)
  ks = jnp.sum(scale * ks_p, axis=2)

  c = cfg.block_q
  sq_ = _Specs(cfg, c)
  out, den, a = _pallas(
      cfg, _fwd_q_kernel, 'feature_attention_fwd_q', (b, h, lq // c, tiles),
      [sq_.x(q, d), *sq_.params(w_in, th_in, sq), sq_.merged(beta), sq_.merged(kv, dv),
       sq_.merged(ks)],
      [sq_.seq_out((b, lq, h, dv), v.dtype), sq_.rowvec_out((b, lq, h)),
       sq_.rowvec_out((b, lq, h))])
  out, den, a = _merge_rows(cfg, out, den, a, v.dtype)
  return out, (q, k, v, w, theta, sq, sk, mask, out, den, a, beta, kv, ks)


def _backward(cfg: _Config, res, g):
  """Cotangents of (q, k, v, w, theta, sq, sk, mask); theta and mask get None (constants)."""
  q, k, v, w, theta, sq, sk, mask, out, den, a, beta, kv, ks = res
  b, lq, h, d = q.shape
  lk = k.shape[1]
  dv = v.shape[-1]
  nm = sq.shape[-1]
  tiles = cfg.m_tiles
  w_in = w if cfg.projected else None
  th_in = theta if cfg.projected else None
  g = g.astype(v.dtype) if g.dtype != v.dtype else g
  # g . out per row (the normalizer's cotangent needs only this reduction of the output).
  go = jnp.sum(g.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
  proj = cfg.projected
  splits_q = lq // (cfg.block_q * cfg.inner_q)
  splits_k = lk // (cfg.block_k * cfg.inner_k)
  spq = _Specs(cfg, cfg.block_q * cfg.inner_q)
  spk = _Specs(cfg, cfg.block_k * cfg.inner_k)

  q_outs = _pallas(
      cfg, _bwd_q_kernel, 'feature_attention_bwd_q', (b, h, splits_q, tiles),
      [spq.x(q, d), spq.rowvec(go), spq.rowvec(den), spq.rowvec(a), spq.seq(g, dv),
       *spq.params(w_in, th_in, sq), spq.merged(beta), spq.merged(kv, dv), spq.merged(ks)],
      [spq.x_out(q.shape, q.dtype), spq.state_out(b, h, splits_q, nm, dv),
       spq.state_out(b, h, splits_q, nm),
       spq.state_out(b, h, splits_q, nm, d, keep=proj), spq.state_out(b, h, splits_q, nm, keep=proj)])
  dq = _tile_sum(q_outs[0], q.dtype)
  dkv, dks = jnp.sum(q_outs[1], axis=2), jnp.sum(q_outs[2], axis=2)
  k_outs = _pallas(
      cfg, _bwd_k_kernel, 'feature_attention_bwd_k', (b, h, splits_k, tiles),
      [spk.x(k, d), spk.seq(v, dv), spk.mask(mask), *spk.params(w_in, th_in, sk),
       spk.merged(beta), spk.merged(dkv, dv), spk.merged(dks)],
      [spk.x_out(k.shape, k.dtype), spk.seq_out(v.shape, v.dtype),
       spk.state_out(b, h, splits_k, nm, d, keep=proj), spk.state_out(b, h, splits_k, nm, keep=proj)])
  dk, dvv = _tile_sum(k_outs[0], k.dtype), _tile_sum(k_outs[1], v.dtype)
  if not proj:
    return dq, dk, dvv, None, None, None, None, None
  dw = jnp.sum(q_outs[3], axis=(0, 2)) + jnp.sum(k_outs[2], axis=(0, 2))
  dsq = jnp.sum(q_outs[4], axis=(0, 2))
  dsk = jnp.sum(k_outs[3], axis=(0, 2))
  return dq, dk, dvv, dw.astype(w.dtype), None, dsq, dsk, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _core(cfg: _Config, q, k, v, w, theta, sq, sk, mask):
  return _forward(cfg, q, k, v, w, theta, sq, sk, mask)[0]


def _core_fwd(cfg: _Config, q, k, v, w, theta, sq, sk, mask):
  return _forward(cfg, q, k, v, w, theta, sq, sk, mask)


_core.defvjp(_core_fwd, _backward)


# ------------------------------------------------------------------------------------------------
# Public API.
# ------------------------------------------------------------------------------------------------

class Tiling(NamedTuple):
  """Launch configuration of one call: sequence block, feature tile, Triton params."""

  block: int
  block_m: int
  num_warps: int
  num_stages: int


def tiling(feature: str, num_features: int, head_dim: int, value_dim: int,
           dtype) -> Tiling:
  """The block table: what ``feature_attention`` launches by default for padded sizes.

  ``num_features`` is the padded feature count M' (2M rounded up for trig; d for elu / relu),
  ``head_dim`` / ``value_dim`` the padded d and dv. Chosen by compiling every case for sm_90a with
  ``kernelformer benchmark pallas-resources`` (docs/pallas.md, "Resources"): registers <= 255, no
  spills, shared memory within the block limit in all 96 cases. ``fits()`` says whether a shape was
  measured as fitting. What sets the registers is the mma.sync operand layout: ~K/2 values per thread
  for an A operand of 16 rows by K, K*N/(32 x warps along N) for a B operand, twice that for tf32x3 --
  so the feature tile (N) and the chunked projection (K) matter, num_warps hardly.
  """
  width = max(head_dim, value_dim)
  f32 = jnp.dtype(dtype) == jnp.float32
  if width > 64:
    block, block_m = 16, 16
  elif feature == 'trig':   # bf16 at 32-row blocks: ptxas held 128 registers and spilled
    block, block_m = 16, (32 if f32 and width > 32 else 16)
  else:     # float32 operands (tf32x3: two parts each) need the smaller query block
    block, block_m = (16 if f32 else 32), (16 if width <= 32 else 32)
  if feature not in _PROJECTED:             # elu / relu: M = d, tiles of q's own columns
    block_m = 32
  return Tiling(block=block, block_m=min(num_features, block_m), num_warps=8, num_stages=1)


def _pow2_at_least(n: int, floor: int = _MIN_TILE) -> int:
  return max(floor, 1 << max(0, int(n) - 1).bit_length())


def _check_block(name: str, value: int) -> int:
  if value < _MIN_TILE or value & (value - 1):
    raise ValueError(f'{name} must be a power of two >= {_MIN_TILE} (a Triton tile side); got {value}')
  return value


def _default_block(length: int, default: int) -> int:
  return min(default, _pow2_at_least(length))


def _splits(n_chunks: int, bh: int, requested: Optional[int]) -> tuple[int, int]:
  """``(splits, chunks per split)`` covering ``n_chunks`` with little padding."""
  want = requested if requested is not None else -(-_TARGET_PROGRAMS // max(bh, 1))
  if want < 1:
    raise ValueError(f'num_splits must be >= 1; got {want}')
  want = min(want, n_chunks)
  inner = -(-n_chunks // want)
  return -(-n_chunks // inner), inner


def _pad_axis(x: Array, axis: int, size: int) -> Array:
  if x.shape[axis] == size:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, size - x.shape[axis])
  return jnp.pad(x, widths)


def _scales(feature: str, feature_weights, heads: int, m: int, width: int):
  """Query and key scales ``[H, width]``: sign(c) sqrt|c| and sqrt|c| (components._side_scales)."""
  if feature_weights is None:
    c = jnp.full((heads, m), 1.0 / m, jnp.float32)
  else:
    c = jnp.broadcast_to(jnp.asarray(feature_weights, jnp.float32), (heads, m))
  mag = jnp.sqrt(jnp.abs(c))
  sq = jnp.where(c < 0, -mag, mag)
  if feature == 'trig':
    sq, mag = jnp.concatenate([sq, sq], axis=-1), jnp.concatenate([mag, mag], axis=-1)
  return _pad_axis(sq, 1, width), _pad_axis(mag, 1, width)


def feature_attention(q: Array, k: Array, v: Array, w: Optional[Array] = None, *,
                      feature: str = 'exp', feature_weights: Optional[Array] = None,
                      mask: Optional[Array] = None, causal: bool = False,
                      block_q: Optional[int] = None, block_k: Optional[int] = None,
                      num_splits: Optional[int] = None, interpret: Optional[bool] = None,
                      eps: float = 1e-6, block_m: Optional[int] = None,
                      num_warps: Optional[int] = None, num_stages: Optional[int] = None) -> Array:
  """Normalized random-feature attention in fused Pallas kernels, ``[B, L, H, dv]`` in ``v.dtype``.

  Equals ``linear.linear_attention(*components.<map>(q, k, Projection(w, feature_weights)), v)`` per
  head up to float32 rounding (where that path's normalizer does not underflow, this one cannot);
  design and math in the module docstring.

  Args:
    q, k: ``[B, L, H, d]``, ``[B, S, H, d]``, already scaled (d^-1/4) by the caller.
    v: ``[B, S, H, dv]``; its dtype sets the output dtype and the matmul operand dtype.
    w: the dense projection, ``[H, M, d]`` or ``[M, d]`` shared by all heads (None for elu / relu);
      differentiable (learnable spectral kernels train through it).
    feature: 'exp' (posrf ``sqrt(c_r) exp(w_r.x - |x|^2/2)``), 'trig' (trigrf
      ``exp(|x|^2/2) [cos, sin](W x)``, 2M features), 'elu' (elu + 1) or 'relu'.
    feature_weights: quadrature weights c_r, ``[M]`` or ``[H, M]``; None = 1/M. Negative weights: sqrt|c|
      on both sides and the sign on the query side, as components.py.
    mask: ``[B, S]`` bool, True = real key. causal: refused in one line (no causal form with the XLA
      path's per-row running-max shift, ``linear.linear_attention(key_shift=)``).
    block_q, block_k: query / key rows per tile, powers of two >= 16. num_splits: programs per (batch,
      head) in the reductions over keys and queries; None = a heuristic aiming at ~256 programs.
    interpret: Pallas interpret mode; None = unless the default backend is a GPU.
    eps: normalizer guard of linear.safe_normalizer.
    block_m: feature columns per program (a power of two >= 16 dividing the padded feature count; fewer
      than the features: one program per tile, XLA merges the partial sums); num_warps, num_stages:
      Triton launch parameters; None = ``tiling()``'s choice.
  """
  if causal:
    raise ValueError('the Pallas kernels are bidirectional only; causal attention: the XLA path')
  if feature not in FEATURES:
    raise ValueError(f'unknown feature {feature!r}; valid: {", ".join(FEATURES)}')
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(f'q, k, v must be [B, L, H, d]; got {q.shape}, {k.shape}, {v.shape}')
  b, lq, h, d = q.shape
  lk = k.shape[1]
  if k.shape != (b, lk, h, d) or v.shape[:3] != (b, lk, h):
    raise ValueError(f'shape mismatch: q {q.shape}, k {k.shape}, v {v.shape}')
  if mask is not None and tuple(mask.shape) != (b, lk):
    raise ValueError(f'mask must be [B, S] = {(b, lk)}; got {tuple(mask.shape)}')
  projected = feature in _PROJECTED
  if projected:
    if w is None:
      raise ValueError(f'feature {feature!r} needs the projection w ([H, M, d] or [M, d])')
    if w.ndim == 2:
      w = jnp.broadcast_to(w, (h,) + w.shape)
    if w.ndim != 3 or w.shape[0] != h or w.shape[2] != d:
      raise ValueError(f'w must be [H, M, d] = [{h}, M, {d}] or [M, d]; got {w.shape}')
  elif w is not None:
    raise ValueError(f'feature {feature!r} takes no projection; got w of shape {w.shape}')
  if interpret is None:
    interpret = jax.default_backend() != 'gpu'

  dv = v.shape[-1]
  d_pad, dv_pad = _pow2_at_least(d), _pow2_at_least(dv)
  if projected:
    nm = _pow2_at_least(w.shape[1] * (2 if feature == 'trig' else 1))
  else:
    nm = d_pad
  tl = tiling(feature, nm, d_pad, dv_pad, v.dtype)
  if block_m is None:
    block_m = tl.block_m
  _check_block('block_m', block_m)
  if nm % block_m:
    raise ValueError(f'block_m must divide the padded feature count {nm}; got {block_m}')
  block_q = _check_block('block_q', block_q or _default_block(lq, tl.block))
  block_k = _check_block('block_k', block_k or _default_block(lk, tl.block))
  splits_q, inner_q = _splits(-(-lq // block_q), b * h, num_splits)
  splits_k, inner_k = _splits(-(-lk // block_k), b * h, num_splits)
  lq_pad, lk_pad = splits_q * inner_q * block_q, splits_k * inner_k * block_k

  half = v.dtype in (jnp.bfloat16, jnp.float16)
  cfg = _Config(kind=feature, block_q=block_q, block_k=block_k, inner_q=inner_q,
                inner_k=inner_k, eps=float(eps), interpret=bool(interpret),
                operand_dtype=jnp.dtype(v.dtype).name if half else 'float32',
                num_warps=num_warps or tl.num_warps, num_stages=num_stages or tl.num_stages,
                block_m=block_m, m_tiles=nm // block_m, k_chunk=_K_CHUNK)

  qp = _pad_axis(_pad_axis(q, 3, d_pad), 1, lq_pad)
  kp = _pad_axis(_pad_axis(k, 3, d_pad), 1, lk_pad)
  vp = _pad_axis(_pad_axis(v, 3, dv_pad), 1, lk_pad)
  valid = jnp.ones((b, lk), jnp.float32) if mask is None else jnp.asarray(mask).astype(jnp.float32)
  valid = _pad_axis(valid, 1, lk_pad)
  if projected:
    m = w.shape[1]
    wf = w.astype(jnp.float32)
    if feature == 'trig':
      wf = jnp.concatenate([wf, wf], axis=1)
      theta = jnp.concatenate([jnp.zeros((m,), jnp.float32),
                               jnp.full((m,), 0.5 * math.pi, jnp.float32)])
    else:
      theta = jnp.zeros((m,), jnp.float32)
    width = _pow2_at_least(wf.shape[1])
    wf = _pad_axis(_pad_axis(wf, 2, d_pad), 1, width)
    theta = _pad_axis(theta, 0, width)
    sq, sk = _scales(feature, feature_weights, h, m, width)
  else:
    if feature_weights is not None:
      raise ValueError(f'feature {feature!r} takes no feature_weights')
    wf = theta = None
    sq = sk = jnp.broadcast_to((jnp.arange(d_pad) < d).astype(jnp.float32), (h, d_pad))
  out = _core(cfg, qp, kp, vp, wf, theta, sq, sk, valid)
  return out[:, :lq, :, :dv]


def fits(feature: str, num_features: Optional[int], head_dim: int, dtype) -> bool:
  """Whether every kernel of this case, at ``tiling()``'s launch configuration, was compiled offline
  and fits an H100 (registers <= 255, no spills, shared memory within the block limit).

  Looked up in ``resources.json`` (written by ``kernelformer benchmark pallas-resources
  --write_table``); an entry counts only if its tiling is the one ``tiling()`` chooses now and it was
  measured for today's kernel code (``kernel_source``, a hash of this file without docstrings), so a
  changed block table or kernel sends 'auto' back to XLA until the check is re-run. ``num_features``
  is M (the rows of W; ignored for elu / relu). Value dim = head dim.
  """
  from kernelformer.pallas import resources  # pylint: disable=g-import-not-at-top
  d = _pow2_at_least(head_dim)
  if feature in _PROJECTED:
    if num_features is None:
      return False
    nm = _pow2_at_least(num_features * (2 if feature == 'trig' else 1))
  else:
    nm = d
  tl = list(tiling(feature, nm, d, d, jnp.dtype(dtype)))
  name = jnp.dtype(dtype).name
  source = resources.kernel_source_hash()
  return any(e['mode'] == 'bidirectional' and e['feature'] == feature and e['num_features'] == nm
             and e['head_dim'] == d and e['dtype'] == name and e['tiling'] == tl and e['fits']
             and e.get('kernel_source') == source
             for e in resources.load_table())


def supported(feature: str, q_shape, dtype, backend: Optional[str] = None, *,
              num_features: Optional[int] = None, check_fit: bool = True) -> bool:
  """Whether ``impl='auto'`` should take these kernels (bidirectional): compiled Triton on a GPU only,
  and only for cases whose kernels fit the hardware (``fits``).

  On CPU the kernels run only in interpret mode (correct, slow) and on TPU they are not written for
  Mosaic, so 'auto' keeps the XLA path there. Head dims above 256 are left to XLA.
  ``check_fit=False`` skips the resource table (the shape and backend checks only).
  """
  backend = backend or jax.default_backend()
  ok = (feature in FEATURES and backend in ('gpu', 'cuda') and len(q_shape) == 4
        and q_shape[-1] <= 256
        and jnp.dtype(dtype) in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16),
                                 jnp.dtype(jnp.float16)))
  if not ok or not check_fit:
    return ok
  return fits(feature, num_features, q_shape[-1], dtype)
