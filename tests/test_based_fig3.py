"""Based figure 3 at CPU scale: configs/sweeps/based_fig3.py plans the intended grid, the state-size
formula (``recall_plot.based_state_size``) equals hand counts from Zoology's ``state_size`` code, and
``recall_plot --vs_state`` takes the best learning rate per (map, state size)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from kernelformer.reproduce import recall_plot


def test_sweep_plans_the_blocks(tmp_path):
  from configs.sweeps import based_fig3 as fig3
  from kernelformer.reproduce import sweeps
  sweep = sweeps.load_sweep('based_fig3')
  runs = sweeps.plan(sweep, str(tmp_path))
  assert not [r.error for r in runs if r.error]
  cos = any(r.kind == 'cosformer' for r in runs)
  low = [m for m in fig3.LOW_LR_MAPS if m != 'cosformer' or cos]
  # blocks of 9 maps (10 with cosformer), the low-lr maps, then 8 (9) maps at each of three points
  assert len(runs) == 9 + len(low) + 3 * 8 + 4 * cos
  assert {r.task for r in runs} == {'mqar'}

  def key(r):
    o = dict(r.point.overrides)
    return (o['data.max_length'], o['data.num_pairs']), o['model.emb_dim']

  def label(r):
    return r.point.label.split(',')[0]
  blocks = {}
  for r in runs:
    blocks.setdefault(key(r), []).append(r)
  assert {k: len(v) - cos * (2 if k == ((64, 4), 64) else 1) for k, v in blocks.items()} == {
      ((64, 4), 64): 9 + len(low) - ('cosformer' in low), ((64, 4), 32): 8, ((128, 8), 64): 8,
      ((256, 16), 64): 8}
  # Block order = run order: the (64, 4) d-64 panel first (10^-1.5, then 10^-2), the longest last.
  assert key(runs[0]) == ((64, 4), 64) and key(runs[-1]) == ((256, 16), 64)
  first = [r for r in runs if key(r) == ((64, 4), 64)]
  assert [dict(r.point.overrides)['optim.learning_rate'] for r in first] == (
      [10 ** -1.5] * (9 + cos) + [1e-2] * len(low))
  assert sorted(label(r) for r in first[9 + cos:]) == sorted(low)
  for r in runs:
    o = dict(r.point.overrides)
    assert o['model.qkv_dim'] == o['model.emb_dim']
    assert o['data.num_train'] == (100_000 if o['data.max_length'] == 64 else 20_000)
    if key(r) != ((64, 4), 64):     # later blocks: each map at its better learning rate
      assert o['optim.learning_rate'] == fig3.BEST_LR.get(label(r), 10 ** -1.5)
      assert label(r) != 'taylor r=8'
    if r.kind == 'posrf-orf':
      assert o['model.attention.num_features'] == o['model.emb_dim']
      assert o['model.attention.redraw_every'] in (0, 100)
  assert sorted(dict(r.point.overrides)['model.attention.map_dim'] for r in first[:9 + cos]
                if r.kind == 'taylor') == [8, 16]
  # The preset: Based's layout (conv layer + mixer, no positions, no MLP), wd 0.1, the top lr.
  cfg = sweeps.point_config(runs[0].point, sweep.common)
  assert (cfg.model.short_conv, cfg.model.pos_encoding, cfg.model.state_mixer) == (3, 'none',
                                                                                  'identity')
  assert (cfg.num_train_steps, cfg.batch_size, cfg.model.num_layers, cfg.model.num_heads) == (
      600, 32, 2, 1)
  assert cfg.optim.weight_decay == 0.1 and cfg.data.vocab_size == 8192
  np.testing.assert_allclose(cfg.optim.learning_rate, 10 ** -1.5)


@pytest.mark.parametrize('kind,d,length,extra,expected', [
    # 3 d (short conv) + (d_v + 1) E, by hand:
    ('taylor', 64, 64, {'map_dim': 16}, 3 * 64 + 65 * (1 + 16 + 16 * 17 // 2)),   # 10,137
    ('taylor', 32, 64, {'map_dim': 8}, 3 * 32 + 33 * (1 + 8 + 36)),               # 1,581
    ('linear-elu', 64, 256, {}, 192 + 65 * 64),
    ('relu', 32, 64, {}, 96 + 33 * 32),
    ('cosformer', 64, 64, {}, 192 + 65 * 128),
    ('hedgehog', 64, 64, {}, 192 + 65 * 128),
    ('dpfp', 32, 64, {}, 96 + 33 * 64),
    ('posrf-orf', 64, 128, {'num_features': 64}, 192 + 65 * 64),
    ('softmax', 64, 128, {}, 192 + 2 * 64 * 128),                                 # KV cache
])
def test_state_size_hand_counts(kind, d, length, extra, expected):
  assert recall_plot.based_state_size(kind, d, d, length, **extra) == expected


@pytest.mark.parametrize('kind,m', [('linear-elu', 0), ('relu', 0), ('hedgehog', 0), ('dpfp', 0),
                                    ('dpfp-nu2', 0), ('posrf-orf', 16), ('cosformer', 0)])
def test_counted_features_are_what_the_decoder_holds(kind, m):
  """E in the state-size formula is the feature dimension of the decoder's own recurrent state."""
  held, _ = recall_plot.state_features(kind, m or 1, 8, 1)
  assert recall_plot.based_expanded_size(kind, 8, num_features=m) == held


def test_taylor_counts_the_symmetric_products_once():
  held, _ = recall_plot.state_features('taylor', 1, 8, 1, 4)
  assert held == 1 + 4 + 16                                   # what the decoder keeps
  assert recall_plot.based_expanded_size('taylor', 8, map_dim=4) == 1 + 4 + 10   # Based's count


