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
  assert any(r.kind == 'cosformer' for r in runs)            # registered: every map runs
  main, extra = fig3.MAIN, fig3.EXTRA
  assert set(main) | set(extra) == set(fig3.MAPS) and not set(main) & set(extra)
  low = lambda maps: [m for m in maps if m in fig3.LOW_LR_MAPS]   # pylint: disable=unnecessary-lambda-assignment
  later = [m for m in fig3.ORDER if m != 'taylor r=8']
  assert {r.task for r in runs} == {'mqar'}

  def key(r):
    o = dict(r.point.overrides)
    return (o['data.max_length'], o['data.num_pairs']), o['model.emb_dim']

  def label(r):
    return r.point.label.split(',')[0]

  def lr(r):
    return dict(r.point.overrides)['optim.learning_rate']
  # Run order: (64, 4) at d 64 (MAIN at 10^-1.5, then its low-lr maps at 10^-2), MAIN at d 32, the same
  # for EXTRA, then (128, 8) and (256, 16) at d 64 with every map but taylor r=8.
  expected = ([(((64, 4), 64), m, 10 ** -1.5) for m in main]
              + [(((64, 4), 64), m, 1e-2) for m in low(main)]
              + [(((64, 4), 32), m, fig3.BEST_LR.get(m, 10 ** -1.5)) for m in main]
              + [(((64, 4), 64), m, 10 ** -1.5) for m in extra]
              + [(((64, 4), 64), m, 1e-2) for m in low(extra)]
              + [(((64, 4), 32), m, fig3.BEST_LR.get(m, 10 ** -1.5)) for m in extra if m in later]
              + [(((128, 8), 64), m, fig3.BEST_LR.get(m, 10 ** -1.5)) for m in later]
              + [(((256, 16), 64), m, fig3.BEST_LR.get(m, 10 ** -1.5)) for m in later])
  assert [(key(r), label(r), lr(r)) for r in runs] == expected
  # By hand: 9 MAIN + 4 EXTRA maps at (64, 4) d 64, 9 + 3 at d 32, 12 at each longer setting.
  assert len(runs) == 9 + 4 + 9 + 3 + 12 + 12 + len(fig3.LOW_LR_MAPS)
  first = [r for r in runs if key(r) == ((64, 4), 64)]
  # Every map of Based's figure but AllPoly, Based's Performer as Zoology computes it.
  assert {'taylor', 'linear-elu', 'relu', 'identity', 'square', 'performer-zoology'} <= {
      r.kind for r in first}
  for r in runs:
    o = dict(r.point.overrides)
    assert o['model.qkv_dim'] == o['model.emb_dim']
    assert o['data.num_train'] == (100_000 if o['data.max_length'] == 64 else 20_000)
    if r.kind == 'posrf-orf':       # our FAVOR+ row: M = d_model
      assert o['model.attention.num_features'] == o['model.emb_dim']
      assert o['model.attention.redraw_every'] in (0, 100)
    if r.kind == 'performer-zoology':   # the kind fixes Zoology's 256 features: nothing overridden
      assert not [k for k in o if k.startswith('model.attention.') and k != sweeps.KIND_KEY]
  assert sorted(dict(r.point.overrides)['model.attention.map_dim'] for r in first
                if r.kind == 'taylor' and lr(r) == 10 ** -1.5) == [8, 16]
  # The preset: Based's layout (conv layer + mixer, no positions, no MLP), wd 0.1, the top lr,
  # random fillers (Based's configs keep MQARConfig's default random_non_queries=True).
  cfg = sweeps.point_config(runs[0].point, sweep.common)
  assert (cfg.model.short_conv, cfg.model.pos_encoding, cfg.model.state_mixer) == (3, 'none',
                                                                                  'identity')
  assert (cfg.num_train_steps, cfg.batch_size, cfg.model.num_layers, cfg.model.num_heads) == (
      600, 32, 2, 1)
  assert cfg.optim.weight_decay == 0.1 and cfg.data.vocab_size == 8192
  assert cfg.data.random_non_queries is True
  np.testing.assert_allclose(cfg.optim.learning_rate, 10 ** -1.5)
  # The Performer point builds Zoology's map: 256 features, drawn once, whatever the preset's M says.
  from kernelformer import registry
  perf = next(r for r in first if r.kind == 'performer-zoology')
  module = registry.build(sweeps.point_config(perf.point, sweep.common).model.attention)
  assert (module.num_features, module.redraw_every) == (256, 0)


