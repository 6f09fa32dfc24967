"""Two public codes' Performers as catalog records, against float64 NumPy re-computations of their code.

* ``performer-zoology``: HazyResearch/zoology @ d88d6f5, zoology/mixers/feature_maps/performer.py
  74-141 (``PerformerFeatureMap``), the feature map of Based's figure 3, in the causal decoder's layout;
* ``performer-skyformer``: pkuzengqi/Skyformer @ 1a677cb, src/models/attention_performer.py 9-25 and
  src/models/performer.py 50-75, 134-139, 174-227 (``PerformerAttention`` -> ``FastAttention`` ->
  ``softmax_kernel`` and ``linear_attention``).

The NumPy functions below follow those lines step by step (not this package's code).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import decoder, registry
from kernelformer.attention import random_features as rf
from kernelformer.features import catalog
from kernelformer.features.projection import Projection

RNGS = {'params': jax.random.PRNGKey(0), 'features': jax.random.PRNGKey(1)}


# ---------------------------------------------------------------------------------------------------
# Zoology.

def zoology_matrix(orthonormal_rows: np.ndarray, d: int) -> np.ndarray:
  """performer.py 130-139: ``vstack(blocks) / sqrt(num_squares + remainder / d)``, blocks orthonormal."""
  m = orthonormal_rows.shape[0]
  num_squares = int(m / d)
  remainder = m - d * num_squares
  return orthonormal_rows / np.sqrt(num_squares + remainder / d)


def zoology_features(x: np.ndarray, random_feats: np.ndarray) -> np.ndarray:
  """performer.py 95-117: ``fmap(x / d**0.25)``, ``fmap = h(x) / sqrt(m) * exp(einsum(x, W))``."""
  d = x.shape[-1]
  x = x / d ** 0.25
  m = random_feats.shape[0]
  h = np.exp(-np.sum(x ** 2, axis=-1, keepdims=True) / 2)
  return h / np.sqrt(m) * np.exp(np.einsum('...d,md->...m', x, random_feats))


def based_causal(q, k, v, eps=1e-12):
  """zoology/mixers/based.py 205-206: ``(q * (k * v).cumsum(2)).sum(-1) / ((q * k.cumsum(2)).sum(-1) + eps)``
  for ``q, k [b, h, l, f]``, ``v [b, h, l, dv]`` (the causal linear attention Based runs)."""
  kv = np.cumsum(k[..., :, None] * v[..., None, :], axis=2)             # [b, h, l, f, dv]
  num = np.einsum('bhlf,bhlfe->bhle', q, kv)
  den = np.einsum('bhlf,bhlf->bhl', q, np.cumsum(k, axis=2))[..., None] + eps
  return num / den


def _orthonormal_rows(w: np.ndarray) -> np.ndarray:
  return w / np.linalg.norm(w, axis=-1, keepdims=True)


def test_zoology_rows_are_orthonormal_blocks_of_norm_one_half_at_d64():
  """The ORF draw, row-normalised, is Zoology's ``orthogonal_gaussian`` (orthonormal blocks of d rows);
  rescaled, every row has Zoology's norm sqrt(d/M): 0.5 at d = 64, M = 256 (performer.py line 138)."""
  from kernelformer.features import weights
  d, m = 64, 256
  w = np.asarray(weights.SAMPLERS['orf'](jax.random.PRNGKey(3), m, d).matrix, np.float64)
  u = _orthonormal_rows(w)
  for b in range(m // d):
    blk = u[b * d:(b + 1) * d]
    np.testing.assert_allclose(blk @ blk.T, np.eye(d), atol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(zoology_matrix(u, d), axis=-1), 0.5, rtol=1e-12)


@pytest.mark.parametrize('d,m', [(64, 256), (16, 40)])
def test_zoology_features_equal_the_public_formula_in_float64(d, m):
  rng = np.random.default_rng(0)
  w = rng.standard_normal((m, d))
  q, k = 1.5 * rng.standard_normal((2, 7, d)), 1.5 * rng.standard_normal((2, 9, d))
  mask = np.arange(9)[None, :] < np.array([[9], [5]])
  with jax.enable_x64(True):
    fn = catalog.get('performer_zoology').fn
    pq, pk = fn(jnp.asarray(q), jnp.asarray(k), Projection(matrix=jnp.asarray(w)), mask=jnp.asarray(mask))
    assert pq.dtype == jnp.float64 and pq.shape[-1] == m
  zw = zoology_matrix(_orthonormal_rows(w), d)
  np.testing.assert_allclose(np.asarray(pq), zoology_features(q, zw), rtol=1e-12, atol=0)
  want_k = np.where(mask[..., None], zoology_features(k, zw), 0.0)      # padded keys: zero features
  np.testing.assert_allclose(np.asarray(pk), want_k, rtol=1e-12, atol=0)


def test_zoology_kind_is_based_causal_attention_with_one_fixed_shared_draw():
  """The kind in the causal layout: float32 module output = Based's causal attention (float64) of
  Zoology's features of the module's own W; W is drawn once (the same at every step) for all heads."""
  b, l, h, d = 2, 12, 2, 16
  ks = jax.random.split(jax.random.PRNGKey(5), 3)
  q, k, v = (jax.random.normal(kk, (b, l, h, d)) for kk in ks)
  module = registry.build({'kind': 'performer-zoology', 'chunk_size': 4})
  assert module.num_features == 256 and module.redraw_every == 0 and module.share_heads
  variables = module.init(RNGS, q, k, v, causal=True)
  w = np.asarray(variables['features']['train'][0], np.float64)           # [M, d]: shared by the heads
  assert w.shape == (256, d)
  out, state = module.apply(variables, q, k, v, causal=True, step=jnp.asarray(1000), rngs=RNGS,
                            mutable=['features'])
  np.testing.assert_array_equal(np.asarray(state['features']['train'][0]), np.asarray(w, np.float32))
  zw = zoology_matrix(_orthonormal_rows(w), d)
  t = lambda x: np.swapaxes(np.asarray(x, np.float64), 1, 2)              # [b, h, l, .]
  want = np.swapaxes(based_causal(zoology_features(t(q), zw), zoology_features(t(k), zw), t(v)), 1, 2)
  np.testing.assert_allclose(np.asarray(out), want, rtol=2e-4, atol=2e-5)


def based_bidirectional(q, k, v, eps=1e-12):
  """zoology/mixers/based.py 208-209: ``(q * (k * v).sum(2)).sum(-1) / ((q * k.sum(2)).sum(-1) + eps)``."""
  num = np.einsum('bhlf,bhsf,bhse->bhle', q, k, v)
  return num / (np.einsum('bhlf,bhsf->bhl', q, k)[..., None] + eps)


@pytest.mark.parametrize('causal', [False, True])
def test_zoology_kind_adds_eps_to_the_normalizer_as_based_does(causal):
  """``num / (den + 1e-12)`` (based.py 205-209, eps at 69 and 102 @ d88d6f5), not a clamp at 1e-6: at
  inputs of norm ~1.5 sqrt(d) (d 64) rows have normalizers in (1e-12, 1e-6), and a clamp there scales
  them by D / 1e-6."""
  b, l, h, d = 2, 16, 2, 64
  ks = jax.random.split(jax.random.PRNGKey(7), 3)
  q, k = (1.5 * jax.random.normal(kk, (b, l, h, d)) for kk in ks[:2])
  v = jax.random.normal(ks[2], (b, l, h, d))
  module = registry.build({'kind': 'performer-zoology', 'chunk_size': 4})
  variables = module.init(RNGS, q, k, v, causal=causal)
  out = module.apply(variables, q, k, v, causal=causal, rngs=RNGS)
  w = np.asarray(variables['features']['train'][0], np.float64)
  zw = zoology_matrix(_orthonormal_rows(w), d)
  t = lambda x: np.swapaxes(np.asarray(x, np.float64), 1, 2)
  fq, fk = zoology_features(t(q), zw), zoology_features(t(k), zw)
  den = np.einsum('bhlf,bhlf->bhl', fq, np.cumsum(fk, axis=2) if causal else fk.sum(2, keepdims=True))
  assert np.mean((den > 1e-12) & (den < 1e-6)) > 0.25        # the rows the clamp would change
  want = (based_causal if causal else based_bidirectional)(fq, fk, t(v))
  np.testing.assert_allclose(np.asarray(out), np.swapaxes(want, 1, 2), rtol=2e-4, atol=2e-5)


def test_zoology_kind_serves_the_decoder_step_by_step():
  """Usable where the fla-style maps are: the causal decoder accepts it, and decoding token by token
  (the recurrent state) gives the full forward's logits."""
  assert decoder.causal_problem('performer-zoology') is None
  model = decoder.Decoder(vocab_size=16, emb_dim=16, num_layers=2, num_heads=1, qkv_dim=16, mlp_dim=16,
                          attention={'kind': 'performer-zoology', 'chunk_size': 4}, max_length=8,
                          pos_encoding='none', short_conv=3, state_mixer='identity', pad_id=None)
  x = jnp.asarray(np.random.default_rng(1).integers(0, 16, (2, 8)), jnp.int32)
  variables = model.init(RNGS, x)
  full = model.apply(variables, x, rngs=RNGS)
  dec = model.clone(decode=True)
  cache = decoder.init_cache(model, 2)
  steps = []
  for t in range(8):
    logits, new = dec.apply({**variables, 'cache': cache}, x[:, t:t + 1], rngs=RNGS, mutable=['cache'])
    cache = new['cache']
    steps.append(logits)
  np.testing.assert_allclose(np.asarray(jnp.concatenate(steps, axis=1)), np.asarray(full),
                             rtol=2e-4, atol=2e-4)


# ---------------------------------------------------------------------------------------------------
# Skyformer.

def skyformer_softmax_kernel(data, projection_matrix, is_query, eps=1e-4):
  """performer.py 50-75 (``normalize_data=True``) for ``data [b, h, n, d]``."""
  data_normalizer = data.shape[-1] ** -0.25
  ratio = projection_matrix.shape[0] ** -0.5
  data_dash = np.einsum('...id,jd->...ij', data_normalizer * data, projection_matrix)
  diag_data = np.sum(data ** 2, axis=-1)
  diag_data = ((diag_data / 2.0) * data_normalizer ** 2)[..., None]
  if is_query:
    return ratio * (np.exp(data_dash - diag_data - np.max(data_dash, axis=-1, keepdims=True)) + eps)
  return ratio * (np.exp(data_dash - diag_data - np.max(data_dash)) + eps)


def skyformer_attention(q, k, v, projection_matrix):
  """attention_performer.py 21-25 (all tokens real) and performer.py 134-139, ``[b, h, n, d]``."""
  d = q.shape[-1]
  qf = skyformer_softmax_kernel(q / np.sqrt(np.sqrt(d)), projection_matrix, True)
  kf = skyformer_softmax_kernel(k / np.sqrt(np.sqrt(d)), projection_matrix, False)
  k_cumsum = kf.sum(axis=-2)
  d_inv = 1.0 / np.einsum('...nd,...d->...n', qf, k_cumsum)
  context = np.einsum('...nd,...ne->...de', kf, v)
  return np.einsum('...de,...nd,...n->...ne', context, qf, d_inv), qf, kf


def _skyformer_inputs(b=2, n=10, h=3, d=16):
  ks = jax.random.split(jax.random.PRNGKey(9), 3)
  q, k, v = (jax.random.normal(kk, (b, n, h, d)) for kk in ks)
  # Keys of unequal scale across examples and heads: the whole-tensor max differs from each head's.
  k = k * jnp.asarray([1.0, 3.0])[:, None, None, None] * jnp.asarray([1.0, 0.5, 2.0])[None, None, :, None]
  return q, k, v


def test_skyformer_features_equal_the_public_formula_in_float64():
  """``[B, H, n, d]`` in one call (the record's ``whole_tensor``): one key max over all of it."""
  rng = np.random.default_rng(2)
  d, m = 16, 24
  w = rng.standard_normal((m, d))
  q, k = rng.standard_normal((2, 3, 7, d)), rng.standard_normal((2, 3, 9, d)) * np.array([1, 3])[:, None, None, None]
  with jax.enable_x64(True):
    pq, pk = catalog.get('performer_skyformer').fn(jnp.asarray(q), jnp.asarray(k),
                                                     Projection(matrix=jnp.asarray(w)))
  s = d ** -0.25    # attention_performer.py 23-24; softmax_kernel scales by d^-1/4 once more
  np.testing.assert_allclose(np.asarray(pq), skyformer_softmax_kernel(q * s, w, True), rtol=1e-12)
  np.testing.assert_allclose(np.asarray(pk), skyformer_softmax_kernel(k * s, w, False), rtol=1e-12)


def test_skyformer_kind_equals_the_public_attention():
  """Module output and its sown features (float32) = Skyformer's, from the module's own fixed W,
  with the key max over every example and head (a per-head max would change the features)."""
  q, k, v = _skyformer_inputs()
  module = registry.build({'kind': 'performer-skyformer'})
  assert module.num_features == 128 and module.redraw_every == 0 and module.share_heads
  variables = module.init(RNGS, q, k, v)
  w = np.asarray(variables['features']['train'][0], np.float64)
  out, sown = module.apply(variables, q, k, v, step=jnp.asarray(500), rngs=RNGS,
                           mutable=['intermediates', 'features'])
  t = lambda x: np.swapaxes(np.asarray(x, np.float64), 1, 2)
  want, qf, kf = skyformer_attention(t(q), t(k), t(v), w)
  np.testing.assert_allclose(np.asarray(out), np.swapaxes(want, 1, 2), rtol=1e-4, atol=1e-5)
  got_k = t(sown['intermediates']['phi_k'][0])
  np.testing.assert_allclose(got_k, kf, rtol=1e-4, atol=1e-9)
  np.testing.assert_allclose(t(sown['intermediates']['phi_q'][0]), qf, rtol=1e-4, atol=1e-9)
  np.testing.assert_array_equal(np.asarray(sown['features']['train'][0]), np.asarray(w, np.float32))


def test_skyformer_kind_has_no_causal_form():
  assert 'no causal form' in decoder.causal_problem('performer-skyformer')
  q, k, v = _skyformer_inputs()
  module = registry.build({'kind': 'performer-skyformer'})
  with pytest.raises(ValueError, match='no causal form'):
    module.init(RNGS, q, k, v, causal=True)
  with pytest.raises(ValueError, match='share_heads'):
    rf.RandomFeatureAttention(component='performer_skyformer', share_heads=False).init(RNGS, q, k, v)
