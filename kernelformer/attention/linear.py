"""The linear-attention core: ``D^-1 phi(Q) (phi(K)^T V)`` (Spectraformer eq. 7; Katharopoulos et al.).

Pure functions on feature maps that have already been computed. Shapes follow the registry:
``phi_q [B, L, H, M]``, ``phi_k [B, S, H, M]``, ``v [B, S, H, Dv]``, ``mask [B, S]`` (True = real key).

* Bidirectional: ``out_i = sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j)`` in O(L M Dv) time and
  O(L (M + Dv) + M Dv) memory: the L x S matrix is never formed.
* Causal: chunked form. Inside a chunk of C positions a masked C x C product; across chunks an
  exclusive prefix sum of the per-chunk ``phi(K)^T V`` states (a position-by-position ``lax.scan`` is
  20-30x slower on accelerators, ``../shared/reference/attention-facts.md``). ``linear_attention`` takes
  stored features (any map); the lean paths form features a chunk at a time and recompute them in the
  backward: ``exp_feature_attention`` / ``causal_exp_feature_attention`` for exp-maps with a
  ``LogSpaceForm`` (posrf, hyperbolic), ``feature_attention`` / ``causal_feature_attention`` for
  row-wise maps (docs/architecture.md says which runs when, and why).
* Padded keys are removed from both numerator and normalizer by zeroing their feature rows.
* Accumulation is float32 whatever the input dtype (bf16 inputs are upcast on CPU, where a bf16 dot with
  a float32 result is not supported, and use ``preferred_element_type`` elsewhere).
* The normalizer never divides by zero: ``|D| < eps`` is replaced by ``eps`` with D's sign; a negative
  ``eps`` is added to every D instead (``D + |eps|``, no clamp, so D always gets its gradient).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

DEFAULT_EPS = 1e-6


def einsum_f32(spec: str, *operands: Array) -> Array:
  """``jnp.einsum`` with float32 accumulation and a float32 result for any input dtype."""
  if jax.default_backend() == 'cpu' or all(o.dtype == jnp.float32 for o in operands):
    return jnp.einsum(spec, *(o.astype(jnp.float32) for o in operands))
  return jnp.einsum(spec, *operands, preferred_element_type=jnp.float32)


def safe_normalizer(den: Array, eps: float = DEFAULT_EPS) -> Array:
  """``den`` with values closer to zero than ``eps`` moved to ``+-eps`` (keeps the sign); for ``eps < 0``
  ``den + |eps|`` (Zoology's ``num / (den + eps)``, HazyResearch/zoology zoology/mixers/based.py 205-209,
  eps 1e-12 at 69 and 102 @ d88d6f5). ``|den| < eps``, the rows where the clamp acts, is then empty."""
  if eps < 0:
    return den - eps
  return jnp.where(jnp.abs(den) < eps, jnp.where(den < 0, -eps, eps), den)


@jax.custom_jvp
def divide_rows(num: Array, den: Array) -> Array:
  """``num [..., Dv] / den [...]``, differentiated as ``d out = (d num - out d den) / den``.

  The normalization of linear attention (Katharopoulos et al. 2020, eq. 6: ``phi(q)^T S / phi(q)^T z``).
  Autodiff of ``/`` forms ``num / den^2``, which overflows in float32 once ``den`` < ~5e-20 (normalizers
  of rows whose features underflowed, clamped at ``eps`` = 1e-30 by ``safe_normalizer``): ``0 * inf``
  then puts NaN into every gradient, even through a branch ``jnp.where`` discards. ``out / den`` is the
  same derivative with no such product.
  """
  return num / den[..., None]


@divide_rows.defjvp
def _divide_rows_jvp(primals, tangents):
  num, den = primals
  d_num, d_den = tangents
  out = num / den[..., None]
  return out, (d_num - out * d_den[..., None]) / den[..., None]


def normalize(num: Array, den: Array, eps: float = DEFAULT_EPS) -> Array:
  """``num / den`` per row with ``den`` kept off zero (``safe_normalizer``): ``divide_rows``."""
  return divide_rows(num, safe_normalizer(den, eps))


def mask_keys(phi_k: Array, mask: Array | None) -> Array:
  """Zeroes the feature rows of padded keys, so they drop out of numerator and normalizer."""
  if mask is None:
    return phi_k
  return phi_k * mask[:, :, None, None].astype(phi_k.dtype)


def linear_attention(phi_q: Array, phi_k: Array, v: Array, *, mask: Array | None = None,
                     causal: bool = False, chunk_size: int = 64,
                     eps: float = DEFAULT_EPS, key_shift: Array | None = None) -> Array:
  """Normalized linear attention; returns ``[B, L, H, Dv]`` in ``v.dtype``.

  ``key_shift [B, L, H, M]`` (causal only): the features were formed with a per-row running key max
  (``components._exp_shifted(causal_chunk=...)``); each product of a query block and an earlier key
  block is then formed on a shift every row involved may see (``_causal_num_den``), so no key after a
  query enters that query's shift, whatever the chunk size.
  """
  phi_k = mask_keys(phi_k, mask)
  if key_shift is not None and not causal:
    raise ValueError('key_shift is for causal attention (per-row running key maxima)')
  if causal:
    num, den = _causal_num_den(phi_q, phi_k, v, chunk_size, key_shift)
  else:
    kv = einsum_f32('bshm,bshd->bhmd', phi_k, v)                  # [B, H, M, Dv]
    ksum = jnp.sum(phi_k.astype(jnp.float32), axis=1)             # [B, H, M]
    num = einsum_f32('blhm,bhmd->blhd', phi_q, kv)
    den = einsum_f32('blhm,bhm->blh', phi_q, ksum)
  out = normalize(num, den, eps)
  return out.astype(v.dtype)


def causal_linear_attention(phi_q: Array, phi_k: Array, v: Array, state, *, chunk_size: int = 64,
                            key_shift: Array | None = None, eps: float = DEFAULT_EPS):
  """Causal linear attention of a block that continues a sequence: ``(out, new_state)``.

  The recurrent form of eq. 9 of Katharopoulos et al. (2020, §3.4) a block at a time (docs/causal.md:
  the decoder's step). ``state = (kv [B, H, M, Dv], ksum [B, H, M], beta [B, H, M])``, float32: the sums
  over the earlier keys relative to their running key max ``beta`` (zero sums and ``beta = -inf`` for an
  empty prefix; maps without a key shift ignore beta). ``key_shift [B, T, H, M]``: the block's running
  maxima (``components`` with ``causal_chunk``, ``shift_init=beta``), None without a shift. The state
  enters as a key block before the block's first row, as the chunks of ``linear_attention`` do, so block
  by block equals the whole sequence's forward up to rounding. Returns ``out [B, T, H, Dv]`` in
  ``v.dtype`` and the state after the block. No padding mask: every row of the block is a token.
  """
  num, den, new_state = _causal_num_den(phi_q, phi_k, v, chunk_size, key_shift, state)
  out = normalize(num, den, eps)
  return out.astype(v.dtype), new_state


def _causal_num_den(phi_q: Array, phi_k: Array, v: Array, chunk_size: int,
                    key_shift: Array | None = None, state=None):
  """Numerator and normalizer of causal linear attention in chunked form; with ``state`` (see
  ``causal_linear_attention``) the carried sums enter every chunk's prefix and the state after the
  last chunk is returned as a third value.

  With ``key_shift`` (docs/kernels.md, "Degenerate rows"): chunk n's key state is formed on
  ``gamma_n``, its last row's shift; ``lax.associative_scan`` with ``(S_a, g_a) + (S_b, g_b) =
  (S_a e^{g_a - g_b} + S_b, g_b)`` gives the inclusive sums relative to each ``gamma_n``, and chunk n's
  queries meet the sums up to chunk n - 1 on ``gamma_{n-1}``. Within a chunk, ``_one_shift_block`` on
  the rows where it is exact, ``_shifted_blocks`` on the others. Every factor is ``<= 1``.
  """
  b, length, h, m = phi_q.shape
  dv = v.shape[-1]
  if key_shift is not None and key_shift.shape != phi_k.shape:
    raise ValueError(f'key_shift has shape {key_shift.shape}; expected {phi_k.shape} (the running key '
                     'max of every row and feature)')
  f32 = lambda x: x.astype(jnp.float32)
  beta = (jnp.zeros((b, length, h, 1), jnp.float32) if key_shift is None
          else jax.lax.stop_gradient(f32(key_shift)))
  phi_q, phi_k, v = f32(phi_q), f32(phi_k), f32(v)
  c = max(1, min(chunk_size, length))
  n_chunks = -(-length // c)
  pad = n_chunks * c - length
  if pad:
    # Zero rows at the end (padded keys add nothing, padded queries are cut off below); their shift
    # repeats the last row's, so the running maxima stay non-decreasing.
    padder = lambda x, mode: jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)), mode=mode)
    phi_q, phi_k, v, beta = (padder(phi_q, 'constant'), padder(phi_k, 'constant'),
                             padder(v, 'constant'), padder(beta, 'edge'))
  # [B, N, H, C, .]: rows of a chunk next to the feature axis.
  chunks = lambda x: jnp.swapaxes(x.reshape(b, n_chunks, c, h, x.shape[-1]), 2, 3)
  qc, kc, vc, bc = chunks(phi_q), chunks(phi_k), chunks(v), chunks(beta)
  gamma = jnp.broadcast_to(bc[..., -1, :], qc.shape[:3] + (m,))       # [B, N, H, M]
  kg = kc * _down(bc - gamma[..., None, :])
  kv_chunk = jnp.einsum('bnhcm,bnhcd->bnhmd', kg, vc)               # [B, N, H, M, Dv]
  ks_chunk = jnp.sum(kg, axis=-2)                                   # [B, N, H, M]
  if state is not None:
    # The carried sums as a chunk "-1" in front on their shift beta0.
    kv0, ks0, beta0 = (f32(x) for x in state)
    beta0 = jnp.where(jnp.isfinite(beta0) & (key_shift is not None), beta0, 0.0)   # none: unshifted
    kv_chunk = jnp.concatenate([kv0[:, None], kv_chunk], axis=1)
    ks_chunk = jnp.concatenate([ks0[:, None], ks_chunk], axis=1)
    gamma = jnp.concatenate([beta0[:, None], gamma], axis=1)

  def combine(a, b_):
    kv_a, ks_a, g_a = a
    kv_b, ks_b, g_b = b_
    f = _down(g_a - g_b)
    return kv_a * f[..., None] + kv_b, ks_a * f + ks_b, g_b

  # Inclusive sums, then shifted by one chunk (not ``inclusive - own chunk``: the subtraction's
  # gradient cancels the cotangent of every later chunk against the own chunk's, which loses the
  # keys' gradient where a normalizer is clamped to eps).
  kv_inc, ks_inc, _ = jax.lax.associative_scan(combine, (kv_chunk, ks_chunk, gamma), axis=1)
  if state is not None:
    final = (kv_inc[:, -1], ks_inc[:, -1], gamma[:, -1] if key_shift is not None else state[2])
    kv_prev, ks_prev, g_prev = kv_inc[:, :-1], ks_inc[:, :-1], gamma[:, :-1]
  else:
    # Chunk 0 has no earlier keys: zero sums (on any shift; its own keeps the factor at 1).
    zero = lambda x: jnp.zeros_like(x[:, :1])
    kv_prev = jnp.concatenate([zero(kv_inc), kv_inc[:, :-1]], axis=1)
    ks_prev = jnp.concatenate([zero(ks_inc), ks_inc[:, :-1]], axis=1)
    g_prev = jnp.concatenate([gamma[:, :1], gamma[:, :-1]], axis=1)
  qg = qc * _down(g_prev[..., None, :] - bc)
  num = jnp.einsum('bnhcm,bnhmd->bnhcd', qg, kv_prev)
  den = jnp.einsum('bnhcm,bnhm->bnhc', qg, ks_prev)
  rise = bc - bc[..., :1, :]
  near = jnp.all((rise >= 0.0) & (rise <= FAST_SPAN), axis=-1)               # [B, N, H, C]

  def per_row(*ops):
    (n1, d1), (n2, d2) = _one_shift_block(*ops), _shifted_blocks(*ops)
    return jnp.where(near[..., None], n1, n2), jnp.where(near, d1, d2)

  if key_shift is None:
    num_in, den_in = _one_shift_block(qc, kc, vc, bc)
  else:
    num_in, den_in = jax.lax.cond(jnp.all(near), _one_shift_block, per_row, qc, kc, vc, bc)
  num = jnp.moveaxis(num + num_in, 3, 2).reshape(b, n_chunks * c, h, dv)[:, :length]
  den = jnp.moveaxis(den + den_in, 3, 2).reshape(b, n_chunks * c, h)[:, :length]
  if state is not None:
    return num, den, final
  return num, den


def _running_max(x: Array) -> Array:
  """The running maximum of ``x [..., n, F]`` along its rows: blocks of 8 rows by doubling, then the
  maxima of the blocks before each (cheaper than ``lax.cummax`` on CPU for n = 64: 2.8 vs 8.2 ms per
  32 chunks of [4, 64, 128], CPU time, interleaved)."""
  def doubling(z):
    s = 1
    while s < z.shape[-2]:
      pad = [(0, 0)] * (z.ndim - 2) + [(s, 0), (0, 0)]
      z = jnp.maximum(z, jnp.pad(z[..., :-s, :], pad, constant_values=-jnp.inf))
      s *= 2
    return z

  n, b = x.shape[-2], 8
  if n <= b or n % b:
    return doubling(x)
  blocks = doubling(x.reshape(x.shape[:-2] + (n // b, b, x.shape[-1])))
  before = doubling(blocks[..., -1, :])
  before = jnp.concatenate([jnp.full_like(before[..., :1, :], -jnp.inf), before[..., :-1, :]], axis=-2)
  return jnp.maximum(blocks, before[..., None, :]).reshape(x.shape)


# A shift factor exp(min(x, 0)): 1 where a column had no valid key yet (its shift is the placeholder 0
# and its features are 0), never above 1, so no inf * 0.
_down = lambda x: jnp.exp(jnp.minimum(x, 0.0))


def _one_shift_block(q: Array, k: Array, v: Array, beta: Array) -> tuple[Array, Array]:
  """``_shifted_blocks``'s sums in one masked ``C x C`` product on the shift of the block's first row,
  ``rho``: queries ``q e^{min(rho - beta_i, 0)}``, keys ``k e^{min(beta_j - rho, span)}``. Exact on
  the rows ``i`` with ``0 <= beta_i - rho <= span`` (every product is ``q_i k_j e^{beta_j - beta_i}``:
  running maxima never decrease, and a key capped at ``span`` is seen only by rows beyond it), and
  independent of later rows, as the per-row form (``_causal_num_den`` takes it where exact)."""
  rho = beta[..., :1, :]
  qg = q * _down(rho - beta)
  kg = k * jnp.exp(jnp.minimum(beta - rho, FAST_SPAN))
  scores = jnp.einsum('...if,...jf->...ij', qg, kg)
  scores = jnp.where(np.tril(np.ones(scores.shape[-2:], bool)), scores, 0.0)
  return jnp.einsum('...ij,...jd->...id', scores, v), jnp.sum(scores, axis=-1)


def _shifted_blocks(q: Array, k: Array, v: Array, beta: Array) -> tuple[Array, Array]:
  """The causal sums within blocks of rows, on shifts that no later key enters: ``(num, den)``.

  ``q, k [..., C, F]`` are features shifted by their own row's running key max ``beta [..., C, F]``
  (non-decreasing along the rows), ``v [..., C, Dv]``. Returns ``num_i = sum_{j <= i} s_ij v_j`` and
  ``den_i = sum_{j <= i} s_ij`` with ``s_ij = sum_r q_ir k_jr e^{beta_jr - beta_ir}``, without an array of
  C x C x F: the diagonal directly, and for each power of two s < C the pairs of neighbouring blocks of s
  rows (rows padded to a power of two) as one dense product on the shift of the first block's last row
  (every factor ``<= 1``); each pair j < i lies in exactly one such pair of blocks. Cost ``C^2 F / 2``
  multiply-adds per block (as the masked product) and ``log2 C`` rescalings (docs/kernels.md).
  """
  c = q.shape[-2]
  cp = 1 << (c - 1).bit_length()
  if cp > c:
    rows = [(0, 0)] * (q.ndim - 2) + [(0, cp - c), (0, 0)]
    q, k, v = jnp.pad(q, rows), jnp.pad(k, rows), jnp.pad(v, rows)
    beta = jnp.pad(beta, rows, mode='edge')
  lead, dv = q.shape[:-2], v.shape[-1]
  diag = jnp.sum(q * k, axis=-1)                                   # j = i: the same shift
  num, den = diag[..., None] * v, diag
  s = 1
  while s < cp:
    pairs = lambda x: x.reshape(lead + (cp // (2 * s), 2, s, x.shape[-1]))
    qs, ks, vs, bs = pairs(q), pairs(k), pairs(v), pairs(beta)
    gamma = bs[..., 0, -1:, :]                                     # [..., P, 1, F]
    kk = ks[..., 0, :, :] * _down(bs[..., 0, :, :] - gamma)
    qq = qs[..., 1, :, :] * _down(gamma - bs[..., 1, :, :])
    scores = jnp.einsum('...if,...jf->...ij', qq, kk)
    n2 = jnp.einsum('...ij,...jd->...id', scores, vs[..., 0, :, :])
    d2 = jnp.sum(scores, axis=-1)
    num = num + jnp.stack([jnp.zeros_like(n2), n2], axis=-3).reshape(lead + (cp, dv))
    den = den + jnp.stack([jnp.zeros_like(d2), d2], axis=-2).reshape(lead + (cp,))
    s *= 2
  return num[..., :c, :], den[..., :c]


def _query_chunk_cotangents(phi, kv, ksum, g, den, eps):
  """Backward of ``out = (phi kv) / safe(phi ksum)`` for one chunk of query rows (bidirectional).

  Returns ``d phi`` and the chunk's contributions to ``d kv`` and ``d ksum``; the guard passes no
  gradient to the normalizer where it acts (as ``jnp.where`` in ``safe_normalizer`` does).
  """
  sden = safe_normalizer(den, eps)
  out = jnp.einsum('...cf,...fd->...cd', phi, kv) / sden[..., None]
  gn = g / sden[..., None]
  gden = jnp.where(jnp.abs(den) < eps, 0.0, -jnp.sum(g * out, axis=-1) / sden)
  dphi = jnp.einsum('...cd,...fd->...cf', gn, kv) + gden[..., None] * ksum[..., None, :]
  return dphi, jnp.einsum('...cf,...cd->...fd', phi, gn), jnp.einsum('...cf,...c->...f', phi, gden)


def _bidirectional_backward(query_features, key_features, q, k, v, g, den, kv, ksum, diff, mask,
                            cq: int, ck: int, eps: float):
  """Backward of a lean bidirectional ``D^-1 phi(Q) (phi(K)^T V)``: features recomputed, never stored.

  ``query_features(qc, diff) -> phi``, ``key_features(kc, mc, diff) -> phi`` form one chunk's features
  (``diff``: the differentiable leaves of the projection); ``kv [.., F, Dv]``, ``ksum [.., F]``, ``den``
  the forward's state and normalizer, ``g`` the output cotangent (float32). A scan over query chunks
  gives dQ and the state cotangents ``dS = sum_i phi(q_i) (g_i / D_i)^T``, ``dz`` (with
  ``_query_chunk_cotangents``); a scan over key chunks gives ``dV = phi(K) dS`` and
  ``dphi(K) = V dS^T + dz``, through ``jax.vjp`` of the key features to dK. Returns ``dq, dk, dv`` (rows
  joined, float32) and ``dw`` (one per leaf of ``diff``, summed over chunks).
  """
  zeros_diff = tuple(jnp.zeros_like(x) for x in diff)

  def query_step(carry, xs):
    dkv, dksum, dw = carry
    qc, gc, denc = xs
    phi, vjp = jax.vjp(query_features, qc, diff)
    dphi, dkv_c, dksum_c = _query_chunk_cotangents(phi, kv, ksum, gc, denc, eps)
    dkv, dksum = dkv + dkv_c, dksum + dksum_c
    dq, ddiff = vjp(dphi.astype(phi.dtype))
    return (dkv, dksum, _add(dw, ddiff)), dq

  (dkv, dksum, dw), dq = jax.lax.scan(
      query_step, (jnp.zeros_like(kv), jnp.zeros_like(ksum), zeros_diff),
      (_split_chunks(q, cq, -2), _split_chunks(g, cq, -2), _split_chunks(den, cq, -1)),
      unroll=q.shape[-2] == cq)

  def key_step(dw, xs):
    kc, vc, mc = xs
    phi, vjp = jax.vjp(lambda kk, dd: key_features(kk, mc, dd), kc, diff)
    dv = jnp.einsum('...cf,...fd->...cd', phi, dkv)
    dphi = jnp.einsum('...cd,...fd->...cf', vc.astype(jnp.float32), dkv) + dksum[..., None, :]
    dk, ddiff = vjp(dphi.astype(phi.dtype))
    return _add(dw, ddiff), (dk, dv)

  dw, (dk, dv) = jax.lax.scan(
      key_step, dw, (_split_chunks(k, ck, -2), _split_chunks(v, ck, -2), _split_chunks(mask, ck, -1)),
      unroll=k.shape[-2] == ck)
  return _join_chunks(dq, -2), _join_chunks(dk, -2), _join_chunks(dv, -2), dw


def quadratic_reference(phi_q: Array, phi_k: Array, v: Array, *, mask: Array | None = None,
                        causal: bool = False, eps: float = DEFAULT_EPS,
                        score_weights: Array | None = None) -> Array:
  """``normalize(phi(Q) phi(K)^T) V`` formed naively as an L x S matrix: the test oracle.

  ``score_weights`` (float32, broadcastable to ``[B, H, L, S]``) multiplies the matrix entrywise before
  masking and normalization: ``exp(B)`` there gives Luo et al.'s RPE reference
  (``rpe.rpe_quadratic_reference``, eq. 10).
  """
  a = jnp.einsum('blhm,bshm->bhls', phi_q.astype(jnp.float32), phi_k.astype(jnp.float32))
  if score_weights is not None:
    a = a * score_weights
  if mask is not None:
    a = jnp.where(mask[:, None, None, :], a, 0.0)
  if causal:
    a = jnp.where(jnp.tril(jnp.ones(a.shape[-2:], dtype=bool)), a, 0.0)
  den = safe_normalizer(a.sum(-1), eps)
  out = jnp.einsum('bhls,bshd->blhd', a / den[..., None], v.astype(jnp.float32))
  return out.astype(v.dtype)


# ----------------------------------------------------------------------------------------------
# Lean paths: features formed a chunk at a time and recomputed in the backward. Four of them --
# bidirectional / causal x exp-maps (a ``LogSpaceForm``, with the stabilizer) / row-wise maps -- share
# one structure: a wrapper that prepares the inputs (``_prepare``, padding) and calls a ``jax.custom_vjp``
# function of ``(q, k, v, diff, nondiff, mask)`` built once per static configuration by ``_lean_vjp``.
# ----------------------------------------------------------------------------------------------

DEFAULT_FEATURE_CHUNK = 1024


def _split_chunks(x: Array, c: int, rows_axis: int) -> Array:
  """``[..., n*c, ...]`` -> ``[n, ..., c, ...]`` along ``rows_axis`` (negative)."""
  ax = x.ndim + rows_axis
  x = x.reshape(x.shape[:ax] + (x.shape[ax] // c, c) + x.shape[ax + 1:])
  return jnp.moveaxis(x, ax, 0)


def _join_chunks(x: Array, rows_axis: int) -> Array:
  """Inverse of ``_split_chunks``."""
  ax = x.ndim - 1 + rows_axis           # position of the chunk axis once the leading n moves back
  x = jnp.moveaxis(x, 0, ax)
  return x.reshape(x.shape[:ax] + (-1,) + x.shape[ax + 2:])


def _prepare(q, k, v, mask, proj, lead_rows_equal: bool):
  """Broadcast q, k, v, mask to common leading axes, upcast, and split ``proj`` into leaves."""
  lead = jnp.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
  keys = k.shape[-2]
  if lead_rows_equal and (keys != q.shape[-2] or v.shape[-2] != keys):
    raise ValueError(f'causal attention needs as many keys as queries; got q {q.shape}, k {k.shape}, '
                     f'v {v.shape}')
  mask = (jnp.ones(lead + (keys,), bool) if mask is None
          else jnp.broadcast_to(jnp.asarray(mask, bool), lead + (keys,)))
  dt = jnp.promote_types(q.dtype, jnp.float32)
  q = jnp.broadcast_to(q, lead + q.shape[-2:]).astype(dt)
  k = jnp.broadcast_to(k, lead + k.shape[-2:]).astype(dt)
  v = jnp.broadcast_to(v, lead + v.shape[-2:]).astype(jnp.float32)
  leaves, treedef = jax.tree.flatten(proj)
  is_float = tuple(bool(jnp.issubdtype(jnp.result_type(x), jnp.inexact)) for x in leaves)
  diff = tuple(x for x, f in zip(leaves, is_float) if f)
  nondiff = tuple(x for x, f in zip(leaves, is_float) if not f)
  return lead, q, k, v, mask, treedef, is_float, diff, nondiff


def _pad_rows(x: Array, pad: int, lead: tuple) -> Array:
  if not pad:
    return x
  return jnp.pad(x, [(0, 0)] * len(lead) + [(0, pad)] + [(0, 0)] * (x.ndim - len(lead) - 1))


def _pad_to_chunks(chunk_size: int, lead: tuple, q, k, v, mask):
  """Bidirectional lean paths: chunks ``cq, ck`` (at most the rows), q and k, v, mask padded to them."""
  cq, ck = max(1, min(chunk_size, q.shape[-2])), max(1, min(chunk_size, k.shape[-2]))
  pad_k = -k.shape[-2] % ck
  return (cq, ck, _pad_rows(q, -q.shape[-2] % cq, lead),
          *(_pad_rows(x, pad_k, lead) for x in (k, v, mask)))


def _query_pass(query_features, q: Array, kv: Array, ksum: Array, cq: int, eps: float):
  """The query pass of a bidirectional lean path: ``(out, den)`` chunk by chunk, rows joined."""
  def query_step(_, qc):
    phi = query_features(qc)
    num = jnp.einsum('...cf,...fd->...cd', phi, kv)
    den = jnp.einsum('...cf,...f->...c', phi, ksum)
    return None, (normalize(num, den, eps), den)

  qcs = _split_chunks(q, cq, -2)
  _, (out, den) = jax.lax.scan(query_step, None, qcs, unroll=qcs.shape[0] == 1)
  return _join_chunks(out, -2), _join_chunks(den, -1)


_add = lambda a, b: tuple(x + y for x, y in zip(a, b))


def _rebuilder(treedef, is_float):
  def rebuild(diff, nondiff):
    it_d, it_n = iter(diff), iter(nondiff)
    return jax.tree.unflatten(treedef, [next(it_d) if f else next(it_n) for f in is_float])
  return rebuild


_float0 = lambda x: np.zeros(np.shape(x), jax.dtypes.float0)


def _lean_vjp(builder):
  """A cached factory of the ``jax.custom_vjp`` function of one lean path.

  ``builder(*config) -> (forward, bwd)`` for a hashable static ``config`` (the form or component,
  the parameters' tree structure, eps, chunk sizes): ``forward(q, k, v, diff, nondiff, mask, save) ->
  (out, saved)`` (``save`` False: the primal, which may save nothing) and ``bwd(residuals, g) -> (dq,
  dk, dv, dw)`` (float32, ``dw`` one per leaf of ``diff``; ``residuals`` are the six arguments, whose
  dtypes the cotangents take, with float0 for ``nondiff`` and ``mask``, then ``saved``). ``functools.cache`` returns the same function for the same
  config, so every trace of a model reuses it.
  """
  @functools.cache
  @functools.wraps(builder)
  def factory(*config):
    forward, bwd = builder(*config)

    def cotangents(res, g):
      (q, k, v, diff, nondiff, mask), dq, dk, dv, dw = res[:6], *bwd(res, g)
      return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype),
              tuple(d.astype(x.dtype) for d, x in zip(dw, diff)),
              tuple(_float0(x) for x in nondiff), _float0(mask))

    def fwd(*args):
      out, saved = forward(*args, True)
      return out, (*args, *saved)

    fn = jax.custom_vjp(lambda *args: forward(*args, False)[0])
    fn.defvjp(fwd, cotangents)
    return fn
  return factory


# ----------------------------------------------------------------------------------------------
# Bidirectional exp-feature attention (a ``LogSpaceForm``; the stabilizer of ``components``).
# ----------------------------------------------------------------------------------------------


def exp_feature_attention(form, q: Array, k: Array, v: Array, proj, *, mask: Array | None = None,
                          eps: float = DEFAULT_EPS, chunk_size: int = DEFAULT_FEATURE_CHUNK) -> Array:
  """Bidirectional ``D^-1 phi(Q) (phi(K)^T V)`` for an exp-map, never storing ``phi(Q)`` or ``phi(K)``.

  ``form`` is a ``components.LogSpaceForm`` (``phi(x)_r = s_r exp(z_r(x))``); ``q [..., L, d]``,
  ``k [..., S, d]``, ``v [..., S, Dv]``, ``mask`` broadcastable to ``[..., S]``; ``proj`` a
  ``Projection`` without a head axis (vmap over heads outside). Same value as
  ``linear_attention(*component(q, k, proj, mask=mask), v, mask=mask)`` (Spectraformer eq. 7 with the
  stabilizer of ``components._exp_shifted``); how: docs/architecture.md, "Exp-feature attention stores
  no features". Gradients flow to every floating leaf of ``proj``, none to the shifts or integer leaves.
  """
  out_dtype = v.dtype
  lead, q, k, v, mask, treedef, is_float, diff, nondiff = _prepare(q, k, v, mask, proj, False)
  length = q.shape[-2]
  cq, ck, q, k, v, mask = _pad_to_chunks(chunk_size, lead, q, k, v, mask)
  out = _exp_attention_fn(form, treedef, is_float, float(eps), cq, ck)(q, k, v, diff, nondiff, mask)
  return out[..., :length, :].astype(out_dtype)


@_lean_vjp
def _exp_attention_fn(form, treedef, is_float, eps, cq, ck):
  """``exp_feature_attention`` for one (form, W structure, eps, chunks)."""
  rebuild = _rebuilder(treedef, is_float)

  def key_features(kc, mc, p, beta):
    ek = jnp.exp(_exp_key_logits(form, kc, mc, p) - beta) * form.scales(p, kc.dtype)[1]
    return jnp.where(mc[..., None], ek, 0.0)

  def forward(q, k, v, diff, nondiff, mask, save):
    del save                           # the residuals are the sums: no cost to the primal
    p = rebuild(diff, nondiff)
    dt = q.dtype
    kcs, vcs, mcs = _split_chunks(k, ck, -2), _split_chunks(v, ck, -2), _split_chunks(mask, ck, -1)
    f = form.logits(jnp.zeros(k.shape[-1:], dt)[None], p).shape[-1]
    lead = q.shape[:-2]
    init = (jnp.full(lead + (1, f), -jnp.inf, dt), jnp.zeros(lead + (f, v.shape[-1]), jnp.float32),
            jnp.zeros(lead + (f,), jnp.float32))

    def key_step(carry, xs):
      beta, kv, ksum = carry
      kc, vc, mc = xs
      z = _exp_key_logits(form, kc, mc, p)
      new = jnp.maximum(beta, jnp.max(z, axis=-2, keepdims=True))
      safe_new = jnp.where(jnp.isfinite(new), new, 0.0)
      # Rescale the state to the new column shift (exp(-inf) = 0 for columns not seen yet).
      rescale = jnp.where(jnp.isfinite(beta), jnp.exp(beta - safe_new), 0.0)
      ek = jnp.where(mc[..., None], jnp.exp(z - safe_new), 0.0) * form.scales(p, dt)[1]
      kv = kv * rescale[..., 0, :, None] + jnp.einsum('...cf,...cd->...fd', ek, vc)
      ksum = ksum * rescale[..., 0, :] + jnp.sum(ek, axis=-2)
      return (new, kv, ksum), None

    (beta, kv, ksum), _ = jax.lax.scan(key_step, init, (kcs, vcs, mcs), unroll=kcs.shape[0] == 1)
    beta = jax.lax.stop_gradient(jnp.where(jnp.isfinite(beta), beta, 0.0))
    out, den = _query_pass(lambda qc: _exp_query_features(form, qc, p, beta), q, kv, ksum, cq, eps)
    return out, (beta, kv, ksum, den)

  def bwd(res, g):
    q, k, v, diff, nondiff, mask, beta, kv, ksum, den = res
    return _bidirectional_backward(
        lambda qq, dd: _exp_query_features(form, qq, rebuild(dd, nondiff), beta),
        lambda kk, mc, dd: key_features(kk, mc, rebuild(dd, nondiff), beta),
        q, k, v, g.astype(jnp.float32), den, kv, ksum, diff, mask, cq, ck, eps)

  return forward, bwd


# The largest rise of the running key max inside one chunk (every feature) for which the chunk's in-chunk
# product is formed on one shift (``causal_exp_feature_attention``): keys then carry factors up to
# e^span, and a term is lost only below e^(span - 87) times its row's largest.
FAST_SPAN = 40.0
MAX_SPAN = 64.0


def _cond_every(pred: Array, if_all, otherwise, operands):
  """``lax.cond(pred, if_all, otherwise, operands)`` that stays one branch under ``jax.vmap``.

  ``lax.cond`` with a batched predicate evaluates both branches and selects. Here a batched ``pred``
  is reduced to ``all(pred)`` and one branch runs for the whole batch: ``if_all`` where the predicate
  holds for every element, ``otherwise`` for every element if one fails. Both branches must compute
  the same function (they differ in cost or range, not in value), and close over no traced values:
  everything traced goes through ``operands``.
  """
  @jax.custom_batching.custom_vmap
  def branch(pred, operands):
    return jax.lax.cond(pred, if_all, otherwise, operands)

  @branch.def_vmap
  def rule(axis_size, in_batched, pred, operands):
    del axis_size
    pred_batched, batched = in_batched
    pred = jnp.all(pred) if pred_batched else pred
    if not any(jax.tree.leaves(batched)):
      out = _cond_every(pred, if_all, otherwise, operands)
      return out, jax.tree.map(lambda _: False, out)
    axes = (jax.tree.map(lambda b: 0 if b else None, batched),)
    out = _cond_every(pred, jax.vmap(if_all, in_axes=axes), jax.vmap(otherwise, in_axes=axes),
                      operands)
    return out, jax.tree.map(lambda _: True, out)

  return branch(pred, operands)


# ----------------------------------------------------------------------------------------------
# Causal exp-feature attention: features formed inside a scan over chunks.
# ----------------------------------------------------------------------------------------------


def causal_exp_feature_attention(form, q: Array, k: Array, v: Array, proj, *,
                                 mask: Array | None = None, eps: float = DEFAULT_EPS,
                                 chunk_size: int = 64, span: float = FAST_SPAN) -> Array:
  """Causal ``D^-1 phi(Q) (phi(K)^T V)`` for an exp-map, one ``lax.scan`` over chunks of the sequence.

  ``form`` is a ``components.LogSpaceForm``; ``q, k [..., L, d]``, ``v [..., L, Dv]``, ``mask``
  broadcastable to ``[..., L]`` (True = real key); ``proj`` a ``Projection`` without a head axis (vmap
  over heads outside). Same value as ``linear_attention(*component(q, k, proj, mask=mask,
  causal_chunk=C), v, mask=mask, causal=True, chunk_size=C, key_shift=...)`` (Spectraformer eq. 7,
  Katharopoulos et al.'s causal prefix sums, the per-row running stabilizer of
  ``components._exp_shifted``), with nothing of size ``[L, M]`` formed; how: docs/architecture.md,
  "Causal exp-feature attention is one scan over chunks". A chunk whose running max rises by at most
  ``span`` is formed on one shift, others per row; ``span=0``: per row everywhere (docs/kernels.md
  "Degenerate rows"). Gradients flow to every floating leaf of ``proj``, none to the shifts.
  """
  if not 0.0 <= span <= MAX_SPAN:
    raise ValueError(f'span must be in [0, {MAX_SPAN:g}] (a rise of the running key max in nats); '
                     f'got {span}')
  out_dtype = v.dtype
  lead, q, k, v, mask, treedef, is_float, diff, nondiff = _prepare(q, k, v, mask, proj, True)
  length = q.shape[-2]
  c = max(1, min(chunk_size, length))
  # Padded positions are masked keys (no shift, zero features) and queries cut off below.
  q, k, v, mask = (_pad_rows(x, -length % c, lead) for x in (q, k, v, mask))
  out = _causal_exp_attention_fn(form, treedef, is_float, float(eps), c, float(span))(q, k, v, diff,
                                                                               nondiff, mask)
  return out[..., :length, :].astype(out_dtype)


def _chunk_sums(phi_q, phi_k, vc, state, ksum, eps):
  """The causal skeleton's step: one chunk from features on one shift and the sums ``S [F, Dv]``,
  ``z [F]`` of the keys before it (Katharopoulos et al. 2020 eqs. 8-9, chunked): ``num = phi(Q) S +
  tril(phi(Q) phi(K)^T) V``, ``den`` alike with ``z``. Returns ``(out, den, S', z')`` with the chunk's
  keys added to the sums."""
  tril = np.tril(np.ones((phi_q.shape[-2], phi_k.shape[-2]), bool))
  scores = jnp.where(tril, jnp.einsum('...if,...jf->...ij', phi_q, phi_k), 0.0)
  num = jnp.einsum('...if,...fd->...id', phi_q, state) + jnp.einsum('...ij,...jd->...id', scores, vc)
  den = jnp.einsum('...if,...f->...i', phi_q, ksum) + jnp.sum(scores, axis=-1)
  return (normalize(num, den, eps), den, state + jnp.einsum('...jf,...jd->...fd', phi_k, vc),
          ksum + jnp.sum(phi_k, axis=-2))


def _chunk_sums_grads(phi_q, phi_k, vc, gc, oc, denc, state, ksum, d_state, d_ksum, eps):
  """The skeleton's backward step: cotangents of ``_chunk_sums`` by hand from its output and normalizer
  (the sums are not formed again). With ``gn = g / D``, ``gd = -(g . out) / D`` (0 where the guard
  acts) and ``dA = tril(gn v^T + gd)``: ``dphi(q) = gn S^T + gd z + dA phi(k)``, ``dphi(k) = dA^T phi(q)
  + v dS'^T + dz'``, ``dv = A^T gn + phi(k) dS'``. Returns those and the cotangents of ``S, z``."""
  tril = np.tril(np.ones((phi_q.shape[-2], phi_k.shape[-2]), bool))
  sden = safe_normalizer(denc, eps)
  gn = gc / sden[..., None]
  gd = jnp.where(jnp.abs(denc) < eps, 0.0, -jnp.sum(gc * oc, axis=-1) / sden)
  scores = jnp.where(tril, jnp.einsum('...if,...jf->...ij', phi_q, phi_k), 0.0)
  d_scores = jnp.where(tril, jnp.einsum('...id,...jd->...ij', gn, vc) + gd[..., None], 0.0)
  d_phi_q = (jnp.einsum('...id,...fd->...if', gn, state) + gd[..., None] * ksum[..., None, :]
             + jnp.einsum('...ij,...jf->...if', d_scores, phi_k))
  d_phi_k = (jnp.einsum('...ij,...if->...jf', d_scores, phi_q)
             + jnp.einsum('...jd,...fd->...jf', vc, d_state) + d_ksum[..., None, :])
  dv = jnp.einsum('...ij,...id->...jd', scores, gn) + jnp.einsum('...jf,...fd->...jd', phi_k, d_state)
  return (d_phi_q, d_phi_k, dv, d_state + jnp.einsum('...if,...id->...fd', phi_q, gn),
          d_ksum + jnp.einsum('...if,...i->...f', phi_q, gd))


def _finite(x: Array) -> Array:
  return jnp.where(jnp.isfinite(x), x, 0.0)


def _exp_key_logits(form, kc, mc, p):
  return jnp.where(mc[..., None], form.logits(kc, p), -jnp.inf)


def _exp_chunk_shifts(zk, gamma, span):
  """``(shift, ref, last, near, quick)`` from a chunk's key logits ``zk`` (``-inf`` for masked keys):
  each row's running key max (0 where no valid key yet), the chunk's first finite one per feature (0 if
  none), the last row's (``-inf`` if none: the next chunk's ``gamma``), whether each row's running max
  is within ``span`` of ``ref`` (every feature), and whether every row's is (every leading index too)."""
  rows = jax.lax.stop_gradient(_running_max(jnp.maximum(zk, gamma)))
  finite = jnp.isfinite(rows)
  ref = _finite(jnp.min(jnp.where(finite, rows, jnp.inf), axis=-2, keepdims=True))
  near = jnp.all(jnp.where(finite, rows - ref, 0.0) <= span, axis=-1)       # [..., C]
  return jnp.where(finite, rows, 0.0), ref, rows[..., -1:, :], near, jnp.all(near)


def _exp_query_features(form, qc, p, shift, ref=None):
  """``phi(q_i)`` on its row's ``shift`` (and the row max ``a_i``); with ``ref``, times
  ``e^{min(ref - shift_i, 0)} <= 1`` in the same exponential."""
  zq = form.logits(qc, p) + shift
  a = _finite(jax.lax.stop_gradient(jnp.max(zq, axis=-1, keepdims=True)))
  if ref is not None:
    zq = zq + jnp.minimum(ref - shift, 0.0)
  return jnp.exp(zq - a) * form.scales(p, qc.dtype)[0]


def _exp_key_features(form, kc, mc, p, shift, cap=None, zk=None):
  """``phi(k_j)`` on ``shift``: its row's, or the chunk's ``ref`` with the exponent capped at ``cap``
  (reached only by keys after every query that would see them at a larger value). ``zk``: the
  chunk's key logits if already formed (the forward's)."""
  z = (_exp_key_logits(form, kc, mc, p) if zk is None else zk) - shift
  if cap is not None:
    z = jnp.where(z > cap, cap, z)     # not minimum: its gradient at z == cap is halved
  return jnp.where(mc[..., None], jnp.exp(z), 0.0) * form.scales(p, kc.dtype)[1]


def _exp_chunk(form, p, eps, span, quick, qc, kc, vc, state, ksum, mc, shift, ref, last, near, gamma,
               zk=None):
  """``(out, den, state, ksum)`` of one chunk of ``causal_exp_feature_attention``. One-shift form:
  ``_chunk_sums`` on ``ref`` (queries times factors ``<= 1``, keys ``<= e^span``), the carried sums
  moved to ``ref`` first and to the last row's shift after. Per-row form (``quick`` False): features on
  their own row's shift, the in-chunk part by ``_shifted_blocks`` (every factor ``<= 1``); it takes
  the one-shift form's rows wherever ``near`` (they are exact there), so no row's value depends on
  which form its chunk took, i.e. on later keys of the chunk or other leading indices."""
  prev = _finite(gamma)
  into, back = _down(prev - ref), _down(ref - _finite(last))
  out, den, s1, z1 = _chunk_sums(_exp_query_features(form, qc, p, shift, ref),
                                 _exp_key_features(form, kc, mc, p, ref, cap=span, zk=zk), vc,
                                 state * jnp.swapaxes(into, -1, -2), ksum * into[..., 0, :], eps)
  one = (out, den, s1 * jnp.swapaxes(back, -1, -2), z1 * back[..., 0, :])
  if quick:
    return one
  phi_q = _exp_query_features(form, qc, p, shift)
  phi_k = _exp_key_features(form, kc, mc, p, shift, zk=zk)
  qg = phi_q * _down(prev - shift)
  num_in, den_in = _shifted_blocks(phi_q, phi_k, vc, shift)
  num = jnp.einsum('...if,...fd->...id', qg, state) + num_in
  den = jnp.einsum('...if,...f->...i', qg, ksum) + den_in
  last_shift = shift[..., -1:, :]
  down = _down(prev - last_shift)
  kg = phi_k * _down(shift - last_shift)
  state = state * jnp.swapaxes(down, -1, -2) + jnp.einsum('...jf,...jd->...fd', kg, vc)
  ksum = ksum * down[..., 0, :] + jnp.sum(kg, axis=-2)
  out = normalize(num, den, eps)
  return jnp.where(near[..., None], one[0], out), jnp.where(near, one[1], den), state, ksum


@_lean_vjp
def _causal_exp_attention_fn(form, treedef, is_float, eps, c, span):
  """``causal_exp_feature_attention`` for one (form, W structure, eps, chunk, span)."""
  rebuild = _rebuilder(treedef, is_float)

  def chunk(quick, qc, kc, vc, state, ksum, diff, mc, nondiff, *rest):
    return _exp_chunk(form, rebuild(diff, nondiff), eps, span, quick, qc, kc, vc, state, ksum, mc,
                      *rest)

  forms = tuple(functools.partial(lambda quick, ops: chunk(quick, *ops), quick) for quick in (True, False))

  def exact_grads(ops):
    """Cotangents ``(dq, dk, dv, dstate, dksum, dw)`` of one chunk in the per-row form (``jax.vjp``)."""
    args, rest, cts = ops[:6], ops[6:13], ops[-3:]
    _, vjp = jax.vjp(lambda *a: (lambda o, d, s, z: (o, s, z))(*chunk(False, *a, *rest)), *args)
    return vjp(cts)

  def quick_grads(ops):
    """The same in the one-shift form: ``_chunk_sums_grads`` on the sums moved to ``ref``, through
    ``jax.vjp`` of the chunk's features."""
    qc, kc, vc, sc, zc, diff, mc, nondiff, shift, ref, last, _, gm, oc, denc, gc, d_state, d_ksum = ops
    phi_q, vjp_q = jax.vjp(
        lambda qq, dd: _exp_query_features(form, qq, rebuild(dd, nondiff), shift, ref), qc, diff)
    phi_k, vjp_k = jax.vjp(
        lambda kk, dd: _exp_key_features(form, kk, mc, rebuild(dd, nondiff), ref, cap=span), kc, diff)
    t = lambda x: jnp.swapaxes(x, -1, -2)
    into, back = _down(_finite(gm) - ref), _down(ref - _finite(last))
    d_phi_q, d_phi_k, dv, d_prev, d_z = _chunk_sums_grads(
        phi_q, phi_k, vc, gc, oc, denc, sc * t(into), zc * into[..., 0, :], d_state * t(back),
        d_ksum * back[..., 0, :], eps)
    dq, dwq = vjp_q(d_phi_q.astype(phi_q.dtype))
    dk, dwk = vjp_k(d_phi_k.astype(phi_k.dtype))
    return dq, dk, dv, d_prev * t(into), d_z * into[..., 0, :], _add(dwq, dwk)

  def forward(q, k, v, diff, nondiff, mask, save):
    p = rebuild(diff, nondiff)
    lead = q.shape[:-2]
    f_dim = form.scales(p, q.dtype)[0].shape[-1]

    def step(carry, xs):
      gamma, state, ksum = carry
      qc, kc, vc, mc = xs
      zk = _exp_key_logits(form, kc, mc, p)
      shift, ref, last, near, quick = _exp_chunk_shifts(zk, gamma, span)
      out, den, new_state, new_ksum = _cond_every(
          quick, *forms, (qc, kc, vc, state, ksum, diff, mc, nondiff, shift, ref, last, near, gamma, zk))
      ys = (out, den, state, ksum, gamma) if save else (out,)
      return (last, new_state, new_ksum), ys

    init = (jnp.full(lead + (1, f_dim), -jnp.inf, q.dtype),
            jnp.zeros(lead + (f_dim, v.shape[-1]), jnp.float32), jnp.zeros(lead + (f_dim,), jnp.float32))
    xs = (_split_chunks(q, c, -2), _split_chunks(k, c, -2), _split_chunks(v, c, -2),
          _split_chunks(mask, c, -1))
    _, ys = jax.lax.scan(step, init, xs, unroll=xs[0].shape[0] == 1)
    return _join_chunks(ys[0], -2), (ys if save else ())

  def bwd(res, g):
    q, k, v, diff, nondiff, mask, out, den, state, ksum, gamma = res

    def step(carry, xs):
      d_state, d_ksum, dw = carry
      qc, kc, vc, mc, gc, oc, denc, sc, zc, gm = xs
      shift, ref, last, near, quick = _exp_chunk_shifts(
          _exp_key_logits(form, kc, mc, rebuild(diff, nondiff)), gm, span)
      dq, dk, dv, d_prev, d_z, dwc = _cond_every(
          quick, quick_grads, exact_grads, (qc, kc, vc, sc, zc, diff, mc, nondiff, shift, ref, last,
                                            near, gm, oc, denc, gc, d_state, d_ksum))
      return (d_prev, d_z, _add(dw, dwc)), (dq, dk, dv)

    split = lambda x: _split_chunks(x, c, -2)
    xs = (split(q), split(k), split(v), _split_chunks(mask, c, -1), split(g.astype(jnp.float32)),
          out, den, state, ksum, gamma)
    init = (jnp.zeros_like(state[0]), jnp.zeros_like(ksum[0]), tuple(jnp.zeros_like(x) for x in diff))
    (_, _, dw), (dq, dk, dv) = jax.lax.scan(step, init, xs, reverse=True,
                                            unroll=state.shape[0] == 1)
    return _join_chunks(dq, -2), _join_chunks(dk, -2), _join_chunks(dv, -2), dw

  return forward, bwd


# ----------------------------------------------------------------------------------------------
# Row-wise feature maps (no key statistic): features formed chunk by chunk, bidirectional and causal.
# Taylor's 1 + d + d^2 features (4,161 at d = 64) must never exist for all L rows.
# ----------------------------------------------------------------------------------------------


def _row_feature_fns(component, rebuild, nondiff):
  """Query-side and key-side features of a row-wise ``component`` (a feature-map record's ``fn``).

  A row-wise map gives each row's features from that row alone (and the map's parameters), so a
  chunk's features are the rows of the whole sequence's. The component returns both sides at once;
  each function keeps one side (the other is dead code to XLA), as the sides may differ (signed row
  weights on the query side, padded keys zeroed on the key side).
  """
  def query_features(qc, diff):
    return component(qc, qc, rebuild(diff, nondiff), mask=None, stabilize=True)[0]

  def key_features(kc, mc, diff):
    return component(kc, kc, rebuild(diff, nondiff), mask=mc, stabilize=True)[1]

  return query_features, key_features


# Rows per chunk of ``feature_attention`` when not given: a chunk's features hold about this many
# floats (1 MiB), between 64 and 1024 rows. At M' = 4161 (Taylor, d = 64) fwd+bwd at L = 2048 took
# 0.41 s with chunks of 64 rows, 1.6 s with 256 and 2.8 s with 1024 (this CPU, load ~16): a chunk's
# [C, M'] features and their gradient must stay in cache.
FEATURE_CHUNK_ELEMENTS = 1 << 18


def feature_chunk_rows(features: int) -> int:
  """The default chunk of ``feature_attention`` for ``features`` = M': a power of two in [64, 1024]."""
  rows = 1 << max(0, (FEATURE_CHUNK_ELEMENTS // max(1, features)).bit_length() - 1)
  return int(min(DEFAULT_FEATURE_CHUNK, max(64, rows)))


def feature_attention(component, q: Array, k: Array, v: Array, proj, *, mask: Array | None = None,
                      eps: float = DEFAULT_EPS, chunk_size: int | None = None) -> Array:
  """Bidirectional ``D^-1 phi(Q) (phi(K)^T V)`` for a row-wise map, never storing ``phi(Q)``, ``phi(K)``.

  ``component`` is a feature-map record's ``fn`` whose features of a row depend on that row alone
  (records with ``row_wise``); ``q [..., L, d]``, ``k [..., S, d]``, ``v [..., S, Dv]``, ``mask``
  broadcastable to ``[..., S]``; ``proj`` its parameters without a head axis, or None. Same value as
  ``linear_attention(*component(q, k, proj, mask=mask), v, mask=mask)`` (Katharopoulos et al. 2020
  eq. 4 / Spectraformer eq. 7); ``chunk_size`` None: ``feature_chunk_rows(M')``; how:
  docs/architecture.md, "Row-wise feature maps store no features either".
  """
  out_dtype = v.dtype
  lead, q, k, v, mask, treedef, is_float, diff, nondiff = _prepare(q, k, v, mask, proj, False)
  length = q.shape[-2]
  if chunk_size is None:
    rebuild = _rebuilder(treedef, is_float)
    phi = jax.eval_shape(lambda x: component(x, x, rebuild(diff, nondiff), mask=None)[0], q[..., :1, :])
    chunk_size = feature_chunk_rows(phi.shape[-1])
  cq, ck, q, k, v, mask = _pad_to_chunks(chunk_size, lead, q, k, v, mask)
  out = _feature_attention_fn(component, treedef, is_float, float(eps), cq, ck)(q, k, v, diff, nondiff,
                                                                              mask)
  return out[..., :length, :].astype(out_dtype)


@_lean_vjp
def _feature_attention_fn(component, treedef, is_float, eps, cq, ck):
  """``feature_attention`` for one (component, parameters, eps, chunks)."""
  rebuild = _rebuilder(treedef, is_float)

  def forward(q, k, v, diff, nondiff, mask, save):
    del save                           # the residuals are the sums: no cost to the primal
    query_features, key_features = _row_feature_fns(component, rebuild, nondiff)

    def key_step(carry, xs):
      kv, ksum = carry
      kc, vc, mc = xs
      phi = key_features(kc, mc, diff)
      return (kv + jnp.einsum('...cf,...cd->...fd', phi, vc), ksum + jnp.sum(phi, axis=-2)), None

    kcs = _split_chunks(k, ck, -2)
    phi0 = jax.eval_shape(lambda x, m: key_features(x, m, diff), kcs[0], _split_chunks(mask, ck, -1)[0])
    lead = q.shape[:-2]
    init = (jnp.zeros(lead + (phi0.shape[-1], v.shape[-1]), jnp.float32),
            jnp.zeros(lead + (phi0.shape[-1],), jnp.float32))
    (kv, ksum), _ = jax.lax.scan(key_step, init, (kcs, _split_chunks(v, ck, -2),
                                                  _split_chunks(mask, ck, -1)),
                                 unroll=kcs.shape[0] == 1)
    out, den = _query_pass(lambda qc: query_features(qc, diff), q, kv, ksum, cq, eps)
    return out, (kv, ksum, den)

  def bwd(res, g):
    q, k, v, diff, nondiff, mask, kv, ksum, den = res
    query_features, key_features = _row_feature_fns(component, rebuild, nondiff)
    return _bidirectional_backward(query_features, key_features, q, k, v, g.astype(jnp.float32), den,
                                   kv, ksum, diff, mask, cq, ck, eps)

  return forward, bwd


def causal_feature_attention(component, q: Array, k: Array, v: Array, proj, *,
                             mask: Array | None = None, eps: float = DEFAULT_EPS,
                             chunk_size: int = 64) -> Array:
  """Causal ``D^-1 phi(Q) (phi(K)^T V)`` for a row-wise map, one ``lax.scan`` over chunks.

  ``component``, ``proj`` as ``feature_attention``; ``q, k [..., L, d]``, ``v [..., L, Dv]``, ``mask``
  broadcastable to ``[..., L]``. Same value as ``linear_attention(*component(q, k, proj, mask=mask), v,
  mask=mask, causal=True, chunk_size=C)`` -- Katharopoulos et al. 2020's causal prefix sums (eqs. 8-9)
  chunked (``_chunk_sums``), checkpointed at segments of G = ceil(sqrt(L/C)) chunks (docs/architecture.md,
  "Row-wise feature maps store no features either"); padded with masked rows to whole segments.
  """
  out_dtype = v.dtype
  lead, q, k, v, mask, treedef, is_float, diff, nondiff = _prepare(q, k, v, mask, proj, True)
  length = q.shape[-2]
  c = max(1, min(chunk_size, length))
  n = -(-length // c)
  g = math.isqrt(n - 1) + 1                     # ceil(sqrt(n)) chunks per segment
  n_seg = -(-n // g)
  # Padded rows: masked keys (zero features) and queries cut off below.
  q, k, v, mask = (_pad_rows(x, n_seg * g * c - length, lead) for x in (q, k, v, mask))
  out = _causal_feature_attention_fn(component, treedef, is_float, float(eps), c, g)(q, k, v, diff,
                                                                                   nondiff, mask)
  return out[..., :length, :].astype(out_dtype)


@_lean_vjp
def _causal_feature_attention_fn(component, treedef, is_float, eps, c, g):
  """``causal_feature_attention`` for one (component, parameters, eps, chunk, segment)."""
  rebuild = _rebuilder(treedef, is_float)
  flat = lambda x: x.reshape((-1,) + x.shape[2:])     # segments joined again

  def chunks(q, k, v, mask):
    return (_split_chunks(q, c, -2), _split_chunks(k, c, -2), _split_chunks(v, c, -2),
            _split_chunks(mask, c, -1))

  def segments(x):
    return x.reshape((x.shape[0] // g, g) + x.shape[1:])

  def init_state(q, k, v, mask, diff, nondiff):
    _, key_features = _row_feature_fns(component, rebuild, nondiff)
    phi = jax.eval_shape(lambda kk, mm: key_features(kk, mm, diff), k[..., :c, :], mask[..., :c])
    lead = q.shape[:-2]
    return (jnp.zeros(lead + (phi.shape[-1], v.shape[-1]), jnp.float32),
            jnp.zeros(lead + (phi.shape[-1],), jnp.float32))

  def forward(q, k, v, diff, nondiff, mask, save):
    query_features, key_features = _row_feature_fns(component, rebuild, nondiff)

    def step(carry, xs):
      qc, kc, vc, mc = xs
      out, den, *carry = _chunk_sums(query_features(qc, diff), key_features(kc, mc, diff), vc, *carry,
                                     eps)
      return tuple(carry), ((out, den) if save else out)

    init = init_state(q, k, v, mask, diff, nondiff)
    xs = chunks(q, k, v, mask)
    if not save:
      _, out = jax.lax.scan(step, init, xs, unroll=xs[0].shape[0] == 1)
      return _join_chunks(out, -2), ()

    def segment(carry, seg_xs):
      new, (out, den) = jax.lax.scan(step, carry, seg_xs, unroll=g == 1)
      return new, (out, den, carry[0], carry[1])

    _, (out, den, s0, z0) = jax.lax.scan(segment, init, tuple(segments(x) for x in xs),
                                         unroll=xs[0].shape[0] == g)
    out = _join_chunks(flat(out), -2)
    return out, (out, flat(den), s0, z0)

  def bwd(res, gr):
    q, k, v, diff, nondiff, mask, out, den, s0, z0 = res
    query_features, key_features = _row_feature_fns(component, rebuild, nondiff)
    zeros_diff = tuple(jnp.zeros_like(x) for x in diff)

    def rebuild_prefix(carry, xs):
      state, ksum = carry
      kc, vc, mc = xs
      phi_k = key_features(kc, mc, diff)
      return ((state + jnp.einsum('...jf,...jd->...fd', phi_k, vc), ksum + jnp.sum(phi_k, axis=-2)),
              (state, ksum))

    def step(carry, xs):
      d_state, d_ksum, dw = carry
      qc, kc, vc, mc, gc, oc, denc, pc, zc = xs
      phi_q, vjp_q = jax.vjp(query_features, qc, diff)
      phi_k, vjp_k = jax.vjp(lambda kk, dd: key_features(kk, mc, dd), kc, diff)
      d_phi_q, d_phi_k, dv, d_state, d_ksum = _chunk_sums_grads(phi_q, phi_k, vc, gc, oc, denc, pc, zc,
                                                               d_state, d_ksum, eps)
      dq, dwq = vjp_q(d_phi_q.astype(phi_q.dtype))
      dk, dwk = vjp_k(d_phi_k.astype(phi_k.dtype))
      return (d_state, d_ksum, _add(dw, _add(dwq, dwk))), (dq, dk, dv)

    def segment(carry, xs):
      qs, ks, vs, ms, gs, outs, dens, s0c, z0c = xs
      _, (ps, zs) = jax.lax.scan(rebuild_prefix, (s0c, z0c), (ks, vs, ms), unroll=g == 1)
      return jax.lax.scan(step, carry, (qs, ks, vs, ms, gs, outs, dens, ps, zs), reverse=True,
                          unroll=g == 1)

    xs = (*chunks(q, k, v, mask), _split_chunks(gr.astype(jnp.float32), c, -2),
          _split_chunks(out, c, -2), den)
    init = (jnp.zeros_like(s0[0]), jnp.zeros_like(z0[0]), zeros_diff)
    (_, _, dw), (dq, dk, dv) = jax.lax.scan(segment, init, (*(segments(x) for x in xs), s0, z0),
                                            reverse=True, unroll=s0.shape[0] == 1)
    return (_join_chunks(flat(dq), -2), _join_chunks(flat(dk), -2), _join_chunks(flat(dv), -2), dw)

  return forward, bwd
