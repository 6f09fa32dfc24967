"""Image (LRA "Image"; CIFAR-10, Krizhevsky 2009): 10-way classification of flattened grayscale pixels.

Long Range Arena (Tay et al. 2021, section 3.5 "Image classification on sequences of pixels") converts
each 32x32 RGB image to grayscale and feeds its 1024 pixels in raster order as tokens, with no 2-D
inductive bias. Grayscale is LRA's ``tf.image.rgb_to_grayscale`` reproduced in numpy (``lra_grayscale``:
``trunc((0.2989 R + 0.5870 G + 0.1140 B) / 255 * 255.5)`` in float32, not PIL's rounding). Tokens per
``data.pixel_padding`` (``pixel_offset``; Pathfinder reads the same field): ``'none'`` (default) ``pixel
+ 1``, vocabulary 257, nothing masked; ``'lra'`` the raw pixel, vocabulary 256 (image/input_pipeline.py
72 @ ad0ff01), so the mask ``inputs != 0`` -- LRA's ``inputs > 0`` (models/transformer/transformer.py
148 @ b4f9fed), Skyformer's (src/preprocess/create_cifar10.py 21, src/models/dataset_LRA.py 32 @
cfe8c8c) -- masks every black pixel (docs/data.md, "Where we differ from LRA").

Every image has exactly 1024 tokens (``TaskInfo.max_length``); ``data.max_length`` must be 1024 or 0
(= automatic).

The data is TFDS' ``cifar10`` read with ``tfds.data_source`` (prepared ``array_record`` files; see
``common.TfdsDataset`` for the on-disk check that keeps TFDS from trying to download). Splits: LRA used
``train[:90%]`` / ``train[90%:]`` / ``test``; here train/val are the same sizes (90/10 of CIFAR-10 train,
``data.val_fraction``) drawn by a permutation seeded with ``data.split_seed``; test is CIFAR-10 test.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from lra_tasks import common

NUM_CLASSES = 10
VOCAB_SIZE = 257   # pixel values 0..255 shifted by one, plus padding (pixel_padding 'none')
PIXEL_PADDINGS = ('none', 'lra')
SIDE = 32
NUM_PIXELS = SIDE * SIDE

# tf.image.rgb_to_grayscale's weights (ITU-R BT.601 luma, as TensorFlow rounds them).
GRAY_WEIGHTS = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)

CIFAR10 = common.TfdsDataset(task='image', name='cifar10', config=None, version='3.0.2',
                             splits=('train', 'test'))


def lra_grayscale(rgb: np.ndarray) -> np.ndarray:
  """``tf.image.rgb_to_grayscale`` on uint8 ``[..., 3]`` images: uint8 ``[...]``.

  TensorFlow converts uint8 to float32 as ``x * (1 / 255)``, takes the weighted sum of the channels,
  and converts back as ``cast(g * 255.5)``, a truncation (the sum of the weights is 0.9999, so no
  saturation is needed). Everything here is float32 as there; only the order of the three-term sum
  may differ, which can move a value that lies within float32 rounding of an integer.
  """
  rgb = np.asarray(rgb)
  if rgb.dtype != np.uint8 or rgb.shape[-1] != 3:
    raise ValueError(f'expected uint8 RGB images [..., 3], got {rgb.dtype} {rgb.shape}')
  scaled = rgb.astype(np.float32) * np.float32(1.0 / 255.0)
  gray = (scaled[..., 0] * GRAY_WEIGHTS[0] + scaled[..., 1] * GRAY_WEIGHTS[1]
          + scaled[..., 2] * GRAY_WEIGHTS[2])
  return (gray * np.float32(255.5)).astype(np.uint8)


def pixel_padding(data: Any) -> str:
  """``data.pixel_padding`` ('none' for a config written before the field existed); DataError if unknown."""
  value = str(getattr(data, 'pixel_padding', 'none'))
  if value not in PIXEL_PADDINGS:
    raise common.DataError(f"data.pixel_padding must be one of {', '.join(map(repr, PIXEL_PADDINGS))}, "
                           f'got {value!r}')
  return value


def pixel_offset(data: Any) -> int:
  """What is added to a pixel to make its token: 1 ('none': 0 stays padding), 0 ('lra': black is 0)."""
  return 0 if pixel_padding(data) == 'lra' else 1


def pixel_vocab_size(data: Any) -> int:
  """257 for 'none' (pixels + 1, and padding), 256 for 'lra' (LRA's vocab_size)."""
  return 256 + pixel_offset(data)


def pixel_tokens(gray: np.ndarray) -> np.ndarray:
  """uint8 pixels in raster order -> int32 tokens ``pixel + 1`` (so 0 stays padding)."""
  return np.asarray(gray, dtype=np.uint8).reshape(-1).astype(np.int32) + 1


def offset_tokens(tokens: np.ndarray, data: Any, *, in_place: bool = False) -> np.ndarray:
  """Tokens made as ``pixel + 1`` (``pixel_tokens``) at ``data``'s ``pixel_offset``: ``tokens`` itself
  for 'none'; for 'lra' ``tokens - 1``, a new array unless ``in_place`` (for an array the caller owns)."""
  if pixel_offset(data) == 1:
    return tokens
  if in_place:
    tokens -= 1
    return tokens
  return tokens - 1


def _convert(record: Mapping[str, Any]) -> tuple[np.ndarray, int]:
  image = np.asarray(record['image'])
  if image.shape != (SIDE, SIDE, 3):
    raise common.DataError(f'image: cifar10 images must be {SIDE}x{SIDE}x3, got {image.shape}')
  label = int(np.asarray(record['label']))
  if not 0 <= label < NUM_CLASSES:
    raise common.DataError(f'image: cifar10 label must be in 0..9, got {label}')
  return pixel_tokens(lra_grayscale(image)), label


def _check_length(data: Any) -> None:
  if int(data.max_length) not in (0, NUM_PIXELS):
    raise common.DataError(f'image: data.max_length must be {NUM_PIXELS} (32x32 pixels) or 0, '
                           f'got {data.max_length}')


def build_arrays(data: Any, split: str) -> dict[str, np.ndarray]:
  """``{'inputs': int32[N, 1024], 'targets': int32[N]}`` for our split of CIFAR-10."""
  if split not in common.SPLITS:
    raise ValueError(f'unknown split {split!r}; valid: {", ".join(common.SPLITS)}')
  _check_length(data)
  tfds_split = 'test' if split == 'test' else 'train'
  inputs, targets = common.read_tfds_split(CIFAR10, data, tfds_split, _convert, cache_key=())
  if split != 'test':
    fraction = common.validation_fraction(data, 'image')
    train_idx, val_idx = common.split_indices(len(targets), (1.0 - fraction, fraction),
                                              data.split_seed)
    idx = train_idx if split == 'train' else val_idx
    inputs, targets = inputs[idx], targets[idx]
  inputs = offset_tokens(inputs, data)   # read_tfds_split's tokens are pixel + 1 (``_convert``)
  arrays = {'inputs': inputs, 'targets': targets}
  common.check_nonempty('image', arrays, split, 'use more data or another data.val_fraction')
  return arrays


class ImageTask:
  """``common.Task`` for LRA Image (grayscale CIFAR-10 as 1024 pixel tokens)."""

  name = 'image'

  def info(self, data: Any) -> common.TaskInfo:
    _check_length(data)
    return common.TaskInfo(num_classes=NUM_CLASSES, vocab_size=pixel_vocab_size(data),
                           max_length=NUM_PIXELS)

  def check(self, data: Any) -> list[str]:
    return CIFAR10.check(data)

  def prepare(self, data: Any) -> None:
    """Nothing to make locally: preparing CIFAR-10 downloads it (scripts/prepare_data.py does that)."""
    del data

  def source(self, data: Any, split: str) -> common.ArraySource:
    missing = self.check(data)
    if missing:
      raise common.DataError('image: data missing: ' + '; '.join(missing))
    return common.ArraySource(**build_arrays(data, split))


TASK = ImageTask()
