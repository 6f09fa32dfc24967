"""Where ``impl='auto'`` may take the fused Pallas kernels: only combinations measured on real hardware.

Nothing unmeasured runs by default. ``validated.json`` beside this module lists the
combinations that ``scripts/gpu_check.py`` compiled (not interpret mode) on a GPU and found equal to
the XLA path in outputs and gradients -- and, where it timed them, not slower than the XLA path. An
entry is keyed by

    (backend, device kind, JAX major.minor, feature, mode, dtype)

with mode 'causal' or 'bidirectional' and dtype the value dtype ('bfloat16', 'float32', ...). The JAX
version is part of the key because the kernels go through the Pallas Triton backend, which JAX 0.11
deprecated (docs/pallas.md, "Which backend"): a result from one JAX line says nothing about another.

``select`` is what ``RandomFeatureAttention._use_pallas`` asks; every decision is logged once per
process (one INFO line per distinct combination). The table ships empty: no GPU has run gpu_check in
this repository yet, so 'auto' takes the XLA path everywhere until one does. ``impl='pallas'`` still
forces the kernels (that is how gpu_check measures them).
"""
from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any, Iterable, Mapping, Optional, Sequence

import jax

TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'validated.json')
KEY_FIELDS = ('backend', 'device_kind', 'jax', 'feature', 'mode', 'dtype')
MODES = ('bidirectional', 'causal')

_log = logging.getLogger(__name__)
_logged: set = set()
_lock = threading.Lock()


def jax_minor(version: Optional[str] = None) -> str:
  """'0.11' from '0.11.2' (the part of the version an entry must match)."""
  parts = (version or jax.__version__).split('.')
  return '.'.join(parts[:2])


def mode_name(causal: bool) -> str:
  return 'causal' if causal else 'bidirectional'


def load(path: Optional[str] = None) -> list[dict[str, Any]]:
  """The table's entries (a list of dicts with ``KEY_FIELDS`` and provenance); [] if the file is absent."""
  path = path or TABLE_PATH
  if not os.path.exists(path):
    return []
  with open(path) as f:
    data = json.load(f)
  entries = data.get('entries', []) if isinstance(data, dict) else data
  for e in entries:
    missing = [k for k in KEY_FIELDS if k not in e]
    if missing:
      raise ValueError(f'{path}: entry {e} lacks {", ".join(missing)}')
  return list(entries)


def _key(entry: Mapping[str, Any]) -> tuple:
  return tuple(str(entry[k]) for k in KEY_FIELDS)


def current_device_kind() -> str:
  devices = jax.devices()
  return devices[0].device_kind if devices else ''


def lookup(*, backend: str, device_kind: str, feature: str, causal: bool, dtype: str,
           jax_version: Optional[str] = None,
           entries: Optional[Sequence[Mapping[str, Any]]] = None) -> Optional[Mapping[str, Any]]:
  """The table entry for this combination, or None."""
  want = (backend, device_kind, jax_minor(jax_version), feature, mode_name(causal), dtype)
  for e in (load() if entries is None else entries):
    if _key(e) == want:
      return e
  return None


def select(feature: str, *, causal: Optional[bool], dtype: str, backend: Optional[str] = None,
           device_kind: Optional[str] = None,
           entries: Optional[Sequence[Mapping[str, Any]]] = None) -> tuple[bool, str]:
  """``(take_pallas, reason)`` for ``impl='auto'``; logs the decision once per distinct combination.

  ``causal=None`` (caller does not know the mode) requires both modes to be validated.
  """
  backend = backend or jax.default_backend()
  if backend in ('cuda', 'rocm'):
    backend = 'gpu'
  device_kind = current_device_kind() if device_kind is None else device_kind
  modes = (False, True) if causal is None else (bool(causal),)
  table = load() if entries is None else entries
  missing = [mode_name(c) for c in modes
             if lookup(backend=backend, device_kind=device_kind, feature=feature, causal=c,
                       dtype=dtype, entries=table) is None]
  ok = not missing
  where = (f'backend={backend} device={device_kind!r} jax={jax_minor()} feature={feature} '
           f'mode={"/".join(mode_name(c) for c in modes)} dtype={dtype}')
  reason = (f'fused Pallas kernels ({where} validated by scripts/gpu_check.py)' if ok else
            f'XLA path ({where}: not in kernelformer/pallas/validated.json; '
            f'run scripts/gpu_check.py on this GPU to validate)')
  with _lock:
    key = (where, ok)
    if key not in _logged:
      _logged.add(key)
      _log.info('attention impl=auto -> %s', reason)
  return ok, reason


def entries_from_results(cases: Iterable[Mapping[str, Any]], *, backend: str, device_kind: str,
                         jax_version: str, source: str,
                         speed: Optional[Mapping[tuple, bool]] = None) -> list[dict[str, Any]]:
  """Table entries from gpu_check correctness cases (compiled on a GPU only).

  A (feature, mode, dtype) combination gets an entry when every one of its cases passed and ran
  compiled (``interpret`` False) on a GPU backend; ``speed[(feature, mode)]`` False (measured slower than
  the XLA path) withholds it.
  """
  if backend not in ('gpu', 'cuda'):
    return []
  groups: dict[tuple, list] = {}
  for c in cases:
    groups.setdefault((c['feature'], c['mode'], c['dtype']), []).append(c)
  out = []
  for (feature, mode, dtype), group in sorted(groups.items()):
    if not all(c['passed'] and not c.get('interpret', True) for c in group):
      continue
    if speed is not None and speed.get((feature, mode)) is False:
      continue
    out.append({'backend': 'gpu', 'device_kind': device_kind, 'jax': jax_minor(jax_version),
                'feature': feature, 'mode': mode, 'dtype': dtype, 'cases': len(group),
                'source': source})
  return out


def merge(new_entries: Sequence[Mapping[str, Any]], path: Optional[str] = None) -> list[dict]:
  """Writes the table with ``new_entries`` replacing entries of the same key; returns the table."""
  path = path or TABLE_PATH
  table = {_key(e): dict(e) for e in load(path)}
  for e in new_entries:
    table[_key(e)] = dict(e)
  entries = [table[k] for k in sorted(table)]
  with open(path, 'w') as f:
    json.dump({'comment': 'written by scripts/gpu_check.py; see kernelformer/pallas/validated.py',
               'entries': entries}, f, indent=1)
    f.write('\n')
  return entries


def _reset_log_for_tests() -> None:
  with _lock:
    _logged.clear()
