"""Shared plumbing of the subcommands: config specs that work outside the repository, help that exits 0.

Config specs. ``FILE.py[:PRESET]`` is looked up first as given (relative to the current directory, so a
user's own config file wins), then among the packaged task configs (``kernelformer.configs``: a
checkout's ``configs/`` folder, installed inside the package): ``configs/listops.py:quick``,
``listops.py:quick`` and ``listops:quick`` all name the packaged ListOps config from any directory.
"""
from __future__ import annotations

import os
import sys
import textwrap
from types import ModuleType
from typing import Callable, Optional, Sequence

HELP_FLAGS = ('-h', '--help', '-?', '--helpshort', '--helpfull')


class UserError(Exception):
  """A mistake the user can fix; the CLI prints its message as one line and exits 2."""


def packaged_configs_dir() -> str:
  from kernelformer import configs  # pylint: disable=g-import-not-at-top
  return os.path.dirname(os.path.abspath(configs.__file__))


def task_names() -> list[str]:
  """The packaged task configs (``configs/<task>.py``), in LRA's order where known."""
  names = [f[:-3] for f in os.listdir(packaged_configs_dir())
           if f.endswith('.py') and not f.startswith('_') and f != 'common.py']
  order = ('listops', 'text', 'retrieval', 'pathfinder', 'image')
  return [n for n in order if n in names] + sorted(n for n in names if n not in order)


def split_spec(spec: str) -> tuple[str, Optional[str]]:
  path, sep, preset = spec.rpartition(':')
  if not sep or not path or os.path.sep in preset or preset.endswith('.py'):
    return spec, None
  return path, preset


def resolve_config_path(path: str) -> str:
  """An existing config file for ``path``: as given, else the packaged one; a UserError otherwise."""
  if os.path.isfile(path):
    return os.path.abspath(path)
  head, base = os.path.split(os.path.normpath(path))
  if head in ('', 'configs'):
    name = base if base.endswith('.py') else base + '.py'
    packaged = os.path.join(packaged_configs_dir(), name)
    if os.path.isfile(packaged):
      return packaged
  if os.path.isdir(path):
    files = sorted(f for f in os.listdir(path) if f.endswith('.py') and not f.startswith('_'))
    raise UserError(f'--config {path} is a directory, not a config file; give FILE.py[:PRESET]'
                    + (f" (in it: {', '.join(files[:8])}{', ...' if len(files) > 8 else ''})"
                       if files else ''))
  raise UserError(f'config file {path} not found (looked in {os.getcwd()} and among the packaged '
                  f'configs: {", ".join(task_names())})')


def resolve_spec(spec: str) -> str:
  """``FILE.py[:PRESET]`` with FILE made an absolute path to an existing file."""
  path, preset = split_spec(spec)
  resolved = resolve_config_path(path)
  return resolved if preset is None else f'{resolved}:{preset}'


def resolve_config_args(args: Sequence[str], flag: str = '--config') -> list[str]:
  """``args`` with the value of every ``--config X`` / ``--config=X`` resolved (``--config.a=b`` kept)."""
  out, i, args = [], 0, list(args)
  while i < len(args):
    a = args[i]
    if a == '--':
      out += args[i:]
      break
    if a == flag and i + 1 < len(args):
      out += [a, resolve_spec(args[i + 1])]
      i += 2
      continue
    if a.startswith(flag + '='):
      out.append(f'{flag}={resolve_spec(a[len(flag) + 1:])}')
    else:
      out.append(a)
    i += 1
  return out


def wants_help(args: Sequence[str]) -> bool:
  for a in args:
    if a == '--':
      return False
    if a in HELP_FLAGS:
      return True
  return False


def wrap(text: str, indent: str = '  ') -> str:
  return textwrap.fill(text, width=100, initial_indent=indent, subsequent_indent=indent + '  ',
                       break_on_hyphens=False)


def absl_help(module: ModuleType, extra_modules: Sequence[str] = (),
              extra: Optional[Callable[[], str]] = None) -> str:
  """The module docstring, its absl flags (and those of ``extra_modules``), then ``extra()``."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  parts = [module.__doc__.strip(), '', 'flags:']
  for name in (module.__name__, *extra_modules):
    text = flags.FLAGS.module_help(name)
    if text:
      parts.append(text)
  if extra is not None:
    parts += ['', extra().rstrip()]
  return '\n'.join(parts) + '\n'


def run_absl(module: ModuleType, prog: str, args: Sequence[str], main: Callable,
             help_text: Callable[[], str], runner: Optional[Callable] = None) -> int:
  """Runs ``main`` under ``absl.app.run`` with ``args``; ``--help`` prints ``help_text()`` and exits 0.

  absl's own ``--help`` exits 1 and lists only flags of ``__main__``: this one lists the command's flags
  and what the user can choose. ``runner`` replaces ``app.run`` (train: one-line user errors).
  """
  del module
  if wants_help(args):
    sys.stdout.write(help_text())
    return 0
  from absl import app  # pylint: disable=g-import-not-at-top
  sys.argv = [prog, *args]
  try:
    if runner is not None:
      runner(main)
    else:
      app.run(main)
  except SystemExit as e:
    return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  return 0


def presets_of(task: str) -> tuple[str, ...]:
  import importlib  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(f'kernelformer.configs.{task}')
  return tuple(getattr(module, 'PRESETS', ()))


def presets_text() -> str:
  lines = ['task configs (--config TASK:PRESET, configs/TASK.py:PRESET, or your own FILE.py[:PRESET]; '
           'the first preset is the default):']
  for t in task_names():
    try:
      presets = ', '.join(presets_of(t))
    except Exception as e:  # pylint: disable=broad-except  (help must not fail on one broken file)
      presets = f'(cannot load configs/{t}.py: {type(e).__name__}: {e})'
    lines.append(f'  {t:<11s} {presets}')
  return '\n'.join(lines)


def kernels_text() -> str:
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  return ('attention kernels (--config.model.attention.kind=NAME; details: kernelformer kernels):\n'
          + wrap(' '.join(registry.list_kernels())))


# ---- the benchmark commands that write one table (benchmark train_step, benchmark loop) -------------

def unknown_kind_error(kinds: Sequence[str]) -> Optional[str]:
  """The one-line error for the first attention kind the registry does not know, else None."""
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  for kind in kinds:
    try:
      registry.get(kind)
    except registry.UnknownKernelError as e:
      return f'error: {e}'
  return None


def write_benchmark_table(name: str, argv: Sequence[str], out_dir: str, details: str,
                          table: Callable[[str], str]) -> str:
  """``table(header)`` with the header every benchmark table starts with -- the exact command, the
  device, CPU, cores and jax version, then ``details`` (load average, shape) -- written to
  ``<out_dir>/<name>.md`` and printed; returns it."""
  import platform  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  header = (f'`kernelformer benchmark {name} {" ".join(argv)}`; {jax.devices()[0].device_kind} '
            f'({platform.processor() or platform.machine()}, {os.cpu_count()} cores), jax '
            f'{jax.__version__}; {details}')
  text = table(header)
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, f'{name}.md'), 'w') as f:
    f.write(text)
  print(text)
  return text
