"""Loader caches: identical batches to the raw files, rebuilt (never read stale) when anything changes."""
from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from configs import pathfinder as pathfinder_config
from configs import retrieval as retrieval_config
from configs import text as text_config
from kernelformer.training import input_pipeline
from lra_tasks import cache
from lra_tasks import common
from lra_tasks import fixtures
from lra_tasks import pathfinder
from lra_tasks import retrieval
from lra_tasks import text
from tests.lra_tasks import helpers


def assert_same_batches(raw, cached, batch_size=4, steps=5):
  """Training batches (same seed, several epochs) and evaluation batches are equal, dtypes included."""
  assert len(raw) == len(cached)
  raw_train = input_pipeline.TrainBatches(raw, batch_size, seed=3)
  cached_train = input_pipeline.TrainBatches(cached, batch_size, seed=3)
  for step in range(steps):
    a, b = raw_train.batch(step), cached_train.batch(step)
    assert a.keys() == b.keys()
    for name in a:
      assert a[name].dtype == b[name].dtype == np.int32
      np.testing.assert_array_equal(a[name], b[name])
  for a, b in zip(input_pipeline.eval_batches(raw, batch_size),
                  input_pipeline.eval_batches(cached, batch_size), strict=True):
    for name in a:
      assert a[name].dtype == b[name].dtype
      np.testing.assert_array_equal(a[name], b[name])


def assert_same_arrays(a, b):
  assert a.keys() == b.keys()
  for name in a:
    assert a[name].dtype == b[name].dtype == np.int32
    np.testing.assert_array_equal(a[name], b[name])


def test_pathfinder_cache_gives_identical_batches(tmp_path):
  fixtures.write_pathfinder_fixture(str(tmp_path), 32, 'hard', 26, seed=4)
  data = helpers.tiny_data(pathfinder_config, tmp_path)
  pathfinder._cached_examples.cache_clear()
  raw = {s: pathfinder.TASK.source(data, s) for s in common.SPLITS}
  raw_arrays = {s: pathfinder.build_arrays(data, s) for s in common.SPLITS}
  assert all(isinstance(src, common.ArraySource) for src in raw.values())
  assert pathfinder.cached_examples(data) is None
  where = pathfinder.build_cache(data)
  stored = pathfinder.cached_examples(data)
  # Decoded once: uint8 pixels (not tokens) and int32 labels, memory-mapped from the cache directory.
  assert isinstance(stored['pixels'], np.memmap) and stored['pixels'].dtype == np.uint8
  assert stored['pixels'].shape == (24, 32 * 32) and os.path.dirname(stored['pixels'].filename) == where
  for split in common.SPLITS:
    cached = pathfinder.TASK.source(data, split)
    assert isinstance(cached, common.IndexedSource)
    assert_same_batches(raw[split], cached, batch_size=4, steps=3)
    assert_same_arrays(raw_arrays[split], pathfinder.build_arrays(data, split))
  # Another split seed needs no rebuild: the split is applied to the cached examples.
  reseeded = helpers.tiny_data(pathfinder_config, tmp_path, split_seed=9)
  pathfinder._cached_examples.cache_clear()
  expected = pathfinder.load_examples(pathfinder.difficulty_dir(data), 32)[0]
  idx = common.split_indices(24, pathfinder.SPLIT_FRACTIONS, 9)[0]
  np.testing.assert_array_equal(pathfinder.build_arrays(reseeded, 'train')['inputs'], expected[idx])


def test_pathfinder_changed_image_is_never_read_stale(tmp_path):
  written = fixtures.write_pathfinder_fixture(str(tmp_path), 32, 'hard', 10, seed=5)
  data = helpers.tiny_data(pathfinder_config, tmp_path)
  old = pathfinder.build_cache(data)
  image = os.path.join(written.directory, 'imgs', '0', 'sample_0.png')
  Image.fromarray(np.full((32, 32), 200, np.uint8)).save(image)
  os.utime(image, ns=(1, 1))   # even with an older time: the size and time differ from the key's
  assert pathfinder.cached_examples(data) is None   # the old cache no longer matches: raw files are read
  pathfinder._cached_examples.cache_clear()
  tokens, _, _ = pathfinder.load_examples(written.directory, 32)
  assert (tokens == 201).all(axis=1).sum() == 1
  new = pathfinder.build_cache(data)
  assert new != old and not os.path.exists(old)   # rebuilt under a new key; the stale one removed
  np.testing.assert_array_equal(pathfinder.cached_examples(data)['pixels'].astype(np.int32) + 1,
                                tokens)


def test_retrieval_cache_gives_identical_batches(tmp_path):
  fixtures.write_retrieval_fixture(str(tmp_path), n_per_split=7, seed=2)
  data = helpers.tiny_data(retrieval_config, tmp_path)
  raw = {s: retrieval.TASK.source(data, s) for s in common.SPLITS}
  raw_arrays = {s: retrieval.build_arrays(data, s) for s in common.SPLITS}
  for split in common.SPLITS:
    retrieval.build_cache(data, split)
  for split in common.SPLITS:
    stored = retrieval.cached_arrays(data, split)
    assert stored['inputs1'].dtype == np.uint16 and isinstance(stored['inputs2'], np.memmap)
    cached = retrieval.TASK.source(data, split)
    assert isinstance(cached, common.IndexedSource)
    assert_same_batches(raw[split], cached, batch_size=2, steps=5)
    assert_same_arrays(raw_arrays[split], retrieval.build_arrays(data, split))


