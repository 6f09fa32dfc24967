"""Sweeps: many training runs named by their overrides, each resumable and skipped once finished.

A sweep is a list of points. A point is a task config file, a preset and config overrides (one of
which is usually ``seed``); every point trains with ``train_and_evaluate`` in its own work directory::

    SWEEP_DIR/<config stem>-<preset>/<short key>=<value>__...__seed=<s>

The directory name is built only from the point's overrides (sorted, seed last), so it is stable across
invocations and readable in ``ls``; characters outside ``[A-Za-z0-9._+=-]`` become ``_`` and a short hash
of the exact overrides is appended whenever that (or truncation) could make two points collide.
Overrides that apply to every point (``Sweep.common``, ``--set``) are recorded but kept out of the name.

Re-running a sweep is always safe: a point whose ``results.json`` exists is skipped (the trainer writes
that file last, atomically), a point with a checkpoint resumes (``train_and_evaluate`` resumes by
itself), and a point that raises is appended to ``SWEEP_DIR/failures.jsonl`` while the sweep goes on.
Each work directory holds ``sweep_point.json`` (what made it); a later sweep that would reuse the
directory with different settings is refused, so runs with different settings are never mixed.
``SWEEP_DIR/sweep.json`` lists every point ever planned into the directory, so a report shows missing
runs as missing instead of dropping them.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import importlib.util
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from kernelformer.training.record import RECORD_NEXT, read_results

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The task configs ship as kernelformer.configs (a checkout's configs/ folder; kernelformer/configs links to it).
SWEEPS_DIR = os.path.join(REPO_ROOT, 'kernelformer', 'configs', 'sweeps')
KIND_KEY = 'model.attention.kind'
SEED_KEY = 'seed'
POINT_FILE = 'sweep_point.json'
SWEEP_FILE = 'sweep.json'
FAILURES_FILE = 'failures.jsonl'
RESULTS_FILE = 'results.json'
_SAFE = re.compile(r'[^A-Za-z0-9._+=-]')
_MAX_NAME = 150

Overrides = tuple[tuple[str, Any], ...]


class SweepError(ValueError):
  """A sweep that cannot be expanded or planned; the message says what to change."""


# ----------------------------------------------------------------------------------------------------
# Values and points.


def parse_value(text: str) -> Any:
  """A command-line value as ml_collections would read it: bool, int, float, None or string.

  The final type is decided by the config field when the override is applied (``coerce``), so
  ``kind=1`` still sets a string field to ``'1'``.
  """
  s = text.strip()
  low = s.lower()
  if low in ('true', 'false'):
    return low == 'true'
  if low == 'none':
    return None
  for cast in (int, float):
    try:
      return cast(s)
    except ValueError:
      pass
  return s


def parse_assignment(text: str, *, multi: bool) -> tuple[str, list[Any]]:
  """``'a.b=1,2'`` -> ``('a.b', [1, 2])`` (``multi``) or ``('a.b', ['1,2'])`` (a single value)."""
  key, sep, rhs = text.partition('=')
  key = key.strip()
  if not sep or not key or not re.fullmatch(r'[A-Za-z_][A-Za-z0-9_.]*', key):
    raise SweepError(f'expected KEY=VALUE{",VALUE..." if multi else ""}, got {text!r}')
  key = key[len('config.'):] if key.startswith('config.') else key
  values = [parse_value(v) for v in (rhs.split(',') if multi else [rhs])]
  if multi and any(v == '' for v in values):
    raise SweepError(f'empty value in {text!r}')
  return key, values


@dataclasses.dataclass(frozen=True)
class Point:
  """One training run of a sweep, before it is given a directory."""

  config: str                       # task config file, relative to the repository root when inside it
  preset: str                       # argument of the file's get_config()
  overrides: Overrides = ()         # (dotted key, value) pairs: part of the run's identity and name
  label: str = ''                   # report row; default: the attention kind

  def get(self, key: str, default: Any = None) -> Any:
    return dict(self.overrides).get(key, default)


@dataclasses.dataclass(frozen=True)
class Sweep:
  name: str
  points: tuple[Point, ...]
  common: Overrides = ()            # applied to every point, kept out of directory names
  paper: str = ''                   # paper_numbers key whose printed numbers the report shows
  description: str = ''
  # Keys besides the kind that name a report row when a point has no label (never the seed: seeds
  # of one row are averaged).
  label_keys: tuple[str, ...] = ()
  argv: tuple[str, ...] = ()        # the `kernelformer sweep` flags that define it (packed jobs' commands)


def grid(config: str, preset: str, axes: Mapping[str, Sequence[Any]], *, label: str = '') -> list[Point]:
  """The cartesian product of ``axes`` (in their order) as points."""
  return [Point(config=config, preset=preset, overrides=tuple(zip(axes, values)), label=label)
          for values in itertools.product(*(list(v) for v in axes.values()))]


def _relative_config(path: str) -> str:
  absolute = os.path.abspath(path)
  if os.path.isfile(absolute):
    rel = os.path.relpath(absolute, REPO_ROOT)
    return absolute if rel.startswith('..') else rel.replace(os.sep, '/')
  return path.replace(os.sep, '/')


def parse_sets(sets: Sequence[str]) -> Overrides:
  """``--set KEY=VALUE`` flags as overrides (the value may contain commas)."""
  return tuple((k, v[0]) for k, v in (parse_assignment(s, multi=False) for s in sets))


def sweep_from_flags(configs: Sequence[str], grids: Sequence[str], sets: Sequence[str] = (),
                     name: str = 'grid') -> Sweep:
  """The sweep of ``scripts/sweep.py --config FILE:PRESET --grid KEY=V1,V2 ... --set KEY=V``."""
  if not configs:
    raise SweepError('give --config FILE.py:PRESET (repeatable) or --sweep NAME')
  axes: dict[str, list[Any]] = {}
  for g in grids:
    key, values = parse_assignment(g, multi=True)
    if key in axes:
      raise SweepError(f'--grid {key} given twice')
    axes[key] = values
  common = parse_sets(sets)
  argv = [*(a for spec in configs for a in ('--config', _relative_config(spec.partition(':')[0]) +
                                               ''.join(spec.partition(':')[1:]))),
          *(a for g in grids for a in ('--grid', g)), *(a for t in sets for a in ('--set', t))]
  clash = set(axes) & {k for k, _ in common}
  if clash:
    raise SweepError(f'{", ".join(sorted(clash))} given both as --grid and --set')
  points = []
  for spec in configs:
    path, _, preset = spec.partition(':')
    points += grid(_relative_config(path), preset, axes)
  # Report rows: the kind plus every other swept key but the seed (seeds of a row are averaged).
  return Sweep(name=name, points=tuple(points), common=common,
               label_keys=tuple(k for k in axes if k not in (KIND_KEY, SEED_KEY)), argv=tuple(argv))


# ----------------------------------------------------------------------------------------------------
# Expansion: kinds checked against the registry, names made unique.


def expand(sweep: Sweep) -> Sweep:
  """Checks every attention kind against the registry and writes kinds by their canonical name.

  Aliases become canonical names (``performer`` -> ``posrf-orf``) so one kernel always lands in one
  directory. All unknown kinds are reported together, with the valid names. (A point that sets no kind
  uses its preset's, which the trainer checks when the run starts.)
  """
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  if not sweep.points:
    raise SweepError(f'sweep {sweep.name!r} has no points (a grid axis without values?); nothing '
                     f'would be trained')
  kinds = sorted({str(p.get(KIND_KEY)) for p in sweep.points if p.get(KIND_KEY) is not None} |
                 {str(v) for k, v in sweep.common if k == KIND_KEY})
  unknown, canonical = [], {}
  for k in kinds:
    try:
      canonical[k] = registry.get(k).name
    except registry.UnknownKernelError:
      unknown.append(k)
  if unknown:
    raise SweepError(f'sweep {sweep.name!r}: {registry.unknown_message(unknown)}')

  def fix(overrides: Overrides) -> Overrides:
    return tuple((k, canonical[str(v)] if k == KIND_KEY and v is not None else v) for k, v in overrides)

  points = []
  for p in sweep.points:
    overrides = fix(p.overrides)
    label = p.label
    if not label:
      values = dict(overrides)
      parts = [str(values[KIND_KEY])] if values.get(KIND_KEY) is not None else []
      parts += [f'{k.rsplit(".", 1)[-1]}={format_value(values[k])}'
                for k in sweep.label_keys if k in values]
      label = ', '.join(parts)
    points.append(dataclasses.replace(p, overrides=overrides, label=label))
  seen: dict[str, Point] = {}
  for p in points:
    d = point_dirname(p)
    if d in seen:
      raise SweepError(f'sweep {sweep.name!r}: two points share the directory {d}: {seen[d]} and {p}')
    seen[d] = p
  return dataclasses.replace(sweep, points=tuple(points), common=fix(sweep.common))


def named_sweeps(directory: str = SWEEPS_DIR) -> list[str]:
  return sorted(f[:-3] for f in os.listdir(directory)
                if f.endswith('.py') and not f.startswith('_'))


def load_sweep(name: str, directory: str = SWEEPS_DIR, *, validate: bool = True) -> Sweep:
  """``configs/sweeps/<name>.py``'s ``get_sweep()``, expanded (kinds validated) unless ``validate=False``."""
  path = os.path.join(directory, f'{name}.py')
  if not os.path.isfile(path):
    raise SweepError(f'no sweep {name!r} ({path} does not exist); named sweeps: '
                     f'{", ".join(named_sweeps(directory))}')
  sweep = dataclasses.replace(sweep_from_data(_import_file(path, f'_kernelformer_sweep_{name}')
                                              .get_sweep()), argv=('--sweep', name))
  return expand(sweep) if validate else sweep


def sweep_from_data(data: Mapping[str, Any]) -> Sweep:
  """A sweep file's ``get_sweep()`` (plain data: sweep files import nothing of the package) as a Sweep.

  ``data``: ``name``, ``points``, and optionally ``common``, ``paper``, ``description``, ``label_keys``
  (the ``Sweep`` fields; ``common`` a dict). Each entry of ``points`` is a dict: ``config``, ``preset``,
  ``grid`` (key -> values: one point per combination, in order), ``overrides`` (key -> value, joining
  every point of the entry) and ``label``.
  """
  points = []
  for p in data['points']:
    axes = {**p.get('grid', {}), **{k: (v,) for k, v in p.get('overrides', {}).items()}}
    points += grid(p['config'], p['preset'], axes, label=p.get('label', ''))
  return Sweep(name=data['name'], points=tuple(points), common=tuple(data.get('common', {}).items()),
               paper=data.get('paper', ''), description=data.get('description', ''),
               label_keys=tuple(data.get('label_keys', ())))


# ----------------------------------------------------------------------------------------------------
# Directory names.


def format_value(v: Any) -> str:
  if isinstance(v, float):
    return repr(v)
  return str(v)


def _short_keys(keys: Sequence[str]) -> dict[str, str]:
  """Last component of each dotted key, or the whole key where two last components coincide."""
  last = [k.rsplit('.', 1)[-1] for k in keys]
  return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def ordered(overrides: Overrides) -> list[tuple[str, Any]]:
  return sorted(overrides, key=lambda kv: (kv[0] == SEED_KEY, kv[0]))


def point_dirname(point: Point) -> str:
  """``<config stem>-<preset>/<key>=<value>__...``: stable, readable, filesystem-safe."""
  stem = os.path.splitext(os.path.basename(point.config))[0]
  group = _SAFE.sub('_', f'{stem}-{point.preset}' if point.preset else stem)
  items = ordered(point.overrides)
  short = _short_keys([k for k, _ in items])
  raw = '__'.join(f'{short[k]}={format_value(v)}' for k, v in items) or 'default'
  safe = _SAFE.sub('_', raw)
  if safe != raw or len(safe) > _MAX_NAME:
    digest = hashlib.sha1(json.dumps([[k, format_value(v)] for k, v in items]).encode()).hexdigest()
    safe = f'{safe[:_MAX_NAME]}-{digest[:8]}'
  return f'{group}/{safe}'


# ----------------------------------------------------------------------------------------------------
# Configs.


def _import_file(path: str, module_name: str):
  if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)  # config files import ``kernelformer.configs.common``
  from kernelformer import plugins  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(module_name, path)
  module = importlib.util.module_from_spec(spec)
  with plugins.config_dir_on_path(path):  # a config file may ``import my_kernels`` beside it
    spec.loader.exec_module(module)
  return module


