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
from kernelformer import run_config
from kernelformer.encoder import Classifier
from kernelformer.layers import EncoderBlock
from kernelformer.training import steps as steps_lib
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
  lra = steps_lib.build_model(run_config.of(retrieval.get_config('lra')), info)
  sky = steps_lib.build_model(run_config.of(retrieval.get_config('skyformer')), info)
  assert lra.retrieval_head == 'lra' and not lra.encoder['qkv_bias']
  assert sky.retrieval_head == 'nli' and sky.encoder['qkv_bias']
  single = steps_lib.build_model(run_config.of(listops.get_config('lra')), common.TaskInfo(10, 20, 16))
  assert not single.encoder['qkv_bias']


def _single(init: str, **kw) -> Classifier:
  encoder = dict(vocab_size=300, emb_dim=64, num_layers=1, num_heads=2, qkv_dim=64, mlp_dim=128,
                 max_length=L, dropout_rate=0.0, pooling='mean', attention={'kind': 'softmax'},
                 param_init=init, **kw)
  return Classifier(num_classes=10, encoder=encoder, mlp_dim=128)


def _params(init: str, seed: int = 0) -> dict:
  params = _single(init).init(jax.random.key(seed), {'inputs': jnp.ones((1, L), jnp.int32)})['params']
  return dict(zip(_leaf_paths(params), jax.tree_util.tree_leaves(params)))


def test_skyformer_init_is_torch_linear_and_small_embeddings():
  """``param_init='skyformer'``: every Linear weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (torch's
  ``reset_parameters``), token embeddings N(0, 0.02); 'lra' keeps xavier / lecun_normal, zero biases,
  N(0, 1) embeddings. Checked on the support and the second moment of every leaf."""
  sky, lra = _params('skyformer'), _params('lra')
  fan_in = {'query': 64, 'key': 64, 'value': 64, 'out': 64, 'Dense_0': 64, 'Dense_1': 128,
            'head_hidden': 64, 'head_out': 128}
  checked = 0
  for path, x in sky.items():
    x = np.asarray(x, np.float64)
    layer = path.split('/')[-2]
    if path.endswith(('kernel', 'bias')) and layer in fan_in:
      bound = fan_in[layer] ** -0.5
      assert np.abs(x).max() <= bound, path
      if x.size >= 64:   # U(-b, b): second moment b^2 / 3, the largest |x| close to b
        assert abs(np.mean(x ** 2) / (bound ** 2 / 3) - 1) < 0.2 and np.abs(x).max() > 0.9 * bound, path
      if path.endswith('bias'):
        assert np.all(np.asarray(lra[path]) == 0), path
      checked += 1
  assert checked == 2 * len(fan_in)
  emb_sky, emb_lra = sky['encoder/embed/embedding'], lra['encoder/embed/embedding']
  assert abs(float(np.std(emb_sky)) / 0.02 - 1) < 0.05 and abs(float(np.std(emb_lra)) - 1) < 0.05
  # xavier_uniform on the q projection (fan_in 64, fan_out 64): bound sqrt(6 / 128) = 0.217, where
  # torch's is 1/8.
  q_max = float(np.abs(np.asarray(lra['encoder/block_0/attention/query/kernel'])).max())
  assert 0.9 * (6 / 128) ** 0.5 < q_max <= (6 / 128) ** 0.5
  with pytest.raises(ValueError, match='model.param_init'):
    _single('torch').init(jax.random.key(0), {'inputs': jnp.ones((1, L), jnp.int32)})


def test_layer_norm_eps_and_exact_gelu_reach_every_layer():
  """``layer_norm_eps`` and ``gelu_approximate=False`` change the function: the block output equals a
  float64 numpy block with torch's LayerNorm (eps 1e-5) and erf GELU, and differs from the tanh form."""
  from scipy.special import erf  # pylint: disable=g-import-not-at-top
  from kernelformer.layers import LayerDefaults
  x = jax.random.normal(jax.random.key(3), (2, 5, 8)) * 0.05   # a small residual stream: eps matters
  d = LayerDefaults('skyformer', 1e-5, False)
  block = EncoderBlock(num_heads=2, qkv_dim=8, mlp_dim=16, attention={'kind': 'softmax'},
                       dropout_rate=0.0, defaults=d)
  v = block.init(jax.random.key(0), x)
  got = np.asarray(block.apply(v, x), np.float64)
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), v['params'])
  xn = np.asarray(x, np.float64)

  def ln(h, q):
    mu, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    return (h - mu) / np.sqrt(var + 1e-5) * q['scale'] + q['bias']

  def dense(h, q, axes=1):
    return np.tensordot(h, q['kernel'], axes=axes) + q['bias']
  y = ln(xn, p['LayerNorm_0'])
  a = p['attention']
  q, k, vv = (dense(y, a[n]) for n in ('query', 'key', 'value'))
  s = np.einsum('blhd,bmhd->bhlm', q, k) / np.sqrt(4)
  w = np.exp(s - s.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  h = xn + dense(np.einsum('bhlm,bmhd->blhd', w, vv), a['out'], axes=2)
  z = dense(ln(h, p['LayerNorm_1']), p['MlpBlock_0']['Dense_0'])
  z = 0.5 * z * (1 + erf(z / np.sqrt(2)))
  want = h + dense(z, p['MlpBlock_0']['Dense_1'])
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
  tanh_block = EncoderBlock(num_heads=2, qkv_dim=8, mlp_dim=16, attention={'kind': 'softmax'},
                            dropout_rate=0.0, defaults=LayerDefaults('skyformer', 1e-6, True))
  assert np.abs(np.asarray(tanh_block.apply(v, x), np.float64) - want).max() > 1e-5


def test_skyformer_presets_build_the_torch_layers():
  info = common.TaskInfo(num_classes=10, vocab_size=20, max_length=16)
  sky = steps_lib.build_model(run_config.of(listops.get_config('skyformer')), info)
  assert (sky.encoder['param_init'], sky.encoder['layer_norm_eps'], sky.encoder['gelu_approximate']) == (
      'skyformer', 1e-5, False)


def test_a_run_recorded_before_the_options_resumes_only_under_their_old_values():
  """A workdir recorded before these options existed ran flax's layers: resuming it under the defaults
  is the same run; under Skyformer's layers (any one option) it is a difference the workdir refuses."""
  from kernelformer.training import fingerprint as fp  # pylint: disable=g-import-not-at-top
  new = fp.config_fields(listops.get_config('quick'))
  options = ('model.param_init', 'model.layer_norm_eps', 'model.gelu_approximate')
  old = {k: v for k, v in new.items() if k not in options}
  assert fp.differences(old, new) == []
  sky = fp.config_fields(listops.get_config('skyformer'))
  for name in options:
    changed = {**new, name: sky[name]}
    assert fp.differences(old, changed) == [f'{name}: {new[name]} -> {sky[name]}']
