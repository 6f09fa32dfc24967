"""Retrieval (LRA "Retrieval"; ACL Anthology Network, Radev et al. 2013): does paper 1 cite paper 2?

Long Range Arena (Tay et al. 2021, section 3.3 "Byte-level document retrieval") encodes two documents
separately with shared weights and classifies the pair from the two encodings, so no information flows
between the documents except through the pooled vectors (the dual encoder, ``TaskInfo.dual=True``;
``kernelformer.encoder.Classifier`` concatenates ``[u, v, u*v, u-v]``). Each document is byte-level:
``byte + 1`` tokens (``common.byte_tokens``), vocabulary 257, cut to ``data.max_length`` bytes (4000
in LRA and the kernel papers) and right-padded. Examples are ``{'inputs1', 'inputs2', 'targets'}``.

Files: LRA's release (``lra_release/tsv_data/new_aan_pairs.{train,eval,test}.tsv``) copied to
``{data_dir}/retrieval/``; train = train, val = eval, test = test. The format is read as LRA's
``matching/input_pipeline.py`` reads it (``make_csv_dataset``, tab-delimited, no header,
``use_quote_delim=False``): ``label  id1  id2  text1  text2``, the texts Python bytes literals that are
tokenized as they stand (docs/data.md gives the reader's details); a row with another field count or
label is a ``DataError`` naming ``{path}:{line}``. With a cache (``lra_tasks.cache``: uint16 tokens at
``data.max_length``) ``source()`` maps it instead of parsing; the examples are identical.
"""
from __future__ import annotations

import csv
import functools
import os
from typing import Any, Iterator

import numpy as np

from lra_tasks import cache
from lra_tasks import common

NUM_CLASSES = 2
VOCAB_SIZE = common.BYTE_VOCAB_SIZE  # 257
SPLIT_FILES = {'train': 'new_aan_pairs.train.tsv', 'val': 'new_aan_pairs.eval.tsv',
               'test': 'new_aan_pairs.test.tsv'}
FIELDS = ('label', 'id1', 'id2', 'text1', 'text2')
RELEASE_DIR = 'lra_release/tsv_data'
RELEASE_URL = 'https://storage.googleapis.com/long-range-arena/lra_release.gz'

# Bumped whenever the tokens of a file change for the same max_length, so old caches are not read.
CACHE_VERSION = 1

# Documents are long single fields; csv's default limit is 128 KiB. 2**31 - 1 fits every C long.
_FIELD_SIZE_LIMIT = 2**31 - 1


def data_root(data: Any) -> str:
  return os.path.join(os.path.expanduser(str(data.data_dir)), 'retrieval')


def split_path(data: Any, split: str) -> str:
  if split not in SPLIT_FILES:
    raise ValueError(f'unknown split {split!r}; valid: {", ".join(common.SPLITS)}')
  return os.path.join(data_root(data), SPLIT_FILES[split])


def misplaced(data: Any, split: str) -> str | None:
  """Where a release file for ``split`` sits under ``data_dir`` if it was copied to the wrong folder."""
  root = os.path.expanduser(str(data.data_dir))
  name = SPLIT_FILES[split]
  for folder in ('', 'tsv_data', RELEASE_DIR, f'lra_release/{RELEASE_DIR}', 'retrieval/tsv_data'):
    candidate = os.path.join(root, folder, name)
    if os.path.isfile(candidate):
      return candidate
  return None


def parse_label(text: str) -> int | None:
  """0 or 1 from ``'0'``, ``'1'``, ``'0.0'``, ``'1.0'`` (any float spelling of 0 or 1), else None."""
  try:
    value = float(text)
  except ValueError:
    return None
  return int(value) if value in (0.0, 1.0) else None


def iter_rows(path: str) -> Iterator[tuple[int, int, bytes, bytes]]:
  """Yields ``(line, label, text1_bytes, text2_bytes)``; a malformed row raises a one-line DataError."""
  fix = 'fix the file or copy it again from the LRA release'
  if csv.field_size_limit() < _FIELD_SIZE_LIMIT:
    csv.field_size_limit(_FIELD_SIZE_LIMIT)
  with open(path, 'r', encoding='utf-8', errors='surrogateescape', newline='') as f:
    reader = csv.reader(f, delimiter='\t', quoting=csv.QUOTE_NONE)
    for row in common.csv_rows(reader, path, fix):
      line = reader.line_num
      if not row:
        continue
      if len(row) != len(FIELDS):
        raise common.DataError(f'{path}:{line}: expected {len(FIELDS)} tab-separated fields '
                               f'({", ".join(FIELDS)}), got {len(row)}; {fix}')
      label = parse_label(row[0])
      if label is None:
        raise common.DataError(f'{path}:{line}: label must be 0 or 1 (or 0.0 / 1.0), got '
                               f'{row[0][:20]!r}; {fix}')
      yield (line, label, row[3].encode('utf-8', 'surrogateescape'),
             row[4].encode('utf-8', 'surrogateescape'))


