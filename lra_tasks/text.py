"""Text (LRA "Text"; IMDb reviews, Maas et al. 2011): byte-level binary sentiment classification.

Long Range Arena (Tay et al. 2021, section 3.2 "Byte-level text classification") feeds the raw review
bytes to the model, so a review of a few hundred words is a sequence of thousands of tokens. Tokens are
``byte + 1`` (``common.byte_tokens``), so 0 stays padding and the vocabulary has 257 ids; reviews are cut
to ``data.max_length`` bytes (LRA's own config: 1000; the kernel papers' table 4: 4000) and right-padded.

The data is TensorFlow Datasets' ``imdb_reviews/plain_text`` read with ``tfds.data_source`` (random access
over prepared ``array_record`` files, no TensorFlow import). Without prepared files TFDS would try to
download for minutes, so ``check()`` looks for them on disk first and names the exact directory and the
command that prepares it, and ``source()`` refuses to run without them. ``data.tfds_check=False`` skips
that check; only tests set it, inside ``tfds.testing.mock_data``.

Splits: IMDb has 25k train and 25k test reviews and no validation set. LRA validated on the test set;
here validation is carved from train (``data.val_fraction``, a permutation seeded by
``data.split_seed``), so model selection never sees a test review. The test split is IMDb's test split.

This module also holds what the TFDS-backed tasks share (``TfdsDataset``, ``read_tfds_split``) and the
seeded split helper ``split_indices`` that Image and Pathfinder use too.
"""
from __future__ import annotations

import dataclasses
import glob
import logging
import os
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from lra_tasks import common

NUM_CLASSES = 2
VOCAB_SIZE = common.BYTE_VOCAB_SIZE  # 257: 256 bytes + padding

_log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------
# Seeded splits (shared with image.py and pathfinder.py).


def split_indices(n: int, fractions: Sequence[float], seed: int) -> list[np.ndarray]:
  """Disjoint index sets covering ``range(n)``: a seeded permutation cut at cumulative fractions.

  The cuts are ``int(n * f1)``, ``int(n * (f1 + f2))``, ... as in LRA's Pathfinder split
  (``int(len * 0.8)``, ``int(len * 0.9)``); the last part takes the rest. Each part is returned sorted,
  so a split keeps the upstream order of its examples and is identical in every process.

  Args:
    n: number of examples.
    fractions: part sizes as fractions of ``n``; they must sum to 1.
    seed: seed of the permutation (``np.random.default_rng``).
  """
  if abs(sum(fractions) - 1.0) > 1e-9 or min(fractions) <= 0:
    raise ValueError(f'fractions must be positive and sum to 1, got {list(fractions)}')
  perm = np.random.default_rng(int(seed)).permutation(n)
  cuts = [int(n * float(np.sum(fractions[:i + 1]))) for i in range(len(fractions) - 1)]
  return [np.sort(part) for part in np.split(perm, cuts)]


def validation_fraction(data: Any, task: str) -> float:
  fraction = float(data.val_fraction)
  if not 0.0 < fraction < 1.0:
    raise common.DataError(f'{task}: data.val_fraction must be in (0, 1), got {fraction}')
  return fraction


def check_nonempty(task: str, arrays: Mapping[str, np.ndarray], split: str, hint: str) -> None:
  n = len(next(iter(arrays.values())))
  if n == 0:
    raise common.DataError(f'{task}: the {split} split is empty; {hint}')


# ----------------------------------------------------------------------------------------------
# TFDS datasets on disk (shared with image.py).


