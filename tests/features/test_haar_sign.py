"""The orthogonal sampler's QR sign convention.

Haar Q is the Q of the QR factorization of a Gaussian matrix G whose R has a positive diagonal (Mezzadri
2007). Which signs a QR routine returns is its own convention (LAPACK's Householder QR: diag(R) of
either sign, Q[0, 0] <= 0), so the test pins the result itself: Q^T G must be upper triangular with a
positive diagonal, whatever convention the QR routine underneath has; and the entries of Q, and of the
ORF sampler's W, must have mean 0.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer.features import weights


def _numpy_qr_with_signs(flip: str):
  """A QR routine with another sign convention: 'all' makes every diag(R) negative, 'random' random."""
  rng = np.random.default_rng(0)

  def qr(a):
    q, r = np.linalg.qr(np.asarray(a, np.float64))
    d = np.sign(np.diagonal(r, axis1=-2, axis2=-1))
    s = -d if flip == 'all' else rng.choice([-1.0, 1.0], size=d.shape)
    return jnp.asarray(q * s[..., None, :], a.dtype), jnp.asarray(r * s[..., :, None], a.dtype)
  return qr


@pytest.mark.parametrize('qr', ['jax', 'all', 'random'])
def test_haar_orthogonal_is_the_factor_with_positive_diagonal(qr, monkeypatch):
  if qr != 'jax':
    monkeypatch.setattr(weights, '_qr', _numpy_qr_with_signs(qr))
  key, num, d = jax.random.key(4), 32, 6
  g = np.asarray(weights.standard_normal(key, (num, d, d)), np.float64)
  q = np.asarray(weights.haar_orthogonal(key, num, d), np.float64)
  np.testing.assert_allclose(np.einsum('nji,njk->nik', q, q), np.broadcast_to(np.eye(d), q.shape),
                             atol=1e-5)
  r = np.einsum('nji,njk->nik', q, g)                          # R = Q^T G
  np.testing.assert_allclose(np.tril(r, -1), 0.0, atol=1e-4)   # upper triangular ...
  assert (np.diagonal(r, axis1=-2, axis2=-1) > 0).all()        # ... with a positive diagonal


def _zero_mean(x):
  """Every entry's mean over the leading axis within 5 standard errors of 0."""
  x = np.asarray(x, np.float64)
  se = x.std(0) / math.sqrt(x.shape[0])
  assert (np.abs(x.mean(0)) < 5 * se + 1e-12).all(), (x.mean(0), se)


def test_haar_and_orf_entries_have_mean_zero():
  d, num = 4, 4096
  _zero_mean(jax.jit(weights.haar_orthogonal, static_argnums=(1, 2))(jax.random.key(2), num, d))
  keys = jax.random.split(jax.random.key(3), num)
  w = jax.jit(jax.vmap(lambda k: weights.orthogonal(k, d, d).matrix))(keys)
  _zero_mean(w)
