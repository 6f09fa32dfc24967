"""MQAR and selective copy (lra_tasks/mqar.py): deterministic examples with the structure the task
defines, targets only at query positions, and a trainer run whose accuracy counts only those."""
from __future__ import annotations

import ml_collections
import numpy as np
import pytest

import lra_tasks
from lra_tasks import mqar


def _data(**kw):
  d = dict(task='mqar', vocab_size=20, num_pairs=4, max_length=24, seed=3, num_train=50, num_val=8,
           num_test=8, data_dir='unused')
  d.update(kw)
  return ml_collections.ConfigDict(d)


def test_mqar_structure_and_determinism():
  data = _data()
  task = lra_tasks.get('mqar')
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
def test_impossible_settings_one_line(kw):
  with pytest.raises(lra_tasks.DataError) as e:
    lra_tasks.get('mqar').info(_data(**kw))
  assert '\n' not in str(e.value) and 'mqar' in str(e.value)


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


@pytest.mark.parametrize('preset', ['quick', 'tiny'])
def test_preset_task_is_solvable_by_recall(preset):
  """In the presets' data every query's key and its value occur earlier in the sequence, the answer is
  the value, keys and values come from disjoint halves of the vocabulary, and so a perfect look-up
  scores 100% while guessing among the context's values cannot."""
  from configs import mqar as mqar_config
  data = mqar_config.get_config(preset).data
  task = lra_tasks.get('mqar')
  v, n = int(data.vocab_size), int(data.num_pairs)
  num_keys = (v - 2) // 2
  for split in ('train', 'test'):
    src = task.source(data, split)
    for i in range(min(50, len(src))):
      ex = src[i]
      seq, tgt = ex['inputs'], ex['targets']
      assert len(seq) == int(data.max_length)
      q = np.nonzero(tgt)[0]
      assert len(q) == n
      assert ((2 <= seq[q]) & (seq[q] < 2 + num_keys)).all()           # queries are keys
      assert ((2 + num_keys <= tgt[q]) & (tgt[q] < v)).all()           # answers are values
      preds = _recall_oracle(seq, tgt)
      assert all(preds[int(p)] == tgt[p] for p in q), (split, i, preds, tgt[q])
  # Not answerable from the query token alone: the same key gets different values across examples.
  src = task.source(data, 'train')
  answers = {}
  for i in range(min(200, len(src))):
    ex = src[i]
    for p in np.nonzero(ex['targets'])[0]:
      answers.setdefault(int(ex['inputs'][p]), set()).add(int(ex['targets'][p]))
  assert max(len(s) for s in answers.values()) > 1
