"""The model options of the paper settings: LRA's Retrieval head and attention without biases.

* ``retrieval_head='lra'``: LRA's ``classifier_head_dual`` with ``interaction=None``, i.e. [u, v] ->
  Dense(mlp) -> ReLU -> Dense(mlp // 2) -> ReLU -> Dense(classes) (long-range-arena
  models/layers/common_layers.py 236-241 @ b4f9fed); 'nli' keeps [u, v, u*v, u-v] -> 2 Dense layers.
* ``qkv_bias=False``: no bias parameter in the query/key/value/output projections (LRA's
  ``nn.SelfAttention(bias=False)``), and the attention equals the biased one with zero biases.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import listops
from configs import retrieval
from kernelformer.encoder import Classifier
from kernelformer.layers import EncoderBlock
from kernelformer.training import trainer
from lra_tasks import common

EMB, MLP, L, B = 8, 12, 6, 3


def _dual(head: str, qkv_bias: bool = True) -> Classifier:
  encoder = dict(vocab_size=11, emb_dim=EMB, num_layers=1, num_heads=2, qkv_dim=8, mlp_dim=MLP,
                 max_length=L, dropout_rate=0.0, pooling='cls', attention={'kind': 'softmax'},
                 qkv_bias=qkv_bias)
  return Classifier(num_classes=2, encoder=encoder, mlp_dim=MLP, dual=True, retrieval_head=head)


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  return {'inputs1': jnp.asarray(rng.integers(1, 11, (B, L)), jnp.int32),
          'inputs2': jnp.asarray(rng.integers(1, 11, (B, L - 2)), jnp.int32)}


def _shapes(params):
  return {k: jax.tree_util.tree_map(lambda x: x.shape, v) for k, v in params.items() if k != 'encoder'}


def test_lra_retrieval_head_shapes_and_function():
  model, batch = _dual('lra'), _batch()
  variables = model.init(jax.random.key(0), batch)
  assert _shapes(variables['params']) == {
      'head_hidden': {'kernel': (2 * EMB, MLP), 'bias': (MLP,)},
      'head_hidden2': {'kernel': (MLP, MLP // 2), 'bias': (MLP // 2,)},
      'head_out': {'kernel': (MLP // 2, 2), 'bias': (2,)}}
  # The head of the two encoder outputs, in float64 numpy.
  logits, state = model.apply(variables, batch, capture_intermediates=True, mutable=['intermediates'])
  both = np.asarray(state['intermediates']['encoder']['__call__'][0], np.float64)
  u, v = both[:B], both[B:]
  p = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), variables['params'])
  h = np.maximum(np.concatenate([u, v], -1) @ p['head_hidden']['kernel'] + p['head_hidden']['bias'], 0)
  h = np.maximum(h @ p['head_hidden2']['kernel'] + p['head_hidden2']['bias'], 0)
  np.testing.assert_allclose(logits, h @ p['head_out']['kernel'] + p['head_out']['bias'],
                             rtol=1e-5, atol=1e-6)


def test_nli_head_is_unchanged_and_unknown_heads_fail():
  variables = _dual('nli').init(jax.random.key(0), _batch())
  assert _shapes(variables['params']) == {
      'head_hidden': {'kernel': (4 * EMB, MLP), 'bias': (MLP,)},
      'head_out': {'kernel': (MLP, 2), 'bias': (2,)}}
  with pytest.raises(ValueError, match='retrieval_head'):
    _dual('concat').init(jax.random.key(0), _batch())


def _leaf_paths(tree):
  return ['/'.join(str(getattr(k, 'key', k)) for k in path)
          for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def test_qkv_bias_false_has_no_projection_bias_and_equals_zero_biases():
  x = jax.random.normal(jax.random.key(1), (2, 5, 8))
  mask = jnp.array([[True] * 5, [True] * 3 + [False] * 2])
  block = lambda bias: EncoderBlock(num_heads=2, qkv_dim=8, mlp_dim=16, attention={'kind': 'softmax'},
                                    dropout_rate=0.0, qkv_bias=bias)
  without = block(False).init(jax.random.key(0), x, mask)
  with_bias = block(True).init(jax.random.key(0), x, mask)
  att = lambda v: sorted(p for p in _leaf_paths(v['params']) if p.startswith('attention/'))
  assert att(without) == ['attention/key/kernel', 'attention/out/kernel', 'attention/query/kernel',
                          'attention/value/kernel']
  assert att(with_bias) == sorted(att(without) + ['attention/key/bias', 'attention/out/bias',
                                                  'attention/query/bias', 'attention/value/bias'])
  # Same kernels, zero biases: the same block output.
  zeroed = jax.tree_util.tree_map_with_path(
      lambda path, a: jnp.zeros_like(a) if 'attention' in str(path) and 'bias' in str(path[-1]) else a,
      with_bias)
  for name in ('query', 'key', 'value', 'out'):
    zeroed['params']['attention'][name]['kernel'] = without['params']['attention'][name]['kernel']
  for k in without['params']:
    if k != 'attention':
      zeroed['params'][k] = without['params'][k]
  np.testing.assert_allclose(block(True).apply(zeroed, x, mask), block(False).apply(without, x, mask),
                             rtol=1e-6, atol=1e-6)


def test_presets_build_the_model_they_name():
  info = common.TaskInfo(num_classes=2, vocab_size=257, max_length=16, dual=True)
  lra = trainer.build_model(retrieval.get_config('lra'), info)
  sky = trainer.build_model(retrieval.get_config('skyformer'), info)
  assert lra.retrieval_head == 'lra' and not lra.encoder['qkv_bias']
  assert sky.retrieval_head == 'nli' and sky.encoder['qkv_bias']
  single = trainer.build_model(listops.get_config('lra'), common.TaskInfo(10, 20, 16))
  assert not single.encoder['qkv_bias']
