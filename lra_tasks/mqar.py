"""Synthetic recall tasks for causal models, generated on the fly: MQAR and selective copy.

All are language-model tasks (``LMTaskInfo``): an example is ``inputs int32[L]`` and ``targets
int32[L]`` where ``targets[p]`` is the token the model must predict after reading ``inputs[:p + 1]``,
and 0 wherever nothing is asked: loss and accuracy count only the query positions. Example ``i`` of a
split is a pure function of ``(data.seed, split, i)``, so nothing is written to disk and every process
and resumed run sees the same data. The sources generate a whole batch at once, vectorised over its
examples (``*_batch``, "Batched generators" below); the per-example ``*_example`` functions define each
law draw by draw and are the reference the batched ones are tested against.

**MQAR** (``mqar``, the default) -- multi-query associative recall exactly as Zoology generates it
(Arora et al. 2023, §3.1; ``multiquery_ar`` in HazyResearch/zoology ``zoology/data/multiquery_ar.py``
at d88d6f5, lines 88-137; the same code as ``_mqar`` in ``zoology/data/associative_recall.py`` at
66f4918, lines 281-330, the commit behind the paper's figure 2). With ``V = data.vocab_size``,
``N = data.num_pairs``, ``L = data.max_length``:

* keys: ``N`` distinct ids from ``[1, V // 2)``; values: ``N`` distinct ids from ``[V // 2, V)``
  (both without replacement, so the values of one example are distinct);
* the sequence starts with the pairs ``k_1 v_1 ... k_N v_N`` (``2N`` tokens); the rest is ``0``;
* key ``k_i`` is queried once at position ``2N + 2 g_i``, where the gaps ``g_1..g_N`` are drawn without
  replacement from ``{0, ..., S - 1}``, ``S = (L - 2N) // 2``, with probabilities
  ``p(g) ∝ a (g + 1)^(a - 1)``, ``a = data.power_a`` (0.01): a power law, most queries soon after the
  pairs (``gap_pmf``);
* the target at a query position is the key's value; the value is **not** written after the query
  (the next token is ``0``), so later queries cannot be answered by elimination;
* ``data.random_non_queries`` (Zoology's flag; False in its figure-2 configs) replaces the ``0`` fillers
  by uniform ids from ``[0, V)``.

Token ``0`` is Zoology's filler, not padding: sequences are never padded, so ``LMTaskInfo.pad_id`` is
None and the decoder attends to every position, as Zoology's model does. With ``data.query_targets``
(default True) an example holds ``targets int32[N]`` and ``inputs_query_positions int32[N]`` (sorted):
the decoder computes logits only at those positions (the loss is the same; the ``V``-wide output
projection runs on ``N`` rows instead of ``L``). False gives ``targets int32[L]``, 0 off the queries.

**Legacy MQAR** (``mqar_legacy``, this repository's variant before it followed Zoology's generator, kept for its measured
runs): vocabulary ``0`` padding, ``1`` filler, keys ``[2, 2 + K)``, values ``[2 + K, V)`` with
``K = (V - 2) // 2``, values drawn **with** replacement, query slots uniform, and every queried key
followed by its value -- so a later query can be answered by elimination among the values not yet
shown (about 52 % at 4 pairs without any recall). Not Zoology's task.

**Selective copy** (Gu & Dao 2023, "Mamba", §3.1): ``N`` data tokens at random positions of a context of
``L - N - 1`` filler tokens, then a separator, then the data tokens again in order; the model must emit
them in order after the separator (targets at the separator and the first ``N - 1`` copied tokens).
Vocabulary ``0`` padding, ``1`` filler, ``2`` separator, data ``[3, V)``.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, Optional

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
  pad_id: Optional[int] = 0    # the padding token the decoder masks as a key; None: nothing is padding


def _split_size(data: Any, split: str) -> int:
  return int({'train': data.num_train, 'val': data.num_val, 'test': data.num_test}[split])


def gap_pmf(space: int, power_a: float) -> np.ndarray:
  """Zoology's query-gap distribution over ``{0, ..., space - 1}``: ``p(g) ∝ a (g + 1)^(a - 1)``
  (``multiquery_ar.py`` at d88d6f5, lines 115-117). The first key's gap has exactly this law; the
  others are drawn from it without replacement."""
  g = np.arange(1, space + 1, dtype=np.float64)
  p = power_a * g ** (power_a - 1.0)
  return p / p.sum()


def zoology_mqar_example(seed: int, split: str, index: int, *, vocab_size: int, num_pairs: int,
                         length: int, power_a: float = 0.01, random_non_queries: bool = False,
                         query_targets: bool = True) -> dict[str, np.ndarray]:
  """Zoology MQAR example ``index`` of ``split`` (module docstring, ``mqar``).

  Same distribution as Zoology's ``multiquery_ar`` (its draws, in its order: keys, values, gaps), from
  a per-example ``np.random.default_rng([seed, split, index])`` instead of one global seed.
  """
  rng = np.random.default_rng([int(seed), _SPLIT_IDS[split], int(index)])
  half = vocab_size // 2
  keys = 1 + rng.choice(half - 1, size=num_pairs, replace=False)            # [1, V/2)
  values = half + rng.choice(vocab_size - half, size=num_pairs, replace=False)   # [V/2, V), distinct
  context = 2 * num_pairs
  space = (length - context) // 2
  gaps = rng.choice(space, size=num_pairs, replace=False, p=gap_pmf(space, power_a))
  seq = np.zeros((length,), np.int32)
  seq[0:context:2], seq[1:context:2] = keys, values
  pos = context + 2 * gaps
  seq[pos] = keys                                   # the query; nothing is written after it
  if random_non_queries:
    fill = rng.integers(0, vocab_size, size=length)
    seq = np.where(seq == 0, fill, seq).astype(np.int32)
  order = np.argsort(pos)
  if query_targets:
    return {'inputs': seq, 'targets': values[order].astype(np.int32),
            'inputs_query_positions': pos[order].astype(np.int32)}
  targets = np.zeros((length,), np.int32)
  targets[pos] = values
  return {'inputs': seq, 'targets': targets}


def mqar_legacy_example(seed: int, split: str, index: int, *, vocab_size: int, num_pairs: int,
                        length: int) -> dict[str, np.ndarray]:
  """Legacy MQAR example ``index`` of ``split`` (module docstring, ``mqar_legacy``):
  ``inputs``, ``targets`` int32[length]."""
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


# ----------------------------------------------------------------------------------------------
# Batched generators: a whole batch of examples in numpy, vectorised over examples.
#
# Example ``i`` of a split is a pure function of ``(data.seed, split, i)`` through counter-based draws:
# draw ``j`` of stream ``s`` of example ``i`` is splitmix64 of the example's key (a hash of the root --
# ``(seed, split, task)`` through ``np.random.SeedSequence`` -- and ``i``) plus ``(s, j)``, so any set of
# indices is generated at once, in any order, with the same examples. The laws are those of the
# per-example generators above (which remain the reference; tests compare the two):
# * N distinct ids from ``[0, K)`` in random order (``rng.choice(K, N, replace=False)``): i.i.d. uniform
#   rows redrawn until their N entries are distinct (conditioned on distinctness, an i.i.d. row is a
#   uniform ordered sample without replacement); or, where that would redraw often (N(N-1) > 2K), the first
#   N of a uniform random permutation (``argsort`` of uniforms);
# * MQAR's gaps, N of ``S`` drawn without replacement with probabilities ``p`` (numpy's
#   ``choice(..., replace=False, p=p)``: successive sampling, each next gap ∝ p among the rest): the N
#   smallest of ``E_g / p_g``, ``E_g`` i.i.d. exponential, in increasing order (the exponential race).

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_TASK_TAGS = {'mqar': 1, 'mqar_legacy': 2, 'selective_copy': 3}


def _mix(x: np.ndarray) -> np.ndarray:
  """The splitmix64 finalizer on uint64 arrays (wrapping arithmetic)."""
  x = x ^ (x >> np.uint64(30))
  x = x * np.uint64(0xBF58476D1CE4E5B9)
  x = x ^ (x >> np.uint64(27))
  x = x * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


class _Draws:
  """Counter-based draws for examples ``indices`` of ``(seed, split, task)``."""

  def __init__(self, seed: int, split: str, task: str, indices: np.ndarray):
    state = np.random.SeedSequence([int(seed), _SPLIT_IDS[split], _TASK_TAGS[task]]).generate_state(
        1, np.uint64)[0]
    with np.errstate(over='ignore'):
      self.keys = _mix(_mix(np.asarray(indices, np.uint64) * _GOLDEN + _GOLDEN) ^ state)

  def uniform(self, stream: int, n: int, rows: np.ndarray | None = None) -> np.ndarray:
    """float64 ``[rows, n]`` uniform on ``[0, 1)`` (53 bits): stream ``stream``'s first ``n`` draws."""
    keys = self.keys if rows is None else self.keys[rows]
    counter = (np.uint64(stream) << np.uint64(32)) + np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over='ignore'):
      bits = _mix(keys[:, None] + counter[None, :] * _GOLDEN)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))

  def integers(self, stream: int, n: int, high: int, rows: np.ndarray | None = None) -> np.ndarray:
    """int64 ``[rows, n]`` uniform on ``[0, high)``."""
    return np.floor(self.uniform(stream, n, rows) * high).astype(np.int64)


