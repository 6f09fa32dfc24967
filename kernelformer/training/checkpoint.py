"""Orbax checkpoints: the latest few for resuming, and the best one by validation accuracy.

``workdir/checkpoints/<step>``: saved every ``checkpoint_every`` steps and at the end (a crash loses at
most the steps since the last one). ``workdir/best/<step>``: saved whenever validation accuracy
improves; the final test accuracy is measured with it. Each checkpoint holds the train state (params,
optimizer state, model state, step — the step is also the data position) and a JSON ``meta`` item
(best validation accuracy so far, its step, time accounting, and ``state_sha256`` / ``structure``:
a digest of the saved arrays and of their shapes, see ``kernelformer.training.fingerprint``).
All processes save and restore together, as orbax requires on multi-host runs.

Safety:
* A write never removes the last complete checkpoint: orbax writes into a temporary directory and
  renames it when complete; a same-step checkpoint being replaced is first renamed aside and deleted
  only after the new one is complete (put back if the write fails). A failed write (full disk, I/O
  error) raises ``RunError`` naming the checkpoints that are kept. Temporary directories left by a
  killed write are removed when the next run opens the directory.
* ``restore_latest`` sets aside (renames to ``<step>.damaged-<n>``, one line saying so) any checkpoint
  that does not restore — missing or truncated files, a bit flip (digest mismatch), corrupt meta —
  and resumes from the newest one that does. A checkpoint of a different model (other shapes) is not
  damage: it is refused with one line.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import sys
import time
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp

from kernelformer.training import fingerprint as fp
from kernelformer.training.workdir import RunError, captured_stderr, say

_TMP = re.compile(r'.*\.orbax-checkpoint-tmp.*|.*\.replaced-\d+$')
_DAMAGED = re.compile(r'\d+\.damaged-\d+')


@contextlib.contextmanager
def _quiet_logs():
  """Orbax, tensorstore's asyncio tasks and absl log a traceback per failed read: silenced here."""
  loggers = [logging.getLogger(n) for n in ('absl', 'asyncio', 'orbax', '')]
  levels = [l.level for l in loggers]
  for l in loggers:
    l.setLevel(logging.CRITICAL + 1)
  try:
    yield
  finally:
    for l, level in zip(loggers, levels):
      l.setLevel(level)


def _register_array_handler() -> None:
  # Replica-parallel saving slices every replicated array across devices with one small jit per
  # parameter shape (70+ compilations for a tiny model, seconds per run); our state is replicated and
  # modest, so one replica writing whole arrays is faster.
  # Replacing orbax's default handler is intended: its "overriding jax.Array" warning is not printed.
  absl_logger = logging.getLogger('absl')
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)
  try:
    ocp.type_handlers.register_type_handler(
        jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True)
  finally:
    absl_logger.setLevel(level)


_register_array_handler()


def _late_tensorstore_callback(unraisable) -> bool:
  """Whether an unraisable exception is a read of a checkpoint already reported as not restoring:
  orbax runs each restore in a fresh event loop and closes it as soon as one read fails, while the
  others are in flight. As each completes, tensorstore (on its own thread) calls
  ``loop.call_soon_threadsafe`` on the closed loop ("Event loop is closed"); each read coroutine left
  suspended is closed by the garbage collector, where ``except BaseException`` in orbax's
  ``_read_array_index_and_device_put`` (serialization.py:327, orbax-checkpoint 0.12.8) turns the
  GeneratorExit into an Exception that prints the array's whole TensorStore spec (60+ lines each)."""
  exc, code = unraisable.exc_value, getattr(unraisable.object, 'cr_code', None)
  return (isinstance(exc, RuntimeError) and str(exc) == 'Event loop is closed') or (
      code is not None and f'{os.sep}orbax{os.sep}' in code.co_filename)


_LATE_CALLBACKS = [0]   # how many have arrived (``_settle`` waits until they stop)


def _unraisable_filter(unraisable, previous=sys.unraisablehook) -> None:
  if _late_tensorstore_callback(unraisable):
    _LATE_CALLBACKS[0] += 1
  else:
    previous(unraisable)


sys.unraisablehook = _unraisable_filter


def _settle(quiet_s: float = 0.2, limit_s: float = 3.0) -> None:
  """After a failed restore: waits until the reads it left in flight have completed (no late callback
  for ``quiet_s``, at most ``limit_s``), so none completes while the interpreter exits -- a tensorstore
  thread that needs Python then is ended by ``pthread_exit`` and aborts the process."""
  deadline = time.monotonic() + limit_s
  seen, since = _LATE_CALLBACKS[0], time.monotonic()
  while time.monotonic() < deadline:
    time.sleep(0.02)
    if _LATE_CALLBACKS[0] != seen:
      seen, since = _LATE_CALLBACKS[0], time.monotonic()
    elif time.monotonic() - since >= quiet_s:
      return
