"""The XLA path that ``feature_attention`` must match, with the same call signature (test oracle).

Features from ``features/components.py`` (posrf, trigrf, elu, relu: Spectraformer eqs. 32 and 10, the
Linear Transformer's elu + 1) one head at a time, then ``attention/linear.py``'s ``linear_attention``
(Spectraformer eq. 7; chunked causal form) or its naive ``quadratic_reference``. Everything is plain
jnp, so ``jax.grad`` of it is the reference gradient. It sits in ``bench`` beside
``gpu_check.py``, above the attention library it is built from; ``kernelformer.pallas`` stays below
``kernelformer.attention``, which dispatches to its kernels.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from kernelformer.attention import linear
from kernelformer.features import catalog
from kernelformer.features.projection import Projection

Array = jax.Array

# The fused kernels' feature names -> the map computing the same features (the records' pallas_feature).
COMPONENT = {r.pallas_feature: r.name for r in catalog.records() if r.pallas_feature}


def features(q: Array, k: Array, w: Optional[Array], *, feature: str = 'exp',
             feature_weights: Optional[Array] = None, mask: Optional[Array] = None):
  """``phi(q) [B, L, H, M']``, ``phi(k) [B, S, H, M']`` from the map's record (stabilized), in float32."""
  fn = catalog.get(COMPONENT[feature]).fn
  q, k = q.astype(jnp.float32), k.astype(jnp.float32)
  h = q.shape[2]
  if w is None:
    proj = None
  else:
    w = jnp.broadcast_to(w.astype(jnp.float32), (h,) + w.shape[-2:])
    fw = None
    if feature_weights is not None:
      fw = jnp.broadcast_to(jnp.asarray(feature_weights, jnp.float32), (h, w.shape[1]))
    proj = Projection(matrix=w, feature_weights=fw)

  def one_head(qh, kh, p):
    return fn(qh, kh, p, mask=mask, stabilize=True)

  return jax.vmap(one_head, in_axes=(2, 2, None if proj is None else 0),
                  out_axes=(2, 2))(q, k, proj)


def xla_feature_attention(q: Array, k: Array, v: Array, w: Optional[Array] = None, *,
                          feature: str = 'exp', feature_weights: Optional[Array] = None,
                          mask: Optional[Array] = None, causal: bool = False,
                          chunk_size: int = 64, eps: float = linear.DEFAULT_EPS,
                          quadratic: bool = False) -> Array:
  """``feature_attention``'s result by the XLA path (``quadratic``: the naive L x S oracle instead)."""
  phi_q, phi_k = features(q, k, w, feature=feature, feature_weights=feature_weights, mask=mask)
  vf = v.astype(jnp.float32)
  if quadratic:
    out = linear.quadratic_reference(phi_q, phi_k, vf, mask=mask, causal=causal, eps=eps)
  else:
    out = linear.linear_attention(phi_q, phi_k, vf, mask=mask, causal=causal,
                                  chunk_size=chunk_size, eps=eps)
  return out.astype(v.dtype)
