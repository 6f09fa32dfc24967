"""LRA Pathfinder loader on release-format PNGs + text metadata: tokens, skips, seeded split, errors."""
from __future__ import annotations

import functools
import logging
import os
import re

import ml_collections
import numpy as np
import pytest
from PIL import Image

from configs import pathfinder as pathfinder_config
from lra_tasks import common
from lra_tasks import fixtures
from lra_tasks import pathfinder
from tests.lra_tasks import helpers

N_IMAGES = 12  # 10 decodable + 1 empty + 1 corrupt


tiny_data = functools.partial(helpers.tiny_data, pathfinder_config)


@pytest.fixture(name='written')
def fixture_written(tmp_path):
  return fixtures.write_pathfinder_fixture(str(tmp_path), 32, 'hard', N_IMAGES, seed=0)


def test_splits_are_the_valid_images_plus_one(tmp_path, written, caplog):
  data = tiny_data(tmp_path)
  pathfinder._cached_examples.cache_clear()
  with caplog.at_level(logging.WARNING, logger='lra_tasks.pathfinder'):
    arrays = {s: pathfinder.build_arrays(data, s) for s in common.SPLITS}
  assert 'skipped 2 empty or unreadable' in caplog.text
  assert [len(arrays[s]['targets']) for s in common.SPLITS] == [8, 1, 1]
  expected = {img.tobytes(): label for img, label in zip(written.images, written.labels)}
  seen = []
  for split in common.SPLITS:
    inputs, targets = arrays[split]['inputs'], arrays[split]['targets']
    assert inputs.shape[1] == 32 * 32 and inputs.dtype == np.int32 and targets.dtype == np.int32
    assert inputs.min() >= 1 and inputs.max() <= 256
    for row, label in zip(inputs, targets):
      key = (row - 1).astype(np.uint8).tobytes()  # tokens are pixel + 1, raster order
      assert expected[key] == label
      seen.append(key)
  assert sorted(seen) == sorted(expected)  # disjoint and complete: every valid image exactly once
  info = pathfinder.TASK.info(data)
  assert info == common.TaskInfo(num_classes=2, vocab_size=257, max_length=1024)
  src = pathfinder.TASK.source(data, 'train')
  np.testing.assert_array_equal(src[3]['inputs'], arrays['train']['inputs'][3])


def test_split_is_seeded_and_deterministic(tmp_path, written):
  del written
  a = pathfinder.build_arrays(tiny_data(tmp_path), 'train')['inputs']
  b = pathfinder.build_arrays(tiny_data(tmp_path), 'train')['inputs']
  c = pathfinder.build_arrays(tiny_data(tmp_path, split_seed=5), 'train')['inputs']
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


def test_second_process_sees_identical_token_ids(tmp_path, written):
  del written
  data = tiny_data(tmp_path)
  here = helpers.split_digests(pathfinder.build_arrays, data, common.SPLITS)
  script = f"""
import ml_collections
from lra_tasks import common, pathfinder
data = ml_collections.ConfigDict({{'data_dir': {str(tmp_path)!r}, 'resolution': 32,
                                   'difficulty': 'hard', 'max_length': 0, 'split_seed': 0}})
print(json.dumps(split_digests(pathfinder.build_arrays, data, common.SPLITS)))
"""
  assert helpers.split_digests_in_subprocess(script, hash_seed=11) == here


def test_difficulty_and_resolution_pick_the_folder(tmp_path):
  data = tiny_data(tmp_path, difficulty='easy', resolution=64)
  (line,) = pathfinder.TASK.check(data)
  assert os.path.join(str(tmp_path), 'pathfinder64', 'curv_baseline', 'metadata') in line
  assert 'pathfinder64/curv_baseline' in line and 'lra_release.gz' in line
  assert 'python scripts/prepare_data.py --task pathfinder' in line
  with pytest.raises(common.DataError, match='data missing'):
    pathfinder.TASK.source(data, 'train')
  with pytest.raises(common.DataError, match='easy, intermediate, hard'):
    pathfinder.TASK.check(tiny_data(tmp_path, difficulty='medium'))
  with pytest.raises(common.DataError, match='32, 64, 128, 256'):
    pathfinder.TASK.info(tiny_data(tmp_path, resolution=48))
  with pytest.raises(common.DataError, match='4096'):
    pathfinder.TASK.info(ml_collections.ConfigDict(
        {'data_dir': str(tmp_path), 'resolution': 64, 'difficulty': 'hard', 'max_length': 1024}))
  fixtures.write_pathfinder_fixture(str(tmp_path), 32, 'intermediate', 5, seed=2)
  assert pathfinder.TASK.check(tiny_data(tmp_path, difficulty='intermediate')) == []
  assert pathfinder.TASK.check(tiny_data(tmp_path, difficulty='hard'))


def test_release_left_nested_is_reported_as_misplaced(tmp_path):
  fixtures.write_pathfinder_fixture(str(tmp_path / 'lra_release' / 'lra_release'), 32, 'hard', 4, 0)
  (line,) = pathfinder.TASK.check(tiny_data(tmp_path))
  nested = os.path.join(str(tmp_path), 'lra_release', 'lra_release', 'pathfinder32')
  assert f'move {nested} to {os.path.join(str(tmp_path), "pathfinder32")}' in line


def test_metadata_files_sort_numerically(tmp_path):
  meta = tmp_path / 'metadata'
  meta.mkdir()
  for stem in ('10', '2', '1'):
    (meta / f'{stem}.npy').write_text('')
  assert [os.path.basename(p) for p in pathfinder.metadata_files(str(tmp_path))] == [
      '1.npy', '2.npy', '10.npy']


def test_broken_files_raise_with_path_and_line(tmp_path, written):
  data = tiny_data(tmp_path)
  meta = os.path.join(written.directory, 'metadata', '0.npy')
  good = open(meta).read()
  with open(meta, 'w') as f:
    f.write(good + 'imgs/0 sample_0.png 9\n')
  line = good.count('\n') + 1
  with pytest.raises(common.DataError, match=re.escape(f'{meta}:{line}: expected at least 4')):
    pathfinder.build_arrays(data, 'train')
  with open(meta, 'w') as f:
    f.write(good + 'imgs/0 sample_0.png 9 2\n')
  with pytest.raises(common.DataError, match=re.escape(f'{meta}:{line}: label')):
    pathfinder.build_arrays(data, 'train')
  with open(meta, 'w') as f:
    f.write(good + 'imgs/0 sample_99.png 99 1\n')
  with pytest.raises(common.DataError, match=r'sample_99\.png is missing'):
    pathfinder.build_arrays(data, 'train')
  with open(meta, 'w') as f:
    f.write(good)
  Image.fromarray(np.zeros((16, 16), np.uint8)).save(
      os.path.join(written.directory, 'imgs', '0', 'sample_0.png'))
  with pytest.raises(common.DataError, match='16x16, expected 32x32'):
    pathfinder.build_arrays(data, 'train')
