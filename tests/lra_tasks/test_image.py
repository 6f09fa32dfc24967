"""LRA Image loader: TensorFlow's grayscale formula, pixel tokens, the seeded 90/10 carve, data checks."""
from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from configs import image as image_config
from lra_tasks import common
from lra_tasks import image
from lra_tasks import text
from tests.lra_tasks import helpers

N = 20


def tiny_data(tmp_path, **overrides):
  return helpers.tiny_data(image_config, tmp_path / 'data', **{'tfds_check': False, **overrides})


def test_grayscale_is_tensorflows_not_pils():
  # Pure channels: trunc(w * 255.5). PIL's convert('L') rounds 0.587 * 255 = 149.7 to 150 for green.
  rgb = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255], [0, 0, 0]], np.uint8)
  np.testing.assert_array_equal(image.lra_grayscale(rgb), [76, 149, 29, 255, 0])
  # Against the formula in float64: equal wherever float32 rounding cannot move the truncation.
  pixels = np.random.default_rng(0).integers(0, 256, size=(64, 64, 3)).astype(np.uint8)
  exact = (pixels.astype(np.float64) / 255.0) @ np.array([0.2989, 0.5870, 0.1140]) * 255.5
  safe = np.abs(exact - np.round(exact)) > 1e-3
  assert safe.mean() > 0.99
  np.testing.assert_array_equal(image.lra_grayscale(pixels)[safe], np.floor(exact[safe]))
  with pytest.raises(ValueError):
    image.lra_grayscale(pixels.astype(np.float32))


def test_splits_are_grayscale_pixels_plus_one(tmp_path):
  data = tiny_data(tmp_path)
  with tfds.testing.mock_data(num_examples=N):
    records = {}
    for split in ('train', 'test'):
      ds = tfds.data_source('cifar10', split=split, data_dir='/nonexistent', download=False)
      records[split] = [(np.asarray(ds[i]['image']), int(np.asarray(ds[i]['label'])))
                        for i in range(len(ds))]
    arrays = {s: image.build_arrays(data, s) for s in common.SPLITS}
    again = image.build_arrays(data, 'val')
  train_idx, val_idx = text.split_indices(N, (0.75, 0.25), data.split_seed)
  expected = {'train': [records['train'][i] for i in train_idx],
              'val': [records['train'][i] for i in val_idx], 'test': records['test']}
  for split, rows in expected.items():
    inputs, targets = arrays[split]['inputs'], arrays[split]['targets']
    assert inputs.shape == (len(rows), 1024) and inputs.dtype == np.int32
    gray = np.stack([image.lra_grayscale(img) for img, _ in rows]).reshape(len(rows), -1)
    np.testing.assert_array_equal(inputs, gray.astype(np.int32) + 1)
    np.testing.assert_array_equal(targets, [label for _, label in rows])
    assert inputs.min() >= 1 and inputs.max() <= 256  # no padding in an image
    assert set(targets.tolist()) <= set(range(10))
  np.testing.assert_array_equal(again['inputs'], arrays['val']['inputs'])
  assert image.TASK.info(data) == common.TaskInfo(num_classes=10, vocab_size=257, max_length=1024)


def test_max_length_must_be_the_pixel_count(tmp_path):
  assert image.TASK.info(tiny_data(tmp_path, max_length=0)).max_length == 1024
  with pytest.raises(common.DataError, match='1024'):
    image.TASK.info(tiny_data(tmp_path, max_length=512))


def test_missing_data_names_directory_and_command(tmp_path):
  data = tiny_data(tmp_path, tfds_check=True)
  (line,) = image.TASK.check(data)
  assert os.path.join(str(tmp_path / 'data'), 'cifar10', '3.0.2') in line
  assert 'python scripts/prepare_data.py --task image' in line
  with pytest.raises(common.DataError, match='cifar10'):
    image.TASK.source(data, 'test')
