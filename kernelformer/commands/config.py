"""kernelformer config: print a resolved config, or the presets of a task.

usage:
  kernelformer config FILE.py[:PRESET] [--config.FIELD=VALUE ...]   # the config train would use
  kernelformer config TASK --presets                                 # the task's presets

examples:
  kernelformer config configs/listops.py:quick
  kernelformer config listops:quick --config.model.attention.kind=favor+ --config.seed=3
  kernelformer config text --presets

FILE is looked up as given (relative to the current directory: your own config files), then among the
packaged task configs, so configs/listops.py:quick, listops.py:quick and listops:quick all work from any
directory. Overrides are applied exactly as train applies them (the config is locked: a misspelled
field is an error), the attention plugin (model.attention.plugin) is imported and the kernel name is
checked, so this is also a dry check of a train command line. The output is YAML.
"""
from __future__ import annotations

import importlib.util
import os
import sys

from absl import app, flags
from ml_collections import config_flags

from kernelformer.commands import _common

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Task config FILE.py[:PRESET] (or give it '
                                          'as the first argument).', lock_config=True)
_PRESETS = flags.DEFINE_bool('presets', False, 'List the presets of the config file instead.')


def _preset_lines(path: str) -> list[str]:
  """Each preset of a task config file with its line from the file's docstring."""
  spec = importlib.util.spec_from_file_location('_kernelformer_config_presets', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  presets = tuple(getattr(module, 'PRESETS', ()))
  doc = [l.strip() for l in (module.__doc__ or '').splitlines()]
  lines = []
  for i, p in enumerate(presets):
    text = next((l[len(p):].strip() for l in doc if l.split(' ', 1)[0] == p), '')
    lines.append(f'  {p:<16s}{"(default) " if i == 0 else ""}{text}')
  return lines


def _source_line(spec: str) -> str:
  """``# source: ...`` from the config file's ``SOURCES`` for the preset of ``spec`` (FILE.py[:PRESET])."""
  path, _, preset = spec.partition(':')
  try:
    module_spec = importlib.util.spec_from_file_location('_kernelformer_config_sources', path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
  except Exception:  # pylint: disable=broad-except  # the config itself loaded; a source line is extra
    return ''
  sources = getattr(module, 'SOURCES', None)
  presets = tuple(getattr(module, 'PRESETS', ()))
  preset = preset or (presets[0] if presets else '')
  if not isinstance(sources, dict) or preset not in sources:
    return ''
  return f'# source: {sources[preset]}'


def _main(argv):
  rest = argv[1:]
  if rest:
    raise app.UsageError(f'unexpected arguments: {" ".join(rest)}')
  config = _CONFIG.value
  if config is None:
    raise app.UsageError('give a config: kernelformer config FILE.py[:PRESET]')
  from kernelformer import plugins, registry  # pylint: disable=g-import-not-at-top
  plugins.load(config.model.attention.plugin)
  canonical = registry.canonical_name(config.model.attention.kind)
  spec = config_flags.get_config_filename(flags.FLAGS['config'])
  print(f'# {spec}' + (f' (attention kind {config.model.attention.kind!r} is {canonical!r})'
                       if canonical != config.model.attention.kind else ''))
  source = _source_line(spec)
  if source:
    print(source)
  import yaml  # pylint: disable=g-import-not-at-top
  print(yaml.safe_dump(config.to_dict(), sort_keys=False, default_flow_style=False), end='')


def print_presets(args) -> int:
  """``kernelformer config TASK --presets`` (no config is built, so no absl parsing)."""
  rest = [a for a in args if a != '--presets']
  if len(rest) != 1 or rest[0].startswith('-'):
    print('error: usage: kernelformer config TASK|FILE.py --presets', file=sys.stderr)
    return 2
  path = _common.resolve_config_path(_common.split_spec(rest[0])[0])
  lines = _preset_lines(path)
  print(f'presets of {path} (--config {os.path.basename(path)[:-3]}:PRESET):')
  print('\n'.join(lines) if lines else '  (none: get_config() takes no preset)')
  return 0


def help_text() -> str:
  return _common.absl_help(sys.modules[__name__], extra=_common.presets_text)


def _clean(main):
  from kernelformer.training import cli as training_cli  # pylint: disable=g-import-not-at-top
  training_cli.main_with_clean_errors(main)


def run(args) -> int:
  args = list(args)
  if not _common.wants_help(args) and '--presets' in args:
    return print_presets(args)
  if not _common.wants_help(args):
    presets = False
    # The first positional argument is the config (or the task, with --presets).
    for i, a in enumerate(args):
      if a == '--':
        break
      if not a.startswith('-') and (i == 0 or not args[i - 1] == '--config'):
        if not presets:
          args[i] = '--config=' + a
        break
    args = _common.resolve_config_args(args)
  return _common.run_absl(sys.modules[__name__], 'kernelformer config', args, _main, help_text,
                          runner=_clean)
