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


class _Batched:
  """The same examples as ``_source`` behind ``read_batch`` (as ``lra_tasks.common.ArraySource``)."""

  def __init__(self, n=N):
    from lra_tasks import common
    self._src = common.ArraySource(inputs=np.stack([np.arange(n) + 1, np.zeros(n, int)], 1).astype(np.int32),
                                   targets=np.arange(n, dtype=np.int32))
    self.calls = 0

  def __len__(self):
    return len(self._src)

  def __getitem__(self, i):
    raise AssertionError('a batched source is read by read_batch, not per example')

  def read_batch(self, indices):
    self.calls += 1
    return self._src.read_batch(indices)


def test_batched_source_gives_the_per_example_batches():
  """A source with ``read_batch`` is read in one call per batch and gives exactly the batches that
  stacking its examples one by one gives (a plugin's list of dicts), for training and evaluation."""
  batched = _Batched(10)
  tb, ref = input_pipeline.TrainBatches(batched, 4, 7), input_pipeline.TrainBatches(_source(10), 4, 7)
  for s in range(8):
    a, b = tb.batch(s), ref.batch(s)
    assert a.keys() == b.keys()
    for k in a:
      assert a[k].dtype == b[k].dtype
      np.testing.assert_array_equal(a[k], b[k], err_msg=f'step {s} {k}')
  assert batched.calls == 8
  for a, b in zip(input_pipeline.eval_batches(batched, 4), input_pipeline.eval_batches(_source(10), 4),
                  strict=True):
    for k in b:
      np.testing.assert_array_equal(a[k], b[k])


def test_epoch_order_is_one_numpy_permutation_per_epoch():
  """The order is ``epoch_order`` exactly (what DATA_ORDER names): one ``default_rng([seed, epoch])``
  permutation per epoch, read in batch-sized runs of the stream."""
  stream = _stream(_steps(5, 0, 10, batch=4, n=10))
  want = np.concatenate([np.random.default_rng([5, e]).permutation(10) for e in range(4)])
  np.testing.assert_array_equal(stream, want)


def test_background_reading_raises_in_the_consumer_and_stops():
  class Broken:
    def __len__(self):
      return N

    def __getitem__(self, i):
      if i == _bad:
        raise KeyError('unreadable example')
      return _source()[i]
  tb = input_pipeline.TrainBatches(Broken(), 4, seed=0)
  _bad = int(tb.indices(2)[1])
  it = tb.iterate(0, 6)
  assert len([next(it), next(it)]) == 2
  with pytest.raises(KeyError, match='unreadable'):
    next(it)
  with pytest.raises(StopIteration):
    next(it)


def test_device_iterate_places_batches_sharded_ahead(monkeypatch):
  """Off the CPU-only case the batches arrive as jax arrays, batch-sharded over the mesh as the
  compiled step takes them, with the host batches' values."""
  import jax
  from kernelformer.training import sharding
  mesh = sharding.make_mesh(jax.devices()[:4])
  tb = input_pipeline.TrainBatches(_source(), 8, seed=2)
  monkeypatch.setattr(input_pipeline, 'stages_on_host', lambda mesh: False)
  placed = list(tb.device_iterate(0, 3, mesh))
  assert len(placed) == 3
  for s, b in enumerate(placed):
    for k, v in b.items():
      assert isinstance(v, jax.Array) and v.sharding.is_equivalent_to(sharding.batch_sharded(mesh), v.ndim)
      np.testing.assert_array_equal(np.asarray(v), tb.batch(s)[k])


def test_data_order_segments_record_a_resume_across_orders(caplog):
  order = input_pipeline.DATA_ORDER
  fresh = input_pipeline.data_order_segments(None, 0, resumed=False)
  assert fresh == [{'from_step': 0, 'data_order': order}]
  assert input_pipeline.data_order_segments(fresh, 40, resumed=True) == fresh   # same order: silent
  assert not caplog.records
  old = input_pipeline.data_order_segments(None, 40, resumed=True)   # a checkpoint before the field
  assert old == [{'from_step': 0, 'data_order': 1}, {'from_step': 40, 'data_order': order}]
  assert any('data order' in r.getMessage() for r in caplog.records)


def test_a_resume_across_data_orders_is_recorded_in_results(tmp_path, monkeypatch, caplog):
  """A run checkpointed under another data order (here: 1) and resumed under today's goes on, says so
  in one warning line, and results.json ``data_order`` lists both stretches; an uninterrupted run
  lists one."""
  import json
  from kernelformer.training import trainer
  from tests.training import helpers
  c = helpers.tiny_config(tmp_path / 'data', checkpoint_every=4)

  class Crash(Exception):
    pass

  def crash_at_6(step, state):
    if step == 6:
      raise Crash()

  monkeypatch.setattr(input_pipeline, 'DATA_ORDER', 1)
  with pytest.raises(Crash):
    trainer.train_and_evaluate(c, str(tmp_path / 'run'), hooks=[crash_at_6])
  monkeypatch.setattr(input_pipeline, 'DATA_ORDER', 2)
  with caplog.at_level('WARNING'):
    trainer.train_and_evaluate(c, str(tmp_path / 'run'))
  results = json.loads((tmp_path / 'run' / 'results.json').read_text())
  assert results['data_order'] == [{'from_step': 0, 'data_order': 1}, {'from_step': 4, 'data_order': 2}]
  assert any('resumed at step 4 under data order 2' in r.getMessage() for r in caplog.records)
