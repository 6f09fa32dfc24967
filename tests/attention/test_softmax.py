"""Softmax attention (Vaswani et al. eq. 1) with masks and Luo et al.'s relative-position bias (eq. 6)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import registry
from kernelformer.attention import softmax
from tests.attention.helpers import fast_jit

B, L, H, D = 2, 5, 2, 4


def _naive(q, k, v, mask=None, causal=False, bias=None):
  """softmax(q.k / sqrt(d) + b_{j-i}) v, with the bias indexed by hand, float64."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  length = q.shape[1]
  logits = np.einsum('blhd,bshd->bhls', q, k) / np.sqrt(q.shape[-1])
  if bias is not None:
    b = np.asarray(bias, np.float64)
    for i in range(length):
      for j in range(length):
        logits[:, :, i, j] += b[:, j - i + length - 1]
  allowed = np.ones(logits.shape, bool)
  if mask is not None:
    allowed &= np.asarray(mask)[:, None, None, :]
  if causal:
    allowed &= np.tril(np.ones((length, length), bool))
  logits = np.where(allowed, logits, -np.inf)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  return np.einsum('bhls,bshd->blhd', w / w.sum(-1, keepdims=True), v)


def _inputs(seed=0):
  ks = jax.random.split(jax.random.PRNGKey(seed), 4)
  q, k, v = (jax.random.normal(kk, (B, L, H, D)) for kk in ks[:3])
  bias = 2.0 * jax.random.normal(ks[3], (H, 2 * L - 1))
  mask = jnp.array([[True] * L, [True, True, False, False, False]])
  return q, k, v, bias, mask


@pytest.mark.parametrize('with_bias', [False, True])
def test_softmax_matches_naive(with_bias):
  q, k, v, bias, mask = _inputs()
  bias = bias if with_bias else None

  @functools.partial(fast_jit, static_argnames='causal')
  def both(q, k, v, mask, bias, causal):
    out = softmax.softmax_attention(q, k, v, mask=mask, causal=causal, position_bias=bias)
    w = softmax.softmax_weights(q, k, mask=mask, causal=causal, position_bias=bias)
    return out, jnp.einsum('bhls,bshd->blhd', w, v)

  for causal in (False, True):
    out, via_weights = both(q, k, v, mask, bias, causal=causal)
    np.testing.assert_allclose(np.asarray(out), _naive(q, k, v, mask, causal, bias),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(via_weights), np.asarray(out), rtol=1e-5, atol=1e-6)


def test_softmax_module_with_bias_and_dropout():
  q, k, v, bias, mask = _inputs(1)
  spec = registry.get('softmax')
  assert spec.supports_position_bias and not spec.requires_position_bias
  module = registry.build({'kind': 'softmax', 'attention_dropout': 0.5})
  # Deterministic: dropout off, the exact biased softmax.
  def dropped(key):
    return module.apply({}, q, k, v, mask=mask, position_bias=bias, deterministic=False,
                        rngs={'dropout': key})

  out, draws = fast_jit(lambda keys: (
      module.apply({}, q, k, v, mask=mask, position_bias=bias, deterministic=True),
      jax.vmap(dropped)(keys)))(jax.random.split(jax.random.PRNGKey(2), 256))
  np.testing.assert_allclose(np.asarray(out), _naive(q, k, v, mask, False, bias), rtol=1e-5,
                             atol=1e-6)
  # Training: dropped weights are rescaled by 1 / (1 - rate), so the mean over many masks is unbiased.
  assert bool(jnp.all(jnp.isfinite(draws)))
  mean = np.asarray(draws.mean(0))
  se = np.asarray(draws.std(0)) / np.sqrt(256)
  assert np.all(np.abs(mean - np.asarray(out)) <= 5 * se + 1e-6)


def test_softmax_bias_shape_is_checked():
  q, k, v, bias, _ = _inputs()
  with pytest.raises(ValueError, match='position_bias'):
    softmax.softmax_attention(q, k, v, position_bias=bias[:, :-2])


def test_training_without_attention_dropout_takes_dot_product_attention(monkeypatch):
  # Only attention dropout in training forms the [B, H, L, S] weights (the module docstring's
  # fallbacks); without it a training call is jax.nn.dot_product_attention (cuDNN flash on a GPU),
  # with the same numbers as evaluation.
  q, k, v, _, mask = _inputs(3)
  calls = []
  real = softmax.softmax_weights
  monkeypatch.setattr(softmax, 'softmax_weights', lambda *a, **kw: calls.append(1) or real(*a, **kw))
  for causal in (False, True):
    module = registry.build({'kind': 'softmax', 'attention_dropout': 0.0})
    train = module.apply({}, q, k, v, mask=mask, causal=causal, deterministic=False,
                         rngs={'dropout': jax.random.PRNGKey(0)})
    evaluation = module.apply({}, q, k, v, mask=mask, causal=causal, deterministic=True)
    assert not calls
    np.testing.assert_array_equal(np.asarray(train), np.asarray(evaluation))
    np.testing.assert_allclose(np.asarray(train), _naive(q, k, v, mask, causal), rtol=1e-5, atol=1e-6)
  dropping = registry.build({'kind': 'softmax', 'attention_dropout': 0.1})
  dropping.apply({}, q, k, v, mask=mask, deterministic=False, rngs={'dropout': jax.random.PRNGKey(0)})
  assert calls                                       # the documented fallback
