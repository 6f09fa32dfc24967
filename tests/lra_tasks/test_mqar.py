"""MQAR (Zoology's generator), legacy MQAR and selective copy (lra_tasks/mqar.py): deterministic examples
with the structure each task defines, targets only at query positions, the power-law gap law, and a
trainer run whose accuracy counts only the queries."""
from __future__ import annotations

import ml_collections
import numpy as np
import pytest

import lra_tasks
from lra_tasks import mqar


def dense_targets(example: dict[str, np.ndarray]) -> np.ndarray:
  """``targets int32[L]`` (0 off the queries) of an example in either format."""
  if 'inputs_query_positions' not in example:
    return np.asarray(example['targets'])
  out = np.zeros(np.shape(example['inputs']), np.int32)
  out[np.asarray(example['inputs_query_positions'])] = example['targets']
  return out


def _data(**kw):
  d = dict(task='mqar_legacy', vocab_size=20, num_pairs=4, max_length=24, seed=3, num_train=50, num_val=8,
           num_test=8, data_dir='unused')
  d.update(kw)
  return ml_collections.ConfigDict(d)


def test_legacy_mqar_structure_and_determinism():
  data = _data()
  task = lra_tasks.get('mqar_legacy')
  info = task.info(data)
  assert info.language_model and info.vocab_size == 20 and info.max_length == 24
  src = task.source(data, 'train')
  assert len(src) == 50
  for i in range(20):
    ex = src[i]
    seq, tgt = ex['inputs'], ex['targets']
    np.testing.assert_array_equal(seq, task.source(data, 'train')[i]['inputs'])  # f(seed, split, i)
    keys, values = seq[0:8:2], seq[1:8:2]
    assert len(set(keys.tolist())) == 4
    assert ((2 <= keys) & (keys < 11)).all() and ((11 <= values) & (values < 20)).all()
    kv = dict(zip(keys.tolist(), values.tolist()))
    q = np.nonzero(tgt)[0]
    assert len(q) == 4 and (q >= 8).all()
    # each query is a key of the prefix; its target is that key's value, which also follows it
    for p in q:
      assert tgt[p] == kv[int(seq[p])] == seq[p + 1]
    assert sorted(seq[q].tolist()) == sorted(keys.tolist())
    rest = np.ones(24, bool)
    rest[:8] = False
    rest[q] = rest[q + 1] = False
    assert (seq[rest] == mqar.FILLER).all()
  assert not np.array_equal(src[0]['inputs'], task.source(data, 'val')[0]['inputs'])
  assert not np.array_equal(src[0]['inputs'], task.source(_data(seed=4), 'train')[0]['inputs'])


def test_selective_copy_structure():
  data = _data(task='selective_copy', num_pairs=3, max_length=16)
  task = lra_tasks.get('selective_copy')
  ex = task.source(data, 'test')[5]
  seq, tgt = ex['inputs'], ex['targets']
  ctx = 16 - 3 - 1
  assert seq[ctx] == mqar.SEPARATOR
  data_tokens = seq[:ctx][seq[:ctx] != mqar.FILLER]
  np.testing.assert_array_equal(seq[ctx + 1:], data_tokens)
  np.testing.assert_array_equal(tgt[ctx:15], data_tokens)
  assert (tgt[:ctx] == 0).all() and tgt[15] == 0


@pytest.mark.parametrize('kw', [dict(vocab_size=8, num_pairs=4), dict(max_length=12)])
@pytest.mark.parametrize('task', ['mqar', 'mqar_legacy'])
def test_impossible_settings_one_line(kw, task):
  with pytest.raises(lra_tasks.DataError) as e:
    lra_tasks.get(task).info(_data(**kw))
  assert '\n' not in str(e.value) and task in str(e.value)


@pytest.mark.parametrize('task', ['mqar', 'mqar_legacy'])
@pytest.mark.parametrize('kw,blamed,not_blamed', [
    (dict(num_pairs=0), 'num_pairs=0 must be >= 1', 'vocab_size'),
    (dict(num_pairs=20, max_length=16, vocab_size=20), 'max_length=16', 'vocab_size'),
    (dict(vocab_size=8, num_pairs=4, max_length=64), 'vocab_size=8', 'max_length'),
])
def test_impossible_settings_name_the_field_at_fault(task, kw, blamed, not_blamed):
  """num_pairs=0 is not a vocabulary problem; too many pairs for the length names the length first."""
  with pytest.raises(lra_tasks.DataError) as e:
    lra_tasks.get(task).info(_data(**kw))
  assert blamed in str(e.value) and not_blamed not in str(e.value), str(e.value)


