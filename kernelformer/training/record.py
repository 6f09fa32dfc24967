"""A run's record: ``run.json`` (``RunRecord``: its config's fields and fingerprint, ``fingerprint``), the end
of a run's record made current by one rename (``new_record`` / ``settle_record``), ``read_results``."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from typing import Any, Optional

from kernelformer.training import fingerprint as fp
from kernelformer.training.workdir import RunError, now_iso, read_bounded, remove_quietly, write_error

RECORD_TMP, RECORD_NEXT = 'record.tmp', 'record.next'


def atomic_write_json(path: str, obj: Any) -> None:
  """Writes ``obj`` to a temporary file, then renames it over ``path``; RunError (one line) on failure,
  with ``path`` as it was."""
  tmp = f'{path}.tmp-{os.getpid()}'
  try:
    with open(tmp, 'w', encoding='utf-8') as f:
      json.dump(obj, f, indent=2, default=str)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except OSError as e:
    remove_quietly(tmp)
    raise write_error(path, e, os.path.dirname(path).removesuffix(os.sep + RECORD_TMP)) from None


@contextlib.contextmanager
def new_record(workdir: str):
  """An empty RECORD_TMP the block writes a record into (its files, a stretch's best/), made current
  by one rename to RECORD_NEXT, then moved into place (``settle_record``); removed if the block raises."""
  staged = os.path.join(workdir, RECORD_TMP)
  try:
    shutil.rmtree(staged, ignore_errors=True)
    os.mkdir(staged)
    yield staged
    os.rename(staged, os.path.join(workdir, RECORD_NEXT))   # the commit
  except OSError as e:
    raise write_error(e.filename or staged, e, workdir) from None
  finally:
    shutil.rmtree(staged, ignore_errors=True)
  settle_record(workdir)


def settle_record(workdir: str) -> None:
  """The next start after a kill: an uncommitted RECORD_TMP goes, a committed RECORD_NEXT is moved into
  place (each step can be done again): its files replace the workdir's, its best/ replaces best/."""
  shutil.rmtree(os.path.join(workdir, RECORD_TMP), ignore_errors=True)
  done, best = os.path.join(workdir, RECORD_NEXT), os.path.join(workdir, 'best')
  if not os.path.isdir(done):
    return
  for root, dirs, files in os.walk(done):
    dirs[:] = [d for d in dirs if root != done or d != 'best']
    for name in files:
      target = os.path.join(workdir, os.path.relpath(root, done), name)
      os.makedirs(os.path.dirname(target), exist_ok=True)
      os.replace(os.path.join(root, name), target)
  if os.path.isdir(os.path.join(done, 'best')):
    if os.path.isdir(best):
      os.rename(best, f'{best}.old')
    os.rename(os.path.join(done, 'best'), best)
  for path in (f'{best}.old', f'{best}.next', done):
    shutil.rmtree(path, ignore_errors=True)


class RunRecord:
  """``workdir/run.json``: the fingerprint of the config this workdir was started with, and changes."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.path = os.path.join(workdir, 'run.json')
    self.data: Optional[dict] = None

  def load(self) -> Optional[dict]:
    """The record, or one made from an older workdir's config.json; None for a new workdir."""
    if os.path.lexists(self.path):
      try:
        self.data = json.loads(read_bounded(self.path))
        if not isinstance(self.data, dict):
          raise TypeError(f'an object was expected, found {type(self.data).__name__}')
        if not isinstance(self.data.get('fields'), dict):
          raise TypeError(f"'fields' must be an object, found "
                          f"{type(self.data.get('fields')).__name__}")
        if not isinstance(self.data.get('fingerprint'), str):
          raise TypeError("'fingerprint' must be a string")
        if not isinstance(self.data.get('changes', []), list):
          raise TypeError("'changes' must be a list")
      except (ValueError, KeyError, TypeError) as e:
        self.data = None
        raise RunError(f'{self.path} is damaged ({type(e).__name__}: {_one_line(e)}); restore it, or '
                       f'use a new --workdir') from None
      return self.data
    legacy = os.path.join(self.workdir, 'config.json')
    if os.path.lexists(legacy):
      try:
        fields = fp.config_fields(json.loads(read_bounded(legacy)))
      except (ValueError, TypeError, AttributeError):
        return None
      self.data = {'fingerprint': fp.digest(fields), 'fields': fields, 'created': None,
                   'changes': [], 'from': 'config.json'}
      return self.data
    return None

  def check(self, config, allow_change: bool) -> list[str]:
    """Refuses (RunError) a config that differs from the record, unless ``allow_config_change``.

    Returns the differences that were allowed (empty when none). Writes nothing.
    """
    fields = fp.config_fields(config)
    if self.data is None:
      return []
    diffs = fp.differences(self.data['fields'], fields)
    if not diffs:
      return []
    if not allow_change:
      shown = '; '.join(diffs[:6]) + (f'; and {len(diffs) - 6} more' if len(diffs) > 6 else '')
      raise RunError(
          f'workdir {self.workdir} holds a run of another config ({shown}); use a new --workdir, or '
          f'pass --config.allow_config_change=True to continue it under the new config (recorded in '
          f'results.json)')
    return diffs

  def write(self, config, allowed: list[str], at_step: int, root: Optional[str] = None) -> None:
    """Records the config (first run), or appends an allowed change, into ``root`` (default: the
    workdir); the lead process calls this."""
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
    atomic_write_json(os.path.join(root or self.workdir, 'run.json'), self.data)

  @property
  def fingerprint(self) -> Optional[str]:
    return None if self.data is None else self.data['fingerprint']

  @property
  def changes(self) -> list:
    return [] if self.data is None else list(self.data.get('changes', []))


def _one_line(e: BaseException) -> str:
  return ' '.join(str(e).split())[:200]


def read_results(workdir: str) -> tuple[Optional[dict], str]:
  """``(results, '')`` of a finished run (its committed ``RECORD_NEXT`` first), ``(None, '')`` where
  there is none, ``(None, 'is ...')`` where it cannot be read (damaged, not a file, not a run's results):
  that run is not finished, and the reader names it. The one reader of train, sweep and report."""
  path = next((p for p in (os.path.join(workdir, RECORD_NEXT, 'results.json'),
                            os.path.join(workdir, 'results.json')) if os.path.lexists(p)), None)
  if path is None:
    return None, ''
  try:
    results = json.loads(read_bounded(path))
  except RunError as e:
    return None, str(e).split('; ')[0].replace(f'{path} ', '')
  except (OSError, ValueError) as e:
    return None, f'is damaged ({_one_line(e) or type(e).__name__})'
  if not isinstance(results, dict):
    return None, f'is damaged (a JSON {type(results).__name__}, not an object)'
  return (results, '') if 'test_accuracy' in results else (
      None, "is not a finished run's results (no test_accuracy)")
