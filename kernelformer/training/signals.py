"""Stopping a run cleanly: SIGINT/SIGTERM as a flag the loop polls, and a watchdog for hung steps.

Signals are read by a thread (``signal.set_wakeup_fd``), not by Python handlers in the main thread: a
handler runs only between bytecodes of the main thread, so one raising an exception lands wherever that
thread is (inside an XLA compilation, where unwinding has ended in a segmentation fault) or waits for a
compilation to return. The thread acts at once, whatever the main thread is doing:

* ``guarded()`` (the ``kernelformer train`` process, from before jax is imported): a signal ends the
  process at once with one line saying what is on disk (``workdir.hard_exit``, exit 130/143).
* ``StopSignals`` (the training loop, from the first step's compilation to the test): the first signal
  only sets a flag: the loop finishes the step in flight (whose input state was donated to it, so no
  earlier state exists to save), saves a checkpoint of the state it returned, and stops with exit code
  130 (SIGINT) or 143 (SIGTERM, how schedulers preempt). A second signal ends the process at once
  without saving, naming the last checkpoint on disk; during a checkpoint write it is deferred until
  the write is complete (an interrupt never leaves a half-written checkpoint), then acted on.

A repeat of the same signal within ``REPEAT_WINDOW_S`` of the first is the same request, not a second
one: GNU ``timeout -s INT`` sends its signal to the command and then to the command's whole process
group (coreutils timeout.c ``cleanup``, unless ``--foreground``), so a run it stops receives SIGINT
twice within microseconds, and taking that as "Ctrl-C twice" stopped it without its checkpoint.

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
_STOP_READER = 0   # a byte that is no signal number: tells the reader thread to end
# A person pressing Ctrl-C twice is 0.1 s apart or more; a signal delivered twice (GNU timeout, a process
# group) is microseconds apart, or in the same read of the wakeup pipe.
REPEAT_WINDOW_S = 0.05


class _Reader:
  """The process's SIGINT/SIGTERM, read from a wakeup pipe by a daemon thread and dispatched to the
  innermost ``StopSignals`` (or, with none, ended at once)."""

  def __init__(self):
    self.lock = threading.Lock()
    self.depth = 0
    self.stack: list['StopSignals'] = []
    self._saved = None
    self.finished = False   # the run's result is out (``finished``): a signal ends the process with 0

  def install(self) -> bool:
    """Takes over SIGINT/SIGTERM (main thread only; nested calls count). Whether it is in place."""
    if threading.current_thread() is not threading.main_thread():
      return False
    if self.depth == 0:
      self.finished = False
      r, w = os.pipe()
      os.set_blocking(w, False)
      previous = {s: signal.signal(s, _ignore) for s in _NAMES}
      previous_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
      if hasattr(signal, 'SIGXFSZ'):
        # Past a file-size limit (ulimit -f) a write fails with EFBIG, reported in one line, instead of
        # the signal ending the process (Python ignores it at start-up; embedders may not).
        previous[signal.SIGXFSZ] = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
      thread = threading.Thread(target=self._read, args=(r,), name='kernelformer-signals', daemon=True)
      thread.start()
      self._saved = (previous, previous_fd, r, w, thread)
    self.depth += 1
    return True

  def uninstall(self) -> None:
    self.depth -= 1
    if self.depth:
      return
    previous, previous_fd, r, w, thread = self._saved
    self._saved = None
    signal.set_wakeup_fd(previous_fd)
    for s, h in previous.items():
      signal.signal(s, signal.SIG_IGN if self.finished and s in _NAMES else h)
    os.write(w, bytes([_STOP_READER]))
    thread.join(5)
    os.close(w)
    os.close(r)

  def _read(self, r: int) -> None:
    last: dict[int, float] = {}   # signal number -> when it was last acted on
    while True:
      try:
        data = os.read(r, 64)
      except OSError:
        return
      now = time.monotonic()
      for b in data:
        if b == _STOP_READER:
          return
        if b in _NAMES:
          if now - last.get(b, -float('inf')) < REPEAT_WINDOW_S:
            continue   # the same delivery twice (module docstring)
          last[b] = now
          self._dispatch(signal.Signals(b))

  def _dispatch(self, signum: int) -> None:
    with self.lock:
      target = self.stack[-1] if self.stack else None
    if target is not None:
      target._on_signal(signum)  # pylint: disable=protected-access
      return
    workdir = workdir_lib.active_workdir()
    if self.finished:
      workdir_lib.hard_exit(f'{_NAMES[signum]}: the run had already finished; nothing lost', 0)
    if workdir is None:
      line = (f'{_NAMES[signum]}: interrupted before training: nothing was written; run the same '
              f'command to start or resume')
    else:
      line = (f'{_NAMES[signum]}: stopped at once, nothing new saved; {workdir_lib.on_disk(workdir)}; '
              f'run the same command to resume')
    workdir_lib.hard_exit(line, EXIT_CODES[signum])


def _ignore(signum, frame) -> None:
  del signum, frame  # the reader thread acts on it (the wakeup pipe has the signal number)


_READER = _Reader()


def finished() -> None:
  """The run is done and its result printed: a later SIGINT/SIGTERM ends the process with exit 0."""
  _READER.finished = True


@contextlib.contextmanager
def guarded():
  """SIGINT/SIGTERM end the process at once with one line (``StopSignals`` blocks inside take over)."""
  installed = _READER.install()
  try:
    yield
  finally:
    if installed:
      _READER.uninstall()


class StopSignals:
  """Context manager: the first SIGINT/SIGTERM sets ``self.signum``; a second ends the process.

  Installs nothing outside the main thread (Python's rule); there it is a flag nobody sets.
  ``workdir`` (default: the run whose lock this process holds) is where the message looks for the last
  checkpoint.
  """

  def __init__(self, workdir: Optional[str] = None):
    self.signum: Optional[int] = None
    self._workdir = workdir
    self._lock = threading.Lock()
    self._saving = 0
    self._deferred_second: Optional[int] = None
    self._installed = False

  def __enter__(self) -> 'StopSignals':
    self._installed = _READER.install()
    if self._installed:
      with _READER.lock:
        _READER.stack.append(self)
    return self

  def __exit__(self, *exc) -> bool:
    if self._installed:
      with _READER.lock:
        _READER.stack.remove(self)
      _READER.uninstall()
      self._installed = False
    return False

  def _on_signal(self, signum: int) -> None:
    """From the reader thread."""
    with self._lock:
      first = self.signum is None
      if first:
        self.signum = signum
      elif self._saving:
        self._deferred_second = signum
    if first:
      workdir_lib.say(f'{_NAMES[signum]}: stopping after this step and saving a checkpoint '
                      f'(press Ctrl-C again to stop without saving)')
    elif self._deferred_second is not None:
      workdir_lib.say(f'{_NAMES[signum]} again: stopping as soon as the checkpoint being written is '
                      f'complete')
    else:
      self._stop_now(signum, '')

  def _stop_now(self, signum: int, what: str) -> None:
    workdir = self._workdir or workdir_lib.active_workdir()
    workdir_lib.hard_exit(
        f'{_NAMES[signum]} again: stopped at once{what}, nothing more saved; '
        f'{workdir_lib.on_disk(workdir)}; run the same command to resume', EXIT_CODES[signum])

  @contextlib.contextmanager
  def deferred(self):
    """Within this block a second signal waits: a checkpoint write is never cut short."""
    with self._lock:
      self._saving += 1
    ok = False
    try:
      yield
      ok = True
    finally:
      with self._lock:
        self._saving -= 1
        act = self._deferred_second if (ok and not self._saving) else None
      if act is not None:
        self._stop_now(act, ' after completing the checkpoint being written')

  @property
  def requested(self) -> bool:
    return self.signum is not None

  def stop_error(self, saved_step: Optional[int], workdir: str) -> workdir_lib.RunError:
    what = (f'checkpoint saved at step {saved_step}' if saved_step is not None
            else 'no new step to save')
    return workdir_lib.RunError(
        f'{_NAMES[self.signum]}: {what}; run the same command to resume (workdir {workdir})',
        EXIT_CODES[self.signum])


_UNSEEN = object()


class Watchdog:
  """Exits the process (``EXIT_HUNG``) when the armed deadline passes without ``arm``/``disarm``."""

  def __init__(self, poll_s: float = 1.0):
    self._lock = threading.Lock()
    self._deadline: Optional[float] = None
    self._what = ''
    self._limit = 0.0
    self._poll = poll_s
    self._progress = None
    self._seen = _UNSEEN
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self.on_fire = None   # called (e.g. to release the workdir lock) before the process exits

  def arm(self, what, limit_s: float, progress=None) -> None:
    """From now, ``what`` must finish (the next ``arm`` or ``disarm``) within ``limit_s`` (0: no limit).

    ``what`` is the text the watchdog prints, or a callable that returns it when the watchdog fires.
    ``progress`` (optional) is a callable that the watchdog thread calls at each poll: when its value
    changes, something finished, and the deadline starts again -- for a host that waits for several
    queued steps at once, the limit then still applies to each step, not to the whole wait."""
    with self._lock:
      self._what = what
      self._limit = float(limit_s)
      self._deadline = time.monotonic() + self._limit if limit_s and limit_s > 0 else None
      self._progress = progress
      self._seen = _UNSEEN
    if self._deadline is not None and self._thread is None:
      self._thread = threading.Thread(target=self._watch, name='kernelformer-watchdog', daemon=True)
      self._thread.start()

  def disarm(self) -> None:
    with self._lock:
      self._deadline = None
      self._progress = None

  def close(self) -> None:
    """Stops the thread and waits for it: nothing of it runs once the run has returned (a thread
    still inside a jax call when the interpreter exits is ended by Python with ``pthread_exit``, which
    aborts the process from the C++ frames it unwinds). Drops the callables the run gave ``arm`` (its
    bound methods): the run's arrays, executables and checkpoint managers are then released when the
    run returns, in order, not by the garbage collector at interpreter exit."""
    self._stop.set()
    self.disarm()
    thread = self._thread
    if thread is not None and thread is not threading.current_thread():
      thread.join(10)
    with self._lock:
      self._what, self._progress, self.on_fire = '', None, None

  def _watch(self) -> None:
    while True:
      interval = min(self._poll, max(self._limit / 10, 0.05))
      before = time.monotonic()
      if self._stop.wait(interval):
        return
      # Time counts only while this thread ran on schedule: a stopped process (SIGSTOP, Ctrl-Z) stops
      # it too and it oversleeps by exactly the stop, while a hung step never delays it.
      paused = time.monotonic() - before - interval
      with self._lock:
        if paused > 0 and self._deadline is not None:
          self._deadline += paused
        if self._deadline is not None and self._progress is not None:
          try:
            seen = self._progress()
          except Exception:  # pylint: disable=broad-except  (a probe that fails shows no progress)
            seen = self._seen
          if self._seen is not _UNSEEN and seen != self._seen:
            self._deadline = time.monotonic() + self._limit   # something finished since the last poll
          self._seen = seen
        late = self._deadline is not None and time.monotonic() > self._deadline
        what, limit = self._what, self._limit
      if late:
        if callable(what):
          try:
            what = what()
          except Exception:  # pylint: disable=broad-except
            what = 'a training step'
        print(f'watchdog: no progress for {limit:g} s while {what}; the run looks hung and was stopped '
              f'(nothing new saved; the last checkpoint is kept). Raise config.watchdog_step_s / '
              f'watchdog_compile_s if it is only slow.', file=sys.stderr, flush=True)
        if self.on_fire is not None:
          try:
            self.on_fire()
          except Exception:  # pylint: disable=broad-except  (exiting anyway)
            pass
        os._exit(workdir_lib.EXIT_HUNG)  # pylint: disable=protected-access
