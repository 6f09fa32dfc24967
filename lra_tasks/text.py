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

Cache (``lra_tasks.cache``, docs/data.md): the byte tokens of TFDS' train and test splits at
``data.max_length`` as uint16; the validation carve is the same index set, so the examples are identical.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import numpy as np

from lra_tasks import cache
from lra_tasks import common
# Re-exported: split_indices moved to common; tests/lra_tasks/test_{text,image}.py still call it here.
from lra_tasks.common import split_indices  # noqa: F401

NUM_CLASSES = 2
VOCAB_SIZE = common.BYTE_VOCAB_SIZE  # 257: 256 bytes + padding
# Bumped whenever the tokens of a record change for the same max_length, so old caches are not read.
CACHE_VERSION = 1


# ----------------------------------------------------------------------------------------------
# The task.

IMDB = common.TfdsDataset(task='text', name='imdb_reviews', config='plain_text', version='1.0.0',
                          splits=('train', 'test'))


def _tokenize_review(max_length: int) -> Callable[[Mapping[str, Any]], tuple[np.ndarray, int]]:
  def convert(record):
    # Prepared records give bytes, mock records str; both become UTF-8 bytes + 1.
    label = int(np.asarray(record['label']))
    if label not in (0, 1):
      raise common.DataError(f'text: imdb_reviews label must be 0 or 1, got {label}')
    return common.byte_tokens(record['text'], max_length), label
  return convert


def split_cache(data: Any, tfds_split: str) -> cache.Cache:
  """The cache of one TFDS split's byte tokens at ``data.max_length``."""
  return cache.Cache(cache.root(data.data_dir), 'text', f'{IMDB.full_name}/{tfds_split}',
                     {'max_length': common.positive_max_length(data, 'text'),
                      'version': CACHE_VERSION})


def _cache_sources(directory: str, tfds_split: str) -> list[str]:
  return [os.path.join(directory, 'dataset_info.json')] + IMDB.shards(directory, tfds_split)


def cached_split(data: Any, tfds_split: str) -> dict[str, np.ndarray] | None:
  """Memory-mapped ``{'inputs': uint16[N, L], 'targets': int32[N]}`` if a current cache exists.

  Only for prepared data on disk (``data.tfds_check``): mock data has no files to key a cache by.
  """
  if not bool(data.tfds_check):
    return None
  directory = IMDB.prepared_dir(data)
  if directory is None:
    return None
  return split_cache(data, tfds_split).load(directory,
                                            lambda: _cache_sources(directory, tfds_split))


def build_cache(data: Any, tfds_split: str) -> str:
  """Tokenizes a prepared TFDS split into a new cache, one record at a time; returns its directory."""
  directory = IMDB.prepared_dir(data)
  if directory is None:
    raise common.DataError('text: data missing: ' + '; '.join(IMDB.check(data)))
  max_length = common.positive_max_length(data, 'text')
  c = split_cache(data, tfds_split)
  key = c.key(cache.fingerprint(directory, _cache_sources(directory, tfds_split)))
  with c.writer(key, {'inputs': (np.uint16, (max_length,)), 'targets': (np.int32, ())}) as w:
    for ids, label in common.iter_tfds_split(IMDB, data, tfds_split, _tokenize_review(max_length)):
      w.append(inputs=ids, targets=label)
  return c.directory(key)


def _split_source(data: Any, split: str) -> common.ArraySource | common.IndexedSource:
  """Our ``split`` of IMDb, from the cache if a current one exists, else read from TFDS."""
  if split not in common.SPLITS:
    raise ValueError(f'unknown split {split!r}; valid: {", ".join(common.SPLITS)}')
  max_length = common.positive_max_length(data, 'text')
  tfds_split = 'test' if split == 'test' else 'train'
  stored = cached_split(data, tfds_split)
  if stored is not None:
    n = len(stored['targets'])
  else:
    inputs, targets = common.read_tfds_split(IMDB, data, tfds_split, _tokenize_review(max_length),
                                             cache_key=(max_length,))
    n = len(targets)
  idx = None
  if split != 'test':
    fraction = common.validation_fraction(data, 'text')
    train_idx, val_idx = common.split_indices(n, (1.0 - fraction, fraction), data.split_seed)
    idx = train_idx if split == 'train' else val_idx
  if stored is not None:
    src = common.IndexedSource(idx, **stored)
  elif idx is None:
    src = common.ArraySource(inputs=inputs, targets=targets)
  else:
    src = common.ArraySource(inputs=inputs[idx], targets=targets[idx])
  common.check_nonempty('text', {'targets': range(len(src))}, split,
                        'use more data or another data.val_fraction')
  return src


def build_arrays(data: Any, split: str) -> dict[str, np.ndarray]:
  """``{'inputs': int32[N, max_length], 'targets': int32[N]}`` for our split of IMDb.

  ``train``/``val`` are the two parts of TFDS' train split (``split_indices`` with fractions
  ``1 - val_fraction, val_fraction``); ``test`` is TFDS' test split.
  """
  return common.source_arrays(_split_source(data, split))


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

  def source(self, data: Any, split: str) -> common.ArraySource | common.IndexedSource:
    missing = self.check(data)
    if missing:
      raise common.DataError('text: data missing: ' + '; '.join(missing))
    return _split_source(data, split)


TASK = TextTask()
