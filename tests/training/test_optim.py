"""kernelformer/training/optim.py: every schedule's shape and peak, the weight-decay mask, one AdamW step.

Each test compares against a formula written out here, so a schedule that loses its warm-up, a decay
that reaches the wrong value, a mask that decays biases, or a chain that drops clipping fails.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import common
from kernelformer.encoder import Classifier
from kernelformer.training import optim as optim_lib

LR, WARMUP, TOTAL = 0.05, 100, 1000


def _optim(schedule='rsqrt', **overrides):
  o = common.base_config().optim
  o.learning_rate, o.schedule, o.warmup_steps = LR, schedule, WARMUP
  for k, v in overrides.items():
    o[k] = v
  return o


def _lr(schedule, steps, **overrides):
  s = optim_lib.make_schedule(_optim(schedule, **overrides), TOTAL)
  return np.array([float(s(t)) for t in steps])


def test_every_config_schedule_name_builds_and_unknown_names_fail():
  # configs/common.py documents the names in a comment; optim.SCHEDULES is the list the code accepts.
  comment = [line for line in open(common.__file__).read().splitlines() if 'c.optim.schedule =' in line]
  for name in optim_lib.SCHEDULES:
    assert f"'{name}'" in comment[0], name
    optim_lib.make_schedule(_optim(name), TOTAL)
  with pytest.raises(ValueError, match='rsqrt'):
    optim_lib.make_schedule(_optim('cosine_decay'), TOTAL)


@pytest.mark.parametrize('schedule', [s for s in optim_lib.SCHEDULES if not s.startswith('onecycle-')])
def test_warmup_is_linear_from_zero(schedule):
  """Every schedule but the one-cycle ones (lr / 25 at step 0, peak at warmup - 1: test_onecycle.py)
  starts at 0 and rises linearly over ``warmup_steps`` to its peak."""
  peak = LR / np.sqrt(WARMUP) if schedule == 'rsqrt' else LR
  steps = np.arange(0, WARMUP + 1, 10)
  np.testing.assert_allclose(_lr(schedule, steps), peak * steps / WARMUP, rtol=1e-5, atol=1e-9)


def test_rsqrt_peak_and_inverse_sqrt_decay():
  """LRA's ``lr * min(1, t/w) / sqrt(max(t, w))``: peak lr/sqrt(w) at t = w, then lr/sqrt(t)."""
  peak = LR / np.sqrt(WARMUP)
  lrs = _lr('rsqrt', np.arange(0, 4 * WARMUP + 1))
  assert np.argmax(lrs) == WARMUP
  np.testing.assert_allclose(lrs.max(), peak, rtol=1e-6)
  after = np.array([WARMUP, 2 * WARMUP, 4 * WARMUP, 9 * WARMUP, 10 * TOTAL])
  np.testing.assert_allclose(_lr('rsqrt', after), LR / np.sqrt(after), rtol=1e-5)
  np.testing.assert_allclose(_lr('rsqrt', [4 * WARMUP]), peak / 2, rtol=1e-5)


def test_cosine_decays_to_zero_at_the_last_step():
  t = np.arange(WARMUP, TOTAL + 1, 50)
  want = LR * 0.5 * (1 + np.cos(np.pi * (t - WARMUP) / (TOTAL - WARMUP)))
  np.testing.assert_allclose(_lr('cosine', t), want, rtol=1e-5, atol=1e-9)
  assert _lr('cosine', [WARMUP]).item() == pytest.approx(LR)
  assert _lr('cosine', [TOTAL]).item() == pytest.approx(0.0, abs=1e-9)


def test_linear_decays_to_zero_at_the_last_step():
  t = np.arange(WARMUP, TOTAL + 1, 50)
  np.testing.assert_allclose(_lr('linear', t), LR * (1 - (t - WARMUP) / (TOTAL - WARMUP)),
                             rtol=1e-5, atol=1e-9)
  assert _lr('linear', [TOTAL]).item() == pytest.approx(0.0, abs=1e-9)


def test_constant_holds_the_peak_after_warmup():
  np.testing.assert_allclose(_lr('constant', [WARMUP, 500, TOTAL, 5 * TOTAL]), LR, rtol=1e-6)


def _model_params():
  """A real Classifier's parameters: CLS token, learned positions, every layer kind the encoder has."""
  encoder = dict(vocab_size=11, emb_dim=8, num_layers=1, num_heads=2, qkv_dim=8, mlp_dim=16,
                 attention={'kind': 'softmax'}, max_length=6, pos_encoding='learned', pooling='cls',
                 dropout_rate=0.0)
  model = Classifier(num_classes=3, encoder=encoder, mlp_dim=8)
  inputs = {'inputs': jnp.ones((2, 6), jnp.int32)}
  params = model.init({'params': jax.random.key(0)}, inputs)['params']
  # Biases, LayerNorm offsets and the CLS token start at 0 (scales at 1), where decay is invisible:
  # give every parameter a random nonzero value.
  keys = iter(jax.random.split(jax.random.key(7), 100))
  return jax.tree.map(lambda p: p + jax.random.normal(next(keys), p.shape), params)