def _distinct(draws: _Draws, stream: int, n: int, high: int) -> np.ndarray:
  """int64 ``[B, n]``: per example ``n`` distinct ids from ``[0, high)`` in uniformly random order."""
  b = len(draws.keys)
  if n * (n - 1) > 2 * high:    # an i.i.d. row would be distinct with probability < ~e^-1
    return np.argsort(draws.uniform(stream << 16, high), axis=1, kind='stable')[:, :n]
  out = np.empty((b, n), np.int64)
  pending = np.arange(b)
  for attempt in range(1 << 16):
    cand = draws.integers((stream << 16) + attempt, n, high, pending)
    srt = np.sort(cand, axis=1)
    ok = ~np.any(srt[:, 1:] == srt[:, :-1], axis=1)
    out[pending[ok]] = cand[ok]
    pending = pending[~ok]
    if not len(pending):
      return out
  raise RuntimeError('no distinct draw after 65536 attempts')   # p(accept) >~ e^-1 per attempt


def _successive(draws: _Draws, stream: int, n: int, p: np.ndarray) -> np.ndarray:
  """int64 ``[B, n]``: per example ``n`` of ``range(len(p))`` without replacement, each next one drawn
  ∝ ``p`` among the rest (the exponential race: the n smallest of ``E / p``, in order)."""
  race = -np.log1p(-draws.uniform(stream << 16, len(p))) / p[None, :]
  if n < len(p):
    part = np.argpartition(race, n - 1, axis=1)[:, :n]
  else:
    part = np.broadcast_to(np.arange(len(p)), race.shape)
  order = np.argsort(np.take_along_axis(race, part, axis=1), axis=1, kind='stable')
  return np.take_along_axis(part, order, axis=1)