@dataclasses.dataclass(frozen=True)
class TfdsDataset:
  """A TFDS dataset that must already be prepared as ``array_record`` files under a data dir.

  TFDS lays a prepared dataset out as ``{data_dir}/{name}[/{config}]/{version}/`` holding
  ``dataset_info.json`` and shards ``{name}-{split}.array_record-NNNNN-of-MMMMM``. ``tfds.load``
  prepares TFRecord shards by default, which ``tfds.data_source`` cannot read.
  """

  task: str                      # our task name (for messages and the prepare command)
  name: str                      # TFDS name, e.g. 'imdb_reviews'
  config: str | None             # TFDS builder config, e.g. 'plain_text', or None
  version: str                   # the version tensorflow-datasets 4.9 builds
  splits: tuple[str, ...]        # TFDS splits the task reads

  def root(self, data: Any) -> str:
    return os.path.expanduser(str(data.tfds_data_dir or data.data_dir))

  def base_dir(self, data: Any) -> str:
    parts = [self.root(data), self.name] + ([self.config] if self.config else [])
    return os.path.join(*parts)

  def expected_dir(self, data: Any) -> str:
    return os.path.join(self.base_dir(data), self.version)

  def _shards(self, directory: str, split: str, file_format: str) -> list[str]:
    return glob.glob(os.path.join(directory, f'{self.name}-{split}.{file_format}-*'))

  def _is_prepared(self, directory: str) -> bool:
    return (os.path.isfile(os.path.join(directory, 'dataset_info.json'))
            and all(self._shards(directory, s, 'array_record') for s in self.splits))

  def prepared_dir(self, data: Any) -> str | None:
    """The version directory holding prepared array_record files (ours first, else the newest)."""
    if self._is_prepared(self.expected_dir(data)):
      return self.expected_dir(data)
    candidates = sorted(glob.glob(os.path.join(self.base_dir(data), '*')), reverse=True)
    for directory in candidates:
      if os.path.isdir(directory) and self._is_prepared(directory):
        return directory
    return None

  def check(self, data: Any) -> list[str]:
    if not bool(data.tfds_check) or self.prepared_dir(data) is not None:
      return []
    directory = self.expected_dir(data)
    prepare = (f'run: python scripts/prepare_data.py --task {self.task} --data_dir {data.data_dir}'
               ' (or set data.tfds_data_dir to a TFDS data dir that has it)')
    if any(self._shards(directory, s, 'tfrecord') for s in self.splits):
      return [f'{directory} holds TFRecord shards, but tfds.data_source reads only array_record: '
              f'{prepare}; it re-prepares with file_format=array_record']
    splits = ', '.join(self.splits)
    return [f'{directory} has no prepared {self.name} ({splits}: dataset_info.json + '
            f'{self.name}-<split>.array_record-* shards): {prepare}']

  def open(self, data: Any, split: str):
    """``tfds.data_source`` for ``split``; never downloads (``download=False``)."""
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    name = self.name + (f'/{self.config}' if self.config else '')
    directory = self.prepared_dir(data) if bool(data.tfds_check) else None
    if directory is not None:
      name += ':' + os.path.basename(directory)
    return tfds.data_source(name, split=split, data_dir=self.root(data), download=False)


def read_tfds_split(dataset: TfdsDataset, data: Any, split: str,
                    convert: Callable[[Mapping[str, Any]], tuple[np.ndarray, int]],
                    cache_key: tuple) -> tuple[np.ndarray, np.ndarray]:
  """``(inputs int32[N, L], targets int32[N])`` of a whole TFDS split, one record at a time.

  Records are read singly: the batched ``__getitems__`` of TFDS' mock data source is broken, and a
  single read costs the same per record. With real prepared data the result is cached per process
  (the trainer asks for train and val, both carved from TFDS' train split); ``cache_key`` must name
  everything ``convert`` depends on. Mock data (``data.tfds_check=False``) is never cached.
  """
  if bool(data.tfds_check):
    directory = dataset.prepared_dir(data)
    if directory is None:
      raise common.DataError(f'{dataset.task}: data missing: ' + '; '.join(dataset.check(data)))
    info = os.stat(os.path.join(directory, 'dataset_info.json'))
    return _cached_tfds_split(dataset, data, split, convert,
                              (directory, split, info.st_mtime_ns, *cache_key))
  return _read_tfds_split(dataset, data, split, convert)