def _run(tmp, workdir, kind, lr, acc, *, d=64, length=64, pairs=4, att=None):
  att = dict(att or {})
  over = {'data.max_length': length, 'data.num_pairs': pairs, 'model.emb_dim': d,
          'model.qkv_dim': d, 'model.attention.kind': kind, 'optim.learning_rate': lr,
          **{f'model.attention.{k}': v for k, v in att.items()}}
  entry = {'workdir': workdir, 'kind': kind, 'task': 'mqar', 'seed': 0, 'preset': 'based',
           'overrides': over}
  if acc is not None:
    os.makedirs(tmp / workdir)
    cfg = {'seed': 0, 'data': {'task': 'mqar', 'num_pairs': pairs, 'max_length': length},
           'optim': {'learning_rate': lr},
           'model': {'num_heads': 1, 'qkv_dim': d, 'emb_dim': d,
                     'attention': {'kind': kind, 'num_features': 64, **att}}}
    (tmp / workdir / 'results.json').write_text(json.dumps(
        {'test_accuracy': acc, 'config': cfg, 'attention': kind, 'task': 'mqar', 'wall_time_s': 10.0}))
  return entry


def test_vs_state_table_csv_and_figure(tmp_path):
  runs = [_run(tmp_path, 'a', 'softmax', 0.03, 0.9),
          _run(tmp_path, 'b', 'taylor', 0.03, 0.4, att={'map_dim': 4}),
          _run(tmp_path, 'c', 'taylor', 0.01, 0.6, att={'map_dim': 4}),   # the better lr wins
          _run(tmp_path, 'd', 'posrf-orf', 0.03, 0.2, att={'num_features': 64, 'redraw_every': 0}),
          _run(tmp_path, 'e', 'posrf-orf', 0.03, 0.1, att={'num_features': 64, 'redraw_every': 100}),
          _run(tmp_path, 'f', 'linear-elu', 0.03, None),                   # planned, unfinished
          _run(tmp_path, 'g', 'linear-elu', 0.03, 0.05, length=128, pairs=8)]
  (tmp_path / 'sweep.json').write_text(json.dumps({'name': 'not_a_named_sweep', 'runs': runs}))
  out = tmp_path / 'out' / 'fig3'
  assert recall_plot.main([str(tmp_path), '--out', str(out), '--vs_state']) == 0
  md = (tmp_path / 'out' / 'fig3.md').read_text()
  four, eight = md.split('**Length 128')
  assert '| taylor r=4 | 64 | 1,167 | 21 | 60.0 [0.01] | 60.0 | 40.0 | 20 |' in four
  assert '| posrf-orf fixed | 64 | 4,352 | 64 | 20.0 [0.03] |' in four
  assert '| posrf-orf redraw/100 | 64 | 4,352 | 64 | 10.0 [0.03] |' in four
  assert '| softmax | 64 | 8,384 | KV cache | 90.0 [0.03] |' in four
  assert '| linear-elu | 64 | 4,352 | 64 | — |' in four
  assert 'Ranked: softmax (90.0 @ 8,384) > taylor r=4 (60.0 @ 1,167) > posrf-orf fixed' in four
  assert 'chance 25 %' in four and 'chance 12.5 %' in eight and '| linear-elu | 64 | 4,352 |' in eight
  assert 'Total wall time of the finished runs: 60 s' in eight
  csv_text = (tmp_path / 'out' / 'fig3.csv').read_text().splitlines()
  assert len(csv_text) == 1 + len(runs) and csv_text[0].startswith('map,kind,length')
  assert (tmp_path / 'out' / 'fig3.png').stat().st_size > 1000


def test_taylor_with_map_dim_decodes_as_the_full_forward():
  """The decode cache of ``taylor`` with Based's projection (map_dim r < head dim) holds 1 + r + r^2
  features per value column, and step-by-step logits equal the full causal forward."""
  import jax
  from kernelformer import decoder
  model = decoder.Decoder(vocab_size=7, emb_dim=16, num_layers=2, num_heads=2, qkv_dim=16, mlp_dim=16,
                          attention={'kind': 'taylor', 'map_dim': 3, 'chunk_size': 2}, max_length=5)
  tokens = jax.random.randint(jax.random.key(0), (2, 5), 1, 7)
  fkey = jax.random.key(2)
  params = model.init({'params': jax.random.key(1), 'features': fkey}, tokens)['params']
  full = model.apply({'params': params}, tokens, rngs={'features': fkey})
  steps = decoder.teacher_forced_logits(model, params, tokens, features_key=fkey)
  np.testing.assert_allclose(np.asarray(steps), np.asarray(full), rtol=2e-4, atol=2e-4)
  cache = decoder.init_cache(model, 1)
  shapes = [v.shape for p, v in jax.tree_util.tree_flatten_with_path(cache)[0]
            if str(getattr(p[-1], 'key', p[-1])) == 'state']
  assert shapes and all(s[2:] == (1 + 3 + 9, 8) for s in shapes)


def test_vs_state_drops_unfinished_runs_the_current_plan_no_longer_has(tmp_path):
  """A run an earlier definition planned (and that never finished) is not shown as missing."""
  runs = [_run(tmp_path, 'a', 'relu', 0.03, 0.5), _run(tmp_path, 'gone', 'relu', 0.01, None)]
  (tmp_path / 'sweep.json').write_text(json.dumps({'name': 'x', 'runs': runs}))
  assert [r['workdir'] for r in recall_plot.collect_state(str(tmp_path), {'a'})] == ['a']
  assert len(recall_plot.collect_state(str(tmp_path))) == 2