def resolve_config_path(config: str) -> str:
  for candidate in (config, os.path.join(REPO_ROOT, config)):
    if os.path.isfile(candidate):
      return os.path.abspath(candidate)
  raise SweepError(f'config file {config} not found (looked in {os.getcwd()} and {REPO_ROOT})')


def load_config(config: str, preset: str):
  """``get_config(preset)`` of a task config file, as ``--config FILE:PRESET`` would load it."""
  path = resolve_config_path(config)
  module = _import_file(path, '_kernelformer_config_' + re.sub(r'\W', '_', path))
  return module.get_config(preset) if preset else module.get_config()


def coerce(config, key: str, value: Any) -> Any:
  """``value`` converted to the type of the config field ``key`` (as ml_collections flags do)."""
  parent, leaf = _parent(config, key)
  if leaf not in parent:
    import difflib  # pylint: disable=g-import-not-at-top
    close = difflib.get_close_matches(leaf, list(parent.keys()), n=1)
    hint = f' Did you mean {key.rsplit(".", 1)[0] + "." if "." in key else ""}{close[0]}?' if close else ''
    raise SweepError(f'config has no field {key!r}.{hint}')
  field_type = parent.get_type(leaf)
  if value is None:
    return None
  if field_type is bool:
    return value if isinstance(value, bool) else parse_value(str(value)) is True
  if field_type is str:
    return value if isinstance(value, str) else format_value(value)
  if field_type is int and isinstance(value, float) and value.is_integer():
    return int(value)
  if field_type is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  return value