def zoology_mqar_batch(seed: int, split: str, indices, *, vocab_size: int, num_pairs: int,
                       length: int, power_a: float = 0.01, random_non_queries: bool = False,
                       query_targets: bool = True) -> dict[str, np.ndarray]:
  """Zoology MQAR examples ``indices`` of ``split`` as one batch (``zoology_mqar_example``'s law)."""
  draws = _Draws(seed, split, 'mqar', indices)
  b, n = len(draws.keys), num_pairs
  half = vocab_size // 2
  keys = 1 + _distinct(draws, 1, n, half - 1)
  values = half + _distinct(draws, 2, n, vocab_size - half)
  context = 2 * n
  space = (length - context) // 2
  gaps = _successive(draws, 3, n, gap_pmf(space, power_a))
  seq = np.zeros((b, length), np.int32)
  seq[:, 0:context:2], seq[:, 1:context:2] = keys, values
  pos = context + 2 * gaps
  np.put_along_axis(seq, pos, keys.astype(np.int32), axis=1)
  if random_non_queries:
    fill = draws.integers(4 << 16, length, vocab_size).astype(np.int32)
    seq = np.where(seq == 0, fill, seq)
  if query_targets:
    order = np.argsort(pos, axis=1)
    return {'inputs': seq,
            'targets': np.take_along_axis(values, order, axis=1).astype(np.int32),
            'inputs_query_positions': np.take_along_axis(pos, order, axis=1).astype(np.int32)}
  targets = np.zeros((b, length), np.int32)
  np.put_along_axis(targets, pos, values.astype(np.int32), axis=1)
  return {'inputs': seq, 'targets': targets}


