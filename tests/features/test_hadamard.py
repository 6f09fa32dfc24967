"""Tests of the fast Walsh-Hadamard transform against the dense Sylvester matrix, and of the padding.

FastFood and SORF rely on ``fwht(x) == x @ H_n`` and on zero-padding d up to a power of two being exact;
a wrong butterfly order or a padding on the wrong axis would silently change every structured sampler.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer.features import hadamard


@pytest.mark.parametrize('n', [1, 2, 8, 32, 128])
def test_fwht_equals_dense_hadamard(n):
  x = np.random.default_rng(n).normal(size=(3, 2, n)).astype(np.float32)
  expected = x @ hadamard.hadamard_matrix(n)
  np.testing.assert_allclose(np.asarray(jax.jit(hadamard.fwht)(jnp.asarray(x))), expected,
                             rtol=1e-5, atol=1e-5 * np.sqrt(n))


def test_fwht_is_its_own_inverse_up_to_n():
  # H_n H_n = n I: a transform with a wrong sign pattern or ordering fails this for non-symmetric H.
  x = jnp.asarray(np.random.default_rng(0).normal(size=(5, 64)), jnp.float32)
  twice = jax.jit(lambda y: hadamard.fwht(hadamard.fwht(y)))(x)
  np.testing.assert_allclose(np.asarray(twice) / 64, np.asarray(x), atol=1e-5)


def test_fwht_under_jit_and_vmap():
  x = jnp.asarray(np.random.default_rng(1).normal(size=(4, 16)), jnp.float32)
  out = jax.jit(jax.vmap(hadamard.fwht))(x)
  np.testing.assert_allclose(np.asarray(out), np.asarray(x) @ hadamard.hadamard_matrix(16),
                             rtol=1e-5, atol=1e-5)


def test_fwht_rejects_non_power_of_two():
  with pytest.raises(ValueError, match='power-of-two'):
    hadamard.fwht(jnp.ones((3, 6)))


def test_hadamard_matrix_is_orthogonal_up_to_n():
  for n in (1, 2, 8, 16):
    h = hadamard.hadamard_matrix(n)
    assert set(np.unique(h)) <= {-1.0, 1.0}
    np.testing.assert_array_equal(h @ h.T, n * np.eye(n))
  with pytest.raises(ValueError):
    hadamard.hadamard_matrix(12)


@pytest.mark.parametrize('n, expected', [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (12, 16), (48, 64),
                                         (64, 64), (65, 128)])
def test_next_pow2(n, expected):
  assert hadamard.next_pow2(n) == expected


def test_pad_to_pow2_zero_pads_the_chosen_axis():
  x = jnp.arange(2 * 5 * 3, dtype=jnp.float32).reshape(2, 5, 3) + 1.0
  last = hadamard.pad_to_pow2(x)
  assert last.shape == (2, 5, 4)
  np.testing.assert_array_equal(np.asarray(last[..., :3]), np.asarray(x))
  np.testing.assert_array_equal(np.asarray(last[..., 3:]), 0.0)
  middle = hadamard.pad_to_pow2(x, axis=1)
  assert middle.shape == (2, 8, 3)
  np.testing.assert_array_equal(np.asarray(middle[:, :5]), np.asarray(x))
  np.testing.assert_array_equal(np.asarray(middle[:, 5:]), 0.0)
  same = jnp.ones((3, 8))
  assert hadamard.pad_to_pow2(same) is same


def test_zero_padding_is_exact_for_projections():
  # w . x over d coordinates equals the padded product when only the padding of x is zero: the reason
  # FastFood and SORF may work in n = next_pow2(d) dimensions.
  rng = np.random.default_rng(3)
  x = rng.normal(size=(4, 12)).astype(np.float32)
  w_full = rng.normal(size=(7, 16)).astype(np.float32)
  padded = np.asarray(hadamard.pad_to_pow2(jnp.asarray(x)))
  np.testing.assert_allclose(padded @ w_full.T, x @ w_full[:, :12].T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('method', ['dense', 'butterfly'])
@pytest.mark.parametrize('n', [2, 16, 256])
def test_fwht_methods_equal_dense_hadamard(method, n):
  """Both forms of the transform are ``x @ H_n``; 'auto' picks dense up to DENSE_MAX."""
  x = np.random.default_rng(n).normal(size=(3, n)).astype(np.float32)
  expected = x @ hadamard.hadamard_matrix(n)
  got = jax.jit(lambda y: hadamard.fwht(y, method=method))(jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5 * np.sqrt(n))


def test_fwht_auto_uses_dense_matmul_only_up_to_threshold():
  small = jax.make_jaxpr(hadamard.fwht)(jnp.ones((2, hadamard.DENSE_MAX)))
  large = jax.make_jaxpr(hadamard.fwht)(jnp.ones((2, 2 * hadamard.DENSE_MAX)))
  assert 'dot_general' in str(small) and 'concatenate' not in str(small)
  assert 'dot_general' not in str(large)
  with pytest.raises(ValueError, match='method'):
    hadamard.fwht(jnp.ones((2, 4)), method='fast')
