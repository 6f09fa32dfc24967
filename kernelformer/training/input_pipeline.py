"""Batches from a task's random-access source, indexed by step: the data position is the step.

Training batch ``s`` holds elements ``s * B ... (s + 1) * B - 1`` of a grain ``MapDataset`` that is shuffled
with the run's seed and reshuffled every epoch. Because a batch is a pure function of (source, seed, step),
resuming at step s reproduces exactly the batches an uninterrupted run would have seen, with no iterator
state to checkpoint, and every process reads only its own rows of each global batch.
"""
from __future__ import annotations

from typing import Iterator, Mapping, Sequence

import grain
import numpy as np

from kernelformer.training import sharding


def collate(examples: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
  return {k: np.stack([np.asarray(e[k]) for e in examples]) for k in examples[0]}


def shuffle_seed(seed: int) -> int:
  """The grain shuffle seed of a run seed: a 32-bit hash, not the seed itself.

  grain reshuffles epoch e with seed ``shuffle_seed + e``, so passing run seeds straight through would
  make seed s's epoch e the same order as seed s + 1's epoch e - 1 (a seed sweep would share its data
  orders, shifted by an epoch). Hashed seeds are far apart, so no two runs share an epoch's order.
  """
  return int(np.random.SeedSequence(int(seed)).generate_state(1, np.uint32)[0])


class TrainBatches:
  """Process-local training batches for steps ``start..stop-1``, prefetched by grain threads."""

  def __init__(self, source, global_batch: int, seed: int):
    if len(source) == 0:
      raise ValueError('the training split is empty')
    self._elements = grain.MapDataset.source(source).shuffle(seed=shuffle_seed(seed)).repeat(None)
    self._global_batch = global_batch
    self._rows = sharding.local_slice(global_batch)

  def batch(self, step: int) -> dict[str, np.ndarray]:
    base = int(step) * self._global_batch
    return collate([self._elements[base + i]
                    for i in range(self._rows.start, self._rows.stop)])

  def iterate(self, start: int, stop: int, num_threads: int = 2) -> Iterator[dict[str, np.ndarray]]:
    steps = grain.MapDataset.range(start, stop).map(self.batch)
    return iter(steps.to_iter_dataset(
        grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=4)))


def eval_batches(source, global_batch: int, max_batches: int = 0) -> Iterator[dict[str, np.ndarray]]:
  """The whole split in order, in fixed-shape batches; padding rows carry ``weights`` 0."""
  n = len(source)
  num = -(-n // global_batch)
  if max_batches:
    num = min(num, max_batches)
  rows = sharding.local_slice(global_batch)
  for b in range(num):
    idx = np.arange(b * global_batch + rows.start, b * global_batch + rows.stop)
    valid = idx < n
    batch = collate([source[int(i) if ok else 0] for i, ok in zip(idx, valid)])
    batch['weights'] = valid.astype(np.float32)
    yield batch