def test_trainer_counts_only_query_positions(tmp_path):
  from configs import mqar as mqar_config
  from kernelformer.training import trainer
  c = mqar_config.get_config('tiny')
  with c.unlocked():
    c.progress = False
  results = trainer.train_and_evaluate(c, str(tmp_path / 'run'))
  # tiny: 32 test sequences x 2 pairs = 64 query positions (not 32 x 16 tokens).
  assert results['test_examples'] == 64
  assert 0.0 <= results['test_accuracy'] <= 1.0
  assert results['attention'] == 'softmax'


def _recall_oracle(seq, tgt):
  """What perfect recall predicts at each query: the token right after the key's first occurrence,
  which must lie before the query. None where the key has not appeared earlier (unsolvable)."""
  preds = {}
  for p in np.nonzero(tgt)[0]:
    earlier = np.nonzero(seq[:p] == seq[p])[0]
    preds[int(p)] = int(seq[earlier[0] + 1]) if len(earlier) and earlier[0] + 1 < p else None
  return preds


@pytest.mark.parametrize('preset', ['legacy_quick', 'cpu', 'tiny'])
def test_preset_task_is_solvable_by_recall(preset):
  """In the presets' data every query's key and its value occur earlier in the sequence, the answer is
  the value, keys and values come from disjoint halves of the vocabulary, and so a perfect look-up
  scores 100% while guessing among the context's values cannot."""
  from configs import mqar as mqar_config
  data = mqar_config.get_config(preset).data
  task = lra_tasks.get(data.task)
  v, n = int(data.vocab_size), int(data.num_pairs)
  lo = 2 if data.task == 'mqar_legacy' else 1
  num_keys = (v - 2) // 2 if data.task == 'mqar_legacy' else v // 2 - 1
  for split in ('train', 'test'):
    src = task.source(data, split)
    for i in range(min(50, len(src))):
      ex = src[i]
      seq, tgt = ex['inputs'], dense_targets(ex)
      assert len(seq) == int(data.max_length)
      q = np.nonzero(tgt)[0]
      assert len(q) == n
      assert ((lo <= seq[q]) & (seq[q] < lo + num_keys)).all()         # queries are keys
      assert ((lo + num_keys <= tgt[q]) & (tgt[q] < v)).all()          # answers are values
      preds = _recall_oracle(seq, tgt)
      assert all(preds[int(p)] == tgt[p] for p in q), (split, i, preds, tgt[q])
  # Not answerable from the query token alone: the same key gets different values across examples.
  src = task.source(data, 'train')
  answers = {}
  for i in range(min(200, len(src))):
    ex = src[i]
    tgt = dense_targets(ex)
    for p in np.nonzero(tgt)[0]:
      answers.setdefault(int(ex['inputs'][p]), set()).add(int(tgt[p]))
  assert max(len(s) for s in answers.values()) > 1


# Zoology's MQAR (the default ``mqar``): zoology/data/multiquery_ar.py at d88d6f5.

def _zdata(**kw):
  d = dict(task='mqar', vocab_size=64, num_pairs=4, max_length=32, seed=3, num_train=400, num_val=8,
           num_test=8, data_dir='unused')
  d.update(kw)
  return ml_collections.ConfigDict(d)


