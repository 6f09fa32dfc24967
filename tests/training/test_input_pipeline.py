"""kernelformer/training/input_pipeline.py: epochs, shuffling, seeds, resuming, evaluation batches.

The source is a list whose example ``i`` carries ``i`` itself, so a batch says exactly which examples it
holds and in what order.
"""
from __future__ import annotations

import numpy as np
import pytest

from kernelformer.training import input_pipeline

N = 24   # examples; B below divides it, so an epoch is exactly N // B steps


def _source(n=N):
  return [{'inputs': np.array([i + 1, 0], np.int32), 'targets': np.int32(i)} for i in range(n)]


def _stream(batches):
  return np.concatenate([b['targets'] for b in batches])


def _steps(seed, start, stop, batch=4, n=N):
  tb = input_pipeline.TrainBatches(_source(n), batch, seed)
  return [tb.batch(s) for s in range(start, stop)]


def test_batches_have_the_global_batch_shape():
  for b in _steps(0, 0, 3, batch=4):
    assert b['inputs'].shape == (4, 2) and b['targets'].shape == (4,)
    np.testing.assert_array_equal(b['inputs'][:, 0], b['targets'] + 1)   # rows are whole examples


def test_every_example_exactly_once_per_epoch_and_a_new_order_each_epoch():
  epochs = _stream(_steps(0, 0, 3 * N // 4)).reshape(3, N)
  for e in epochs:
    np.testing.assert_array_equal(np.sort(e), np.arange(N))
  assert not np.array_equal(epochs[0], np.arange(N)), 'not shuffled'
  assert not np.array_equal(epochs[0], epochs[1]), 'same order in epochs 0 and 1'
  assert not np.array_equal(epochs[1], epochs[2]), 'same order in epochs 1 and 2'


def test_epochs_that_straddle_batches():
  """N = 10, B = 4: the k-th N examples of the stream are still a permutation, batch boundaries aside."""
  stream = _stream(_steps(5, 0, 10, batch=4, n=10))   # 40 examples = 4 epochs
  for e in stream.reshape(4, 10):
    np.testing.assert_array_equal(np.sort(e), np.arange(10))


def test_same_seed_same_order_other_seed_other_order():
  a, b, c = (_stream(_steps(seed, 0, 12)) for seed in (3, 3, 4))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


def test_seeds_do_not_share_epochs():
  """Seed s's epoch e must not be seed s+1's epoch e-1 (a seed sweep would see the same data orders)."""
  per_epoch = N // 4
  for seed in (0, 1, 7):
    a = _stream(_steps(seed, per_epoch, 2 * per_epoch))       # epoch 1 of seed
    b = _stream(_steps(seed + 1, 0, per_epoch))               # epoch 0 of seed + 1
    assert not np.array_equal(a, b), seed


def test_resumed_iterator_continues_the_uninterrupted_sequence():
  tb = input_pipeline.TrainBatches(_source(), 4, seed=11)
  whole = list(tb.iterate(0, 9))
  again = input_pipeline.TrainBatches(_source(), 4, seed=11)   # a new process after a restart
  resumed = list(tb.iterate(0, 4)) + list(again.iterate(4, 9))
  assert len(whole) == len(resumed) == 9
  for s, (w, r) in enumerate(zip(whole, resumed)):
    for k in w:
      np.testing.assert_array_equal(w[k], r[k], err_msg=f'step {s} {k}')
    np.testing.assert_array_equal(w['targets'], tb.batch(s)['targets'])


def test_empty_training_split_is_a_clear_error():
  with pytest.raises(ValueError, match='empty'):
    input_pipeline.TrainBatches([], 4, seed=0)


@pytest.mark.parametrize('n,batch', [(10, 4), (12, 4), (3, 8)])
def test_eval_batches_cover_every_example_once_in_order(n, batch):
  batches = list(input_pipeline.eval_batches(_source(n), batch))
  assert len(batches) == -(-n // batch)
  for b in batches:   # fixed shapes, so one compiled eval step serves every batch
    assert b['inputs'].shape == (batch, 2) and b['weights'].shape == (batch,)
    assert set(np.unique(b['weights'])) <= {0.0, 1.0}
  weights = np.concatenate([b['weights'] for b in batches])
  targets = np.concatenate([b['targets'] for b in batches])
  np.testing.assert_array_equal(targets[weights == 1], np.arange(n))
  np.testing.assert_array_equal(weights, np.arange(len(weights)) < n)   # padding only at the end
  last = batches[-1]['weights']
  assert last.sum() == n - (len(batches) - 1) * batch


def test_eval_batches_max_batches_caps_the_count():
  batches = list(input_pipeline.eval_batches(_source(10), 4, max_batches=2))
  assert len(batches) == 2
  np.testing.assert_array_equal(_stream(batches), np.arange(8))
