"""Stop a multi-process run within seconds when one of its processes dies.

Without this, the survivors of a lost process wait inside their next collective until JAX's
coordination service misses the dead process's heartbeats (100 s by default) and then abort with a core
dump. ``PeerMonitor`` is a daemon thread started right after ``jax.distributed.initialize``: every
``interval_s`` each process increments a counter of its own in the coordination service's key-value
store and reads the others'. A peer whose counter has not moved for ``timeout_s`` (measured on this
process's clock, so hosts' clocks need not agree), or a coordinator that stops answering for as long,
ends this process with one line naming the lost process and exit code ``EXIT_PEER_LOST``. The main
thread may be blocked in a collective that will never complete, so the thread exits with ``os._exit``;
checkpoints are only ever replaced atomically, so the last complete one is kept.

A process that finishes normally stops its thread first (``stop``), and one whose client is shut down
(``jax.distributed.shutdown``) is not mistaken for a lost coordinator.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, Optional

EXIT_PEER_LOST = 5
_KEY = 'kernelformer/alive/{}'


def _client():
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.client


class PeerMonitor:
  """Heartbeats through the coordination service; exits this process when a peer stops beating."""

  def __init__(self, process_index: int, process_count: int, timeout_s: float,
               interval_s: float = 1.0, on_lost: Optional[Callable[[str], None]] = None,
               client_fn: Callable = _client):
    self.process_index = int(process_index)
    self.process_count = int(process_count)
    self.timeout_s = float(timeout_s)
    self.interval_s = float(interval_s)
    self._client_fn = client_fn
    self._on_lost = on_lost or _exit_with
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name='kernelformer-peers', daemon=True)

  def start(self) -> 'PeerMonitor':
    self._thread.start()
    return self

  def stop(self) -> None:
    self._stop.set()

  def _run(self) -> None:
    peers = [p for p in range(self.process_count) if p != self.process_index]
    now = time.monotonic()
    seen = {p: (None, now) for p in peers}       # last counter value, when it last changed
    contact = now                                # last successful exchange with the coordinator
    beat = 0
    while not self._stop.wait(self.interval_s):
      client = self._client_fn()
      if client is None:                         # jax.distributed.shutdown(): the run is over
        return
      beat += 1
      now = time.monotonic()
      try:
        client.key_value_set(_KEY.format(self.process_index), str(beat), allow_overwrite=True)
        for p in peers:
          try:
            value = client.key_value_try_get(_KEY.format(p))
          except Exception:  # pylint: disable=broad-except  (not written yet: counts as unchanged)
            value = None
          if value != seen[p][0]:
            seen[p] = (value, now)
        contact = now
      except Exception as e:  # pylint: disable=broad-except  (the coordinator may be gone)
        if self._stop.is_set() or self._client_fn() is None:
          return
        if now - contact > self.timeout_s:
          self._on_lost(f'lost contact with the coordinator (process 0) for {now - contact:.0f} s '
                        f'({type(e).__name__}); stopping process {self.process_index} too. The last '
                        'checkpoint is kept: restart all processes with the same command to resume.')
          return
        continue
      for p in peers:
        if now - seen[p][1] > self.timeout_s:
          self._on_lost(f'process {p} of {self.process_count} stopped responding (no heartbeat for '
                        f'{now - seen[p][1]:.0f} s); stopping process {self.process_index} too. The '
                        'last checkpoint is kept: restart all processes with the same command to '
                        'resume.')
          return


def _exit_with(line: str) -> None:
  print(line, file=sys.stderr, flush=True)
  os._exit(EXIT_PEER_LOST)  # pylint: disable=protected-access  (the main thread may be stuck in C++)


_MONITOR: Optional[PeerMonitor] = None


def start(timeout_s: float) -> Optional[PeerMonitor]:
  """Starts the monitor for this process of a multi-process run (no-op for one process or 0 s)."""
  global _MONITOR
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() < 2 or not timeout_s or timeout_s <= 0 or _MONITOR is not None:
    return _MONITOR
  _MONITOR = PeerMonitor(jax.process_index(), jax.process_count(), timeout_s,
                         interval_s=min(1.0, timeout_s / 5)).start()
  return _MONITOR


_TRANSPORT_ERRORS = ('gloo', 'connection reset', 'connection closed', 'connection refused',
                     'socket closed', 'unavailable', 'deadline_exceeded', 'broken pipe')


def handle_collective_failure(error: BaseException) -> None:
  """For an exception that reached the CLI: if it is a collective broken by a lost peer, end cleanly.

  Gloo notices a dead peer at once (``Connection reset by peer`` inside the next all-reduce), before
  the heartbeats do. The monitor is then given its timeout to name the silent process (it exits the
  process with that line); if every peer still beats, the error itself is the one line. Returns
  (doing nothing) for anything else, and in a single-process run.
  """
  if _MONITOR is None or 'RuntimeError' not in type(error).__name__:
    return
  text = str(error).strip()
  if not any(t in text.lower() for t in _TRANSPORT_ERRORS):
    return
  deadline = time.monotonic() + _MONITOR.timeout_s + 3 * _MONITOR.interval_s
  while time.monotonic() < deadline:   # the monitor's os._exit ends this wait if a peer is silent
    time.sleep(_MONITOR.interval_s)
  first = text.splitlines()[0] if text else type(error).__name__
  _exit_with(f'a cross-process collective failed ({first[:200]}); stopping process '
             f'{_MONITOR.process_index}. The last checkpoint is kept: restart all processes with the '
             'same command to resume.')


def stop() -> None:
  """Stops this process's heartbeats (a finished process must not look lost to slower peers)."""
  if _MONITOR is not None:
    _MONITOR.stop()
