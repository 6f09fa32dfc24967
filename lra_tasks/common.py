"""What every LRA task provides to the trainer, and small helpers shared by the task modules.

A task turns its upstream files into random-access sources of fixed-length examples::

    task = lra_tasks.get('listops')
    info = task.info(config.data)              # TaskInfo: classes, vocabulary, length, dual?
    missing = task.check(config.data)          # [] when everything needed is on disk
    task.prepare(config.data)                  # makes what can be made locally (ListOps), else no-op
    src = task.source(config.data, 'train')    # len(src), src[i] -> {'inputs': int32[L], 'targets': int32}

Dual tasks (Retrieval) give ``inputs1`` and ``inputs2`` instead of ``inputs``. Token id 0 is padding
in every task (the model derives its key padding mask from ``inputs != 0``), so vocabularies start at 1.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

PAD_ID = 0
SPLITS = ('train', 'val', 'test')


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

  @property
  def arrays(self) -> Mapping[str, np.ndarray]:
    return self._arrays


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
