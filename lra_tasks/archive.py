"""Extracting only what a task needs from LRA's release, streaming, resumable, crash-safe.

LRA's release (``lra_release.gz``, a gzipped tar of ~7 GB) holds every task's files under
``lra_release/`` (some copies nest it twice, ``lra_release/lra_release/``): ``listops-1000/``,
``tsv_data/`` (Retrieval's ``new_aan_pairs.*.tsv``) and ``pathfinder{32,64,128,256}/<curv dir>/``
with ``imgs/<k>/sample_<n>.png`` and ``metadata/<k>.npy``. A task needs a small part of it, so the archive is read once, front to back, in tarfile's streaming
mode (``'r|*'``, 1 MiB chunks; a local copy of the extracted folder works the same way); each file is
written to ``<name>.partial`` and renamed when complete, so an interrupted run resumes; a truncated or
corrupt archive stops with one line naming the archive and the member; one run at a time per data dir
(an ``flock`` on ``{data_dir}/.prepare_data.lock``). docs/data.md, "What a run does", says more.

The member paths are matched per ``Selection``: ``<anything>/<anchor>/<path below the anchor>``, where
the path below the anchor must match the selection's pattern; the file goes to
``{data_dir}/<dest>/<path below the anchor>``. Names with ``..`` or absolute paths are never written.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import gzip
import os
import re
import tarfile
import time
import zlib
from typing import Callable, Iterator, Sequence

from lra_tasks import common

CHUNK = 1 << 20
PARTIAL = '.partial'
LOCK_NAME = '.prepare_data.lock'

# progress(member name, bytes of it written so far, its size): after every chunk and at the end.
Progress = Callable[[str, int, int], None]


@dataclasses.dataclass(frozen=True)
class Selection:
  """The release members one task (or one Pathfinder set) needs, and where they go.

  Attributes:
    label: a name for messages, e.g. ``'retrieval'`` or ``'pathfinder32/curv_contour_length_14'``.
    anchor: the directory inside the release root, e.g. ``'tsv_data'``.
    dest: the destination directory relative to the data dir, e.g. ``'retrieval'``.
    files: exact paths below the anchor, all required (and then nothing else is taken); or
    pattern: a regex a path below the anchor must match in full (at least one file required).
  """

  label: str
  anchor: str
  dest: str
  files: tuple[str, ...] = ()
  pattern: str = ''

  def __post_init__(self):
    if bool(self.files) == bool(self.pattern):
      raise ValueError(f'{self.label}: give exactly one of files and pattern')

  @property
  def include(self) -> str:
    """The regex (full match) of the paths below the anchor that this selection takes."""
    return self.pattern or '|'.join(re.escape(f) for f in self.files)

  def below_anchor(self, name: str) -> str | None:
    """The path below the anchor if member ``name`` belongs to this selection, else None."""
    marker = self.anchor + '/'
    # The anchor must start a path component: 'x/tsv_data/a' yes, 'x/old_tsv_data/a' no.
    at = 0
    while True:
      i = name.find(marker, at)
      if i < 0:
        return None
      if i == 0 or name[i - 1] == '/':
        rest = name[i + len(marker):]
        if re.fullmatch(self.include, rest):
          return rest
      at = i + 1


@dataclasses.dataclass
class Result:
  """What one extraction did, per selection label."""

  found: dict[str, int]           # matching members seen in the source
  written: dict[str, int]         # files written in this run
  kept: dict[str, int]            # files already complete from an earlier run
  bytes_written: int = 0
  seconds: float = 0.0


def safe_name(name: str) -> str | None:
  """The member name normalized (no leading ``./``), or None if absolute or with ``..``/empty parts."""
  while name.startswith('./'):
    name = name[2:]
  if not name or name.startswith('/'):
    return None
  parts = name.split('/')
  if any(p in ('', '.', '..') for p in parts):
    return None
  return name


@contextlib.contextmanager
def lock(data_dir: str) -> Iterator[None]:
  """Holds ``{data_dir}/.prepare_data.lock``; a second concurrent run stops with a DataError."""
  os.makedirs(data_dir, exist_ok=True)
  path = os.path.join(data_dir, LOCK_NAME)
  with open(path, 'w', encoding='utf-8') as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno in (errno.EAGAIN, errno.EACCES):
        raise common.DataError(f'another scripts/prepare_data.py is writing into {data_dir} '
                               f'(it holds {path}); wait for it to finish') from e
      raise
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _is_complete(dest: str, size: int, mtime: float) -> bool:
  try:
    st = os.stat(dest)
  except OSError:
    return False
  return st.st_size == size and int(st.st_mtime) == int(mtime)


class _ArchiveError(Exception):
  """Reading the archive failed (as opposed to writing the destination)."""


def _write(read: Callable[[int], bytes], dest: str, size: int, mtime: float, name: str,
           progress: Progress | None, chunk: int) -> int:
  """Copies ``size`` bytes from ``read`` to ``dest`` via ``dest.partial`` and a rename."""
  partial = dest + PARTIAL
  done = 0
  try:
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(partial, 'wb') as out:
      while done < size:
        try:
          block = read(min(chunk, size - done))
        except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
          raise _ArchiveError(str(e) or type(e).__name__) from e
        if not block:
          raise _ArchiveError(f'unexpected end of data after {done} of {size} bytes')
        out.write(block)
        done += len(block)
        if progress is not None:
          progress(name, done, size)
    os.utime(partial, (mtime, mtime))
    os.replace(partial, dest)
  except BaseException as e:
    # Exceptions (and Ctrl-C) leave no partial file; only a killed process can, and the next run
    # overwrites it.
    with contextlib.suppress(OSError):
      os.unlink(partial)
    if isinstance(e, OSError):   # the destination's problem (disk full, permissions), not the source's
      raise common.DataError(f'cannot write {dest}: {e.strerror or e}') from e
    raise
  if progress is not None and size == 0:
    progress(name, 0, 0)
  return done


def _match(selections: Sequence[Selection], name: str) -> tuple[Selection, str] | None:
  for sel in selections:
    rest = sel.below_anchor(name)
    if rest is not None:
      return sel, rest
  return None


def _all_exact_found(selections: Sequence[Selection], seen: dict[str, set[str]]) -> bool:
  return all(sel.files and set(sel.files) <= seen[sel.label] for sel in selections)


def extract(source: str, selections: Sequence[Selection], data_dir: str, *,
            progress: Progress | None = None, chunk: int = CHUNK) -> Result:
  """Extracts the selected members of ``source`` (a tar[.gz] archive or an extracted folder).

  Returns what was found and written; raises a one-line ``DataError`` for a truncated or corrupt
  archive (naming it and the member), for a selection with no match, or for a missing exact file.
  """
  source = os.path.expanduser(source)
  if not os.path.exists(source):
    raise common.DataError(f'--source {source} does not exist; give the path of lra_release.gz or '
                           'of the folder it was extracted to')
  if not os.access(source, os.R_OK):
    raise common.DataError(f'--source {source} is not readable')
  start = time.perf_counter()
  result = Result(found={s.label: 0 for s in selections}, written={s.label: 0 for s in selections},
                  kept={s.label: 0 for s in selections})
  seen: dict[str, set[str]] = {s.label: set() for s in selections}
  with lock(data_dir):
    if os.path.isdir(source):
      _extract_folder(source, selections, data_dir, result, seen, progress, chunk)
    else:
      _extract_archive(source, selections, data_dir, result, seen, progress, chunk)
  for sel in selections:
    missing = sorted(set(sel.files) - seen[sel.label])
    where = f'{sel.anchor}/' + (missing[0] if missing else f'({sel.include})')
    if missing or not seen[sel.label]:
      raise common.DataError(
          f'{source} has no member */{where} ({sel.label}); is it LRA\'s lra_release.gz (or the '
          'folder it unpacks to)?')
  result.seconds = time.perf_counter() - start
  return result


def _record(result: Result, seen, sel: Selection, rest: str, written: int | None) -> None:
  seen[sel.label].add(rest)
  result.found[sel.label] += 1
  if written is None:
    result.kept[sel.label] += 1
  else:
    result.written[sel.label] += 1
    result.bytes_written += written


def _is_gzip(path: str) -> bool:
  with open(path, 'rb') as f:
    return f.read(2) == b'\x1f\x8b'


def _open_stream(path: str) -> tuple[tarfile.TarFile, gzip.GzipFile | None]:
  """The tar stream of ``path`` and, for gzip, the decompressor (to finish and CRC-check it)."""
  if _is_gzip(path):
    # gzip.GzipFile checks the CRC and length at the end of the stream; tarfile's own 'r|gz' does not,
    # so a corrupt archive could otherwise pass unnoticed.
    gz = gzip.GzipFile(path, mode='rb')
    return tarfile.open(fileobj=gz, mode='r|'), gz
  # 'r|*': a forward-only stream (bzip2, xz or plain tar), never seeking, never unpacking all.
  return tarfile.open(path, mode='r|*'), None


def _extract_archive(path, selections, data_dir, result, seen, progress, chunk) -> None:
  current, reading_data = None, False
  produced: list[str] = []   # every destination this archive accounts for (written or kept)
  complete = False
  try:
    with contextlib.ExitStack() as stack:
      tar, gz = _open_stream(path)
      if gz is not None:
        stack.enter_context(gz)
      stack.enter_context(tar)
      for member in tar:
        current, reading_data = member.name, False
        name = safe_name(member.name)
        hit = _match(selections, name) if name and member.isfile() else None
        if hit is None:
          continue
        sel, rest = hit
        dest = os.path.join(data_dir, sel.dest, *rest.split('/'))
        produced.append(dest)
        if _is_complete(dest, member.size, member.mtime):
          _record(result, seen, sel, rest, None)
        else:
          reading_data = True
          stream = tar.extractfile(member)
          written = _write(stream.read, dest, member.size, member.mtime, member.name, progress,
                           chunk)
          reading_data = False
          _record(result, seen, sel, rest, written)
        if _all_exact_found(selections, seen):
          break   # everything asked for is there: no need to read the rest of 7 GB
      else:
        # Read to the end of the compressed stream: gzip verifies its CRC and length only there.
        complete = True
        if gz is not None:
          while gz.read(CHUNK):
            pass
  except (_ArchiveError, tarfile.TarError, EOFError, zlib.error, OSError) as e:
    # Destination errors were turned into DataErrors in _write: these all come from the archive.
    raise _archive_error(path, e, current, reading_data, complete, produced) from None


def _archive_error(path: str, e: BaseException, current: str | None, reading_data: bool,
                   complete: bool, produced: list[str]) -> common.DataError:
  """The one-line error for a failed read; removes files a corrupt archive may have damaged."""
  detail = str(e) or type(e).__name__
  cause = e.__cause__ if isinstance(e, _ArchiveError) and e.__cause__ is not None else e
  truncated = (isinstance(cause, EOFError) or 'unexpected end of data' in detail
               or 'truncated' in detail)
  if current is None:
    where = 'reading its first member failed'
  elif reading_data:
    where = f'reading member {current} failed'
  elif complete:
    where = f'its end, after the last member {current}, failed the integrity check'
  else:
    where = f'reading the member after {current} failed'
  note = ''
  if not truncated:
    # A corrupt compressed stream can decode to wrong bytes before the error shows; a truncated one
    # cannot (every file before the cut was read whole), so only then are extracted files kept.
    removed = 0
    for dest in produced:
      with contextlib.suppress(OSError):
        os.unlink(dest)
        removed += 1
    note = f'; removed the {removed} file(s) extracted from it' if removed else ''
  kind = 'truncated' if truncated else 'corrupt'
  return common.DataError(f'{path}: {kind} archive: {where} ({detail}){note}; download it again')


def _release_roots(source: str) -> list[str]:
  return [source, os.path.join(source, 'lra_release'),
          os.path.join(source, 'lra_release', 'lra_release')]


def _extract_folder(source, selections, data_dir, result, seen, progress, chunk) -> None:
  for sel in selections:
    anchor_dir = next((os.path.join(r, sel.anchor) for r in _release_roots(source)
                       if os.path.isdir(os.path.join(r, sel.anchor))), None)
    anchor_parts = sel.anchor.split('/')
    if anchor_dir is None and \
        os.path.normpath(source).split(os.sep)[-len(anchor_parts):] == anchor_parts:
      anchor_dir = source   # the anchor folder itself was given
    if anchor_dir is None:
      continue
    for directory, subdirs, files in os.walk(anchor_dir):
      subdirs.sort()
      for file in sorted(files):
        src = os.path.join(directory, file)
        rest = os.path.relpath(src, anchor_dir).replace(os.sep, '/')
        if not re.fullmatch(sel.include, rest) or not os.path.isfile(src):
          continue
        st = os.stat(src)
        dest = os.path.join(data_dir, sel.dest, *rest.split('/'))
        if os.path.abspath(dest) == os.path.abspath(src):
          _record(result, seen, sel, rest, None)   # the data dir is the release folder itself
          continue
        if _is_complete(dest, st.st_size, st.st_mtime):
          _record(result, seen, sel, rest, None)
          continue
        try:
          with open(src, 'rb') as f:
            written = _write(f.read, dest, st.st_size, st.st_mtime, src, progress, chunk)
        except _ArchiveError as e:
          raise common.DataError(f'{src}: reading it failed ({e}); copy the release folder '
                                 'again') from None
        _record(result, seen, sel, rest, written)
