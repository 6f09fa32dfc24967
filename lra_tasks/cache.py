"""Memory-mapped caches of decoded task arrays, keyed by the identity of their sources and options.

Why (docs/data.md, "Caches", with the sizes and times): reading LRA's raw files costs the same at every
start of every run and holds int32 copies in memory; a cache holds that work once, on disk, in the most
compact dtype (uint8 pixels, uint16 byte tokens), and a loader maps it. Nothing stale may be read, so a
cache is found only under a key computed from its *scope* (the task, ``what`` it is made of, the
preprocessing options and the loader's cache version) and a *fingerprint* of the source files (per file
its path relative to the source root, size and modification time in ns: ``stat``, not content hashes,
which would cost what the cache saves; content checksums live in ``lra_tasks.manifest``).

Layout: ``{data_dir}/cache/{task}-{scope[:12]}-{key[:16]}/`` holding ``<array>.bin`` (raw C-order
rows) and ``meta.json`` (dtypes, shapes, scope, key, options). A cache is built in a temporary
directory and renamed into place after ``meta.json`` is written, so it exists completely or not at
all; a ``.bin`` whose size disagrees with ``meta.json`` makes the cache count as absent.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import shutil
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

FORMAT = 1
META = 'meta.json'
DIRNAME = 'cache'

_log = logging.getLogger(__name__)


def root(data_dir: str) -> str:
  """``{data_dir}/cache``: where every task's caches live."""
  return os.path.join(os.path.expanduser(str(data_dir)), DIRNAME)


def _digest(obj: Any) -> str:
  blob = json.dumps(obj, sort_keys=True, separators=(',', ':'))
  return hashlib.sha256(blob.encode('utf-8')).hexdigest()


def fingerprint(source_root: str, paths: Sequence[str]) -> str:
  """sha256 over ``(path relative to source_root, size, mtime_ns)`` of every source file, sorted.

  Raises ``OSError`` if a file is missing (the caller treats that as a cache miss, so the raw reader
  reports the missing file in its own words).
  """
  entries = []
  for path in paths:
    st = os.stat(path)
    entries.append((os.path.relpath(path, source_root), st.st_size, st.st_mtime_ns))
  entries.sort()
  return _digest(entries)


class Cache:
  """The caches of one thing (``task`` + ``what`` + ``options``) under ``cache_root``."""

  def __init__(self, cache_root: str, task: str, what: str, options: Mapping[str, Any]):
    self.cache_root = cache_root
    self.task = task
    self.what = what
    self.options = dict(options)
    self.scope = _digest({'format': FORMAT, 'task': task, 'what': what, 'options': self.options})

  def key(self, source_fingerprint: str) -> str:
    return _digest({'scope': self.scope, 'sources': source_fingerprint})

  def directory(self, key: str) -> str:
    return os.path.join(self.cache_root, f'{self.task}-{self.scope[:12]}-{key[:16]}')

  def existing(self) -> list[str]:
    """Complete cache directories of this scope, any key (stale ones included)."""
    pattern = os.path.join(self.cache_root, f'{self.task}-{self.scope[:12]}-*', META)
    return sorted(os.path.dirname(p) for p in glob.glob(pattern))

  def load(self, source_root: str, sources: Callable[[], Sequence[str]]
           ) -> dict[str, np.ndarray] | None:
    """The cached arrays (read-only memory maps) for the current sources, or None.

    ``sources`` is called only when some cache of this scope exists, so a task without caches pays
    nothing; if it fails (``OSError``, ``ValueError``: a missing or malformed source), the cache is
    not used and the raw reader reports the problem.
    """
    if not self.existing():
      return None
    try:
      key = self.key(fingerprint(source_root, sources()))
    except (OSError, ValueError):
      return None
    return open_arrays(self.directory(key), key)

  @contextlib.contextmanager
  def writer(self, key: str, columns: Mapping[str, tuple[Any, tuple[int, ...]]]
             ) -> Iterator[Writer]:
    """Streams rows into a new cache for ``key``; committed on a clean exit, discarded on an error.

    ``columns`` maps an array name to ``(dtype, row_shape)``; each ``append`` adds one row to every
    array. Other keys of the same scope (stale caches) are removed after the commit.
    """
    final = self.directory(key)
    w = Writer(final, columns, {'task': self.task, 'what': self.what, 'options': self.options,
                                'scope': self.scope, 'key': key})
    try:
      yield w
    except BaseException:
      w.abort()
      raise
    w.commit()
    for other in self.existing():
      if other != final:
        shutil.rmtree(other, ignore_errors=True)
        _log.info('%s: removed stale cache %s', self.task, other)


