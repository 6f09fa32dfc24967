"""What every LRA task provides to the trainer, and small helpers shared by the task modules.

A task turns its upstream files into random-access sources of fixed-length examples::

    task = lra_tasks.get('listops')
    info = task.info(config.data)              # TaskInfo: classes, vocabulary, length, dual?
    missing = task.check(config.data)          # [] when everything needed is on disk
    task.prepare(config.data)                  # makes what can be made locally (ListOps), else no-op
    src = task.source(config.data, 'train')    # len(src), src[i] -> {'inputs': int32[L], 'targets': int32}

Dual tasks (Retrieval) give ``inputs1`` and ``inputs2`` instead of ``inputs``. Token id 0 is padding
in every task (the model derives its key padding mask from ``inputs != 0``), so vocabularies start at 1.

A source may also answer a whole batch at once: ``src.read_batch(indices int[B]) -> {name: int32[B,
...]}``, equal to stacking ``src[i]`` over ``indices`` (the training and evaluation batches use it when
present, else they stack single examples). ``ArraySource``, ``IndexedSource``, the generated recall
tasks (``lra_tasks/mqar.py``) and enwik8's ``WindowSource`` have it.

Shared by the task modules: the sources (``ArraySource`` over int32 arrays, ``IndexedSource`` over
stored, possibly memory-mapped rows), the seeded ``split_indices``, and the TFDS helpers
(``TfdsDataset``: where a prepared dataset must be and how to say it is missing; ``read_tfds_split``).
"""
from __future__ import annotations

import csv
import dataclasses
import glob
import logging
import os
import time
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import numpy as np

PAD_ID = 0
SPLITS = ('train', 'val', 'test')

_log = logging.getLogger(__name__)


class DataError(ValueError):
  """Missing, misplaced or malformed data; the message is one line saying what to do."""


@dataclasses.dataclass(frozen=True)
class TaskInfo:
  num_classes: int
  vocab_size: int      # including padding (id 0)
  max_length: int      # tokens per example (per document for dual tasks)
  dual: bool = False   # two documents per example, encoded separately (Retrieval)


class Task(Protocol):
  name: str

  def info(self, data: Any) -> TaskInfo:
    ...

  def check(self, data: Any) -> list[str]:
    """One line per missing file: the exact expected path and how to obtain it."""
    ...

  def prepare(self, data: Any) -> None:
    ...

  def source(self, data: Any, split: str) -> Sequence[Mapping[str, np.ndarray]]:
    ...


def require(task: Task, data: Any) -> None:
  """Raises one DataError listing everything missing for ``task`` (after ``prepare``)."""
  task.prepare(data)
  missing = task.check(data)
  if missing:
    raise DataError(f'{task.name}: data missing: ' + '; '.join(missing))


