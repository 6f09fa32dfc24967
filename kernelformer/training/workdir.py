"""A workdir belongs to one run: its lock (``WorkdirLock``: ``workdir/lock`` (pid, host), made atomically:
one run at a time, a dead one's goes), its files read with bounds, its code version; its record: record.py."""
from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time
from typing import Optional

EXIT_ERROR = 1        # a user-fixable problem (config, workdir, disk)
EXIT_DIVERGED = 3     # non-finite loss or gradient norm
EXIT_HUNG = 4         # the watchdog saw no progress (signals.Watchdog)
EXIT_SIGINT = 130     # 128 + SIGINT: interrupted, checkpoint saved
EXIT_SIGTERM = 143    # 128 + SIGTERM: preempted, checkpoint saved


class RunError(Exception):
  """A run stopped for a reason the user can act on; ``str(e)`` is the one line to print."""

  def __init__(self, message: str, exit_code: int = EXIT_ERROR):
    super().__init__(message)
    self.exit_code = exit_code


def now_iso() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')


def say(line: str) -> None:
  """One line on stderr for the user (the progress bar and results go elsewhere)."""
  print(line, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# Ending the process at once (a second Ctrl-C, kernelformer.training.signals).

_ACTIVE = {'workdir': None, 'locks': []}   # the run's workdir once known; the locks this process holds


def active_workdir() -> Optional[str]:
  """The workdir of the run in this process (set when its ``WorkdirLock`` is made), or None before."""
  return _ACTIVE['workdir']


def set_active_workdir(workdir: Optional[str]) -> None:
  _ACTIVE['workdir'] = None if workdir is None else os.path.abspath(workdir)


def latest_checkpoint(workdir: Optional[str]) -> Optional[int]:
  """The newest complete checkpoint step in ``workdir/checkpoints`` (orbax renames a checkpoint to its
  bare step number only once it is complete), or None."""
  if workdir is None:
    return None
  try:
    steps = [int(n) for n in os.listdir(os.path.join(workdir, 'checkpoints')) if n.isdigit()]
  except OSError:
    return None
  return max(steps) if steps else None


def on_disk(workdir: Optional[str]) -> str:
  """What a resumed run would start from, as a phrase for a one-line message."""
  step = latest_checkpoint(workdir)
  if workdir is None:
    return 'nothing was written'
  if step is None:
    return f'no checkpoint in {workdir} yet'
  return f'the last checkpoint on disk is step {step} ({os.path.join(workdir, "checkpoints", str(step))})'


def hard_exit(line: str, code: int) -> None:
  """Prints ``line``, releases this process's workdir locks and ends the process now (``os._exit``).

  For a second Ctrl-C: unwinding the stack (finally blocks, interpreter shutdown) can run for minutes
  inside an XLA compilation and has ended in a segmentation fault; nothing is half-written when this is
  called (a checkpoint write defers it until the write is complete).
  """
  try:
    say(line)
  except Exception:  # pylint: disable=broad-except  (exiting anyway)
    pass
  for lock in list(_ACTIVE['locks']):
    try:
      lock.release()
    except Exception:  # pylint: disable=broad-except
      pass
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except Exception:  # pylint: disable=broad-except
      pass
  os._exit(code)  # pylint: disable=protected-access


class _Captured:
  path: Optional[str] = None      # the log file, when ``keep()`` was called and it held anything

  def __init__(self):
    self._keep = False
    self._name: Optional[str] = None

  def keep(self) -> None:
    """Keep the output in a file (its ``path``) instead of printing it."""
    self._keep = True

  def wait_quiet(self, quiet_s: float = 0.5, limit_s: float = 5.0) -> None:
    """Waits until nothing was written for ``quiet_s`` (at most ``limit_s``): after a failed write,
    background threads (tensorstore's) still report on, and write, what they had in flight."""
    if self._name is None:
      return
    last, quiet_since = -1, time.monotonic()
    deadline = quiet_since + limit_s
    while time.monotonic() < deadline:
      try:
        size = os.path.getsize(self._name)
      except OSError:
        return
      if size != last:
        last, quiet_since = size, time.monotonic()
      elif time.monotonic() - quiet_since >= quiet_s:
        return
      time.sleep(0.05)


@contextlib.contextmanager
def captured_stderr():
  """Holds back what is written to file descriptor 2 (Python, C++ and library logs alike) in this block.

  Afterwards it is written to stderr as it was, unless ``keep()`` was called (a failure reported in one
  line): then it stays in a temporary file whose path is ``.path``.
  """
  captured = _Captured()
  try:
    sys.stderr.flush()
    fd, name = tempfile.mkstemp(prefix='kernelformer-', suffix='.log')
    saved = os.dup(2)
  except (OSError, ValueError):   # no stderr, or no room for the file: leave stderr as it is
    yield captured
    return
  captured._name = name  # pylint: disable=protected-access
  os.dup2(fd, 2)
  os.close(fd)
  try:
    yield captured
  finally:
    try:
      sys.stderr.flush()
    except (OSError, ValueError):
      pass
    os.dup2(saved, 2)
    os.close(saved)
    try:
      size = os.path.getsize(name)
      if captured._keep and size:  # pylint: disable=protected-access
        captured.path = name
      else:
        if size and not captured._keep:  # pylint: disable=protected-access
          with open(name, 'rb') as f:
            os.write(2, f.read())
        os.remove(name)
    except OSError:
      pass


# ----------------------------------------------------------------------------------------------
# The run's own files: read with bounds, written atomically, each failure one line.

MAX_METRICS_BYTES = 1 << 30       # metrics.jsonl: a million events is ~300 MB
MAX_METRICS_LINE = 1 << 20        # one event is ~300 bytes; a longer line is damage and is dropped
MAX_RECORD_BYTES = 64 << 20       # run.json, config.json, results.json, the lock
RUN_FILES = {'metrics.jsonl': MAX_METRICS_BYTES, 'results.json': MAX_RECORD_BYTES,
             'run.json': MAX_RECORD_BYTES, 'config.json': MAX_RECORD_BYTES,
             'lock': MAX_RECORD_BYTES}


def check_file(path: str, limit: int) -> None:
  """RunError unless ``path`` is absent or a regular file (links followed) of at most ``limit`` bytes:
  a link to /dev/zero or /dev/full, a FIFO or a runaway file would make a reader hang or fill memory."""
  try:
    st = os.stat(path)
  except FileNotFoundError:
    if os.path.islink(path):
      raise RunError(f'{path} is a link to a missing file; remove it, or use a new --workdir') from None
    return
  except OSError as e:
    raise RunError(f'{path} cannot be read ({e.strerror or e}); fix it, or use a new --workdir') from None
  if not stat.S_ISREG(st.st_mode):
    kind = ('a character device' if stat.S_ISCHR(st.st_mode) else 'a block device'
            if stat.S_ISBLK(st.st_mode) else 'a FIFO' if stat.S_ISFIFO(st.st_mode) else 'a directory'
            if stat.S_ISDIR(st.st_mode) else 'not a file')
    target = f' (a link to {os.path.realpath(path)})' if os.path.islink(path) else ''
    raise RunError(f'{path} is {kind}{target}, not a regular file; move it aside (the run writes '
                   f'{os.path.basename(path)} itself), or use a new --workdir')
  if st.st_size > limit:
    raise RunError(f'{path} is {st.st_size / (1 << 20):.0f} MiB, more than any run writes (at most '
                   f'{limit >> 20} MiB); move it aside, or use a new --workdir')


def check_run_files(workdir: str) -> None:
  """``check_file`` for each file of ``RUN_FILES`` in ``workdir`` (before a run reads or appends)."""
  for name, limit in RUN_FILES.items():
    check_file(os.path.join(workdir, name), limit)


def read_bounded(path: str, limit: int = MAX_RECORD_BYTES) -> bytes:
  """The bytes of a small file of the run, after ``check_file``; at most ``limit`` bytes are read."""
  check_file(path, limit)
  with open(path, 'rb') as f:
    data = f.read(limit + 1)
  if len(data) > limit:
    raise RunError(f'{path} grew past {limit >> 20} MiB while being read; move it aside, or use a '
                   f'new --workdir')
  return data


def write_error(path: str, error: OSError, workdir: Optional[str] = None) -> RunError:
  """The one line for a failed write of a run file (full disk, file-size limit, I/O error)."""
  why = error.strerror or type(error).__name__
  if error.errno == errno.EFBIG:
    why += ' (a file-size limit: ulimit -f)'
  where = f'; {on_disk(workdir)}' if workdir else ''
  return RunError(f'could not write {path} ({why}){where}; free disk space or fix the directory, then '
                  f'run the same command to resume')


UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def unwritable_data(error: OSError, data_dir: str) -> Optional[str]:
  """The one line for data that cannot be written where it belongs (a read-only or unwritable data
  directory), or None for another OS error."""
  if error.errno not in UNWRITABLE:
    return None
  where = error.filename or data_dir
  return (f'cannot write the data into {where} ({error.strerror or error}); make {data_dir} writable, '
          f'or put the data elsewhere: --config.data.data_dir=DIR or $KERNELFORMER_DATA (prepare-data: '
          f'--data_dir DIR)')


def remove_quietly(path: str) -> None:
  try:
    os.remove(path)
  except OSError:
    pass


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class WorkdirLock:
  """``workdir/lock`` while a run is in progress; ``release()`` removes it (only if still ours)."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, 'lock')
    self._held = False
    set_active_workdir(workdir)   # every process of the run (only the lead takes the lock)

  def acquire(self) -> None:
    host = socket.gethostname()
    info = {'pid': os.getpid(), 'host': host, 'started': now_iso()}
    tmp = f'{self.path}.{os.getpid()}.tmp'
    try:
      with open(tmp, 'w', encoding='utf-8') as f:
        json.dump(info, f)
    except OSError as e:
      remove_quietly(tmp)
      raise write_error(self.path, e) from None
    try:
      for attempt in range(2):
        try:
          os.link(tmp, self.path)
          self._held = True
          _ACTIVE['locks'].append(self)
          return
        except FileExistsError:
          pass
        holder = self._read()
        if attempt == 0 and holder is not None and holder.get('host') == host and \
            not _pid_alive(int(holder.get('pid', -1))):
          say(f"taking over a stale lock in {os.path.dirname(self.path)} (pid {holder['pid']} on "
              f'{host} is gone)')
          try:
            os.remove(self.path)
          except FileNotFoundError:
            pass
          continue
        who = (f"pid {holder.get('pid')} on host {holder.get('host')} since {holder.get('started')}"
               if holder else 'an unreadable lock file')
        raise RunError(f'workdir {os.path.dirname(self.path)} is in use by {who}; wait for that run '
                       f'to end, use another --workdir, or delete {self.path} if that process is gone')
    finally:
      remove_quietly(tmp)

  def _read(self) -> Optional[dict]:
    try:
      holder = json.loads(read_bounded(self.path, 1 << 20))
      return holder if isinstance(holder, dict) else None
    except (OSError, ValueError, RunError):
      return None

  def release(self) -> None:
    if not self._held:
      return
    self._held = False
    if self in _ACTIVE['locks']:
      _ACTIVE['locks'].remove(self)
    holder = self._read()
    if holder is not None and holder.get('pid') == os.getpid():
      os.remove(self.path)


def _metrics_lines(f, dropped: list):
  """The lines of an open metrics file, each at most ``MAX_METRICS_LINE`` bytes (longer ones are
  skipped without being held in memory and counted in ``dropped[0]``)."""
  while True:
    line = f.readline(MAX_METRICS_LINE + 1)
    if not line:
      return
    if len(line) > MAX_METRICS_LINE:
      dropped[0] += 1
      while line and not line.endswith(b'\n'):
        line = f.readline(MAX_METRICS_LINE)
      continue
    yield line


def truncate_metrics(workdir: str, step: int, drop_test: bool = True, out: Optional[str] = None) -> int:
  """Drops ``metrics.jsonl`` events after ``step`` (and test events); returns how many were dropped.
  ``out``: the kept events are written there (always), the workdir's file is left as it is.

  A resumed run continues after ``step`` and logs those events again. Test events belong to the end
  of a run; the segment that ends this run writes its own. Torn last lines (a killed write) go too.
  The file is read line by line with a bound on each line and on its size (``check_file``), so a
  damaged or runaway file costs neither memory nor time; it is rewritten only when something goes.
  """
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.lexists(path):
    return 0
  check_file(path, MAX_METRICS_BYTES)

  def keep(line: bytes) -> bool:
    try:
      event = json.loads(line)
      return int(event['step']) <= step and not (drop_test and event.get('split') == 'test')
    except (ValueError, KeyError, TypeError):
      return False

  dropped = [0]
  with open(path, 'rb') as f:
    for line in _metrics_lines(f, dropped):
      if not keep(line):
        dropped[0] += 1
  if not dropped[0] and out is None:
    return 0
  tmp = f'{out or path}.tmp-{os.getpid()}'
  try:
    with open(path, 'rb') as f, open(tmp, 'wb') as kept:
      for line in _metrics_lines(f, [0]):
        if keep(line):
          kept.write(line if line.endswith(b'\n') else line + b'\n')
      kept.flush()
      os.fsync(kept.fileno())
    os.replace(tmp, out or path)
  except OSError as e:
    remove_quietly(tmp)
    raise write_error(path, e, workdir) from None
  return dropped[0]


def code_version() -> dict:
  """``{'package_version'}`` of the installed kernelformer, plus ``{'git_commit', 'git_dirty'}`` when the
  code runs from a git checkout (the package's parent folder is the top of a git work tree; an installed
  copy in site-packages has none, even inside some other repository)."""
  out = {}
  try:
    from importlib import metadata  # pylint: disable=g-import-not-at-top
    out['package_version'] = metadata.version('kernelformer')
  except Exception:  # pylint: disable=broad-except  (not installed as a package)
    out['package_version'] = 'unknown'
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if not os.path.exists(os.path.join(root, '.git')):  # a checkout's top has .git (a folder or a file)
    return out
  try:
    commit = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=root, capture_output=True, text=True,
                            timeout=10, check=True).stdout.strip()
    # --no-optional-locks: status would otherwise refresh the index under .git/index.lock, and two
    # runs starting at once (a sweep, a test suite) would fail it for one of them -- whose code then
    # read as another version (a spurious code_versions entry).
    status = subprocess.run(['git', '--no-optional-locks', 'status', '--porcelain',
                             '--untracked-files=no'], cwd=root, capture_output=True, text=True,
                            timeout=10, check=True).stdout
    out.update(git_commit=commit, git_dirty=bool(status.strip()))
  except (OSError, subprocess.SubprocessError):
    pass
  return out