def _parent(config, key: str):
  node = config
  *parents, leaf = key.split('.')
  for i, p in enumerate(parents):
    if p not in node:
      raise SweepError(f'config has no field {".".join(parents[:i + 1])!r} (in override {key!r})')
    node = node[p]
  return node, leaf


def apply_overrides(config, overrides: Iterable[tuple[str, Any]]):
  """Sets each dotted key (the config stays locked: no new fields), returns ``config``."""
  for key, value in overrides:
    parent, leaf = _parent(config, key)
    parent[leaf] = coerce(config, key, value)
  return config


def point_config(point: Point, common: Overrides = ()):
  return apply_overrides(load_config(point.config, point.preset), [*common, *point.overrides])


# ----------------------------------------------------------------------------------------------------
# Planning and running.


@dataclasses.dataclass
class Run:
  """A point placed in a sweep directory."""

  point: Point
  workdir: str
  task: str
  kind: str
  seed: Optional[int]
  common: Overrides = ()
  error: str = ''                   # why the point cannot start (e.g. its config file is missing)

  @property
  def name(self) -> str:
    return point_dirname(self.point)

  def identity(self) -> dict:
    return {'config': self.point.config, 'preset': self.point.preset,
            'overrides': {k: v for k, v in ordered(self.point.overrides)},
            'common': {k: v for k, v in self.common}}

  def status(self) -> str:
    """'done' (a finished run's results.json), 'resume' (a checkpoint exists), 'new'; 'error' if it
    cannot start. A results.json that cannot be read is not 'done' (``unreadable``)."""
    results, _ = read_results(self.workdir)
    if results is not None:
      return 'done'
    if self.error:
      return 'error'
    return 'new' if checkpoint_step(self.workdir) is None else 'resume'

  def unreadable(self) -> str:
    """The line naming this point's results.json where it cannot be read, else ''."""
    _, why = read_results(self.workdir)
    return why and f'{os.path.join(self.workdir, RESULTS_FILE)} {why}: not finished'

  @property
  def members(self) -> tuple[Run, ...]:
    return (self,)

  def command(self, python: str = 'python', config_path: str = '', launcher: Sequence[str] = (),
              sweep_dir: str = '') -> list[str]:
    """The equivalent ``scripts/train.py`` command line (for ``--emit``, ``--parallel``, launchers).

    ``launcher`` (e.g. ``python -m kernelformer``, which an installed package has where a ``scripts/``
    folder may not exist) replaces ``python scripts/``, and the run's progress bar is off;
    ``sweep_dir``: the sweep directory as the job sees it (default: this one).
    """
    path = config_path or self.point.config
    spec = f'{path}:{self.point.preset}' if self.point.preset else path
    workdir = f'{sweep_dir.rstrip("/")}/{self.name}' if sweep_dir else self.workdir
    args = [*launcher, 'train'] if launcher else [python, 'scripts/train.py']
    args += ['--config', spec, '--workdir', workdir]
    for k, v in [*self.common, *ordered(self.point.overrides)]:
      args.append(f'--config.{k}={format_value(v)}')
    return args + (['--config.progress=False'] if launcher else [])


