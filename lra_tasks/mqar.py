"""Synthetic recall tasks for causal models, generated on the fly: MQAR and selective copy.

Both are language-model tasks (``LMTaskInfo``): an example is ``inputs int32[L]`` and ``targets
int32[L]`` where ``targets[p]`` is the token the model must predict after reading ``inputs[:p + 1]``,
and 0 wherever nothing is asked: loss and accuracy count only the query positions. Example ``i`` of a
split is a pure function of ``(data.seed, split, i)`` (``np.random.default_rng([seed, split, i])``), so
nothing is written to disk and every process and resumed run sees the same data.

**MQAR** -- multi-query associative recall (Arora et al. 2023, "Zoology", §3.1 and their
``multiquery_ar`` generator). Vocabulary ``0`` padding, ``1`` filler, keys ``[2, 2 + K)``, values
``[2 + K, V)`` with ``K = (V - 2) // 2``. A sequence holds ``N = data.num_pairs`` key-value pairs with
distinct keys (``k_1 v_1 ... k_N v_N``), then every key once more, in a random order, each at a random
slot of the rest of the sequence and followed by its value; the other positions hold the filler. The
target at a queried key is its value. Zoology draws the query gaps from a power law and uses token 0 as
filler; here the slots are uniform and the filler is its own token (0 is padding in this codebase).

**Selective copy** (Gu & Dao 2023, "Mamba", §3.1): ``N`` data tokens at random positions of a context of
``L - N - 1`` filler tokens, then a separator, then the data tokens again in order; the model must emit
them in order after the separator (targets at the separator and the first ``N - 1`` copied tokens).
Vocabulary ``0`` padding, ``1`` filler, ``2`` separator, data ``[3, V)``.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any

import numpy as np

from lra_tasks import common

FILLER = 1
SEPARATOR = 2
_SPLIT_IDS = {'train': 0, 'val': 1, 'test': 2}


@dataclasses.dataclass(frozen=True)
class LMTaskInfo(common.TaskInfo):
  """A causal language-model task: per-position targets, the decoder, and the metric to report."""

  language_model: bool = True
  metric: str = 'accuracy'     # 'accuracy' (on target positions) | 'bits_per_byte'


def _split_size(data: Any, split: str) -> int:
  return int({'train': data.num_train, 'val': data.num_val, 'test': data.num_test}[split])


def mqar_example(seed: int, split: str, index: int, *, vocab_size: int, num_pairs: int,
                 length: int) -> dict[str, np.ndarray]:
  """MQAR example ``index`` of ``split`` (module docstring): ``inputs``, ``targets`` int32[length]."""
  rng = np.random.default_rng([int(seed), _SPLIT_IDS[split], int(index)])
  num_keys = (vocab_size - 2) // 2
  keys = 2 + rng.choice(num_keys, size=num_pairs, replace=False)
  values = 2 + num_keys + rng.integers(0, vocab_size - 2 - num_keys, size=num_pairs)
  seq = np.full((length,), FILLER, np.int32)
  targets = np.zeros((length,), np.int32)
  seq[0:2 * num_pairs:2], seq[1:2 * num_pairs:2] = keys, values
  slots = (length - 2 * num_pairs) // 2
  chosen = np.sort(rng.choice(slots, size=num_pairs, replace=False))
  order = rng.permutation(num_pairs)
  pos = 2 * num_pairs + 2 * chosen
  seq[pos], seq[pos + 1] = keys[order], values[order]
  targets[pos] = values[order]
  return {'inputs': seq, 'targets': targets}


def selective_copy_example(seed: int, split: str, index: int, *, vocab_size: int, num_tokens: int,
                           length: int) -> dict[str, np.ndarray]:
  """Selective-copy example ``index`` of ``split`` (module docstring)."""
  rng = np.random.default_rng([int(seed), _SPLIT_IDS[split], int(index)])
  context = length - num_tokens - 1
  data = 3 + rng.integers(0, vocab_size - 3, size=num_tokens)
  seq = np.full((length,), FILLER, np.int32)
  targets = np.zeros((length,), np.int32)
  seq[np.sort(rng.choice(context, size=num_tokens, replace=False))] = data
  seq[context] = SEPARATOR
  seq[context + 1:] = data
  targets[context:length - 1] = data
  return {'inputs': seq, 'targets': targets}


class GeneratedSource:
  """``src[i]`` generated on access from ``(seed, split, i)``; ``len(src)`` examples."""

  def __init__(self, make, size: int):
    self._make, self._size = make, size

  def __len__(self) -> int:
    return self._size

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    if not 0 <= int(i) < self._size:
      raise IndexError(i)
    return self._make(int(i))


class _RecallTask(abc.ABC):
  name = ''

  @abc.abstractmethod
  def _validate(self, data: Any) -> None:
    """Raises a one-line error for settings the generator cannot satisfy."""

  def info(self, data: Any) -> LMTaskInfo:
    self._validate(data)
    v = int(data.vocab_size)
    return LMTaskInfo(num_classes=v, vocab_size=v, max_length=int(data.max_length))

  def check(self, data: Any) -> list[str]:
    del data
    return []       # generated on the fly: nothing on disk

  def prepare(self, data: Any) -> None:
    del data


class MQARTask(_RecallTask):
  name = 'mqar'

  def _validate(self, data: Any) -> None:
    v, n, length = int(data.vocab_size), int(data.num_pairs), int(data.max_length)
    num_keys = (v - 2) // 2
    if n < 1 or num_keys < n or v - 2 - num_keys < 1:
      raise common.DataError(f'mqar: data.vocab_size={v} gives {num_keys} keys, fewer than '
                             f'data.num_pairs={n} (need vocab_size >= 2 * num_pairs + 2)')
    if length < 4 * n:
      raise common.DataError(f'mqar: data.max_length={length} must be >= 4 * num_pairs = {4 * n} '
                             '(the pairs, then every key queried once with its value)')

  def source(self, data: Any, split: str) -> GeneratedSource:
    self._validate(data)
    kw = dict(vocab_size=int(data.vocab_size), num_pairs=int(data.num_pairs),
              length=int(data.max_length))
    seed = int(data.seed)
    return GeneratedSource(lambda i: mqar_example(seed, split, i, **kw), _split_size(data, split))


class SelectiveCopyTask(_RecallTask):
  name = 'selective_copy'

  def _validate(self, data: Any) -> None:
    v, n, length = int(data.vocab_size), int(data.num_pairs), int(data.max_length)
    if v < 4 or n < 1 or length < 2 * n + 1:
      raise common.DataError(f'selective_copy: need vocab_size >= 4, num_pairs >= 1 (tokens to copy) '
                             f'and max_length >= 2 * num_pairs + 1; got {v}, {n}, {length}')

  def source(self, data: Any, split: str) -> GeneratedSource:
    self._validate(data)
    kw = dict(vocab_size=int(data.vocab_size), num_tokens=int(data.num_pairs),
              length=int(data.max_length))
    seed = int(data.seed)
    return GeneratedSource(lambda i: selective_copy_example(seed, split, i, **kw),
                           _split_size(data, split))


TASK = MQARTask()
SELECTIVE_COPY = SelectiveCopyTask()