def test_based_preset_fills_with_random_tokens_and_zoology_presets_with_zeros():
  """Based's data: every filler (and the slot after each query) a uniform id in [0, V), as Zoology's
  ``random_non_queries=True``; the figure-2 presets keep Zoology's zeros."""
  import lra_tasks
  from configs import mqar
  for preset, random in (('based', True), ('zoology', False), ('cpu', False)):
    cfg = mqar.get_config(preset)
    assert bool(cfg.data.random_non_queries) is random, preset
  cfg = mqar.get_config('based')
  ex = lra_tasks.get('mqar').source(cfg.data, 'train')[3]
  tokens = np.asarray(ex['inputs'])
  pairs = 2 * cfg.data.num_pairs
  rest = np.delete(tokens[pairs:], np.asarray(ex['inputs_query_positions']) - pairs)
  assert rest.size == cfg.data.max_length - 3 * cfg.data.num_pairs
  # ~60 fillers drawn from 8,192 ids: a zero-filled sequence (or a constant) would fail this.
  assert len(np.unique(rest)) > 0.9 * rest.size


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
    ('performer-zoology', 64, 64, {}, 192 + 65 * 64),     # Based counts d, although 256 are computed
    ('identity', 32, 64, {}, 96 + 33 * 32),
    ('square', 64, 64, {}, 192 + 65 * 64),
])
def test_state_size_hand_counts(kind, d, length, extra, expected):
  assert recall_plot.based_state_size(kind, d, d, length, **extra) == expected
  # Based's axis is in bytes: 4 per element (float32), Zoology's ``state_size * 4``.
  assert recall_plot.based_state_bytes(kind, d, d, length, **extra) == 4 * expected


def test_state_bytes_sit_on_the_x_values_of_based_figure():
  """Our state formula, in bytes, reproduces every x value of Based's plotted figure (d_model 64-512;
  Taylor at feature_dim 24, 1 head), so our points and the figure's share one axis."""
  for name, pts in recall_plot.BASED_FIG3.items():
    kind = recall_plot.BASED_KINDS.get(name, 'relu')      # AllPoly counts d, as ReLU
    extra = {'map_dim': 24} if kind == 'taylor' else {}
    assert [recall_plot.based_state_bytes(kind, d, d, 1024, **extra)
            for d in recall_plot.BASED_D_MODELS] == [x for x, _ in pts], name
  # The figure's own reading: ReLU / PosELU ~0.24 at d_model 64, Taylor 0.80 at 5x the state.
  assert recall_plot.BASED_FIG3['ReLU'][0] == (17408, 0.238)
  assert recall_plot.BASED_FIG3['Taylor'][0] == (85268, 0.803)


@pytest.mark.parametrize('kind,m', [('linear-elu', 0), ('relu', 0), ('hedgehog', 0), ('dpfp', 0),
                                    ('dpfp-nu2', 0), ('posrf-orf', 16), ('cosformer', 0)])
def test_counted_features_are_what_the_decoder_holds(kind, m):
  """E in the state-size formula is the feature dimension of the decoder's own recurrent state."""
  held, _ = recall_plot.state_features(kind, m or 1, 8, 1)
  assert recall_plot.based_expanded_size(kind, 8, num_features=m) == held


def test_zoology_performer_is_counted_as_based_counts_it():
  """Based's Performer computes 256 features but its state counts d (inherited ``expanded_size``):
  the decoder holds 256, the figure's axis counts d."""
  held, _ = recall_plot.state_features('performer-zoology', 64, 32, 1)
  assert held == 256
  assert recall_plot.based_expanded_size('performer-zoology', 32) == 32


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
          _run(tmp_path, 'g', 'linear-elu', 0.03, 0.05, length=128, pairs=8),
          _run(tmp_path, 'h', 'performer-zoology', 0.03, 0.01)]
  (tmp_path / 'sweep.json').write_text(json.dumps({'name': 'not_a_named_sweep', 'runs': runs}))
  out = tmp_path / 'out' / 'fig3'
  assert recall_plot.main([str(tmp_path), '--out', str(out), '--vs_state']) == 0
  md = (tmp_path / 'out' / 'fig3.md').read_text()
  four, eight = md.split('**Length 128')
  assert '| taylor r=4 | 64 | 4,668 | 21 | 60.0 [0.01] | 60.0 | 40.0 | 20 |' in four
  assert '| posrf-orf fixed | 64 | 17,408 | 64 | 20.0 [0.03] |' in four
  assert '| posrf-orf redraw/100 | 64 | 17,408 | 64 | 10.0 [0.03] |' in four
  assert '| softmax | 64 | 33,536 | KV cache | 90.0 [0.03] |' in four
  assert '| linear-elu | 64 | 17,408 | 64 | — |' in four
  # Based's Performer: Based's count (d), 256 features held.
  assert '| performer-zoology | 64 | 17,408 | 256 | 1.0 [0.03] |' in four
  assert 'Ranked: softmax (90.0 @ 33,536) > taylor r=4 (60.0 @ 4,668) > posrf-orf fixed' in four
  assert 'chance 25 %' in four and 'chance 12.5 %' in eight and '| linear-elu | 64 | 17,408 |' in eight
  assert 'Total wall time of the finished runs: 70 s' in eight
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