@dataclasses.dataclass
class Pack(Run):
  """Unfinished points of one config that differ only in ``population.FIELDS``, trained as one
  population (``--pack``): one job, whose members' work directories are the points' own."""

  members: tuple[Run, ...] = ()     # (a Run is its own only member)
  argv: tuple[str, ...] = ()        # Sweep.argv
  sweep_dir: str = ''

  @property
  def name(self) -> str:
    return ' + '.join(r.name for r in self.members)

  def config(self):
    """The first point's config with ``population``: each member's values of the varying fields."""
    from kernelformer.training import population  # pylint: disable=g-import-not-at-top
    configs = [point_config(r.point, r.common) for r in self.members]
    value = lambda c, f: _parent(c, f)[0][f.rsplit('.', 1)[-1]]
    varying = [f for f in population.FIELDS if len({value(c, f) for c in configs}) > 1]
    with configs[0].unlocked():
      configs[0].population = [{f: value(c, f) for f in varying} for c in configs]
    return configs[0]

  def command(self, python: str = 'python', launcher: Sequence[str] = (), sweep_dir: str = '',
              **_) -> list[str]:
    """``kernelformer sweep <the sweep's flags> --pack N --points A,B,...``: the sweep trains exactly
    these points, those still unfinished, as one population (``argv``: configs by absolute or
    repository path)."""
    return [*([*launcher, 'sweep'] if launcher else [python, 'scripts/sweep.py']), *self.argv,
            '--sweep_dir', sweep_dir or self.sweep_dir, '--pack', str(len(self.members)),
            '--points', ','.join(r.name for r in self.members)]


