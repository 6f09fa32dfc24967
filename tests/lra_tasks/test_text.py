"""LRA Text loader on TFDS mock records: byte tokens, padding, the seeded validation carve, data checks."""
from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from configs import text as text_config
from lra_tasks import common
from lra_tasks import text
from tests.lra_tasks import helpers

N = 20   # mock records per TFDS split


def tiny_data(tmp_path, **overrides):
  return helpers.tiny_data(text_config, tmp_path / 'data', **{'tfds_check': False, **overrides})


def mock_records(split):
  """The mock records as TFDS serves them, read independently of the loader."""
  ds = tfds.data_source('imdb_reviews', split=split, data_dir='/nonexistent', download=False)
  return [(ds[i]['text'], int(np.asarray(ds[i]['label']))) for i in range(len(ds))]


def test_splits_are_byte_tokens_of_the_records(tmp_path):
  data = tiny_data(tmp_path)
  with tfds.testing.mock_data(num_examples=N):
    train_records, test_records = mock_records('train'), mock_records('test')
    arrays = {s: text.build_arrays(data, s) for s in common.SPLITS}
    src = text.TASK.source(data, 'val')
  length = data.max_length
  train_idx, val_idx = text.split_indices(N, (0.75, 0.25), data.split_seed)
  assert len(train_idx) == 15 and len(val_idx) == 5
  assert not set(train_idx) & set(val_idx) and set(train_idx) | set(val_idx) == set(range(N))
  for split, records in (('train', [train_records[i] for i in train_idx]),
                         ('val', [train_records[i] for i in val_idx]),
                         ('test', test_records)):
    inputs, targets = arrays[split]['inputs'], arrays[split]['targets']
    assert inputs.shape == (len(records), length) and inputs.dtype == np.int32
    assert targets.dtype == np.int32
    np.testing.assert_array_equal(inputs, np.stack([helpers.naive_bytes(t, length) for t, _ in records]))
    np.testing.assert_array_equal(targets, [label for _, label in records])
    assert inputs.min() >= 0 and inputs.max() <= 256 and set(targets.tolist()) <= {0, 1}
    # Right padding: once a row reaches a 0 it stays 0.
    real = inputs != 0
    assert np.all(real[:, :-1] >= real[:, 1:])
  assert len(src) == 5
  np.testing.assert_array_equal(src[0]['inputs'], arrays['val']['inputs'][0])
  assert text.TASK.info(data) == common.TaskInfo(num_classes=2, vocab_size=257, max_length=length)


def test_truncation_and_seed(tmp_path):
  with tfds.testing.mock_data(num_examples=N):
    short = text.build_arrays(tiny_data(tmp_path, max_length=12), 'test')
    records = mock_records('test')
    a = text.build_arrays(tiny_data(tmp_path), 'val')
    b = text.build_arrays(tiny_data(tmp_path), 'val')
    other = text.build_arrays(tiny_data(tmp_path, split_seed=1), 'val')
  lengths = np.array([len(t.encode()) for t, _ in records])
  assert lengths.max() > 12 > lengths.min()  # the mock has reviews on both sides of the cut
  np.testing.assert_array_equal((short['inputs'] != 0).sum(1), np.minimum(lengths, 12))
  np.testing.assert_array_equal(a['inputs'], b['inputs'])
  assert not np.array_equal(a['inputs'], other['inputs'])


def test_second_process_sees_identical_token_ids(tmp_path):
  data = tiny_data(tmp_path)
  with tfds.testing.mock_data(num_examples=N):
    here = helpers.split_digests(text.build_arrays, data, common.SPLITS)
  script = f"""
import tensorflow_datasets as tfds
from configs import text as text_config
from lra_tasks import common, text
c = text_config.get_config('tiny')
c.data.data_dir = {str(tmp_path / 'data')!r}
c.data.tfds_check = False
with tfds.testing.mock_data(num_examples={N}):
  print(json.dumps(split_digests(text.build_arrays, c.data, common.SPLITS)))
"""
  assert helpers.split_digests_in_subprocess(script, hash_seed=123) == here


def test_missing_data_names_directory_and_command(tmp_path):
  data = tiny_data(tmp_path, tfds_check=True)
  (line,) = text.TASK.check(data)
  expected = os.path.join(str(tmp_path / 'data'), 'imdb_reviews', 'plain_text', '1.0.0')
  assert expected in line and 'python scripts/prepare_data.py --task text' in line
  with pytest.raises(common.DataError, match='imdb_reviews'):
    text.TASK.source(data, 'train')
  with pytest.raises(common.DataError, match='data missing'):
    common.require(text.TASK, data)
  # TFRecord shards (tfds.load's default) are not readable by data_source: say so.
  os.makedirs(expected)
  open(os.path.join(expected, 'imdb_reviews-train.tfrecord-00000-of-00001'), 'w').close()
  (line,) = text.TASK.check(data)
  assert 'TFRecord' in line and 'array_record' in line


def test_prepared_layout_is_found_in_tfds_data_dir(tmp_path):
  tfds_dir = tmp_path / 'tfds'
  data = tiny_data(tmp_path, tfds_check=True, tfds_data_dir=str(tfds_dir))
  version_dir = tfds_dir / 'imdb_reviews' / 'plain_text' / '1.0.0'
  version_dir.mkdir(parents=True)
  (version_dir / 'dataset_info.json').write_text('{}')
  (version_dir / 'imdb_reviews-train.array_record-00000-of-00001').write_bytes(b'')
  assert text.TASK.check(data)  # the test split is still missing
  (version_dir / 'imdb_reviews-test.array_record-00000-of-00001').write_bytes(b'')
  assert text.TASK.check(data) == []
  assert text.IMDB.prepared_dir(data) == str(version_dir)


def test_split_indices_cuts_like_lra():
  parts = text.split_indices(10, (0.8, 0.1, 0.1), seed=3)
  assert [len(p) for p in parts] == [8, 1, 1]
  assert sorted(np.concatenate(parts).tolist()) == list(range(10))
  with pytest.raises(ValueError):
    text.split_indices(10, (0.5, 0.4), seed=0)
