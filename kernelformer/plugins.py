"""A user's kernels: the registration API, and ``config.model.attention.plugin``'s modules imported first.

A plugin is an ordinary module that registers feature maps, samplers or mechanisms at import with this
module's ``register_feature_map`` (a ``FeatureMap`` record), ``register_component`` (the same, as a
decorator), ``register_sampler`` and ``register_mechanism``; see docs/extending.md. ``plugin`` is a
comma-separated list; each entry is

* a path to a ``.py`` file (absolute, or relative to the current directory), imported under a name
  derived from its absolute path, or
* an importable module name (``my_kernels``, ``mypackage.kernels``), found on ``sys.path`` (the current
  directory is tried too).

Loading is idempotent: a file or module already imported (by an earlier call, or by the config file
that imports it) is not imported again, so nothing registers twice.

Where plugins come from, all loaded before any kernel name is looked up (docs/extending.md, "Three ways
to load your module"): ``--config.model.attention.plugin=...`` (loaded when the config is parsed, and
again by the trainer); ``--plugin ...`` on every command (``split_plugin_flag``; exported as
``$KERNELFORMER_PLUGIN`` for a sweep's subprocesses); a config file's own ``import my_kernels`` (its
folder is on ``sys.path`` while it loads, ``config_dir_on_path``).

``provenance`` lists the files a run's kernel came from with their sha256 digests (results.json's
``plugins``). This module imports no JAX until a plugin is loaded or registers something: the
``kernelformer`` command loads it before JAX (``kernelformer/cli.py``), so the registration functions
import the library where they run.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any, Callable, Iterator, Optional, Sequence

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
  files = [f for f in map(_entry_file, _entries(attention.get('plugin'))) if f]
  files += [f for f in sources(attention.get('kind')) if f not in files]
  return [{'file': f, 'sha256': _sha256(f) if os.path.isfile(f) else ''} for f in files]


# ----------------------------------------------------------------------------------------------------
# Registering kernels from outside the package (docs/extending.md). A user's module calls these at
# import; ``load`` (``--config.model.attention.plugin=FILE.py|module``, ``--plugin``) or an import in the
# user's config file runs it.
# ----------------------------------------------------------------------------------------------------

# Where registered user code lives: ('component' | 'sampler' | 'mechanism', name) -> absolute file path.
# ``sources(kind)`` combines them, so results.json names the files a run's kernel came from.
_SOURCES: dict[tuple[str, str], str] = {}


def _source_file(obj: Any) -> str:
  import inspect  # pylint: disable=g-import-not-at-top
  try:
    path = inspect.getsourcefile(obj)
  except TypeError:
    path = None
  if not path:
    path = getattr(sys.modules.get(getattr(obj, '__module__', ''), None), '__file__', None)
  return os.path.abspath(path) if path else ''


def sources(name: str) -> list[str]:
  """Files of user code (plugins, config files) that registered a part of kernel ``name``: its
  component, its sampler or the whole mechanism; empty for a built-in."""
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  spec = registry.get(name)
  keys = [('mechanism', spec.name.lower()), ('component', spec.fixed.get('component', '')),
          ('sampler', spec.fixed.get('weights', ''))]
  out = []
  for key in keys:
    path = _SOURCES.get(key)
    if path and path not in out:
      out.append(path)
  return out


def register_feature_map(record):
  """Registers a feature map (a ``kernelformer.features.feature_map.FeatureMap``) and its kinds.

  The record joins the catalog; a map with a projection (``parts > 0``) and no ``kind`` of its own is
  paired with every weight sampler as ``<name>-<sampler>`` (and learnable FastFood), a map without one
  is the single kind ``<name>`` (or ``record.kind``). Returns the record.
  """
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  from kernelformer.attention import random_features  # pylint: disable=g-import-not-at-top
  from kernelformer.features import catalog  # pylint: disable=g-import-not-at-top
  registry.list_kernels()          # the built-in kinds first, so a taken name fails here, not later
  catalog.register(record)
  _SOURCES[('component', record.name)] = _source_file(record.fn)
  for spec in random_features.grid_specs(component=record.name):
    registry.register(spec)
  return record


def register_component(name: str, fn: Callable | None = None, *, target_kernel: str, parts: int,
                       positive: bool = False, paper: str = '', approximates: str = ''):
  """``register_feature_map`` for a function: a decorator building its ``FeatureMap`` record.

  ``fn(q, k, proj, *, mask=None, stabilize=True) -> (phi_q, phi_k)``: the contract of
  ``kernelformer.features.components`` (``proj`` a ``Projection``: ``projection.project(x, proj)`` is
  x W^T). ``parts``: features per row of W (Spectraformer eq. 11's l; 0: no W, one kernel named
  ``name``); ``target_kernel``: 'softmax', 'gaussian' or 'none'. Without ``fn`` it is a decorator; the
  decorated function is returned unchanged.
  """
  def decorate(f):
    from kernelformer.features.feature_map import FeatureMap  # pylint: disable=g-import-not-at-top
    register_feature_map(FeatureMap(name, f, target_kernel, parts=parts, positive=positive, paper=paper,
                                    approximates=approximates))
    return f
  return decorate if fn is None else decorate(fn)


def register_sampler(name: str, fn: Callable | None = None, *, paper: str = ''):
  """Registers a weight sampler ``fn(key, num_features, dim) -> Projection`` and its kernels.

  Every projection-based component (built-in and registered) gets ``<component>-<name>``. Without
  ``fn`` it is a decorator; the function is returned unchanged.
  """
  def decorate(f):
    from kernelformer import registry  # pylint: disable=g-import-not-at-top
    from kernelformer.attention import random_features  # pylint: disable=g-import-not-at-top
    from kernelformer.features import weights  # pylint: disable=g-import-not-at-top
    registry.list_kernels()
    weights.register_sampler(name, f)
    _SOURCES[('sampler', name)] = _source_file(f)
    for spec in random_features.grid_specs(sampler=name, paper=paper):
      registry.register(spec)
    return f
  return decorate if fn is None else decorate(fn)


def register_mechanism(name: str, module: type | None = None, **spec_fields):
  """Registers a whole mechanism: a Flax module class with the registry's call signature.

  ``spec_fields`` are the other ``AttentionSpec`` fields (``fixed``, ``paper``, ``approximates``,
  ``complexity``, ``learnable``, ``aliases``, ``supports_position_bias``, ...). The module's dataclass
  fields are its options; they are config fields only if the mechanism is registered before the config
  is built (import the plugin at the top of the config file). Without ``module`` it is a class decorator.
  """
  def decorate(cls):
    from kernelformer import registry  # pylint: disable=g-import-not-at-top
    from kernelformer.configs import common  # pylint: disable=g-import-not-at-top
    spec = registry.register(registry.AttentionSpec(name=name, module=cls, **spec_fields))
    common.OPTIONS.update({k: t for k, t in registry.option_types([spec]).items() if k not in common.OPTIONS})
    _SOURCES[('mechanism', name.lower())] = _source_file(cls)
    return cls
  return decorate if module is None else decorate(module)