def checkpoint_step(workdir: str) -> Optional[int]:
  ckpt = os.path.join(workdir, 'checkpoints')
  steps = [int(n) for n in os.listdir(ckpt) if n.isdigit()] if os.path.isdir(ckpt) else []
  return max(steps) if steps else None


class SweepInterrupted(Exception):
  """SIGINT/SIGTERM stopped the sweep; the running point saved its checkpoint. ``exit_code`` 130/143."""

  def __init__(self, message: str, exit_code: int):
    super().__init__(message)
    self.exit_code = exit_code


INTERRUPT_EXIT_CODES = (130, 143)   # the trainer's exit codes for SIGINT / SIGTERM (checkpoint saved)


def raise_on_sigterm(signum, frame):  # pylint: disable=unused-argument
  raise SweepInterrupted('terminated (SIGTERM)', 143)


def plan(sweep: Sweep, sweep_dir: str) -> list[Run]:
  """Places every point under ``sweep_dir`` and checks its overrides against its config.

  A config file that cannot be loaded (not written yet, unknown preset) makes its points 'error'
  (recorded as failures when run); an override naming no field of a config that does load is a
  mistake in the sweep itself and stops the whole sweep before anything trains. So does a work
  directory left by a point with different settings.
  """
  runs = []
  cache: dict[tuple[str, str], Any] = {}
  for p in sweep.points:
    key = (p.config, p.preset)
    if key not in cache:
      try:
        cache[key] = load_config(p.config, p.preset)
      except Exception as e:  # pylint: disable=broad-except  (reported per point, the sweep goes on)
        cache[key] = e
    base = cache[key]
    workdir = os.path.join(sweep_dir, point_dirname(p))
    if isinstance(base, Exception):
      stem = os.path.splitext(os.path.basename(p.config))[0]
      runs.append(Run(p, workdir, stem, str(p.get(KIND_KEY) or ''), p.get(SEED_KEY), sweep.common,
                      error=f'cannot load {p.config}:{p.preset}: {type(base).__name__}: {base}'))
      continue
    config = base.copy_and_resolve_references()
    try:
      apply_overrides(config, [*sweep.common, *p.overrides])
    except (SweepError, TypeError, ValueError) as e:
      raise SweepError(f'sweep {sweep.name!r}, point {point_dirname(p)}: {e}') from None
    runs.append(Run(p, workdir, str(config.data.task), str(config.model.attention.kind),
                    int(config.seed), sweep.common))
  conflicts = []
  for r in runs:
    path = os.path.join(r.workdir, POINT_FILE)
    if os.path.isfile(path):
      with open(path, encoding='utf-8') as f:
        before = json.load(f).get('identity')
      if before != _jsonable(r.identity()):
        conflicts.append(f'{r.workdir}: made with {before}, now {_jsonable(r.identity())}')
  if conflicts:
    raise SweepError('work directories made with different settings (use another --sweep_dir): ' +
                     '; '.join(conflicts))
  return runs


