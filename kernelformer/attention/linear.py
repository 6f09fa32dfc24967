"""The linear-attention core: ``D^-1 phi(Q) (phi(K)^T V)`` (Spectraformer eq. 7; Katharopoulos et al.).

Pure functions on feature maps that have already been computed. Shapes follow the registry:
``phi_q [B, L, H, M]``, ``phi_k [B, S, H, M]``, ``v [B, S, H, Dv]``, ``mask [B, S]`` (True = real key).

* Bidirectional: ``out_i = sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j)`` in O(L M Dv) time and
  O(L (M + Dv) + M Dv) memory: the L x S matrix is never formed.
* Causal: chunked form. Inside a chunk of C positions a masked C x C product; across chunks an
  exclusive prefix sum of the per-chunk ``phi(K)^T V`` states. A position-by-position ``lax.scan`` is
  20-30x slower on accelerators (``../shared/reference/attention-facts.md``), so it is not used.
* Padded keys are removed from both numerator and normalizer by zeroing their feature rows.
* Accumulation is float32 whatever the input dtype (bf16 inputs are upcast on CPU, where a bf16 dot with
  a float32 result is not supported, and use ``preferred_element_type`` elsewhere).
* The normalizer never divides by zero: ``|D| < eps`` is replaced by ``eps`` with D's sign.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

DEFAULT_EPS = 1e-6


def einsum_f32(spec: str, *operands: Array) -> Array:
  """``jnp.einsum`` with float32 accumulation and a float32 result for any input dtype."""
  if jax.default_backend() == 'cpu' or all(o.dtype == jnp.float32 for o in operands):
    return jnp.einsum(spec, *(o.astype(jnp.float32) for o in operands))
  return jnp.einsum(spec, *operands, preferred_element_type=jnp.float32)


def safe_normalizer(den: Array, eps: float = DEFAULT_EPS) -> Array:
  """``den`` with values closer to zero than ``eps`` moved to ``+-eps`` (keeps the sign)."""
  return jnp.where(jnp.abs(den) < eps, jnp.where(den < 0, -eps, eps), den)


def mask_keys(phi_k: Array, mask: Array | None) -> Array:
  """Zeroes the feature rows of padded keys, so they drop out of numerator and normalizer."""
  if mask is None:
    return phi_k
  return phi_k * mask[:, :, None, None].astype(phi_k.dtype)


def linear_attention(phi_q: Array, phi_k: Array, v: Array, *, mask: Array | None = None,
                     causal: bool = False, chunk_size: int = 64,
                     eps: float = DEFAULT_EPS) -> Array:
  """Normalized linear attention; returns ``[B, L, H, Dv]`` in ``v.dtype``."""
  phi_k = mask_keys(phi_k, mask)
  if causal:
    num, den = _causal_num_den(phi_q, phi_k, v, chunk_size)
  else:
    kv = einsum_f32('bshm,bshd->bhmd', phi_k, v)                  # [B, H, M, Dv]
    ksum = jnp.sum(phi_k.astype(jnp.float32), axis=1)             # [B, H, M]
    num = einsum_f32('blhm,bhmd->blhd', phi_q, kv)
    den = einsum_f32('blhm,bhm->blh', phi_q, ksum)
  out = num / safe_normalizer(den, eps)[..., None]
  return out.astype(v.dtype)


def _causal_num_den(phi_q: Array, phi_k: Array, v: Array, chunk_size: int):
  """Numerator and normalizer of causal linear attention in chunked form."""
  b, length, h, m = phi_q.shape
  dv = v.shape[-1]
  c = max(1, min(chunk_size, length))
  n_chunks = -(-length // c)
  pad = n_chunks * c - length
  if pad:
    # Zero rows at the end: padded keys add nothing, padded queries are cut off below.
    padder = lambda x: jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
    phi_q, phi_k, v = padder(phi_q), padder(phi_k), padder(v)
  qc = phi_q.reshape(b, n_chunks, c, h, m)
  kc = phi_k.reshape(b, n_chunks, c, h, m)
  vc = v.reshape(b, n_chunks, c, h, dv)
  # Inter-chunk part: exclusive prefix sum of per-chunk states.
  kv_chunk = einsum_f32('bnchm,bnchd->bnhmd', kc, vc)               # [B, N, H, M, Dv]
  ks_chunk = jnp.sum(kc.astype(jnp.float32), axis=2)              # [B, N, H, M]
  kv_prev = jnp.cumsum(kv_chunk, axis=1) - kv_chunk
  ks_prev = jnp.cumsum(ks_chunk, axis=1) - ks_chunk
  num = einsum_f32('bnchm,bnhmd->bnchd', qc, kv_prev)
  den = einsum_f32('bnchm,bnhm->bnch', qc, ks_prev)
  # Intra-chunk part: masked quadratic C x C.
  scores = einsum_f32('bnihm,bnjhm->bnhij', qc, kc)
  tril = jnp.tril(jnp.ones((c, c), dtype=bool))
  scores = jnp.where(tril, scores, 0.0)
  num = num + einsum_f32('bnhij,bnjhd->bnihd', scores, vc)
  den = den + jnp.einsum('bnhij->bnih', scores)
  num = num.reshape(b, n_chunks * c, h, dv)[:, :length]
  den = den.reshape(b, n_chunks * c, h)[:, :length]
  return num, den


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