def _path(path):
  return '/'.join(str(getattr(k, 'key', k)) for k in path)


def _should_decay(path: str) -> bool:
  # The intent written in optim.py: weights decay; biases, LayerNorm scales and vectors (the CLS token is
  # one vector however it is stored) do not.
  leaf = path.split('/')[-1]
  return leaf in ('kernel', 'embedding', 'pos_embedding')


def test_weight_decay_mask_by_parameter_kind():
  """With zero gradients AdamW's update is -lr * wd * p exactly where the mask decays, 0 elsewhere."""
  params = _model_params()
  paths = {_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
  # The tree has every kind this test is about (q/k/v biases are 2-D, the CLS token is 3-D).
  for needed in ('attention/query/bias', 'attention/out/kernel', 'LayerNorm_0/scale', 'encoder/cls',
                 'embed/embedding', 'encoder/pos_embedding', 'final_norm/bias', 'head_out/bias'):
    assert any(needed in p for p in paths), needed
  wd = 0.1
  tx, schedule = optim_lib.make_optimizer(
      _optim('constant', warmup_steps=1, weight_decay=wd, learning_rate=1e-2), TOTAL)
  zeros = jax.tree.map(jnp.zeros_like, params)
  state = tx.init(params)
  _, state = tx.update(zeros, state, params)        # step 0: lr 0 (warm-up starts at 0)
  updates, _ = tx.update(zeros, state, params)      # step 1: lr = peak
  lr = float(schedule(1))
  assert lr == pytest.approx(1e-2)
  decayed, kept = [], []
  for (path, u), p in zip(jax.tree_util.tree_flatten_with_path(updates)[0], jax.tree.leaves(params)):
    name = _path(path)
    if _should_decay(name):
      np.testing.assert_allclose(u, -lr * wd * p, rtol=1e-5, atol=1e-12, err_msg=name)
      decayed.append(name)
    else:
      np.testing.assert_array_equal(u, 0.0, err_msg=f'{name} must not be decayed')
      kept.append(name)
  assert decayed and kept


def _adamw_reference(params, grads_seq, lrs, *, b1, b2, eps, wd, clip=None):
  """AdamW (Loshchilov & Hutter 2019, algorithm 2) in numpy, bias-corrected, decoupled decay."""
  params = jax.tree.map(np.asarray, params)
  m = jax.tree.map(np.zeros_like, params)
  v = jax.tree.map(np.zeros_like, params)
  for t, (g, lr) in enumerate(zip(grads_seq, lrs), start=1):
    g = jax.tree.map(np.asarray, g)
    if clip:
      norm = np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in jax.tree.leaves(g)))
      g = jax.tree.map(lambda x: x * min(1.0, clip / norm), g)
    m = jax.tree.map(lambda m_, g_: b1 * m_ + (1 - b1) * g_, m, g)
    v = jax.tree.map(lambda v_, g_: b2 * v_ + (1 - b2) * g_ ** 2, v, g)

    def step(p, m_, v_, path):
      mhat, vhat = m_ / (1 - b1 ** t), v_ / (1 - b2 ** t)
      decay = wd * p if _should_decay(_path(path)) else 0.0
      return p - lr * (mhat / (np.sqrt(vhat) + eps) + decay)
    params = jax.tree_util.tree_map_with_path(lambda path, p, m_, v_: step(p, m_, v_, path),
                                              params, m, v)
  return params


@pytest.mark.parametrize('clip', [0.0, 0.5])
def test_two_steps_match_hand_written_adamw(clip):
  params = _model_params()
  keys = iter(jax.random.split(jax.random.key(1), 100))
  grads_seq = [jax.tree.map(lambda p: jax.random.normal(next(keys), p.shape), params)
               for _ in range(3)]
  o = _optim('cosine', warmup_steps=2, learning_rate=3e-2, weight_decay=0.1, eps=1e-2, b1=0.8,
             b2=0.9, grad_clip_norm=clip)
  tx, schedule = optim_lib.make_optimizer(o, 10)
  state, p = tx.init(params), params
  for g in grads_seq:
    updates, state = tx.update(g, state, p)
    p = optax.apply_updates(p, updates)
  lrs = [float(schedule(t)) for t in range(3)]
  assert lrs[0] == 0 and lrs[1] > 0
  want = _adamw_reference(params, grads_seq, lrs, b1=0.8, b2=0.9, eps=1e-2, wd=0.1, clip=clip)
  for (path, got), exp in zip(jax.tree_util.tree_flatten_with_path(p)[0], jax.tree.leaves(want)):
    np.testing.assert_allclose(got, exp, rtol=2e-5, atol=1e-6, err_msg=_path(path))
  if clip:  # clipping must matter at these sizes, or the clipped case would prove nothing
    unclipped = _adamw_reference(params, grads_seq, lrs, b1=0.8, b2=0.9, eps=1e-2, wd=0.1)
    assert max(float(np.max(np.abs(x - y)))
               for x, y in zip(jax.tree.leaves(unclipped), jax.tree.leaves(want))) > 1e-4


# ------------------------------------------------------------------------------------------------------
# optim.decay_mask: which leaves AdamW decays, by parameter name, under 'matrices' and 'all'.