def packed(runs: Sequence[Run], size: int, sweep: Sweep, sweep_dir: str) -> list[Run]:
  """``runs`` with the unfinished points that differ only in ``population.FIELDS`` (same config file,
  preset and other overrides) as ``Pack``s of at most ``size`` members (-1: as many as ``fit`` a
  device); finished points and points that cannot start stay as they are."""
  from kernelformer.training import population  # pylint: disable=g-import-not-at-top
  groups: dict[Any, list[Run]] = {}
  for r in runs:
    shared = tuple((k, format_value(v)) for k, v in ordered(r.point.overrides) if k not in population.FIELDS)
    alone = r.error or r.status() == 'done'
    groups.setdefault(r.name if alone else (r.point.config, r.point.preset, shared), []).append(r)
  out = []
  for group in groups.values():
    as_pack = lambda chunk, r=group[0]: Pack(r.point, r.workdir, r.task, r.kind, r.seed, r.common,
                                             members=tuple(chunk), argv=sweep.argv, sweep_dir=sweep_dir)
    n = size if size > 0 else fit(as_pack(group).config()) if len(group) > 1 else 1
    out += [c[0] if len(c) == 1 else as_pack(c) for c in (group[i:i + n] for i in range(0, len(group), n))]
  return out


def step_bytes(config) -> int:
  """One device's bytes for ``config``'s population step by XLA's ``memory_analysis`` (compiled ahead)."""
  import lra_tasks  # pylint: disable=g-import-not-at-top
  from kernelformer.bench import train_step  # pylint: disable=g-import-not-at-top
  from kernelformer.training import metrics, population  # pylint: disable=g-import-not-at-top
  info = lra_tasks.get(config.data.task).info(config.data)
  pop, state, window = population.build(config, info, train_step.random_source(info, config.batch_size))
  return metrics.memory_of(pop.compile(state, window, pop.batch(0)), total=True)


def device_memory() -> int:
  """An accelerator's ``bytes_limit``; on CPU, the available RAM (``MemAvailable``) / devices."""
  import jax  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0]
  if device.platform != 'cpu':
    return int(device.memory_stats()['bytes_limit'])
  with open('/proc/meminfo', encoding='utf-8') as f:
    kib = next(int(l.split()[1]) for l in f if l.startswith('MemAvailable:'))
  return kib * 1024 // jax.device_count()


def fit(config, fraction: float = 0.9) -> int:
  """The most members of ``config.population`` (a prefix) whose step ``step_bytes`` puts within
  ``fraction`` of ``device_memory()``, tried from all down (on several devices a population's members x
  data split can make more members need less per device); at least 1 (a point's single run)."""
  budget, members = fraction * device_memory(), list(config.population)
  for n in range(len(members), 1, -1):
    with config.unlocked():
      config.population = members[:n]
    if step_bytes(config) <= budget:
      return n
  return 1


def _jsonable(x: Any) -> Any:
  return json.loads(json.dumps(x, default=str))


def _lead_only(write):
  """The sweep's files are written by process 0 of a multi-host (packed) job only, as the trainer's."""
  def wrapper(*args):
    from jax._src import distributed  # pylint: disable=g-import-not-at-top  (no backend started)
    return write(*args) if not distributed.global_state.process_id else None
  return wrapper


@_lead_only
def write_sweep_file(sweep: Sweep, sweep_dir: str, runs: Sequence[Run]) -> str:
  """``sweep_dir/sweep.json``: every run ever planned here (merged with earlier invocations)."""
  os.makedirs(sweep_dir, exist_ok=True)
  path = os.path.join(sweep_dir, SWEEP_FILE)
  entries: dict[str, dict] = {}
  meta = {'name': sweep.name, 'paper': sweep.paper, 'description': sweep.description}
  if os.path.isfile(path):
    with open(path, encoding='utf-8') as f:
      old = json.load(f)
    entries = {e['workdir']: e for e in old.get('runs', [])}
    meta = {k: old.get(k) or v for k, v in meta.items()}
  for r in (m for run in runs for m in run.members):
    entries[r.name] = {'workdir': r.name, 'label': r.point.label or r.kind, 'kind': r.kind,
                       'task': r.task, 'seed': r.seed, **_jsonable(r.identity())}
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump({**meta, 'runs': list(entries.values())}, f, indent=1)
  os.replace(tmp, path)
  return path