class ArraySource:
  """A random-access source over equally long numpy arrays: ``src[i] -> {name: array[i]}``."""

  def __init__(self, **arrays: np.ndarray):
    lengths = {len(a) for a in arrays.values()}
    if len(lengths) != 1:
      raise ValueError(f'arrays of different lengths: { {k: len(a) for k, a in arrays.items()} }')
    self._arrays = arrays
    self._len = lengths.pop()

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    return {k: a[i] for k, a in self._arrays.items()}

  def read_batch(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    """Examples ``indices`` as one batch, ``{name: array[indices]}``: one gather per array."""
    return {k: a[indices] for k, a in self._arrays.items()}

  @property
  def arrays(self) -> Mapping[str, np.ndarray]:
    return self._arrays


class IndexedSource:
  """Rows of stored arrays, picked by an index and converted on access: ``src[i] -> {name: int32}``.

  The stored arrays may be memory-mapped caches in a compact dtype (uint8 pixels, uint16 byte tokens);
  ``src[i]`` reads only row ``index[i]`` and returns what ``ArraySource`` over the fully converted
  arrays would: ``int32(stored[index[i]]) + offsets[name]`` (an int32 row, or an ``np.int32`` scalar
  for 1-D arrays). So a cached split gives the same examples as the raw one without first converting
  the whole split to int32 in memory (Path-X: 3.3 GB of uint8 instead of 13 GB of int32).
  """

  def __init__(self, index: np.ndarray | None, offsets: Mapping[str, int] | None = None,
               **arrays: np.ndarray):
    lengths = {len(a) for a in arrays.values()}
    if len(lengths) != 1:
      raise ValueError(f'arrays of different lengths: { {k: len(a) for k, a in arrays.items()} }')
    n = lengths.pop()
    self._index = np.arange(n) if index is None else np.asarray(index, dtype=np.int64)
    if len(self._index) and (self._index.min() < 0 or self._index.max() >= n):
      raise ValueError(f'index out of range for {n} rows')
    self._arrays = arrays
    self._offsets = {k: int((offsets or {}).get(k, 0)) for k in arrays}
    # Per-example work is the hot path of training: plain ndarray views of the maps (indexing an
    # np.memmap builds a memmap object per row), the offsets as int32, and the row/scalar choice
    # made once.
    self._fields = [(name, np.asarray(a), np.int32(self._offsets[name]), a.ndim == 1)
                    for name, a in arrays.items()]
    self._positions = self._index.tolist()

  def __len__(self) -> int:
    return len(self._positions)

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    j = self._positions[i]
    out = {}
    for name, a, offset, scalar in self._fields:
      if scalar:
        out[name] = np.int32(a[j] + offset)
      else:
        # A fresh int32 row (never a view of the map), as ArraySource's int32 arrays give.
        row = a[j].astype(np.int32)
        row += offset
        out[name] = row
    return out

  def read_batch(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    """Examples ``indices`` as one batch: one gather of the stored rows per array, then one int32
    conversion -- what stacking ``src[i]`` gives."""
    rows = self._index[np.asarray(indices, dtype=np.int64)]
    out = {}
    for name, a, offset, _ in self._fields:
      batch = a[rows].astype(np.int32)
      batch += offset
      out[name] = batch
    return out

  def materialize(self) -> dict[str, np.ndarray]:
    """All rows as read-only int32 arrays: what a loader's ``build_arrays`` returns."""
    out = {}
    for name, a in self._arrays.items():
      full = np.asarray(a)[self._index].astype(np.int32) + np.int32(self._offsets[name])
      full.setflags(write=False)
      out[name] = full
    return out


def source_arrays(src: ArraySource | IndexedSource) -> dict[str, np.ndarray]:
  """Every row of a split's source as whole int32 arrays (a loader's ``build_arrays``).

  An ``IndexedSource`` (a cached split) is converted with ``materialize``; an ``ArraySource`` already
  holds the int32 arrays and gives them as they are.
  """
  if isinstance(src, IndexedSource):
    return src.materialize()
  return dict(src.arrays)


def pad_or_truncate(ids: Sequence[int], length: int) -> np.ndarray:
  """``ids`` cut to ``length`` tokens or right-padded with PAD_ID (right padding, as cuDNN expects)."""
  out = np.full((length,), PAD_ID, dtype=np.int32)
  ids = np.asarray(ids[:length], dtype=np.int32)
  out[:len(ids)] = ids
  return out


def byte_tokens(text: str | bytes, length: int) -> np.ndarray:
  """Byte-level tokens (LRA Text/Retrieval): UTF-8 bytes + 1, so 0 stays padding; vocabulary 257."""
  if isinstance(text, str):
    text = text.encode('utf-8')
  return pad_or_truncate(np.frombuffer(text, dtype=np.uint8).astype(np.int32) + 1, length)


BYTE_VOCAB_SIZE = 257


def atomic_write_text(path: str, text: str, newline: str = '') -> None:
  """Writes ``text`` to ``path`` via a temporary name and a rename: no half-written file survives a crash."""
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  tmp = f'{path}.tmp.{os.getpid()}'
  with open(tmp, 'w', encoding='utf-8', newline=newline) as f:
    f.write(text)
  os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# Seeded splits (Text, Image, Pathfinder).


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


def positive_max_length(data: Any, task: str) -> int:
  """``data.max_length`` of a byte-level task (Text, Retrieval), which must be at least one token."""
  max_length = int(data.max_length)
  if max_length < 1:
    raise DataError(f'{task}: data.max_length must be >= 1, got {max_length}')
  return max_length


def validation_fraction(data: Any, task: str) -> float:
  fraction = float(data.val_fraction)
  if not 0.0 < fraction < 1.0:
    raise DataError(f'{task}: data.val_fraction must be in (0, 1), got {fraction}')
  return fraction


def check_nonempty(task: str, arrays: Mapping[str, Any], split: str, hint: str) -> None:
  n = len(next(iter(arrays.values())))
  if n == 0:
    raise DataError(f'{task}: the {split} split is empty; {hint}')


# ----------------------------------------------------------------------------------------------
# TFDS datasets on disk (Text, Image).


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

  @property
  def full_name(self) -> str:
    """``name[/config]:version``, as ``tfds.builder`` and ``tfds.data_source`` take it."""
    return self.name + (f'/{self.config}' if self.config else '') + f':{self.version}'

  def root(self, data: Any) -> str:
    return os.path.expanduser(str(data.tfds_data_dir or data.data_dir))

  def base_dir(self, data: Any) -> str:
    parts = [self.root(data), self.name] + ([self.config] if self.config else [])
    return os.path.join(*parts)

  def expected_dir(self, data: Any) -> str:
    return os.path.join(self.base_dir(data), self.version)

  def shards(self, directory: str, split: str, file_format: str = 'array_record') -> list[str]:
    return sorted(glob.glob(os.path.join(directory, f'{self.name}-{split}.{file_format}-*')))

  def _is_prepared(self, directory: str) -> bool:
    return (os.path.isfile(os.path.join(directory, 'dataset_info.json'))
            and all(self.shards(directory, s) for s in self.splits))

  def prepared_dir(self, data: Any) -> str | None:
    """The version directory holding prepared array_record files (ours first, else the newest)."""
    if self._is_prepared(self.expected_dir(data)):
      return self.expected_dir(data)
    candidates = sorted(glob.glob(os.path.join(self.base_dir(data), '*')), reverse=True)
    for directory in candidates:
      if os.path.isdir(directory) and self._is_prepared(directory):
        return directory
    return None

  def holds_tfrecord(self, directory: str) -> bool:
    return any(self.shards(directory, s, 'tfrecord') for s in self.splits)

  def check(self, data: Any) -> list[str]:
    if not bool(data.tfds_check) or self.prepared_dir(data) is not None:
      return []
    directory = self.expected_dir(data)
    prepare = (f'run: python scripts/prepare_data.py --task {self.task} --data_dir {data.data_dir}'
               ' (or set data.tfds_data_dir to a TFDS data dir that has it)')
    if self.holds_tfrecord(directory):
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


def iter_tfds_split(dataset: TfdsDataset, data: Any, split: str,
                    convert: Callable[[Mapping[str, Any]], tuple[np.ndarray, int]]):
  """Yields ``convert(record)`` for every record of a TFDS split, in order, one record at a time.

  Records are read singly: the batched ``__getitems__`` of TFDS' mock data source is broken, and a
  single read costs the same per record.
  """
  source = dataset.open(data, split)
  for i in range(len(source)):
    yield convert(source[i])


def read_tfds_split(dataset: TfdsDataset, data: Any, split: str,
                    convert: Callable[[Mapping[str, Any]], tuple[np.ndarray, int]],
                    cache_key: tuple) -> tuple[np.ndarray, np.ndarray]:
  """``(inputs int32[N, L], targets int32[N])`` of a whole TFDS split, one record at a time.

  With real prepared data the result is cached per process (the trainer asks for train and val,
  both carved from TFDS' train split); ``cache_key`` must name everything ``convert`` depends on.
  Mock data (``data.tfds_check=False``) is never cached.
  """
  if bool(data.tfds_check):
    directory = dataset.prepared_dir(data)
    if directory is None:
      raise DataError(f'{dataset.task}: data missing: ' + '; '.join(dataset.check(data)))
    info = os.stat(os.path.join(directory, 'dataset_info.json'))
    return _cached_tfds_split(dataset, data, split, convert,
                              (directory, split, info.st_mtime_ns, *cache_key))
  return _read_tfds_split(dataset, data, split, convert)


def _read_tfds_split(dataset, data, split, convert):
  start = time.perf_counter()
  rows, targets = [], []
  for ids, target in iter_tfds_split(dataset, data, split, convert):
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


def csv_rows(reader, path: str, fix: str) -> Iterator[list[str]]:
  """The reader's rows; a csv fault (a field over csv's size limit, ...) is a DataError naming the line."""
  while True:
    try:
      row = next(reader)
    except StopIteration:
      return
    except csv.Error as e:
      raise DataError(f'{path}:{reader.line_num}: malformed row ({e}); {fix}') from None
    yield row