def read_tsv(path: str, max_length: int) -> dict[str, np.ndarray]:
  """Token arrays of one release TSV: ``inputs1``/``inputs2`` int32[N, max_length], ``targets`` int32[N]."""
  first, second, targets = [], [], []
  for _, label, text1, text2 in iter_rows(path):
    first.append(common.byte_tokens(text1, max_length))
    second.append(common.byte_tokens(text2, max_length))
    targets.append(label)
  empty = np.zeros((0, max_length), np.int32)
  arrays = {'inputs1': np.stack(first) if first else empty,
            'inputs2': np.stack(second) if second else empty.copy(),
            'targets': np.asarray(targets, dtype=np.int32).reshape(len(targets))}
  for a in arrays.values():
    a.setflags(write=False)
  return arrays


@functools.lru_cache(maxsize=3)
def _cached_read(path: str, max_length: int, mtime_ns: int, size: int) -> dict[str, np.ndarray]:
  del mtime_ns, size  # cache key only: a changed file is read again
  return read_tsv(path, max_length)


def split_cache(data: Any, split: str) -> cache.Cache:
  """The cache of one split file's tokens at ``data.max_length``."""
  return cache.Cache(cache.root(data.data_dir), 'retrieval', f'retrieval/{SPLIT_FILES[split]}',
                     {'max_length': common.positive_max_length(data, 'retrieval'),
                      'version': CACHE_VERSION})


def cached_arrays(data: Any, split: str) -> dict[str, np.ndarray] | None:
  """The memory-mapped uint16 tokens and int32 targets of ``split``, if a current cache exists."""
  path = split_path(data, split)
  return split_cache(data, split).load(data_root(data), lambda: [path])


def build_cache(data: Any, split: str) -> str:
  """Writes the cache of ``split`` (streaming, one row at a time); returns its directory."""
  path = _check_file(data, split)
  max_length = common.positive_max_length(data, 'retrieval')
  c = split_cache(data, split)
  key = c.key(cache.fingerprint(data_root(data), [path]))
  columns = {'inputs1': (np.uint16, (max_length,)), 'inputs2': (np.uint16, (max_length,)),
             'targets': (np.int32, ())}
  with c.writer(key, columns) as w:
    for _, label, text1, text2 in iter_rows(path):
      w.append(inputs1=common.byte_tokens(text1, max_length),
               inputs2=common.byte_tokens(text2, max_length), targets=label)
    if c.key(cache.fingerprint(data_root(data), [path])) != key:
      raise common.DataError(f'retrieval: {path} changed while it was being cached; run again')
  return c.directory(key)


def _stored(data: Any, split: str) -> common.IndexedSource | None:
  stored = cached_arrays(data, split)
  if stored is None:
    return None
  return common.IndexedSource(None, **stored)


def _check_file(data: Any, split: str) -> str:
  path = split_path(data, split)
  if not os.path.isfile(path):
    raise common.DataError('retrieval: data missing: ' + '; '.join(TASK.check(data)))
  return path


def _check_nonempty(n: int, path: str) -> None:
  if n == 0:
    raise common.DataError(f'retrieval: {path} holds no examples; copy it again from the LRA release')


def build_arrays(data: Any, split: str) -> dict[str, np.ndarray]:
  """The token/label arrays of our ``split`` (train = train, val = eval, test = test).

  From the cache when a current one exists (identical values), else parsed from the TSV.
  """
  path = _check_file(data, split)
  max_length = common.positive_max_length(data, 'retrieval')
  stored = _stored(data, split)
  if stored is not None:
    _check_nonempty(len(stored), path)
    return stored.materialize()
  st = os.stat(path)
  arrays = _cached_read(path, max_length, st.st_mtime_ns, st.st_size)
  _check_nonempty(len(arrays['targets']), path)
  return dict(arrays)


class RetrievalTask:
  """``common.Task`` for LRA Retrieval (AAN citation pairs, bytes, dual encoder)."""

  name = 'retrieval'

  def info(self, data: Any) -> common.TaskInfo:
    return common.TaskInfo(num_classes=NUM_CLASSES, vocab_size=VOCAB_SIZE,
                           max_length=int(data.max_length), dual=True)

  def check(self, data: Any) -> list[str]:
    lines = []
    for split in common.SPLITS:
      path = split_path(data, split)
      if not os.path.isfile(path):
        found = misplaced(data, split)
        if found:
          lines.append(f'{path} is missing, but {found} exists: move it there')
          continue
        lines.append(
            f'{path} is missing: run: python scripts/prepare_data.py --task retrieval --data_dir '
            f'{data.data_dir} --source <lra_release.gz or its extracted folder>, or download '
            f'{RELEASE_URL}, extract it and copy {RELEASE_DIR}/{SPLIT_FILES[split]} there')
    return lines

  def prepare(self, data: Any) -> None:
    """Nothing to make locally: the files come from the LRA release."""
    del data

  def source(self, data: Any, split: str) -> common.ArraySource | common.IndexedSource:
    """The cached split as a memory-mapped source if there is one, else the parsed arrays."""
    path = _check_file(data, split)
    common.positive_max_length(data, 'retrieval')
    stored = _stored(data, split)
    if stored is not None:
      _check_nonempty(len(stored), path)
      return stored
    return common.ArraySource(**build_arrays(data, split))


TASK = RetrievalTask()
