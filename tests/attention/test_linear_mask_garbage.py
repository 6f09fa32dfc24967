"""The linear-attention core masks padded keys in its numerator AND its normalizer.

Components zero the features of padded keys, so a key sum that skipped the mask would go unnoticed
through every module-level test. Here the core (``linear.linear_attention``) is given feature rows full
of garbage (large positive values, so they would dominate both sums) at padded positions, directly:
its output for every real query must equal the quadratic reference over the real keys only.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer.attention import linear

B, L, H, M, DV = 2, 10, 2, 6, 3


@pytest.mark.parametrize('causal', [False, True])
def test_garbage_in_padded_feature_rows_changes_nothing(causal):
  kq, kk, kv, kg = jax.random.split(jax.random.key(0), 4)
  phi_q = jax.random.uniform(kq, (B, L, H, M), minval=0.1, maxval=1.0)
  phi_k = jax.random.uniform(kk, (B, L, H, M), minval=0.1, maxval=1.0)
  v = jax.random.normal(kv, (B, L, H, DV))
  mask = np.ones((B, L), bool)
  # Causal: padding first, so that real queries come after padded keys and could see them.
  padded = slice(0, 3) if causal else slice(L - 3, L)
  mask[0, padded] = False
  mask[1, (slice(0, 1) if causal else slice(L - 1, L))] = False
  mask = jnp.asarray(mask)
  pad = ~mask[:, :, None, None]
  garbage_k = jnp.where(pad, 1e3 * (1.0 + jax.random.uniform(kg, phi_k.shape)), phi_k)
  garbage_v = jnp.where(pad, 1e4, v)
  out = linear.linear_attention(phi_q, garbage_k, garbage_v, mask=mask, causal=causal, chunk_size=4)
  ref = linear.quadratic_reference(phi_q, phi_k, v, mask=mask, causal=causal)
  real = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(out)[real], np.asarray(ref)[real], rtol=1e-4, atol=1e-5)
