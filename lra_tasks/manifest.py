"""Verification manifests: what a task's data directory held when it was prepared, checked later.

``scripts/prepare_data.py`` writes ``MANIFEST.json`` into each directory it fills (``retrieval/``,
``pathfinder32/curv_contour_length_14/``, the ListOps split directory, the TFDS version directory):
the file count, the total size and, per file, its size and sha256. ``--check`` recomputes them, so a
file that was truncated, edited, deleted or added since is reported by path, not discovered later as
a wrong accuracy. The manifest also records which files it covers (a regex over paths relative to the
directory) so that a new file appearing there is caught too.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
from typing import Any

from lra_tasks import common

NAME = 'MANIFEST.json'
FORMAT = 1
_BLOCK = 1 << 20


def sha256_file(path: str) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(_BLOCK), b''):
      h.update(block)
  return h.hexdigest()


def covered_files(directory: str, include: str) -> list[str]:
  """Paths (relative, ``/``-separated, sorted) under ``directory`` that fully match ``include``."""
  out = []
  for root, subdirs, files in os.walk(directory):
    subdirs.sort()
    for file in files:
      rel = os.path.relpath(os.path.join(root, file), directory).replace(os.sep, '/')
      if rel != NAME and re.fullmatch(include, rel):
        out.append(rel)
  return sorted(out)


def build(directory: str, include: str, task: str, source: str) -> dict[str, Any]:
  """The manifest of the files under ``directory`` matching ``include`` (reads every file once)."""
  entries = []
  for rel in covered_files(directory, include):
    path = os.path.join(directory, *rel.split('/'))
    entries.append([rel, os.path.getsize(path), sha256_file(path)])
  return {'format': FORMAT, 'task': task, 'source': source, 'include': include,
          'created': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
          'count': len(entries), 'bytes': sum(e[1] for e in entries), 'files': entries}


def path(directory: str) -> str:
  return os.path.join(directory, NAME)


def write(directory: str, include: str, task: str, source: str) -> dict[str, Any]:
  """Builds and writes ``{directory}/MANIFEST.json`` (atomically); returns it."""
  manifest = build(directory, include, task, source)
  common.atomic_write_text(path(directory), json.dumps(manifest, separators=(',', ':')) + '\n')
  return manifest


def read(directory: str) -> dict[str, Any] | None:
  try:
    with open(path(directory), encoding='utf-8') as f:
      manifest = json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:
    raise common.DataError(f'{path(directory)} is unreadable ({e}); delete it and run '
                           'scripts/prepare_data.py again') from e
  if manifest.get('format') != FORMAT:
    raise common.DataError(f'{path(directory)}: unknown manifest format {manifest.get("format")!r}')
  return manifest


def verify(directory: str, manifest: dict[str, Any], checksums: bool = True,
           limit: int = 10) -> list[str]:
  """One line per difference between ``directory`` and its manifest ([] when they agree).

  Checks the set of covered files, every size and, with ``checksums``, every sha256. At most
  ``limit`` lines name files; a last line counts the rest.
  """
  problems: list[str] = []
  expected = {rel: (size, digest) for rel, size, digest in manifest['files']}
  present = set(covered_files(directory, manifest['include']))
  for rel in sorted(set(expected) - present):
    problems.append(f'{os.path.join(directory, rel)} is missing (listed in {path(directory)})')
  for rel in sorted(present - set(expected)):
    problems.append(f'{os.path.join(directory, rel)} is not in {path(directory)} (added later?)')
  for rel in sorted(present & set(expected)):
    file = os.path.join(directory, rel)
    size, digest = expected[rel]
    actual = os.path.getsize(file)
    if actual != size:
      problems.append(f'{file} has {actual} bytes, the manifest says {size}')
    elif checksums and sha256_file(file) != digest:
      problems.append(f'{file} has another sha256 than in the manifest (same size: corrupted?)')
  if len(problems) > limit:
    problems = problems[:limit] + [f'... and {len(problems) - limit} more differences']
  return problems


def summary(manifest: dict[str, Any]) -> str:
  return f'{manifest["count"]} files, {format_bytes(manifest["bytes"])}'


def format_bytes(n: float) -> str:
  for unit in ('B', 'KB', 'MB', 'GB'):
    if n < 1000 or unit == 'GB':
      return f'{n:.0f} {unit}' if unit == 'B' else f'{n:.1f} {unit}'
    n /= 1000
  return f'{n:.1f} GB'