def _read_tfds_split(dataset, data, split, convert):
  start = time.perf_counter()
  source = dataset.open(data, split)
  rows, targets = [], []
  for i in range(len(source)):
    ids, target = convert(source[i])
    rows.append(ids)
    targets.append(target)
  inputs = np.stack(rows) if rows else np.zeros((0, 0), np.int32)
  targets_arr = np.asarray(targets, dtype=np.int32).reshape(len(targets))
  inputs.setflags(write=False)
  targets_arr.setflags(write=False)
  _log.info('%s: read %d records of %s/%s in %.1f s', dataset.task, len(rows), dataset.name, split,
            time.perf_counter() - start)
  return inputs, targets_arr


_TFDS_CACHE: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def _cached_tfds_split(dataset, data, split, convert, key):
  if key not in _TFDS_CACHE:
    # Two entries at most: a task's TFDS train and test splits.
    while len(_TFDS_CACHE) >= 2:
      _TFDS_CACHE.pop(next(iter(_TFDS_CACHE)))
    _TFDS_CACHE[key] = _read_tfds_split(dataset, data, split, convert)
  return _TFDS_CACHE[key]


# ----------------------------------------------------------------------------------------------
# The task.

IMDB = TfdsDataset(task='text', name='imdb_reviews', config='plain_text', version='1.0.0',
                   splits=('train', 'test'))


def _tokenize_review(max_length: int) -> Callable[[Mapping[str, Any]], tuple[np.ndarray, int]]:
  def convert(record):
    # Prepared records give bytes, mock records str; both become UTF-8 bytes + 1.
    label = int(np.asarray(record['label']))
    if label not in (0, 1):
      raise common.DataError(f'text: imdb_reviews label must be 0 or 1, got {label}')
    return common.byte_tokens(record['text'], max_length), label
  return convert


def build_arrays(data: Any, split: str) -> dict[str, np.ndarray]:
  """``{'inputs': int32[N, max_length], 'targets': int32[N]}`` for our split of IMDb.

  ``train``/``val`` are the two parts of TFDS' train split (``split_indices`` with fractions
  ``1 - val_fraction, val_fraction``); ``test`` is TFDS' test split.
  """
  if split not in common.SPLITS:
    raise ValueError(f'unknown split {split!r}; valid: {", ".join(common.SPLITS)}')
  max_length = int(data.max_length)
  if max_length < 1:
    raise common.DataError(f'text: data.max_length must be >= 1, got {max_length}')
  tfds_split = 'test' if split == 'test' else 'train'
  inputs, targets = read_tfds_split(IMDB, data, tfds_split, _tokenize_review(max_length),
                                    cache_key=(max_length,))
  if split != 'test':
    fraction = validation_fraction(data, 'text')
    train_idx, val_idx = split_indices(len(targets), (1.0 - fraction, fraction), data.split_seed)
    idx = train_idx if split == 'train' else val_idx
    inputs, targets = inputs[idx], targets[idx]
  arrays = {'inputs': inputs, 'targets': targets}
  check_nonempty('text', arrays, split, 'use more data or another data.val_fraction')
  return arrays


class TextTask:
  """``common.Task`` for LRA Text (IMDb, bytes)."""

  name = 'text'

  def info(self, data: Any) -> common.TaskInfo:
    return common.TaskInfo(num_classes=NUM_CLASSES, vocab_size=VOCAB_SIZE,
                           max_length=int(data.max_length), dual=False)

  def check(self, data: Any) -> list[str]:
    return IMDB.check(data)

  def prepare(self, data: Any) -> None:
    """Nothing to make locally: preparing IMDb downloads it (scripts/prepare_data.py does that)."""
    del data

  def source(self, data: Any, split: str) -> common.ArraySource:
    missing = self.check(data)
    if missing:
      raise common.DataError('text: data missing: ' + '; '.join(missing))
    return common.ArraySource(**build_arrays(data, split))


TASK = TextTask()
