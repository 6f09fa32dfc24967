"""A workdir belongs to one run: its lock, its config record (``run.json``), its code version.

* ``WorkdirLock``: ``workdir/lock`` holds the running process's pid and host. A second run in the same
  workdir is refused with one line; a lock left by a dead process on this host is taken over (one line
  says so). Created atomically (``os.link`` of a complete temporary file), so a reader never sees a
  half-written lock.
* ``RunRecord``: ``workdir/run.json`` records the first run's config fingerprint and fields
  (``kernelformer.training.fingerprint``). A later run with other fields is refused before compiling,
  naming each differing field, unless ``config.allow_config_change`` is set; an allowed change is
  appended to the record's ``changes`` (and reported in results.json). Workdirs from before run.json
  existed are fingerprinted from their ``config.json``.
* ``truncate_metrics``: on resume, events logged after the restored step are dropped from
  ``metrics.jsonl`` (the resumed run logs them again), so the file has no duplicates.
* ``RunError``: a run that cannot go on, with the process exit code the CLI uses (one line, no
  traceback).
"""
from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
from typing import Any, Optional

from kernelformer.training import fingerprint as fp

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


def atomic_write_json(path: str, obj: Any) -> None:
  tmp = f'{path}.tmp-{os.getpid()}'
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump(obj, f, indent=2, default=str)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


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

  def acquire(self) -> None:
    host = socket.gethostname()
    info = {'pid': os.getpid(), 'host': host, 'started': now_iso()}
    tmp = f'{self.path}.{os.getpid()}.tmp'
    with open(tmp, 'w', encoding='utf-8') as f:
      json.dump(info, f)
    try:
      for attempt in range(2):
        try:
          os.link(tmp, self.path)
          self._held = True
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
      os.remove(tmp)

  def _read(self) -> Optional[dict]:
    try:
      with open(self.path, encoding='utf-8') as f:
        holder = json.load(f)
      return holder if isinstance(holder, dict) else None
    except (OSError, ValueError):
      return None

  def release(self) -> None:
    if not self._held:
      return
    self._held = False
    holder = self._read()
    if holder is not None and holder.get('pid') == os.getpid():
      os.remove(self.path)


class RunRecord:
  """``workdir/run.json``: the fingerprint of the config this workdir was started with, and changes."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.path = os.path.join(workdir, 'run.json')
    self.data: Optional[dict] = None

  def load(self) -> Optional[dict]:
    """The record, or one made from an older workdir's config.json; None for a new workdir."""
    if os.path.exists(self.path):
      try:
        with open(self.path, encoding='utf-8') as f:
          self.data = json.load(f)
        self.data['fields']  # pylint: disable=pointless-statement
      except (ValueError, KeyError, TypeError) as e:
        raise RunError(f'{self.path} is damaged ({type(e).__name__}); restore it, or use a new '
                       f'--workdir') from None
      return self.data
    legacy = os.path.join(self.workdir, 'config.json')
    if os.path.exists(legacy):
      try:
        with open(legacy, encoding='utf-8') as f:
          fields = fp.config_fields(json.load(f))
      except (ValueError, TypeError, AttributeError):
        return None
      self.data = {'fingerprint': fp.digest(fields), 'fields': fields, 'created': None,
                   'changes': [], 'from': 'config.json'}
      return self.data
    return None

  def check(self, config, resume_step: Optional[int]) -> list[str]:
    """Refuses (RunError) a config that differs from the record, unless ``allow_config_change``.

    Returns the differences that were allowed (empty when none). Writes nothing.
    """
    fields = fp.config_fields(config)
    if self.data is None:
      return []
    diffs = fp.differences(self.data['fields'], fields)
    if not diffs:
      return []
    if not config.get('allow_config_change', False):
      shown = '; '.join(diffs[:6]) + (f'; and {len(diffs) - 6} more' if len(diffs) > 6 else '')
      raise RunError(
          f'workdir {self.workdir} holds a run of another config ({shown}); use a new --workdir, or '
          f'pass --config.allow_config_change=True to continue it under the new config (recorded in '
          f'results.json)')
    return diffs

  def write(self, config, allowed: list[str], at_step: int) -> None:
    """Records the config (first run), or appends an allowed change; the lead process calls this."""
    fields = fp.config_fields(config)
    if self.data is None or self.data.get('from') == 'config.json':
      base = self.data
      self.data = {'fingerprint': fp.digest(fields), 'fields': fields, 'created': now_iso(),
                   'changes': [], 'excluded_fields': sorted(fp.EXCLUDED)}
      if base is not None and allowed:
        self.data['changes'].append({'at_step': at_step, 'date': now_iso(), 'fields': allowed})
    elif allowed:
      self.data['changes'].append({'at_step': at_step, 'date': now_iso(), 'fields': allowed})
      self.data['fingerprint'] = fp.digest(fields)
      self.data['fields'] = fields
    else:
      return
    atomic_write_json(self.path, self.data)

  @property
  def fingerprint(self) -> Optional[str]:
    return None if self.data is None else self.data['fingerprint']

  @property
  def changes(self) -> list:
    return [] if self.data is None else list(self.data.get('changes', []))


def read_results(workdir: str) -> Optional[dict]:
  path = os.path.join(workdir, 'results.json')
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding='utf-8') as f:
      results = json.load(f)
    if not isinstance(results, dict):
      raise ValueError('not an object')
    return results
  except (ValueError, UnicodeDecodeError) as e:
    raise RunError(f'{path} is damaged ({e}); move it aside and re-run to re-test the final '
                   f'checkpoint') from None


def truncate_metrics(workdir: str, step: int, drop_test: bool = True) -> int:
  """Drops ``metrics.jsonl`` events after ``step`` (and test events); returns how many were dropped.

  A resumed run continues after ``step`` and logs those events again. Test events belong to the end
  of a run; the segment that ends this run writes its own. Torn last lines (a killed write) go too.
  """
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return 0
  kept, dropped = [], 0
  with open(path, encoding='utf-8', errors='replace') as f:
    for line in f:
      try:
        event = json.loads(line)
        keep = int(event['step']) <= step and not (drop_test and event.get('split') == 'test')
      except (ValueError, KeyError, TypeError):
        keep = False
      if keep:
        kept.append(line if line.endswith('\n') else line + '\n')
      else:
        dropped += 1
  if dropped:
    tmp = f'{path}.tmp-{os.getpid()}'
    with open(tmp, 'w', encoding='utf-8') as f:
      f.writelines(kept)
    os.replace(tmp, path)
  return dropped


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
    status = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=root,
                            capture_output=True, text=True, timeout=10, check=True).stdout
    out.update(git_commit=commit, git_dirty=bool(status.strip()))
  except (OSError, subprocess.SubprocessError):
    pass
  return out