def test_zoology_mqar_structure():
  """Keys from [1, V/2), distinct values from [V/2, V), pairs first, each key queried once at an even
  offset after them, its value the target there, and nothing revealed after a query: no value token
  anywhere after the pairs (the fillers are 0)."""
  data = _zdata()
  task = lra_tasks.get('mqar')
  info = task.info(data)
  assert info.pad_id is None and info.vocab_size == 64
  src = task.source(data, 'train')
  n, v = 4, 64
  for i in range(200):
    ex = src[i]
    seq, tgt, qp = ex['inputs'], ex['targets'], ex['inputs_query_positions']
    np.testing.assert_array_equal(seq, task.source(data, 'train')[i]['inputs'])   # f(seed, split, i)
    keys, values = seq[0:2 * n:2], seq[1:2 * n:2]
    assert ((1 <= keys) & (keys < v // 2)).all() and ((v // 2 <= values) & (values < v)).all()
    assert len(set(keys.tolist())) == n and len(set(values.tolist())) == n      # distinct values
    assert tgt.shape == qp.shape == (n,) and (np.diff(qp) > 0).all()
    assert (qp >= 2 * n).all() and ((qp - 2 * n) % 2 == 0).all() and (qp < 32).all()
    kv = dict(zip(keys.tolist(), values.tolist()))
    assert [kv[int(k)] for k in seq[qp]] == tgt.tolist()                         # target = the value
    assert sorted(seq[qp].tolist()) == sorted(keys.tolist())                     # each key once
    for p, val in zip(qp, tgt):
      assert val not in seq[p:]                                                  # nothing revealed
    rest = np.ones(32, bool)
    rest[:2 * n] = False
    rest[qp] = False
    assert (seq[rest] == 0).all()
    dense = dense_targets(ex)
    assert set(np.nonzero(dense)[0].tolist()) == set(qp.tolist())               # labels only there
  assert not np.array_equal(src[0]['inputs'], task.source(data, 'val')[0]['inputs'])


def test_zoology_mqar_dense_targets_and_random_fillers():
  dense = lra_tasks.get('mqar').source(_zdata(query_targets=False), 'train')[7]
  compact = lra_tasks.get('mqar').source(_zdata(), 'train')[7]
  assert set(dense) == {'inputs', 'targets'} and dense['targets'].shape == (32,)
  np.testing.assert_array_equal(dense['targets'], dense_targets(compact))
  np.testing.assert_array_equal(dense['inputs'], compact['inputs'])
  noisy = lra_tasks.get('mqar').source(_zdata(random_non_queries=True), 'train')[7]
  keep = compact['inputs'] != 0
  np.testing.assert_array_equal(noisy['inputs'][keep], compact['inputs'][keep])   # same draws first
  assert (noisy['inputs'][~keep] != 0).mean() > 0.8                              # fillers replaced


def test_zoology_gap_law_is_the_power_law():
  """The first key's query gap follows Zoology's p(g) ∝ a (g+1)^(a-1), a = 0.01 (chi-square, fixed
  seed), and is far from uniform; with a = 1 the same test accepts the uniform law."""
  from scipy import stats
  n, length, num = 4, 64, 3000
  space = (length - 2 * n) // 2
  for a, other in ((0.01, np.full(space, 1.0 / space)), (1.0, mqar.gap_pmf(space, 0.01))):
    gaps = []
    for i in range(num):
      seq = mqar.zoology_mqar_example(11, 'train', i, vocab_size=128, num_pairs=n, length=length,
                                      power_a=a)['inputs']
      p = 2 * n + np.nonzero(seq[2 * n:] == seq[0])[0][0]
      gaps.append((p - 2 * n) // 2)
    counts = np.bincount(gaps, minlength=space)
    pmf = mqar.gap_pmf(space, a)
    assert stats.chisquare(counts, num * pmf).pvalue > 1e-3
    assert stats.chisquare(counts, num * other).pvalue < 1e-6
  np.testing.assert_allclose(mqar.gap_pmf(4, 0.01), np.arange(1, 5) ** -0.99 / np.sum(np.arange(1, 5) ** -0.99))


def test_zoology_fig2_sweep_plans_the_panel(tmp_path):
  """24 runs on Zoology's task: 3 kernels x d_model {64, 128} x lr logspace(-4, -2, 4); the linear
  kernels in Zoology's conv layout (short_conv 3, no positions), softmax with learned positions."""
  from kernelformer.reproduce import sweeps
  runs = sweeps.plan(sweeps.load_sweep('zoology_fig2'), str(tmp_path))
  assert not [r.error for r in runs if r.error] and len(runs) == 24
  assert {r.task for r in runs} == {'mqar'}
  lrs = {r.point.get('optim.learning_rate') for r in runs}
  np.testing.assert_allclose(sorted(lrs), np.logspace(-4, -2, 4))
  assert {(r.kind, r.point.get('model.emb_dim')) for r in runs} == {
      (k, d) for k in ('softmax', 'linear-elu', 'posrf-orf') for d in (64, 128)}
  for r in runs:
    conv = r.kind != 'softmax'
    assert r.point.get('model.short_conv') == (3 if conv else None)
    assert r.point.get('model.pos_encoding') == ('none' if conv else None)


def test_zoology_fig2_full_sweep_plans_the_panel_in_run_order(tmp_path):
  """32 runs at the ``zoology`` preset, learning rates descending outermost, then kind, then d_model;
  ``taylor`` with Based's 8-dim feature map, ``posrf-orf`` with M = d_model. The CPU-scale panel is
  the same points for its three kernels on the ``cpu`` preset."""
  from kernelformer.reproduce import sweeps
  full = sweeps.load_sweep('zoology_fig2_full')
  runs = sweeps.plan(full, str(tmp_path))
  assert not [r.error for r in runs if r.error] and len(runs) == 32
  assert {r.point.preset for r in runs} == {'zoology'}
  order = [(r.point.get('optim.learning_rate'), r.kind, r.point.get('model.emb_dim')) for r in runs]
  kinds = ('softmax', 'linear-elu', 'posrf-orf', 'taylor')
  assert order == [(lr, k, d) for lr in sorted(np.logspace(-4, -2, 4).tolist(), reverse=True)
                   for k in kinds for d in (64, 128)]
  for r in runs:
    d = r.point.get('model.emb_dim')
    assert r.point.get('model.qkv_dim') == d
    assert r.point.get('model.attention.map_dim') == (8 if r.kind == 'taylor' else None)
    assert r.point.get('model.attention.num_features') == (d if r.kind == 'posrf-orf' else None)
  cpu = sweeps.load_sweep('zoology_fig2')
  assert [p.overrides for p in cpu.points] == [p.overrides for p in full.points
                                               if p.get(sweeps.KIND_KEY) != 'taylor']
  assert {p.preset for p in cpu.points} == {'cpu'}


def test_resuming_a_pre_zoology_mqar_run_is_a_config_change():
  """A run recorded before MQAR followed Zoology's generator (data.task='mqar' meant today's mqar_legacy; no query_targets field)
  differs from today's mqar config, so its workdir is not silently continued on the new task."""
  from configs import mqar as mqar_config
  from kernelformer.training import fingerprint
  new = fingerprint.config_fields(mqar_config.get_config('cpu'))
  old = {k: v for k, v in new.items()
         if k not in ('data.query_targets', 'data.power_a', 'data.random_non_queries',
                      'model.short_conv', 'model.state_mixer')}
  assert 'data.query_targets: None -> True' in fingerprint.differences(old, new)
  legacy = fingerprint.config_fields(mqar_config.get_config('legacy_quick'))
  assert fingerprint.differences({k: v for k, v in legacy.items()
                                  if k not in ('model.short_conv', 'model.state_mixer')}, legacy) == []


# The batched generators (what the sources use) against the per-example ones (the reference laws).

def _two_sample_pvalue(a, b):
  """Chi-square test that two samples of small non-negative integers have the same law."""
  from scipy import stats
  a, b = np.asarray(a).ravel(), np.asarray(b).ravel()
  size = int(max(a.max(), b.max())) + 1
  table = np.stack([np.bincount(a, minlength=size), np.bincount(b, minlength=size)])
  table = table[:, table.sum(0) > 0]
  return stats.chi2_contingency(table).pvalue


def _zoology_stats(ex, n):
  seq, qp = ex['inputs'], ex['inputs_query_positions']
  keys, values = seq[0:2 * n:2], seq[1:2 * n:2]
  gaps = [(int(np.nonzero(seq[2 * n:] == k)[0][0])) // 2 for k in keys]   # gap of the i-th pair's key
  return {'key0': keys[0], 'key_last': keys[-1], 'value0': values[0], 'value_last': values[-1],
          'gap0': gaps[0], 'gap1': gaps[1], 'gap_last': gaps[-1], 'first_query': (qp[0] - 2 * n) // 2,
          'last_query': (qp[-1] - 2 * n) // 2}


@pytest.mark.parametrize('power_a', [0.01, 0.5])
def test_batched_zoology_mqar_has_the_per_example_law(power_a):
  """Keys, values and the gaps of the first, second and last pair (successive sampling: the first
  pair's key is likelier queried early), and the first and last query slots: each statistic's
  histogram over 3000 batched examples against 3000 of ``zoology_mqar_example`` (chi-square
  homogeneity, fixed seeds); a uniform-gap generator is rejected by the same test."""
  n, v, length, num = 4, 32, 64, 3000
  kw = dict(vocab_size=v, num_pairs=n, length=length, power_a=power_a)
  batch = mqar.zoology_mqar_batch(5, 'train', np.arange(num), **kw)
  batched = [_zoology_stats({k: x[i] for k, x in batch.items()}, n) for i in range(num)]
  single = [_zoology_stats(mqar.zoology_mqar_example(6, 'train', i, **kw), n) for i in range(num)]
  for name in batched[0]:
    p = _two_sample_pvalue([s[name] for s in batched], [s[name] for s in single])
    assert p > 1e-3, (name, p)
  if power_a < 0.1:
    uniform = mqar.zoology_mqar_batch(5, 'train', np.arange(num), **{**kw, 'power_a': 1.0})
    gaps = [_zoology_stats({k: x[i] for k, x in uniform.items()}, n)['gap0'] for i in range(num)]
    assert _two_sample_pvalue(gaps, [s['gap0'] for s in single]) < 1e-6


def test_batched_legacy_mqar_and_selective_copy_have_the_per_example_laws():
  num = 3000
  kw = dict(vocab_size=12, num_pairs=4, length=24)     # 5 keys for 4 pairs: the permutation path
  lb = mqar.mqar_legacy_batch(5, 'train', np.arange(num), **kw)
  ls = [mqar.mqar_legacy_example(6, 'train', i, **kw) for i in range(num)]
  def legacy(seq, tgt):
    q = np.nonzero(tgt)[0]
    return {'key0': seq[0], 'value0': seq[1], 'q0': (q[0] - 8) // 2, 'q_last': (q[-1] - 8) // 2,
            'asked_first': int(np.nonzero(seq[0:8:2] == seq[q[0]])[0][0])}
  a = [legacy(s, t) for s, t in zip(lb['inputs'], lb['targets'])]
  b = [legacy(e['inputs'], e['targets']) for e in ls]
  for name in a[0]:
    assert _two_sample_pvalue([x[name] for x in a], [x[name] for x in b]) > 1e-3, name
  kw = dict(vocab_size=8, num_tokens=3, length=16)
  sb = mqar.selective_copy_batch(5, 'train', np.arange(num), **kw)['inputs']
  ss = np.stack([mqar.selective_copy_example(6, 'train', i, **kw)['inputs'] for i in range(num)])
  def copy_stats(seq):
    where = np.nonzero(seq[:12] != mqar.FILLER)[0]
    return {'first': where[0], 'last': where[-1], 'token0': seq[where[0]], 'token_last': seq[where[-1]]}
  a, b = [copy_stats(s) for s in sb], [copy_stats(s) for s in ss]
  for name in a[0]:
    assert _two_sample_pvalue([x[name] for x in a], [x[name] for x in b]) > 1e-3, name


@pytest.mark.parametrize('task', ['mqar', 'mqar_legacy', 'selective_copy'])
def test_a_batch_is_its_examples(task):
  """``read_batch`` of any indices, in any order, equals the examples ``src[i]``: an example is a
  function of (seed, split, i) alone, not of the batch it is read in."""
  data = _zdata(task=task) if task == 'mqar' else _data(task=task, num_pairs=3, max_length=16)
  src = lra_tasks.get(task).source(data, 'train')
  idx = np.array([7, 3, 3, 0, len(src) - 1])
  batch = src.read_batch(idx)
  for row, i in enumerate(idx):
    for k, v in src[int(i)].items():
      assert batch[k].dtype == v.dtype == np.int32
      np.testing.assert_array_equal(batch[k][row], v)
  with pytest.raises(IndexError):
    src.read_batch(np.array([len(src)]))
