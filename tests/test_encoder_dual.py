"""The Retrieval dual encoder is siamese for EVERY registered mechanism.

LRA's Retrieval task encodes two documents with one shared encoder and classifies [u, v, u*v, u-v].
"Shared" must include the random features, landmarks and their redraws: two identical documents
must give identical embeddings, in training (at any step, across a redraw) and in evaluation. Before
the fix each document took its own ``make_rng('features')`` and identical documents differed by
|u - v| / |u| = 0.4-1.4 for every random-feature kind and Skyformer.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelformer
from kernelformer.encoder import Classifier
from tests.attention.helpers import fast_jit

L, VOCAB, B = 10, 17, 2
# Small options every mechanism reads (build ignores the rest); SGQ needs >= 2 * head_dim + 1 features.
OPTIONS = {'num_features': 9, 'num_landmarks': 3, 'linformer_k': 3, 'max_length': L + 1,
           'chunk_size': 4, 'num_mixture_components': 2, 'redraw_every': 2}


def _model(kind: str) -> Classifier:
  encoder = dict(vocab_size=VOCAB, emb_dim=8, num_layers=1, num_heads=2, qkv_dim=8, mlp_dim=8,
                 max_length=L, dropout_rate=0.0, pooling='cls',
                 attention={'kind': kind, **OPTIONS})
  return Classifier(num_classes=2, encoder=encoder, mlp_dim=8, dual=True)


def _embeddings(model, variables, batch, *, train, step):
  """(u, v): the encoder outputs of the two towers, read from the captured intermediates."""
  _, state = model.apply(variables, batch, train=train, step=step,
                         rngs={'features': jax.random.PRNGKey(7), 'dropout': jax.random.PRNGKey(8)},
                         capture_intermediates=True, mutable=['intermediates', 'features'])
  both = state['intermediates']['encoder']['__call__'][0]
  n = batch['inputs1'].shape[0]
  return both[:n], both[n:]


def _docs():
  rng = np.random.default_rng(0)
  a = rng.integers(1, VOCAB, size=(B, L)).astype(np.int32)
  a[1, 6:] = 0   # one padded document
  return a


@pytest.mark.parametrize('kind', kernelformer.list_kernels())
def test_identical_documents_give_identical_embeddings(kind):
  model = _model(kind)
  a = jnp.asarray(_docs())
  batch = {'inputs1': a, 'inputs2': a}
  variables = model.init({'params': jax.random.PRNGKey(0), 'features': jax.random.PRNGKey(7),
                          'dropout': jax.random.PRNGKey(8)}, batch)

  def all_modes(variables, steps):
    # Training at step 0 and at step 3 (a later redraw window): the step an input, as in the trainer,
    # and the training forward compiled once (a loop over the two steps); and evaluation.
    train = jax.lax.map(lambda s: _embeddings(model, variables, batch, train=True, step=s), steps)
    return [jax.tree.map(lambda x: x[0], train), jax.tree.map(lambda x: x[1], train),
            _embeddings(model, variables, batch, train=False, step=None)]

  for u, v in fast_jit(all_modes)(variables, jnp.asarray([0, 3], jnp.int32)):
    u, v = np.asarray(u), np.asarray(v)
    assert np.all(np.isfinite(u))
    np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6, err_msg=kind)


@pytest.mark.parametrize('kind', ['posrf-orf', 'skyformer', 'gmm-rks', 'nystromformer'])
def test_a_tower_does_not_depend_on_the_other_document(kind):
  """u of document A is the same whether it is paired with A or with another document."""
  model = _model(kind)
  a = jnp.asarray(_docs())
  c = jnp.asarray(np.random.default_rng(1).integers(1, VOCAB, size=(B, L)).astype(np.int32))
  variables = model.init({'params': jax.random.PRNGKey(0), 'features': jax.random.PRNGKey(7),
                          'dropout': jax.random.PRNGKey(8)}, {'inputs1': a, 'inputs2': a})
  u_aa, _ = _embeddings(model, variables, {'inputs1': a, 'inputs2': a}, train=True, step=jnp.int32(1))
  u_ac, v_ac = _embeddings(model, variables, {'inputs1': a, 'inputs2': c}, train=True,
                           step=jnp.int32(1))
  np.testing.assert_allclose(u_aa, u_ac, rtol=1e-5, atol=1e-6)
  assert not np.allclose(u_ac, v_ac)


def test_documents_of_different_lengths_are_padded_not_truncated():
  model = _model('posrf-orf')
  a = jnp.asarray(_docs())
  short = a[:, :6]
  variables = model.init({'params': jax.random.PRNGKey(0), 'features': jax.random.PRNGKey(7)},
                         {'inputs1': a, 'inputs2': a})
  # Document 1 of ``a`` is padded after position 6: as a 6-token input it is the same document.
  u, v = _embeddings(model, variables, {'inputs1': a, 'inputs2': short}, train=False, step=None)
  np.testing.assert_allclose(u[1], v[1], rtol=1e-5, atol=1e-6)