# A failed write (full disk, file-size limit) leaves orbax's asyncio futures holding the OS error; when
# they are garbage-collected, asyncio logs "Future exception was never retrieved" with a traceback per
# array, after the run has already said what failed in one line (Checkpoints.save). We use no asyncio
# of our own, so its logger only ever repeats that failure.
logging.getLogger('asyncio').setLevel(logging.CRITICAL)

# Test hook: seconds to sleep inside each checkpoint write (after orbax starts writing, before it
# completes), so that a test's signal lands during a save. Never set outside tests.
_SLOW_SAVE_ENV = 'KERNELFORMER_TEST_SLOW_SAVE_S'


class Checkpoints:

  def __init__(self, directory: str, max_to_keep: int, *, read_only: bool = False):
    """``read_only``: for a reader beside a run that may be writing (nothing is created, rotated or
    cleaned up)."""
    self.directory = os.path.abspath(directory)
    self._max_to_keep = max_to_keep
    self._read_only = read_only
    self._kept: tuple[int, ...] = ()
    if not read_only and jax.process_index() == 0 and os.path.isdir(self.directory):
      for name in os.listdir(self.directory):
        if _TMP.fullmatch(name):
          # Left by a write that was killed: incomplete by construction (a complete one is renamed).
          shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
    self._manager = self._open()

  def _open(self):
    policies = ocp.checkpoint_managers
    keep = policies.LatestN(n=self._max_to_keep)
    if self._kept:
      keep = policies.AnyPreservationPolicy([keep, policies.CustomSteps(list(self._kept))])
    def manager():
      options = ocp.CheckpointManagerOptions(preservation_policy=keep, create=not self._read_only,
                                             read_only=self._read_only,
                                             enable_async_checkpointing=False)
      return ocp.CheckpointManager(self.directory, options=options, item_names=('state', 'meta'))
    if self._read_only:   # orbax warns that the directory is read only: that is what was asked for
      with _quiet_logs():
        return manager()
    return manager()

  def keep_through(self, step: int) -> None:
    """The checkpoints at ``step`` and before are never rotated away by later saves (a stretch that
    continues a finished run leaves that run's checkpoints as they were)."""
    self._kept = tuple(s for s in self.all_steps() if s <= step)
    self._reload()

  def copy_of(self, source: str) -> None:
    """Becomes a copy of ``source`` in hard links (orbax adds and removes files, never rewrites one)."""
    self._manager.close()
    if jax.process_index() == 0:
      shutil.rmtree(self.directory, ignore_errors=True)
      if os.path.isdir(source):
        shutil.copytree(source, self.directory, copy_function=os.link)
    sync('checkpoint-copy')
    self._manager = self._open()

  def _reload(self) -> None:
    self._manager.close()
    self._manager = self._open()

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: Any, meta: dict) -> None:
    """Saves ``state`` at ``step``; on failure raises RunError and keeps every earlier checkpoint."""
    step = int(step)
    meta = {**meta, 'state_sha256': fp.tree_digest(state), 'structure': fp.tree_structure(state)}
    path = os.path.join(self.directory, str(step))
    aside = None
    if step in self._manager.all_steps():
      # A resumed run re-reaches a step an interrupted run had saved (e.g. its best): replace it, but
      # keep the old one until the new one is complete.
      aside = f'{path}.replaced-{os.getpid()}'
      if jax.process_index() == 0:
        os.rename(path, aside)
      sync('checkpoint-aside')
      self._reload()
    # orbax, tensorstore and asyncio print their own tracebacks when a write fails (100+ lines for a
    # full disk): held back, and kept in a log file named by the one-line error.
    with captured_stderr() as captured:
      try:
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
        if os.environ.get(_SLOW_SAVE_ENV):
          time.sleep(float(os.environ[_SLOW_SAVE_ENV]))
        self._manager.wait_until_finished()
        error = None
      except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore/OS errors alike)
        error = e
        captured.keep()
        captured.wait_quiet()   # the writes still in flight end (and stop printing) before cleaning up
        self._after_failed_save(path, aside)
    if error is not None:
      e = error
      kept = ', '.join(map(str, self.all_steps())) or 'none'
      reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      code = re.search(r"os_error_code='(\d+)'", str(e))   # tensorstore names the OS error last
      if code or (isinstance(e, OSError) and e.errno):
        n = int(code.group(1)) if code else e.errno
        reason = os.strerror(n) + (' (a file-size limit: ulimit -f)' if n == errno.EFBIG else '')
      log = f"; orbax's log: {captured.path}" if captured.path else ''
      raise RunError(f'could not write checkpoint {path} ({reason[:200]}); '
                     f'checkpoints kept: {kept}; free disk space or fix the directory, then run the '
                     f'same command to resume{log}') from None
    if aside is not None and jax.process_index() == 0:
      shutil.rmtree(aside, ignore_errors=True)

  def _after_failed_save(self, path: str, aside: Optional[str]) -> None:
    if jax.process_index() == 0:
      for name in os.listdir(self.directory):
        if '.orbax-checkpoint-tmp' in name:
          shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
      if aside is not None and os.path.isdir(aside):
        if os.path.isdir(path):
          shutil.rmtree(path, ignore_errors=True)
        os.rename(aside, path)
    try:
      self._reload()
    except Exception:  # pylint: disable=broad-except  (reported by the caller's RunError)
      pass

  def restore(self, abstract_state: Any, step: Optional[int] = None) -> tuple[Any, dict]:
    """Restores ``step`` (default latest) into the shapes and shardings of ``abstract_state``.

    Raises RunError for a checkpoint of another structure; other exceptions mean damage. A stored
    digest that does not match the restored arrays raises ValueError (damage).
    """
    step = self.latest_step() if step is None else step
    meta = self.meta(step)
    want = fp.tree_structure(abstract_state)
    if meta.get('structure') not in (None, want):
      versions = meta.get('code_versions') or [{}]
      commit = (versions[-1].get('code_version') or {}).get('git_commit') if isinstance(
          versions[-1], dict) else None
      by = f' (written by commit {commit[:12]})' if commit else ''
      raise RunError(f'{self.directory}/{step} holds a model of other shapes or state than this config '
                     f'builds with this code{by}; continue it with the code that wrote it, or use a new '
                     f'--workdir for this config')
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    state = restored['state']
    if meta.get('state_sha256') is not None and fp.tree_digest(state) != meta['state_sha256']:
      raise ValueError('the restored arrays do not match the digest written with them')
    return state, meta

  def meta(self, step: int) -> dict:
    return dict(self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))['meta'])

  def restore_latest(self, abstract_state: Any, upto: Optional[int] = None
                     ) -> Optional[tuple[Any, dict]]:
    """The newest checkpoint (at most at step ``upto``) that restores; damaged newer ones are set
    aside. None if there is none.

    Orbax's own error logs (tracebacks of the failed reads) are silenced: each damaged checkpoint gets
    the one line of ``_set_aside``.
    """
    for step in sorted(s for s in self._manager.all_steps() if upto is None or s <= upto)[::-1]:
      try:
        with _quiet_logs():
          return self.restore(abstract_state, step)
      except RunError:
        raise
      except Exception as e:  # pylint: disable=broad-except  (any failure to read is damage)
        _settle()
        self._set_aside(step, e)
    return None

  def damaged(self) -> list[str]:
    """Names of the checkpoints set aside as damaged (``<step>.damaged-<n>``), oldest step first."""
    if not os.path.isdir(self.directory):
      return []
    names = [n for n in os.listdir(self.directory) if _DAMAGED.fullmatch(n)]
    return sorted(names, key=lambda n: (int(n.split('.')[0]), n))

  def _set_aside(self, step: int, error: BaseException) -> None:
    path = os.path.join(self.directory, str(step))
    n = 1
    while os.path.exists(f'{path}.damaged-{n}'):
      n += 1
    target = f'{path}.damaged-{n}'
    if jax.process_index() == 0:
      os.rename(path, target)
      say(f'checkpoint {path} does not restore ({type(error).__name__}: {error_reason(error)}); set '
          f'aside as {os.path.basename(target)}, trying the previous one')
    sync('checkpoint-set-aside')
    self._reload()

  def close(self) -> None:
    self._manager.close()


_OBJECT_REPR = re.compile(r'<(?:bound method [^<>]*|[^<>]* at 0x[0-9a-fA-F]+)>')
_DRIVER_CHAIN = re.compile(r'(?:Error opening "\w+" driver: )+')


def error_reason(error: BaseException, limit: int = 160) -> str:
  """The first line of ``error`` as words for a user: no object reprs (a tensorstore error can carry
  ``<bound method pybind11_detail_function_record_... of <... at 0x...>>``), no driver chain, cut at a
  word."""
  text = str(error).strip().splitlines()[0] if str(error).strip() else ''
  while True:
    shorter = _OBJECT_REPR.sub('', text)
    if shorter == text:
      break
    text = shorter
  text = ' '.join(_DRIVER_CHAIN.sub('', text).split())
  if len(text) > limit:
    text = text[:limit].rsplit(' ', 1)[0] + ' ...'
  return text


def abstract_like(tree: Any) -> Any:
  """ShapeDtypeStructs with the shardings of ``tree``, for restoring onto the same devices."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, 'sharding', None)), tree)


def sync(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)