def test_retrieval_changed_option_or_file_rebuilds(tmp_path):
  fixtures.write_retrieval_fixture(str(tmp_path), n_per_split=4, seed=0)
  data = helpers.tiny_data(retrieval_config, tmp_path, max_length=48)
  at48 = retrieval.build_cache(data, 'test')
  shorter = helpers.tiny_data(retrieval_config, tmp_path, max_length=20)
  assert retrieval.cached_arrays(shorter, 'test') is None   # another option: no cache yet
  at20 = retrieval.build_cache(shorter, 'test')
  assert at20 != at48 and os.path.isdir(at48)   # both settings keep their own cache
  assert retrieval.cached_arrays(shorter, 'test')['inputs1'].shape[1] == 20
  # A rewritten file (other rows): the caches are stale, the loader reads the file until rebuilt.
  fixtures.write_retrieval_fixture(str(tmp_path), n_per_split=5, seed=1)
  assert retrieval.cached_arrays(data, 'test') is None
  fresh = retrieval.read_tsv(retrieval.split_path(data, 'test'), 48)
  assert_same_arrays(fresh, retrieval.build_arrays(data, 'test'))
  rebuilt = retrieval.build_cache(data, 'test')
  assert rebuilt != at48 and not os.path.exists(at48)
  assert_same_arrays(fresh, retrieval.build_arrays(data, 'test'))
  assert len(retrieval.TASK.source(data, 'test')) == 5


def test_damaged_cache_is_not_used(tmp_path):
  fixtures.write_retrieval_fixture(str(tmp_path), n_per_split=3, seed=0)
  data = helpers.tiny_data(retrieval_config, tmp_path)
  where = retrieval.build_cache(data, 'val')
  with open(os.path.join(where, 'inputs2.bin'), 'r+b') as f:
    f.truncate(10)
  assert retrieval.cached_arrays(data, 'val') is None
  assert isinstance(retrieval.TASK.source(data, 'val'), common.ArraySource)
  assert cache.open_arrays(where) is None


def fake_prepared_imdb(root):
  """The on-disk layout of a prepared imdb_reviews (so check() passes); records come from mock_data."""
  version = os.path.join(root, 'imdb_reviews', 'plain_text', '1.0.0')
  os.makedirs(version)
  with open(os.path.join(version, 'dataset_info.json'), 'w') as f:
    f.write('{}')
  for split in ('train', 'test'):
    with open(os.path.join(version, f'imdb_reviews-{split}.array_record-00000-of-00001'), 'wb') as f:
      f.write(split.encode())
  return version


def test_text_cache_gives_identical_batches_on_mock_data(tmp_path):
  fake_prepared_imdb(str(tmp_path))
  data = helpers.tiny_data(text_config, tmp_path, tfds_check=True)
  with tfds.testing.mock_data(num_examples=20):
    common._TFDS_CACHE.clear()
    raw = {s: text.TASK.source(data, s) for s in common.SPLITS}
    raw_arrays = {s: text.build_arrays(data, s) for s in common.SPLITS}
    assert text.cached_split(data, 'train') is None
    for split in ('train', 'test'):
      text.build_cache(data, split)
  # Reading the cache needs no TFDS at all (outside mock_data nothing could be read from TFDS here).
  assert text.cached_split(data, 'train')['inputs'].dtype == np.uint16
  for split in common.SPLITS:
    cached = text.TASK.source(data, split)
    assert isinstance(cached, common.IndexedSource)
    assert_same_batches(raw[split], cached, batch_size=2, steps=4)
    assert_same_arrays(raw_arrays[split], text.build_arrays(data, split))
  assert text.cached_split(helpers.tiny_data(text_config, tmp_path, tfds_check=True, max_length=32),
                           'train') is None


def test_indexed_source_matches_array_source():
  rng = np.random.default_rng(0)
  pixels = rng.integers(0, 256, size=(9, 6)).astype(np.uint8)
  labels = rng.integers(0, 2, size=9).astype(np.int32)
  idx = np.array([1, 4, 8])
  lazy = common.IndexedSource(idx, {'inputs': 1}, inputs=pixels, targets=labels)
  eager = common.ArraySource(inputs=pixels[idx].astype(np.int32) + 1, targets=labels[idx])
  assert len(lazy) == 3
  for i in range(3):
    a, b = lazy[i], eager[i]
    assert type(a['targets']) is type(b['targets']) is np.int32
    np.testing.assert_array_equal(a['inputs'], b['inputs'])
    assert a['inputs'].dtype == np.int32 and a['targets'] == b['targets']
  with pytest.raises(ValueError, match='out of range'):
    common.IndexedSource(np.array([9]), inputs=pixels, targets=labels)