class Writer:
  """Appends rows to ``<name>.bin`` files in a temporary directory; ``commit`` renames it into place."""

  def __init__(self, final: str, columns: Mapping[str, tuple[Any, tuple[int, ...]]],
               meta: Mapping[str, Any]):
    self.final = final
    self.tmp = f'{final}.tmp-{os.getpid()}'
    shutil.rmtree(self.tmp, ignore_errors=True)
    os.makedirs(self.tmp)
    self._columns = {name: (np.dtype(dtype), tuple(shape)) for name, (dtype, shape) in columns.items()}
    self._files = {name: open(os.path.join(self.tmp, f'{name}.bin'), 'wb') for name in columns}
    self._meta = dict(meta)
    self.rows = 0
    self._start = time.perf_counter()

  def append(self, **rows: Any) -> None:
    if set(rows) != set(self._columns):
      raise ValueError(f'expected rows for {sorted(self._columns)}, got {sorted(rows)}')
    for name, row in rows.items():
      dtype, shape = self._columns[name]
      row = np.asarray(row)
      if row.shape != shape:
        raise ValueError(f'{name}: row shape {row.shape}, expected {shape}')
      # A value outside the stored dtype would wrap silently: refuse it.
      if row.size and np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        if row.min() < info.min or row.max() > info.max:
          raise ValueError(f'{name}: values outside {dtype} range')
      self._files[name].write(np.ascontiguousarray(row, dtype=dtype).tobytes())
    self.rows += 1

  def _close(self) -> None:
    for f in self._files.values():
      f.close()

  def abort(self) -> None:
    self._close()
    shutil.rmtree(self.tmp, ignore_errors=True)

  def commit(self) -> str:
    self._close()
    arrays = {name: {'dtype': dtype.str, 'shape': [self.rows, *shape]}
              for name, (dtype, shape) in self._columns.items()}
    meta = {'format': FORMAT, **self._meta, 'arrays': arrays, 'rows': self.rows,
            'build_seconds': round(time.perf_counter() - self._start, 3)}
    with open(os.path.join(self.tmp, META), 'w', encoding='utf-8') as f:
      json.dump(meta, f, indent=1, sort_keys=True)
    try:
      os.replace(self.tmp, self.final)
    except OSError:
      # Another process committed the same key first (same sources, same options: same content).
      if not os.path.isfile(os.path.join(self.final, META)):
        raise
      shutil.rmtree(self.tmp, ignore_errors=True)
    return self.final


def open_arrays(directory: str, key: str | None = None) -> dict[str, np.ndarray] | None:
  """The arrays of a committed cache as read-only memory maps, or None if absent or inconsistent."""
  try:
    with open(os.path.join(directory, META), encoding='utf-8') as f:
      meta = json.load(f)
  except (OSError, ValueError):
    return None
  if meta.get('format') != FORMAT or (key is not None and meta.get('key') != key):
    return None
  out = {}
  for name, spec in meta['arrays'].items():
    dtype, shape = np.dtype(spec['dtype']), tuple(spec['shape'])
    path = os.path.join(directory, f'{name}.bin')
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    try:
      size = os.path.getsize(path)
    except OSError:
      size = -1
    if size != expected:
      _log.warning('cache %s: %s has %d bytes, expected %d; not using it', directory, path, size,
                   expected)
      return None
    # np.memmap cannot map an empty file.
    out[name] = (np.memmap(path, dtype=dtype, mode='r', shape=shape) if expected
                 else np.zeros(shape, dtype))
  return out


def disk_bytes(directory: str) -> int:
  return sum(os.path.getsize(p) for p in glob.glob(os.path.join(directory, '*')) if os.path.isfile(p))