@_lead_only
def record_failure(sweep_dir: str, run: Run, error: str, details: str = '') -> None:
  entry = {'time': datetime.datetime.now().isoformat(timespec='seconds'), 'workdir': run.name,
           'task': run.task, 'kind': run.kind, 'seed': run.seed, 'error': error,
           'details': details[-4000:], 'command': shlex.join(run.command())}
  with open(os.path.join(sweep_dir, FAILURES_FILE), 'a', encoding='utf-8') as f:
    f.write(json.dumps(entry) + '\n')


@_lead_only
def write_point_file(run: Run) -> None:
  os.makedirs(run.workdir, exist_ok=True)
  with open(os.path.join(run.workdir, POINT_FILE), 'w', encoding='utf-8') as f:
    json.dump({'identity': _jsonable(run.identity()), 'label': run.point.label or run.kind,
               'kind': run.kind, 'task': run.task, 'seed': run.seed,
               'command': shlex.join(run.command())}, f, indent=1)


def run_sweep(sweep: Sweep, sweep_dir: str, *,
              train_fn: Optional[Callable[[Any, str], Any]] = None, parallel: int = 0,
              pack: int = 0, log: Callable[[str], None] = print) -> dict[str, int]:
  """Runs every unfinished point; returns counts ``{'done': skipped, 'ran', 'failed'}``.

  ``parallel=0`` trains in this process, one point after another, with ``train_fn`` (default
  ``train_and_evaluate``); ``parallel=N`` runs up to N ``scripts/train.py`` subprocesses at a time,
  each logging to ``<workdir>/train.log``. ``pack`` (``packed``'s size): populations trained by
  ``train_population`` instead of their points one by one. A KeyboardInterrupt stops the sweep (the
  running point has saved a checkpoint; run the same command again to continue).
  """
  runs = plan(sweep, sweep_dir)
  write_sweep_file(sweep, sweep_dir, runs)
  counts = {'done': 0, 'ran': 0, 'failed': 0}
  todo = []
  for r in runs:
    if r.status() == 'done':
      counts['done'] += 1
      log(f'skip (finished)  {r.name}')
    else:
      if r.unreadable():
        log(r.unreadable())
      todo.append(r)
  log(f'sweep {sweep.name}: {len(runs)} runs, {counts["done"]} finished, {len(todo)} to run')
  from kernelformer import data_location  # pylint: disable=g-import-not-at-top
  for data_dir in sorted({str(point_config(r.point, r.common).data.data_dir) for r in todo
                          if not r.error}):
    log(data_location.describe(data_dir))
  todo = packed(todo, pack, sweep, sweep_dir) if pack else todo
  if parallel and parallel > 0:
    _run_parallel(todo, sweep_dir, parallel, counts, log)
    return counts
  if train_fn is None:
    from kernelformer.training import trainer  # pylint: disable=g-import-not-at-top
    train_fn = trainer.train_and_evaluate
  for i, r in enumerate(todo):
    status = r.status()
    log(f'[{i + 1}/{len(todo)}] {status:6s} {r.name}')
    if r.error:
      record_failure(sweep_dir, r, r.error)
      counts['failed'] += 1
      log(f'  failed: {r.error}')
      continue
    for m in r.members:
      write_point_file(m)
    t0, error, results = time.time(), None, None
    try:
      if isinstance(r, Pack):
        from kernelformer.training import population_run  # pylint: disable=g-import-not-at-top
        population_run.train_population(r.config(), [m.workdir for m in r.members])
      else:
        results = train_fn(point_config(r.point, r.common), r.workdir) or {}
    except KeyboardInterrupt:
      log(f'interrupted during {r.name}; run the same command again to continue')
      raise
    except Exception as e:  # pylint: disable=broad-except  (recorded; the sweep goes on)
      code = getattr(e, 'exit_code', None)
      if isinstance(e, SweepInterrupted) or code in INTERRUPT_EXIT_CODES:
        # SIGINT/SIGTERM reached the trainer: it saved the point's checkpoint. Stop the sweep (a
        # preempted job must end), instead of recording a failure and starting the next point.
        log(f'interrupted during {r.name}; run the same command again to continue')
        raise SweepInterrupted(str(e), code or 143) from None
      error = (f'{type(e).__name__}: {e}', traceback.format_exc())
    for m in r.members:   # a population's member is finished where its results.json is
      results = read_results(m.workdir)[0] if isinstance(r, Pack) else results
      if results is None:
        record_failure(sweep_dir, m, *(error or ('did not finish; see its workdir', '')))
        counts['failed'] += 1
        log(f'  {m.name} failed after {time.time() - t0:.0f}s: {(error or ("did not finish",))[0]}')
        continue
      counts['ran'] += 1
      acc = results.get('test_accuracy') if isinstance(results, dict) else None
      log(f'  {m.name} finished in {time.time() - t0:.0f}s' +
          (f', test accuracy {acc:.4f}' if acc is not None else ''))
  return counts


