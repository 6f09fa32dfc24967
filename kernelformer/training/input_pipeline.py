"""Batches from a task's random-access source, indexed by step: the data position is the step.

Training batch ``s`` holds positions ``s * B ... (s + 1) * B - 1`` of an endless stream of epochs; epoch
``e`` visits the source in the order of one numpy permutation drawn from ``(seed, e)``
(``epoch_order``). Because a batch is a pure function of (source, seed, step), resuming at step s
reproduces exactly the batches an uninterrupted run would have seen, with no iterator state to
checkpoint, and every process reads only its own rows of each global batch.

A source that has ``read_batch(indices)`` (``lra_tasks.common``: arrays, memory-mapped caches, the
generated recall tasks) answers a batch in one call; any other random-access source (a plugin's list of
dicts) is read one example at a time and stacked (``collate``). Both give the same batch.

``TrainBatches.device_iterate`` reads the batches of steps ``start..stop-1`` in a background thread and
places each on the devices, batch-sharded as the compiled step expects, ``PREFETCH`` steps ahead: the
next batch is on the device while the current step runs.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Iterator, Mapping, Sequence

import jax
import numpy as np

from kernelformer.training import sharding

# The order of training examples and the generated tasks' examples, recorded in results.json
# (``data_order``) and in every checkpoint: a run resumed under another version sees other batches
# from the resume step on, which is recorded and warned about (``data_order_segments``).
#   1: grain ``MapDataset.shuffle`` per element (seed hashed), recall tasks generated one example at a
#      time from ``np.random.default_rng([seed, split, i])``.
#   2: one numpy permutation per epoch (``epoch_order``); recall tasks generated a batch at a time from
#      counter-based draws (``lra_tasks/mqar.py``), with the same distribution.
DATA_ORDER = 2
# Training batches placed on the devices ahead of their step (flax's prefetch_to_device).
PREFETCH = 2


def collate(examples: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
  return {k: np.stack([np.asarray(e[k]) for e in examples]) for k in examples[0]}


def read(source, indices: np.ndarray) -> dict[str, np.ndarray]:
  """Examples ``indices`` of ``source`` as one batch: ``source.read_batch`` when it has one, else its
  examples stacked."""
  read_batch = getattr(source, 'read_batch', None)
  if read_batch is not None:
    return read_batch(indices)
  return collate([source[int(i)] for i in indices])


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
  """Epoch ``epoch``'s order of ``n`` examples under run seed ``seed``: a permutation drawn from
  ``np.random.default_rng([seed, epoch])`` -- independent across epochs and across seeds (seed s's
  epoch e is not seed s+1's epoch e-1)."""
  return np.random.default_rng([int(seed), int(epoch)]).permutation(n)


def data_order_segments(previous, start: int, resumed: bool) -> list:
  """The data order that fed each stretch of the run: ``[{'from_step', 'data_order'}, ...]``.

  A run resumed under another ``DATA_ORDER`` trains on other batches from the resume step on (not the
  ones an uninterrupted run would have seen): legal, never silent -- a new entry starts at the resume
  step and one warning line says so. Checkpoints older than this field had order 1.
  """
  segments = [dict(s) for s in previous] if isinstance(previous, list) else []
  if resumed and not segments and start > 0:
    segments = [{'from_step': 0, 'data_order': 1}]
  if segments and segments[-1].get('data_order') == DATA_ORDER:
    return segments
  if segments:
    logging.warning('resumed at step %d under data order %d; the steps before it saw data order %s, '
                    'so the run is not the uninterrupted one (results.json data_order)', start,
                    DATA_ORDER, segments[-1].get('data_order'))
  segments.append({'from_step': int(start), 'data_order': DATA_ORDER})
  return segments


def stages_on_host(mesh) -> bool:
  """One process whose devices are CPUs: a "device" buffer is host memory, so placing a batch ahead
  buys no overlap, and ``jax.device_put`` costs more host time (Python, per leaf) than the copy the
  compiled step makes of a numpy argument in its own (C++) dispatch."""
  return jax.process_count() == 1 and all(d.platform == 'cpu' for d in mesh.devices.flat)


def placer(mesh, whole: bool = False):
  """``batch -> batch on mesh``, sharded along its leading axes; the identity where the compiled step
  places its numpy arguments itself (``stages_on_host``). ``whole``: every process holds the whole
  batch (a population's, ``TrainBatches(whole=True)``) and places the blocks of its devices."""
  if stages_on_host(mesh):
    return lambda b: b
  data = sharding.batch_sharded(mesh)
  if jax.process_count() == 1:   # one call for the whole dict: half the time of shard_batch
    return lambda b: jax.device_put(b, data)
  if whole:
    return lambda b: {k: jax.make_array_from_callback(v.shape, data, v.__getitem__) for k, v in b.items()}
  return lambda b: sharding.shard_batch(b, mesh)


_END = object()


def _work(out: queue.Queue, stop: threading.Event, items, make) -> None:
  def put(item) -> bool:
    while not stop.is_set():
      try:
        out.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False
  try:
    for i in items:
      if not put((make(i), None)):
        return
  except BaseException as e:  # pylint: disable=broad-except
    put((None, e))
    return
  put((_END, None))


class _Ahead:
  """Yields ``make(i)`` for ``i`` in ``items``, computed by one background thread at most ``size``
  items ahead of the consumer. An exception in the thread is raised at the consumer's next item;
  ``close``, or dropping the iterator (the thread holds no reference to it), stops the thread."""

  def __init__(self, items, make, size: int):
    self._queue = queue.Queue(maxsize=max(1, size))
    self._stop = threading.Event()
    self._done = False
    self._thread = threading.Thread(target=_work, args=(self._queue, self._stop, items, make),
                                    daemon=True, name='kernelformer-input')
    self._thread.start()

  def __iter__(self):
    return self

  def __next__(self):
    if self._done:
      raise StopIteration
    item, error = self._queue.get()
    if error is not None:
      self.close()
      raise error
    if item is _END:
      self.close()
      raise StopIteration
    return item

  def close(self) -> None:
    """Stops the thread and waits for the item it is making: a thread still inside a jax call (a
    device_put) when the interpreter exits is ended by Python with ``pthread_exit``, which aborts the
    process from the C++ frames it unwinds."""
    self._done = True
    self._stop.set()
    thread = getattr(self, '_thread', None)
    if thread is not None and thread.is_alive() and thread is not threading.current_thread():
      thread.join(timeout=30)

  def __del__(self):
    self.close()


class TrainBatches:
  """Process-local training batches of a source: ``batch(step)`` and iterators over steps."""

  def __init__(self, source, global_batch: int, seed: int, whole: bool = False):
    self._n = len(source)
    if self._n == 0:
      raise ValueError('the training split is empty')
    self._source = source
    self._seed = int(seed)
    self._global_batch = global_batch
    self._rows = slice(0, global_batch) if whole else sharding.local_slice(global_batch)
    self._orders: dict[int, np.ndarray] = {}   # the last few epochs' permutations

  def _order(self, epoch: int) -> np.ndarray:
    order = self._orders.get(epoch)
    if order is None:
      order = epoch_order(self._n, self._seed, epoch)
      if len(self._orders) >= 4:
        self._orders.pop(min(self._orders))
      self._orders[epoch] = order
    return order

  def indices(self, step: int) -> np.ndarray:
    """The source indices of this process's rows of training batch ``step``."""
    base = int(step) * self._global_batch
    positions = np.arange(base + self._rows.start, base + self._rows.stop, dtype=np.int64)
    epochs, offsets = np.divmod(positions, self._n)
    first, last = int(epochs[0]), int(epochs[-1])
    if first == last:
      return self._order(first)[offsets]
    out = np.empty_like(positions)
    for e in range(first, last + 1):
      here = epochs == e
      out[here] = self._order(e)[offsets[here]]
    return out

  def batch(self, step: int) -> dict[str, np.ndarray]:
    return read(self._source, self.indices(step))

  def iterate(self, start: int, stop: int) -> Iterator[dict[str, np.ndarray]]:
    """Host (numpy) batches of steps ``start..stop-1``, read ``PREFETCH`` ahead in a thread."""
    return _Ahead(range(start, stop), self.batch, PREFETCH)

  def device_iterate(self, start: int, stop: int, mesh) -> Iterator[dict]:
    """Batches of steps ``start..stop-1`` on ``mesh`` as the compiled step takes them, each read and
    placed by a background thread ``PREFETCH`` steps ahead of the consumer."""
    return placed_ahead(self.batch, start, stop, mesh)


def placed_ahead(batch_of_step, start: int, stop: int, mesh, whole: bool = False) -> Iterator[dict]:
  """``batch_of_step(s)`` for steps ``start..stop-1``, placed on ``mesh`` (``placer``) by a background
  thread ``PREFETCH`` steps ahead of the consumer."""
  place = placer(mesh, whole)
  return _Ahead(range(start, stop), lambda s: place(batch_of_step(s)), PREFETCH)


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
    batch = read(source, np.where(valid, idx, 0))
    batch['weights'] = valid.astype(np.float32)
    yield batch
