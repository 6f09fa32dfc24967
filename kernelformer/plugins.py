"""Loading a user's kernels: ``config.model.attention.plugin`` names Python modules to import first.

A plugin is an ordinary module that registers components, samplers or mechanisms at import
(``kernelformer.registry.register_component`` / ``register_sampler`` / ``register_mechanism``; see
docs/extending.md). ``plugin`` is a comma-separated list; each entry is

* a path to a ``.py`` file (absolute, or relative to the current directory), imported under a name
  derived from its absolute path, or
* an importable module name (``my_kernels``, ``mypackage.kernels``), found on ``sys.path`` (the current
  directory is tried too).

Loading is idempotent: a file or module already imported (by an earlier call, or by the config file
that imports it) is not imported again, so nothing registers twice. The trainer loads the plugin before
it builds the model; ``kernelformer kernels --plugin`` and ``kernelformer config`` take the same values.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Optional

from kernelformer import registry


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
    raise registry.KernelPluginError(
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
      raise registry.KernelPluginError(
          f'attention plugin module {name!r} not found on sys.path or in {os.getcwd()} '
          '(give a path to a .py file, or install the module)') from None
    raise


def load(spec: Optional[str]) -> list[ModuleType]:
  """Imports every plugin of ``spec`` (comma-separated files or module names); returns the modules."""
  modules = []
  for entry in _entries(spec):
    if entry.endswith('.py') or os.sep in entry or '/' in entry:
      modules.append(_load_file(entry))
    else:
      modules.append(_load_module(entry))
  return modules