def _attention_params(kind):
  """A real random-feature attention's parameters (a learned sampler under ``sampler/``), nonzero."""
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  module = registry.build({'kind': kind, 'num_features': 4, 'num_mixture_components': 2})
  x = jnp.ones((1, 3, 2, 4))
  params = module.init({'params': jax.random.key(0), 'features': jax.random.key(1)}, x, x, x)['params']
  keys = iter(jax.random.split(jax.random.key(3), 100))
  return jax.tree.map(lambda p: p + jax.random.normal(next(keys), p.shape), params)


def _decayed_names(params, mode, wd=0.1):
  """The paths AdamW decays, found from its update with zero gradients (-lr * wd * p where decayed)."""
  tx, schedule = optim_lib.make_optimizer(
      _optim('constant', warmup_steps=1, weight_decay=wd, learning_rate=1e-2, decay_mask=mode), TOTAL)
  zeros = jax.tree.map(jnp.zeros_like, params)
  state = tx.init(params)
  _, state = tx.update(zeros, state, params)
  updates, _ = tx.update(zeros, state, params)
  lr = float(schedule(1))
  decayed = set()
  for (path, u), p in zip(jax.tree_util.tree_flatten_with_path(updates)[0], jax.tree.leaves(params)):
    if np.any(np.asarray(u) != 0):
      np.testing.assert_allclose(u, -lr * wd * p, rtol=1e-5, atol=1e-12, err_msg=_path(path))
      decayed.add(_path(path))
  return decayed


# Every learned sampler's parameters, by name (attention/learned.py).
SAMPLER_LEAVES = {
    'gmm-rks': {'sampler/means', 'sampler/factors'},
    'gmm-prf': {'sampler/means', 'sampler/factors'},
    'fastfood-prf': {'sampler/row_len', 'sampler/g', 'sampler/b'},
    'fastfood-rks': {'sampler/row_len', 'sampler/g', 'sampler/b'},
    # The learned feature maps of features/maps.py.
    'hedgehog': {'map_w'},
    't2r': {'map_w', 'map_b'},
    'rebased': {'map_gamma', 'map_beta'},
}


@pytest.mark.parametrize('kind', sorted(SAMPLER_LEAVES))
def test_learned_sampler_leaves_by_name_under_each_mask(kind):
  """'matrices': no GMM means/factors, no FastFood row_len/g/b; 'all' (the paper's AdamW): every one."""
  params = _attention_params(kind)
  names = {_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
  assert names == SAMPLER_LEAVES[kind]
  assert _decayed_names(params, 'matrices') == set()
  assert _decayed_names(params, 'all') == SAMPLER_LEAVES[kind]


def test_generative_sampler_is_decayed_only_under_all():
  params = _attention_params('generative-prf')
  names = {_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
  assert {'sampler/dense_0/kernel', 'sampler/dense_4/bias', 'sampler/norm_0/scale'} <= names
  assert _decayed_names(params, 'matrices') == set()
  assert _decayed_names(params, 'all') == names


def test_all_decays_every_model_leaf_and_matrices_only_weights():
  """'all' (LRA's flax optim.Adam): biases, LayerNorm and the CLS token too; 'matrices': by name."""
  params = _model_params()
  names = {_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
  assert _decayed_names(params, 'all') == names
  matrices = _decayed_names(params, 'matrices')
  assert matrices == {n for n in names if _should_decay(n)}
  assert 'encoder/cls' not in matrices and any(n.endswith('/bias') for n in names - matrices)


def test_missing_decay_mask_means_matrices_and_unknown_value_is_an_error():
  o = common.base_config().optim
  assert o.decay_mask == 'matrices'
  from kernelformer import run_config  # pylint: disable=g-import-not-at-top
  old = common.base_config().to_dict()
  del old['optim']['decay_mask']                                        # a config written before the field
  assert run_config.of(old).optim.decay_mask == 'matrices'
  with pytest.raises(ValueError, match='valid: matrices, all'):
    optim_lib.decay_mask({'w': jnp.ones((2, 2))}, 'biases')


def test_validate_refuses_an_unknown_decay_mask_in_one_line():
  from kernelformer.training import validate  # pylint: disable=g-import-not-at-top
  c = common.base_config()
  c.data.task = 'listops'
  c.optim.decay_mask = 'weights'
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_config(c)
  msg = str(e.value)
  assert '\n' not in msg and 'config.optim.decay_mask=' in msg and "'matrices', 'all'" in msg


def test_a_run_recorded_before_decay_mask_resumes_only_with_matrices():
  """Runs recorded before the field decayed by 'matrices': resuming them with 'all' is a config change."""
  from kernelformer.training import fingerprint  # pylint: disable=g-import-not-at-top
  c = common.base_config()
  new = fingerprint.config_fields(c)
  old = {k: v for k, v in new.items() if k != 'optim.decay_mask'}
  assert fingerprint.differences(old, new) == []
  c.optim.decay_mask = 'all'
  assert fingerprint.differences(old, fingerprint.config_fields(c)) == ['optim.decay_mask: matrices -> all']
