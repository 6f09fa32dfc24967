"""Loading a user's kernels: ``config.model.attention.plugin`` names Python modules to import first.

A plugin is an ordinary module that registers components, samplers or mechanisms at import
(``kernelformer.registry.register_component`` / ``register_sampler`` / ``register_mechanism``; see
docs/extending.md). ``plugin`` is a comma-separated list; each entry is

* a path to a ``.py`` file (absolute, or relative to the current directory), imported under a name
  derived from its absolute path, or
* an importable module name (``my_kernels``, ``mypackage.kernels``), found on ``sys.path`` (the current
  directory is tried too).

Loading is idempotent: a file or module already imported (by an earlier call, or by the config file
that imports it) is not imported again, so nothing registers twice.

Where plugins come from, all loaded before any kernel name is looked up:

* ``--config.model.attention.plugin=...`` (train, config; ``--set``/``--grid`` of sweep): loaded when the
  config is parsed, before the overrides are checked, and again by the trainer;
* ``--plugin ...`` on every ``kernelformer`` command (``split_plugin_flag``): loaded by the dispatcher
  before the command starts, and exported as ``$KERNELFORMER_PLUGIN`` so the subprocesses of a
  ``sweep --parallel`` load it too;
* a config file's own ``import my_kernels``: the config file's folder is on ``sys.path`` while it loads
  (``config_dir_on_path``).

``provenance`` lists the files a run's kernel came from with their sha256 digests (results.json's
``plugins``). This module imports no JAX until a plugin is actually loaded.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any, Iterator, Optional, Sequence

ENV_VAR = 'KERNELFORMER_PLUGIN'


def _plugin_error(message: str) -> Exception:
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  return registry.KernelPluginError(message)


def _entries(spec: Optional[str]) -> list[str]:
  if not spec:
    return []
  return [e.strip() for e in str(spec).split(',') if e.strip()]


def _already_imported(path: str) -> Optional[ModuleType]:
  for module in list(sys.modules.values()):
    f = getattr(module, '__file__', None)
    if f and os.path.abspath(f) == path:
      return module
  return None


def _load_file(path: str) -> ModuleType:
  path = os.path.abspath(path)
  if not os.path.isfile(path):
    raise _plugin_error(
        f'attention plugin {path} not found (a .py path is taken relative to {os.getcwd()})')
  module = _already_imported(path)
  if module is not None:
    return module
  stem = os.path.splitext(os.path.basename(path))[0]
  name = f'kernelformer_plugin_{stem}_{hashlib.sha1(path.encode()).hexdigest()[:8]}'
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  # The plugin's own directory is importable, so it can import its neighbours.
  folder = os.path.dirname(path)
  if folder not in sys.path:
    sys.path.append(folder)
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # pylint: disable=broad-except
    del sys.modules[name]
    # One line naming the plugin's own line (a typo, a name registered twice), not a traceback.
    import traceback  # pylint: disable=g-import-not-at-top
    frames = [f for f in traceback.extract_tb(e.__traceback__) if os.path.abspath(f.filename) == path]
    line = e.lineno if isinstance(e, SyntaxError) and e.filename == path else (
        frames[-1].lineno if frames else None)
    where = f'{path}:{line}' if line else path
    raise _plugin_error(f'attention plugin {where} failed to import: {type(e).__name__}: '
                        f'{" ".join(str(e).split())}') from e
  except BaseException:
    del sys.modules[name]
    raise
  return module


def _load_module(name: str) -> ModuleType:
  if name in sys.modules:
    return sys.modules[name]
  added = os.getcwd() not in sys.path
  if added:
    sys.path.append(os.getcwd())
  try:
    return importlib.import_module(name)
  except ModuleNotFoundError as e:
    if e.name and name.split('.')[0] == e.name.split('.')[0]:
      raise _plugin_error(
          f'attention plugin module {name!r} not found on sys.path or in {os.getcwd()} '
          '(give a path to a .py file, or install the module)') from None
    raise


def _is_file_entry(entry: str) -> bool:
  return entry.endswith('.py') or os.sep in entry or '/' in entry


def load(spec: Optional[str]) -> list[ModuleType]:
  """Imports every plugin of ``spec`` (comma-separated files or module names); returns the modules."""
  modules = []
  for entry in _entries(spec):
    if _is_file_entry(entry):
      modules.append(_load_file(entry))
    else:
      modules.append(_load_module(entry))
  return modules


def absolute(spec: Optional[str]) -> str:
  """``spec`` with each ``.py`` path made absolute (relative to the current directory)."""
  return ','.join(os.path.abspath(e) if _is_file_entry(e) else e for e in _entries(spec))


def split_plugin_flag(args: Sequence[str]) -> tuple[list[str], str]:
  """``args`` without their ``--plugin X`` / ``--plugin=X`` flags, and the plugins they name
  (comma-joined, paths made absolute). Arguments after ``--`` are left alone."""
  rest, found, args, i = [], [], list(args), 0
  while i < len(args):
    a = args[i]
    if a == '--':
      rest += args[i:]
      break
    if a == '--plugin' and i + 1 < len(args):
      found.append(args[i + 1])
      i += 2
      continue
    if a.startswith('--plugin='):
      found.append(a[len('--plugin='):])
    else:
      rest.append(a)
    i += 1
  return rest, absolute(','.join(found))


def export(spec: str) -> str:
  """Adds ``spec`` to ``$KERNELFORMER_PLUGIN`` (inherited by subprocesses); returns the whole value."""
  entries = _entries(os.environ.get(ENV_VAR, ''))
  entries += [e for e in _entries(spec) if e not in entries]
  os.environ[ENV_VAR] = ','.join(entries)
  return os.environ[ENV_VAR]


@contextlib.contextmanager
def config_dir_on_path(config_path: Optional[str]) -> Iterator[None]:
  """While a config file loads, its folder is importable: ``import my_kernels`` beside it works."""
  folder = os.path.dirname(os.path.abspath(config_path)) if config_path else None
  added = bool(folder) and folder not in sys.path
  if added:
    sys.path.insert(0, folder)
  try:
    yield
  finally:
    if added and folder in sys.path:
      sys.path.remove(folder)


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      h.update(block)
  return h.hexdigest()


def _entry_file(entry: str) -> Optional[str]:
  if _is_file_entry(entry):
    return os.path.abspath(entry)
  module = sys.modules.get(entry)
  f = getattr(module, '__file__', None)
  return os.path.abspath(f) if f else None


def provenance(attention: Any) -> list[dict]:
  """``[{'file', 'sha256'}]``: the plugin files named by ``attention.plugin`` and every file of user
  code that registered a part of ``attention.kind`` (a config file's ``import``, ``--plugin``)."""
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  files = [f for f in map(_entry_file, _entries(attention.get('plugin'))) if f]
  files += [f for f in registry.sources(attention.get('kind')) if f not in files]
  return [{'file': f, 'sha256': _sha256(f) if os.path.isfile(f) else ''} for f in files]