def mqar_legacy_batch(seed: int, split: str, indices, *, vocab_size: int, num_pairs: int,
                      length: int) -> dict[str, np.ndarray]:
  """Legacy MQAR examples ``indices`` of ``split`` as one batch (``mqar_legacy_example``'s law)."""
  draws = _Draws(seed, split, 'mqar_legacy', indices)
  b, n = len(draws.keys), num_pairs
  num_keys = (vocab_size - 2) // 2
  keys = 2 + _distinct(draws, 1, n, num_keys)
  values = 2 + num_keys + draws.integers(2 << 16, n, vocab_size - 2 - num_keys)
  slots = (length - 2 * n) // 2
  chosen = np.sort(_distinct(draws, 3, n, slots), axis=1)
  order = np.argsort(draws.uniform(4 << 16, n), axis=1)         # a uniform permutation of the pairs
  seq = np.full((b, length), FILLER, np.int32)
  targets = np.zeros((b, length), np.int32)
  seq[:, 0:2 * n:2], seq[:, 1:2 * n:2] = keys, values
  pos = 2 * n + 2 * chosen
  asked, answers = (np.take_along_axis(x, order, axis=1).astype(np.int32) for x in (keys, values))
  np.put_along_axis(seq, pos, asked, axis=1)
  np.put_along_axis(seq, pos + 1, answers, axis=1)
  np.put_along_axis(targets, pos, answers, axis=1)
  return {'inputs': seq, 'targets': targets}


def selective_copy_batch(seed: int, split: str, indices, *, vocab_size: int, num_tokens: int,
                         length: int) -> dict[str, np.ndarray]:
  """Selective-copy examples ``indices`` of ``split`` as one batch (``selective_copy_example``'s law)."""
  draws = _Draws(seed, split, 'selective_copy', indices)
  b, n = len(draws.keys), num_tokens
  context = length - n - 1
  data = (3 + draws.integers(1 << 16, n, vocab_size - 3)).astype(np.int32)
  seq = np.full((b, length), FILLER, np.int32)
  targets = np.zeros((b, length), np.int32)
  np.put_along_axis(seq, np.sort(_distinct(draws, 2, n, context), axis=1), data, axis=1)
  seq[:, context] = SEPARATOR
  seq[:, context + 1:] = data
  targets[:, context:length - 1] = data
  return {'inputs': seq, 'targets': targets}


class GeneratedSource:
  """Examples generated on access from ``(seed, split, i)``; ``len(src)`` of them.

  ``read_batch(indices)`` generates a batch at once (``make_batch``); ``src[i]`` is row 0 of the batch
  ``[i]``, so both give the same examples."""

  def __init__(self, make_batch, size: int):
    self._make_batch, self._size = make_batch, size

  def __len__(self) -> int:
    return self._size

  def read_batch(self, indices) -> dict[str, np.ndarray]:
    indices = np.asarray(indices, np.int64)
    if len(indices) and (indices.min() < 0 or indices.max() >= self._size):
      raise IndexError(f'indices outside [0, {self._size})')
    return self._make_batch(indices)

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    if not 0 <= int(i) < self._size:
      raise IndexError(i)
    return {k: v[0] for k, v in self._make_batch(np.array([int(i)], np.int64)).items()}


class _RecallTask(abc.ABC):
  """A generated task: ``_batch(seed, split, idx, **_options(data))`` gives its examples."""
  name = ''
  pad_id: Optional[int] = 0

  @abc.abstractmethod
  def _validate(self, data: Any) -> None:
    """Raises a one-line error for settings the generator cannot satisfy."""

  def info(self, data: Any) -> LMTaskInfo:
    self._validate(data)
    v = int(data.vocab_size)
    return LMTaskInfo(num_classes=v, vocab_size=v, max_length=int(data.max_length), pad_id=self.pad_id)

  def source(self, data: Any, split: str) -> GeneratedSource:
    self._validate(data)
    batch, kw, seed = self._batch, self._options(data), int(data.seed)
    return GeneratedSource(lambda idx: batch(seed, split, idx, **kw), _split_size(data, split))

  def check(self, data: Any) -> list[str]:
    del data
    return []       # generated on the fly: nothing on disk

  def prepare(self, data: Any) -> None:
    del data


