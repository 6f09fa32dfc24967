"""The ``kernelformer`` command (also ``python -m kernelformer``): one entry point, one subcommand per job.

  kernelformer train --config configs/listops.py:quick --workdir runs/listops_quick
  kernelformer kernels                        # every kernel: aliases, paper, options and defaults
  kernelformer config listops:quick           # the resolved config; --presets lists a task's presets
  kernelformer sweep ... / report ... / prepare-data ... / benchmark ... / reproduce ...

``kernelformer COMMAND --help`` lists the command's flags and what can be chosen (presets, config
fields, kernels, named sweeps, papers) and exits 0. The subcommands live in ``kernelformer/commands``;
``scripts/*.py`` are aliases of them.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Optional, Sequence

from kernelformer.commands import COMMANDS


def usage() -> str:
  lines = ['usage: kernelformer COMMAND [flags]   (kernelformer COMMAND --help for its flags)', '',
           'commands:']
  lines += [f'  {name:<14s}{summary}' for name, (_, summary) in COMMANDS.items()]
  lines += ['', 'Kernels from your own module: --plugin FILE.py|module on any command, or',
            '--config.model.attention.plugin=FILE.py (docs/extending.md).']
  return '\n'.join(lines)


def run_command(name: str, args: Sequence[str]) -> int:
  """Runs subcommand ``name``; user errors end in one line on stderr and a non-zero code."""
  from kernelformer import plugins  # pylint: disable=g-import-not-at-top
  from kernelformer.commands import _common  # pylint: disable=g-import-not-at-top
  args, plugin = plugins.split_plugin_flag(args)
  if plugin:
    plugins.export(plugin)  # subprocesses (sweep --parallel) load it too
  try:
    if os.environ.get(plugins.ENV_VAR):
      # Before the command (and its --help) looks up any kernel name.
      plugins.load(os.environ[plugins.ENV_VAR])
  except Exception as e:  # pylint: disable=broad-except
    from kernelformer import registry  # pylint: disable=g-import-not-at-top
    if not isinstance(e, registry.KernelPluginError):
      raise
    print(f'error: {e}', file=sys.stderr)
    return 2
  module = importlib.import_module(f'kernelformer.commands.{COMMANDS[name][0]}')
  try:
    return int(module.run(list(args)) or 0)
  except SystemExit as e:
    return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  except _common.UserError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  except BrokenPipeError:
    # The reader went away (kernelformer kernels | head): not an error; keep Python's exit flush quiet.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
  except KeyboardInterrupt:
    print('interrupted', file=sys.stderr)
    return 130


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ('-h', '--help', 'help'):
    print(usage())
    return 0 if argv else 2
  name, args = argv[0], argv[1:]
  if name not in COMMANDS:
    import difflib  # pylint: disable=g-import-not-at-top
    close = difflib.get_close_matches(name, list(COMMANDS), n=1)
    print(f'error: unknown command {name!r}.' + (f' Did you mean {close[0]}?' if close else '')
          + f' Valid: {", ".join(COMMANDS)}.', file=sys.stderr)
    return 2
  if name == 'train':
    # Ctrl-C from here on (while jax loads, the data is prepared, the step compiles, ...) ends the
    # process with one line (kernelformer.training.signals); the training loop takes it over.
    from kernelformer.training import signals  # pylint: disable=g-import-not-at-top
    with signals.guarded():
      return run_command(name, args)
  return run_command(name, args)


if __name__ == '__main__':
  sys.exit(main())
