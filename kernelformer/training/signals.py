"""Stopping a run cleanly: SIGINT/SIGTERM as a flag the loop polls, and a watchdog for hung steps.

``StopSignals`` replaces the SIGINT and SIGTERM handlers while the training loop runs. The first signal
only sets a flag: the loop finishes the step in flight (whose input state was donated to it, so no
earlier state exists to save), saves a checkpoint of the state it returned, and stops with exit code
130 (SIGINT) or 143 (SIGTERM, how schedulers preempt). A second signal while nothing is being written
stops at once without saving (the last checkpoint stays); during a checkpoint write every signal is
deferred until the write is complete, so an interrupt never leaves a half-written checkpoint behind.

``Watchdog`` is a daemon thread: when no progress (a train step, an evaluation batch) is reported
within the armed time limit, it prints one line naming the step and what it was doing and ends the
process with ``os._exit`` (a hung XLA call cannot be interrupted from Python). It saves nothing.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Optional

from kernelformer.training import workdir as workdir_lib

_NAMES = {signal.SIGINT: 'SIGINT', signal.SIGTERM: 'SIGTERM'}
EXIT_CODES = {signal.SIGINT: workdir_lib.EXIT_SIGINT, signal.SIGTERM: workdir_lib.EXIT_SIGTERM}


class StopSignals:
  """Context manager: SIGINT/SIGTERM set ``self.signum`` instead of killing the process.

  Installs handlers only in the main thread (Python's rule); elsewhere it is a flag nobody sets.
  """

  def __init__(self):
    self.signum: Optional[int] = None
    self._previous: dict = {}
    self._saving = 0
    self._deferred_second = False

  def __enter__(self) -> 'StopSignals':
    if threading.current_thread() is threading.main_thread():
      for s in _NAMES:
        self._previous[s] = signal.signal(s, self._handle)
    return self

  def __exit__(self, *exc) -> bool:
    for s, h in self._previous.items():
      signal.signal(s, h)
    self._previous = {}
    return False

  def _handle(self, signum, frame) -> None:
    del frame
    if self.signum is None:
      self.signum = signum
      workdir_lib.say(f'{_NAMES[signum]}: stopping after this step and saving a checkpoint '
                      f'(press Ctrl-C again to stop without saving)')
      return
    if self._saving:
      self._deferred_second = True   # acted on once the checkpoint write is complete
      return
    raise workdir_lib.RunError(
        f'{_NAMES[signum]} again: stopped without saving; the last checkpoint on disk is kept; '
        f'run the same command to resume from it', EXIT_CODES[signum])

  @contextlib.contextmanager
  def deferred(self):
    """Within this block signals are only recorded: a checkpoint write is never cut short."""
    self._saving += 1
    try:
      yield
    finally:
      self._saving -= 1

  @property
  def requested(self) -> bool:
    return self.signum is not None

  def stop_error(self, saved_step: Optional[int], workdir: str) -> workdir_lib.RunError:
    what = (f'checkpoint saved at step {saved_step}' if saved_step is not None
            else 'no new step to save')
    return workdir_lib.RunError(
        f'{_NAMES[self.signum]}: {what}; run the same command to resume (workdir {workdir})',
        EXIT_CODES[self.signum])


class Watchdog:
  """Exits the process (``EXIT_HUNG``) when the armed deadline passes without ``arm``/``disarm``."""

  def __init__(self, poll_s: float = 1.0):
    self._lock = threading.Lock()
    self._deadline: Optional[float] = None
    self._what = ''
    self._limit = 0.0
    self._poll = poll_s
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self.on_fire = None   # called (e.g. to release the workdir lock) before the process exits

  def arm(self, what: str, limit_s: float) -> None:
    """From now, ``what`` must finish (the next ``arm`` or ``disarm``) within ``limit_s`` (0: no limit)."""
    with self._lock:
      self._what = what
      self._limit = float(limit_s)
      self._deadline = time.monotonic() + self._limit if limit_s and limit_s > 0 else None
    if self._deadline is not None and self._thread is None:
      self._thread = threading.Thread(target=self._watch, name='kernelformer-watchdog', daemon=True)
      self._thread.start()

  def disarm(self) -> None:
    with self._lock:
      self._deadline = None

  def close(self) -> None:
    self._stop.set()
    self.disarm()

  def _watch(self) -> None:
    while not self._stop.wait(min(self._poll, max(self._limit / 10, 0.05))):
      with self._lock:
        late = self._deadline is not None and time.monotonic() > self._deadline
        what, limit = self._what, self._limit
      if late:
        print(f'watchdog: no progress for {limit:g} s while {what}; the run looks hung and was stopped '
              f'(nothing new saved; the last checkpoint is kept). Raise config.watchdog_step_s / '
              f'watchdog_compile_s if it is only slow.', file=sys.stderr, flush=True)
        if self.on_fire is not None:
          try:
            self.on_fire()
          except Exception:  # pylint: disable=broad-except  (exiting anyway)
            pass
        os._exit(workdir_lib.EXIT_HUNG)  # pylint: disable=protected-access