class MQARTask(_RecallTask):
  """Zoology's MQAR (module docstring)."""

  name = 'mqar'
  pad_id = None
  _batch = staticmethod(zoology_mqar_batch)

  def _validate(self, data: Any) -> None:
    v, n, length = int(data.vocab_size), int(data.num_pairs), int(data.max_length)
    a = float(data.get('power_a', 0.01))
    if n < 1:
      raise common.DataError(f'mqar: data.num_pairs={n} must be >= 1 (key-value pairs per sequence)')
    if length < 4 * n or length % 2:
      raise common.DataError(f'mqar: data.max_length={length} must be even and >= 4 * num_pairs = '
                             f'{4 * n} (the pairs, then a query slot pair per key; as Zoology); '
                             f'lower data.num_pairs or raise data.max_length')
    if v // 2 - 1 < n:
      raise common.DataError(f'mqar: data.vocab_size={v} gives {max(v // 2 - 1, 0)} keys [1, V/2), '
                             f'fewer than data.num_pairs={n} (need vocab_size >= 2 * num_pairs + 2)')
    if not a > 0:
      raise common.DataError(f'mqar: data.power_a={a} must be > 0 (1.0 = uniform gaps)')

  def _options(self, data: Any) -> dict:
    return dict(vocab_size=int(data.vocab_size), num_pairs=int(data.num_pairs),
                length=int(data.max_length), power_a=float(data.get('power_a', 0.01)),
                random_non_queries=bool(data.get('random_non_queries', False)),
                query_targets=bool(data.get('query_targets', True)))


class LegacyMQARTask(_RecallTask):
  """This repository's MQAR before it followed Zoology's generator (module docstring, ``mqar_legacy``)."""

  name = 'mqar_legacy'
  _batch = staticmethod(mqar_legacy_batch)

  def _validate(self, data: Any) -> None:
    v, n, length = int(data.vocab_size), int(data.num_pairs), int(data.max_length)
    num_keys = (v - 2) // 2
    if n < 1:
      raise common.DataError(f'mqar_legacy: data.num_pairs={n} must be >= 1 (key-value pairs per '
                             f'sequence)')
    if length < 4 * n:
      raise common.DataError(f'mqar_legacy: data.max_length={length} must be >= 4 * num_pairs = {4 * n} '
                             '(the pairs, then every key queried once with its value); lower '
                             'data.num_pairs or raise data.max_length')
    if num_keys < n or v - 2 - num_keys < 1:
      raise common.DataError(f'mqar_legacy: data.vocab_size={v} gives {num_keys} keys, fewer than '
                             f'data.num_pairs={n} (need vocab_size >= 2 * num_pairs + 2)')

  def _options(self, data: Any) -> dict:
    return dict(vocab_size=int(data.vocab_size), num_pairs=int(data.num_pairs), length=int(data.max_length))


class SelectiveCopyTask(_RecallTask):
  name = 'selective_copy'
  _batch = staticmethod(selective_copy_batch)

  def _validate(self, data: Any) -> None:
    v, n, length = int(data.vocab_size), int(data.num_pairs), int(data.max_length)
    if v < 4 or n < 1 or length < 2 * n + 1:
      raise common.DataError(f'selective_copy: need vocab_size >= 4, num_pairs >= 1 (tokens to copy) '
                             f'and max_length >= 2 * num_pairs + 1; got {v}, {n}, {length}')

  def _options(self, data: Any) -> dict:
    return dict(vocab_size=int(data.vocab_size), num_tokens=int(data.num_pairs), length=int(data.max_length))


TASK = MQARTask()
LEGACY = LegacyMQARTask()
SELECTIVE_COPY = SelectiveCopyTask()
