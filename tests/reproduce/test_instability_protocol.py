"""Skyformer's protocol as options of ``reproduce instability``, each at a tiny size: torch AMP
(``--precision skyformer-amp``), Kernelized Attention's dropout on its kernel matrix, the padding to
2048 (``--set data.max_length``), the two controls (``--vary``), programs compiled once, the spread."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import registry
from kernelformer.attention.gaussian import GaussianAttention, gaussian_scores
from kernelformer.layers import attention_options
from kernelformer.reproduce import instability as ins
from tests.reproduce.test_instability import LISTOPS, MODEL, listops_config


def _f(c, kind, keys, batch, params=None):
  pr = ins.programs(c, kind)
  state = pr['init'](keys)
  p = state.pop('params') if params is None else params
  return p, np.asarray(pr['embed'](p, state, batch, jnp.int32(0), keys))


def test_amp_rounds_the_linears_in_float16_and_keeps_f_in_float32(tmp_path):
  c32 = listops_config(tmp_path)
  c16 = listops_config(tmp_path, ins.PRECISIONS['skyformer-amp'])
  keys, batches = ins.seed_inputs(c32, 0, 1)
  params, f32 = _f(c32, 'gaussian', keys, batches[0])
  _, f16 = _f(c16, 'gaussian', keys, batches[0], params)
  real = ins.token_mask(batches[0], 'mean', f32.shape[1])
  err = np.abs(f16 - f32)[real]
  # float16's rounding (spacing 2^-10 relative) moves f, by a float16-sized amount ...
  assert err.max() > 1e-4 and err.max() < 5e-2, err.max()
  # ... while f itself is the float32 final LayerNorm, not a float16 value.
  assert f16.dtype == np.float32 and np.any(f16 != f16.astype(np.float16).astype(np.float32))
  # The train step under the trainer's loss scale 2^16 gives finite updates on the float32 master
  # weights (the scale unchanged: the step was not skipped).
  pr = ins.programs(c16, 'gaussian')
  state = pr['init'](keys)
  p = state.pop('params')
  out = pr['train_step'](p, pr['tx'].init(p), state, batches[0], jnp.int32(1), keys)
  assert float(out[1].scale) == 2.0 ** 16 and all(bool(jnp.all(jnp.isfinite(u))) for u in
                                                   jax.tree.leaves(out[3]))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(out[0]))


def test_gaussian_dropout_reaches_the_kernel_matrix_and_the_preset_sets_it():
  kq, kk, kd = jax.random.split(jax.random.key(0), 3)
  q, k = jax.random.normal(kq, (1, 6, 1, 4)), jax.random.normal(kk, (1, 6, 1, 4))
  v = jnp.eye(6)[None, :, None, :]          # one-hot values: the output is C itself
  c = np.asarray(gaussian_scores(q, k))[0, 0]
  mod = GaussianAttention(attention_dropout=0.5)
  kept = np.asarray(mod.apply({}, q, k, v, deterministic=True))[0, :, 0]
  np.testing.assert_allclose(kept, c, rtol=1e-6)
  out = np.asarray(mod.apply({}, q, k, v, deterministic=False, rngs={'dropout': kd}))[0, :, 0]
  dropped = out == 0
  assert 5 < dropped.sum() < 31                                   # entries of C, not rows or columns
  np.testing.assert_allclose(out[~dropped], 2 * c[~dropped], rtol=1e-6)
  # Skyformer's src/config.py attention_dropout 0.1 reaches gaussian; its Skyformer has no dropout.
  opts = attention_options(ins.task_config('listops').model.attention.to_dict())
  assert registry.build({**opts, 'kind': 'gaussian'}).attention_dropout == 0.1
  assert not hasattr(registry.build({**opts, 'kind': 'skyformer'}), 'attention_dropout')


def test_padding_to_a_longer_length_only_appends_padding(tmp_path):
  short = ins.seed_batches(listops_config(tmp_path), 0, 1)[0]['inputs']
  long = ins.seed_batches(listops_config(tmp_path, [('data.max_length', 48)]), 0, 1)[0]['inputs']
  assert long.shape[1] == 48
  np.testing.assert_array_equal(long[:, :32], short)
  assert not long[:, 32:].any()


@pytest.mark.parametrize('vary', ins.VARY)
def test_each_control_fixes_what_it_says(tmp_path, vary):
  c = listops_config(tmp_path)
  (k1, b1), (k2, b2) = ins.seed_inputs(c, 1, 2, vary), ins.seed_inputs(c, 2, 2, vary)
  same = lambda a, b: bool(np.all(jax.random.key_data(a) == jax.random.key_data(b)))
  same_batches = all(np.array_equal(x['inputs'], y['inputs']) for x, y in zip(b1, b2))
  assert same_batches == (vary == 'init')
  assert same(k1['init'], k2['init']) == (vary == 'batches')
  assert same(k1['dropout'], k2['dropout']) == same(k1['features'], k2['features']) == (vary != 'all')
  p1, _ = _f(c, 'softmax', k1, b1[0])
  p2, _ = _f(c, 'softmax', k2, b2[0])
  assert jax.tree.all(jax.tree.map(np.array_equal, p1, p2)) == (vary == 'batches')


def test_programs_compile_once_for_all_seeds(tmp_path, monkeypatch):
  built = []
  make = ins.programs
  monkeypatch.setattr(ins, 'programs', lambda c, kind: built.append(make(c, kind)) or built[-1])
  res = ins.run('listops', [0, 1], kinds=('gaussian',), steps=2, log=lambda m: None,
                overrides=[*LISTOPS, *MODEL, ('data.data_dir', str(tmp_path / 'data'))])
  assert len(built) == 2 and res['seeds'] == [0, 1]
  for pr in built:
    assert pr['train_step']._cache_size() == 1 and pr['f_and_jvp']._cache_size() == 1
  assert all(e['seconds'] > 0 for e in res['per_seed'])


def test_spread_and_the_reuse_key():
  s = ins.spread([0.5, 1.0, 2.0, 1.0])
  assert s['median'] == 1.0 and s['geomean'] == pytest.approx(1.0) and s['below'] == 0.25
  lo, hi = s['geomean_ci95']
  half = 3.182446 * np.std(np.log([0.5, 1, 2, 1]), ddof=1) / 2      # t_{0.975, 3}
  assert lo == pytest.approx(np.exp(-half)) and hi == pytest.approx(np.exp(half))
  settings = {k: 0 for k in ins.SETTINGS}
  env = {'code': {'git_commit': 'a' * 40, 'git_dirty': False}}
  for key in ('precision', 'vary'):
    _, why = ins.reusable({**settings, key: 1, 'environment': env}, settings, env)
    assert f'its {key} differs' in why