def _run_parallel(todo: Sequence[Run], sweep_dir: str, slots: int, counts: dict, log) -> None:
  pending = [r for r in todo]
  active: list[tuple[Run, subprocess.Popen, Any, float]] = []
  try:
    while pending or active:
      while pending and len(active) < slots:
        r = pending.pop(0)
        if r.error:
          record_failure(sweep_dir, r, r.error)
          counts['failed'] += 1
          log(f'failed (cannot start) {r.name}: {r.error}')
          continue
        for m in r.members:
          write_point_file(m)
        logf = open(os.path.join(r.workdir, 'train.log'), 'a', encoding='utf-8')
        # Same working directory as this process, so relative data_dir and work directories mean
        # the same in the child; the config file by absolute path.
        cmd = r.command(launcher=(sys.executable, '-m', 'kernelformer'),
                        config_path=resolve_config_path(r.point.config))
        # The child imports this very kernelformer, installed or not (REPO_ROOT holds the package).
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (REPO_ROOT, os.environ.get('PYTHONPATH', '')) if p))
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=os.getcwd(), env=env)
        active.append((r, proc, logf, time.time()))
        log(f'start {r.name} (pid {proc.pid})')
      still = []
      for r, proc, logf, t0 in active:
        rc = proc.poll()
        if rc is None:
          still.append((r, proc, logf, t0))
          continue
        logf.close()
        finished = [m for m in r.members if read_results(m.workdir)[0] is not None]
        counts['ran'] += len(finished)
        if rc == 0 and len(finished) == len(r.members):
          log(f'finished {r.name} in {time.time() - t0:.0f}s')
        elif rc in INTERRUPT_EXIT_CODES:
          counts['interrupted'] = counts.get('interrupted', 0) + len(r.members) - len(finished)
          log(f'interrupted {r.name} (exit code {rc}, checkpoint saved); it resumes on the next run')
        else:   # a packed job's sweep recorded its own members' failures
          with open(os.path.join(r.workdir, 'train.log'), encoding='utf-8', errors='replace') as f:
            tail = f.read()[-4000:]
          last = [l for l in tail.splitlines() if l.strip()]
          for m in (r,) if not isinstance(r, Pack) else ():
            record_failure(sweep_dir, m, f'exit code {rc}: {last[-1] if last else ""}', tail)
          counts['failed'] += len(r.members) - len(finished)
          log(f'failed {r.name}: exit code {rc}')
      active = still
      if active:
        time.sleep(0.5)
  except (KeyboardInterrupt, SweepInterrupted) as e:
    sig = 15 if isinstance(e, SweepInterrupted) and e.exit_code == 143 else 2
    for r, proc, logf, _ in active:
      proc.send_signal(sig)  # SIGINT / SIGTERM: the trainer saves a checkpoint and exits
    for r, proc, logf, _ in active:
      proc.wait()
      logf.close()
    raise


def emit(runs: Sequence[Run], python: str = 'python') -> list[str]:
  """One shell command per unfinished run, for a cluster scheduler (run from the repository root)."""
  return [shlex.join(r.command(python=python)) for r in runs if r.status() != 'done']
