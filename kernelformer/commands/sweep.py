"""kernelformer sweep: a grid of overrides over task configs, or a named sweep (configs/sweeps/NAME.py).

usage:
  kernelformer sweep --config FILE.py[:PRESET] --grid KEY=V1,V2,... [--grid ...] [--set KEY=V] --sweep_dir DIR
  kernelformer sweep --sweep NAME --sweep_dir DIR [--dry_run] [--emit FILE] [--parallel N]

examples:
  kernelformer sweep --config configs/listops.py:quick \\
      --grid model.attention.kind=softmax,posrf-orf,oprf-mm --grid seed=0,1,2 --sweep_dir runs/sweeps/mine
  kernelformer sweep --sweep mini --sweep_dir runs/sweeps/mini
  kernelformer sweep --config listops:tiny --set model.attention.plugin=$PWD/my_kernels.py \\
      --grid model.attention.kind=softmax,mine-orf --sweep_dir runs/sweeps/mine

Each point trains in SWEEP_DIR/<config>-<preset>/<overrides>; finished points are skipped, interrupted
ones resume, failures go to SWEEP_DIR/failures.jsonl and the sweep goes on. Then: kernelformer report
SWEEP_DIR. The work is kernelformer.reproduce.sweeps; see docs/reproduce.md.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys

from absl import app, flags

from kernelformer.commands import _common

_CONFIG = flags.DEFINE_multi_string('config', [], 'Task config FILE.py[:PRESET] (repeatable).')
_GRID = flags.DEFINE_multi_string('grid', [], 'KEY=V1,V2,...: one sweep axis (repeatable; product).')
_SET = flags.DEFINE_multi_string('set', [], 'KEY=VALUE applied to every run, not part of run names.')
_SWEEP = flags.DEFINE_string('sweep', None, 'Named sweep: configs/sweeps/NAME.py.')
_SWEEP_DIR = flags.DEFINE_string('sweep_dir', None, 'Directory holding one work directory per run.')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Print the runs and their status; train nothing.')
_EMIT = flags.DEFINE_string('emit', None, 'Write one scripts/train.py command per unfinished run here.')
_PARALLEL = flags.DEFINE_integer('parallel', 0, '0: train in this process one run after another; '
                                 'N: up to N scripts/train.py subprocesses at a time.')
flags.mark_flags_as_required(['sweep_dir'])


PLUGIN_KEY = 'model.attention.plugin'


def _load_plugins(sweeps) -> None:
  """Registers the user's kernels before the kinds are checked: ``--set``/``--grid`` plugins, and
  plugins set (or imported) by the ``--config`` files themselves."""
  from kernelformer import plugins  # pylint: disable=g-import-not-at-top
  for text in _SET.value:
    key, value = sweeps.parse_assignment(text, multi=False)
    if key == PLUGIN_KEY:
      plugins.load(value[0] if isinstance(value, list) else value)
  for text in _GRID.value:
    key, values = sweeps.parse_assignment(text, multi=True)
    if key == PLUGIN_KEY:
      for v in values:
        plugins.load(v)
  for spec in _CONFIG.value:
    path, _, preset = spec.partition(':')
    try:
      config = sweeps.load_config(path, preset)
    except Exception:  # pylint: disable=broad-except  (plan() reports configs that cannot load)
      continue
    plugins.load(config.model.attention.get('plugin'))


def _main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  from kernelformer.reproduce import sweeps  # pylint: disable=g-import-not-at-top
  try:
    if _SWEEP.value:
      if _CONFIG.value or _GRID.value:
        raise sweeps.SweepError('give either --sweep NAME or --config/--grid, not both')
      sweep = sweeps.load_sweep(_SWEEP.value)
      if _SET.value:
        sweep = dataclasses.replace(sweep, common=(*sweep.common, *sweeps.parse_sets(_SET.value)))
    else:
      _load_plugins(sweeps)
      sweep = sweeps.expand(sweeps.sweep_from_flags(_CONFIG.value, _GRID.value, _SET.value,
                                                    name=os.path.basename(_SWEEP_DIR.value.rstrip('/'))))
    sweep_dir = _SWEEP_DIR.value
    if _DRY_RUN.value or _EMIT.value:
      runs = sweeps.plan(sweep, sweep_dir)
      if _DRY_RUN.value:
        for r in runs:
          print(f'{r.status():6s} {r.name}' + (f'  ({r.error})' if r.error else ''))
        counts = {s: sum(r.status() == s for r in runs) for s in ('done', 'resume', 'new', 'error')}
        print(f'{len(runs)} runs: ' + ', '.join(f'{v} {k}' for k, v in counts.items()))
      if _EMIT.value:
        lines = sweeps.emit(runs)
        with open(_EMIT.value, 'w', encoding='utf-8') as f:
          f.write(f'# {len(lines)} runs of sweep {sweep.name}; run each from {sweeps.REPO_ROOT}\n')
          f.write('\n'.join(lines) + ('\n' if lines else ''))
        sweeps.write_sweep_file(sweep, sweep_dir, runs)
        print(f'wrote {len(lines)} commands to {_EMIT.value}')
      return
    # SIGTERM (a scheduler preempting the sweep) stops it like Ctrl-C: the running point checkpoints
    # (the trainer handles the signal while it trains), and no further point starts.
    signal.signal(signal.SIGTERM, sweeps._raise_on_sigterm)  # pylint: disable=protected-access
    counts = sweeps.run_sweep(sweep, sweep_dir, parallel=_PARALLEL.value,
                              log=lambda s: print(s, flush=True))
  except (sweeps.SweepError, registry.KernelPluginError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  except KeyboardInterrupt:
    print('interrupted: run the same command again to continue the sweep.', file=sys.stderr)
    sys.exit(130)
  except sweeps.SweepInterrupted as e:
    print(f'{e}: run the same command again to continue the sweep.', file=sys.stderr)
    sys.exit(e.exit_code)
  print(f'{counts["ran"]} trained, {counts["done"]} already finished, {counts["failed"]} failed'
        + (f' (see {os.path.join(sweep_dir, sweeps.FAILURES_FILE)})' if counts['failed'] else ''))
  if counts['failed']:
    sys.exit(1)


def help_text() -> str:
  from kernelformer.reproduce import sweeps  # pylint: disable=g-import-not-at-top
  named = 'named sweeps (--sweep NAME): ' + ', '.join(sweeps.named_sweeps())
  return _common.absl_help(sys.modules[__name__], extra=lambda: '\n\n'.join(
      [named, _common.presets_text(), _common.kernels_text()]))


def run(args) -> int:
  if not _common.wants_help(args):
    args = _common.resolve_config_args(args)
  return _common.run_absl(sys.modules[__name__], 'kernelformer sweep', args, _main, help_text)
