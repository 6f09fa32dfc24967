"""kernelformer sweep: a grid of overrides over task configs, or a named sweep (configs/sweeps/NAME.py).

usage:
  kernelformer sweep --config FILE.py[:PRESET] --grid KEY=V1,V2,... [--grid ...] [--set KEY=V] --sweep_dir DIR
  kernelformer sweep --sweep NAME --sweep_dir DIR [--dry_run] [--emit FILE] [--parallel N] [--pack [N]]
  kernelformer sweep ... --launcher slurm [--slurm_partition P --gpus_per_node G --nodes N --time MIN
      --slurm_args KEY=VALUE,...] [--dry_run]     # one SLURM job per unfinished point (submitit)
  kernelformer sweep ... --launcher slurm --status  # each point: finished/queued/running/stopped/failed
  kernelformer sweep ... --launcher tpu-pod --tpu_name NAME --zone ZONE [--tpu_sweep_dir DIR] [--submit]

examples:
  kernelformer sweep --config configs/listops.py:quick \\
      --grid model.attention.kind=softmax,posrf-orf,oprf-mm --grid seed=0,1,2 --sweep_dir runs/sweeps/mine
  kernelformer sweep --sweep mini --sweep_dir runs/sweeps/mini
  kernelformer sweep --config listops:tiny --set model.attention.plugin=$PWD/my_kernels.py \\
      --grid model.attention.kind=softmax,mine-orf --sweep_dir runs/sweeps/mine

Each point trains in SWEEP_DIR/<config>-<preset>/<overrides>; finished points are skipped, interrupted
ones resume, failures go to SWEEP_DIR/failures.jsonl and the sweep goes on. Then: kernelformer report
SWEEP_DIR. The work is kernelformer.reproduce.sweeps (launchers: kernelformer.reproduce.launchers); see
docs/reproduce.md, "Sweeps on clusters". With --launcher slurm, re-running the same command submits only
the points that are neither finished nor queued/running; each resumes from its own checkpoint.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys

from absl import app, flags

from kernelformer.commands import _common
from kernelformer.training import cli as training_cli

_CONFIG = flags.DEFINE_multi_string('config', [], 'Task config FILE.py[:PRESET] (repeatable).')
_GRID = flags.DEFINE_multi_string('grid', [], 'KEY=V1,V2,...: one sweep axis (repeatable; product).')
_SET = flags.DEFINE_multi_string('set', [], 'KEY=VALUE applied to every run, not part of run names.')
_SWEEP = flags.DEFINE_string('sweep', None, 'Named sweep: configs/sweeps/NAME.py.')
_SWEEP_DIR = flags.DEFINE_string('sweep_dir', None, 'Directory holding one work directory per run.')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Print the runs and their status; train nothing.')
_EMIT = flags.DEFINE_string('emit', None, 'Write one scripts/train.py command per unfinished run here.')
_PARALLEL = flags.DEFINE_integer('parallel', 0, '0: train in this process one run after another; '
                                 'N: up to N scripts/train.py subprocesses at a time.')
_LAUNCHER = flags.DEFINE_enum('launcher', 'local', ['local', 'slurm', 'tpu-pod'],
                              'Where points train: this machine, one SLURM job each (submitit), or a '
                              'Cloud TPU pod slice (gcloud ... --worker=all).')
_STATUS = flags.DEFINE_bool('status', False, '--launcher slurm: show each point\'s state and exit.')
_PARTITION = flags.DEFINE_string('slurm_partition', '', 'SLURM partition (default: the cluster\'s).')
_GPUS = flags.DEFINE_integer('gpus_per_node', 0, 'GPUs per node for each SLURM job.')
_NODES = flags.DEFINE_integer('nodes', 1, 'Nodes per point (one task per node; jax.distributed from '
                              'SLURM\'s environment when > 1).')
_CPUS = flags.DEFINE_integer('cpus_per_task', 1, 'CPUs per task for each SLURM job.')
_TIME = flags.DEFINE_integer('time', 24 * 60, 'Time limit of each SLURM job, minutes; the trainer '
                             'saves and the job requeues before it runs out.')
_MEM = flags.DEFINE_float('mem_gb', 0.0, 'Memory per node, GB (0: the cluster\'s default).')
_SLURM_ARGS = flags.DEFINE_multi_string('slurm_args', [], 'Other sbatch options as KEY=VALUE[,KEY=VALUE] '
                                        '(e.g. account=abc,qos=high,constraint=a100).')
_TPU_NAME = flags.DEFINE_string('tpu_name', '', '--launcher tpu-pod: the TPU VM (pod slice) name.')
_ZONE = flags.DEFINE_string('zone', '', '--launcher tpu-pod: its zone.')
_TPU_PROJECT = flags.DEFINE_string('tpu_project', '', '--launcher tpu-pod: GCP project (default: '
                                   'gcloud\'s).')
_TPU_SWEEP_DIR = flags.DEFINE_string('tpu_sweep_dir', '', '--launcher tpu-pod: the sweep directory as '
                                     'the TPU hosts see it (a mount all hosts share); default --sweep_dir.')
_TPU_CODE_DIR = flags.DEFINE_string('tpu_code_dir', '~/kernelformer', '--launcher tpu-pod: where the '
                                    'repository is on every host.')
_PACK = flags.DEFINE_integer(
    'pack', 0, 'Unfinished points differing only in population fields (seed, optim.learning_rate, ...: '
    'training.population.FIELDS) train as populations of up to N members, one job each. --pack alone '
    '(--launcher local): the most members whose step XLA\'s compiled estimate (memory_analysis: '
    'arguments + outputs + temporaries) puts within 90% of a device\'s memory (bytes_limit; CPU: '
    'available RAM / devices).')
_POINTS = flags.DEFINE_list('points', [], 'Only these points (names as --dry_run prints them): what '
                            'a packed job runs.')
_SUBMIT = flags.DEFINE_bool('submit', False, '--launcher tpu-pod: run the printed gcloud commands.')
training_cli.define_distributed_flags()   # a packed job on several hosts (a TPU pod slice)
flags.mark_flags_as_required(['sweep_dir'])


def _cluster(sweep, sweep_dir) -> int:
  """--launcher slurm / tpu-pod: submit, dry-run or show status; returns the exit code."""
  from kernelformer.reproduce import launchers, sweeps  # pylint: disable=g-import-not-at-top
  if _PARALLEL.value or _EMIT.value:
    raise sweeps.SweepError(f'--launcher {_LAUNCHER.value} does not take --parallel or --emit')
  if _LAUNCHER.value == 'slurm':
    options = launchers.SlurmOptions(
        partition=_PARTITION.value, nodes=_NODES.value, gpus_per_node=_GPUS.value,
        cpus_per_task=_CPUS.value, time_min=_TIME.value, mem_gb=_MEM.value,
        extra=launchers.SlurmOptions.parse_extra(_SLURM_ARGS.value))
    if _STATUS.value:
      why = launchers.slurm_available()
      runs = sweeps.plan(sweep, sweep_dir)
      statuses = launchers.slurm_status(runs, sweep_dir, states={} if why else None)
      if why:
        print(f'note: {why}; queued/running jobs cannot be seen, only the run directories')
      print('\n'.join(launchers.format_status(statuses)))
      return 0
    counts = launchers.submit_slurm(sweep, sweep_dir, options, dry_run=_DRY_RUN.value, pack=_PACK.value,
                                    log=lambda s: print(s, flush=True))
    if not _DRY_RUN.value:
      print(f'{counts["submitted"]} submitted, {counts["active"]} already queued or running, '
            f'{counts["finished"]} finished; see: kernelformer sweep ... --launcher slurm --status')
    return 1 if counts['error'] else 0
  if _STATUS.value:
    raise sweeps.SweepError('--status is for --launcher slurm; a TPU pod\'s points are in its sweep '
                            'directory: kernelformer report')
  options = launchers.TpuPodOptions(tpu_name=_TPU_NAME.value, zone=_ZONE.value,
                                    project=_TPU_PROJECT.value, sweep_dir=_TPU_SWEEP_DIR.value,
                                    code_dir=_TPU_CODE_DIR.value)
  commands = launchers.tpu_pod_commands(_plan(sweeps, sweep, sweep_dir), sweep_dir, options)
  import shlex  # pylint: disable=g-import-not-at-top
  for cmd in commands:
    print(shlex.join(cmd))
  if not _SUBMIT.value:
    print(f'# {len(commands) - 1} {"jobs" if _PACK.value else "points"}; add --submit to run these '
          f'commands in order', flush=True)
    return 0
  return launchers.run_commands(commands)


def _plan(sweeps, sweep, sweep_dir):
  runs = sweeps.plan(sweep, sweep_dir)
  return sweeps.packed(runs, _PACK.value, sweep, sweep_dir) if _PACK.value else runs


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
        sweep = dataclasses.replace(sweep, common=(*sweep.common, *sweeps.parse_sets(_SET.value)),
                                    argv=(*sweep.argv, *(a for t in _SET.value for a in ('--set', t))))
    else:
      _load_plugins(sweeps)
      sweep = sweeps.expand(sweeps.sweep_from_flags(_CONFIG.value, _GRID.value, _SET.value,
                                                    name=os.path.basename(_SWEEP_DIR.value.rstrip('/'))))
    sweep_dir = _SWEEP_DIR.value
    if _PACK.value < -1 or (_PACK.value == -1 and _LAUNCHER.value != 'local'):
      raise sweeps.SweepError(f'--pack {_PACK.value}: give a population size N >= 1, or --pack alone '
                              f'(it sizes populations for this machine\'s device: --launcher local only)')
    if _POINTS.value:
      unknown = set(_POINTS.value) - {sweeps.point_dirname(p) for p in sweep.points}
      if unknown:
        raise sweeps.SweepError(f'--points: sweep {sweep.name!r} has no point {sorted(unknown)[0]}')
      sweep = dataclasses.replace(sweep, points=tuple(
          p for p in sweep.points if sweeps.point_dirname(p) in _POINTS.value))
    if _LAUNCHER.value != 'local':
      code = _cluster(sweep, sweep_dir)
      if code:
        sys.exit(code)
      return
    if _STATUS.value or _SUBMIT.value:
      raise sweeps.SweepError('--status and --submit need --launcher slurm or tpu-pod')
    if _DRY_RUN.value or _EMIT.value:
      runs = _plan(sweeps, sweep, sweep_dir)
      if _DRY_RUN.value:
        for r in runs:
          note = r.error or r.unreadable()
          print(f'{r.status():6s} {r.name}' + (f'  ({note})' if note else ''))
        counts = {s: sum(r.status() == s for r in runs) for s in ('done', 'resume', 'new', 'error')}
        print(f'{len(runs)} {"jobs" if _PACK.value else "runs"}: ' +
              ', '.join(f'{v} {k}' for k, v in counts.items()))
      if _EMIT.value:
        lines = sweeps.emit(runs)
        try:
          with open(_EMIT.value, 'w', encoding='utf-8') as f:
            f.write(f'# {len(lines)} runs of sweep {sweep.name}; run each from {sweeps.REPO_ROOT}\n')
            f.write('\n'.join(lines) + ('\n' if lines else ''))
        except OSError as e:
          raise sweeps.SweepError(f'--emit {_EMIT.value}: {e.strerror}') from None
        sweeps.write_sweep_file(sweep, sweep_dir, runs)
        print(f'wrote {len(lines)} commands to {_EMIT.value}')
      return
    # SIGTERM (a scheduler preempting the sweep) stops it like Ctrl-C: the running point checkpoints
    # (the trainer handles the signal while it trains), and no further point starts.
    signal.signal(signal.SIGTERM, sweeps.raise_on_sigterm)
    training_cli.maybe_initialize_distributed()
    counts = sweeps.run_sweep(sweep, sweep_dir, parallel=_PARALLEL.value, pack=_PACK.value,
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
    args = [('--pack=-1' if a == '--pack' and (i + 1 == len(args) or args[i + 1].startswith('--'))
             else a) for i, a in enumerate(args)]   # --pack alone: as many members as fit
  return _common.run_absl(sys.modules[__name__], 'kernelformer sweep', args, _main, help_text)
