"""Command-line plumbing for scripts/train.py: multi-host start-up and one-line errors.

Errors a user can fix (missing data, a malformed file, an unknown kernel, a misspelled or mistyped config
field, a batch size the devices cannot split) end the program with one line saying what to do, not a
traceback. Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import os
import sys
import traceback
from typing import Callable, Optional

from absl import app, flags

_COORDINATOR = None
_NUM_PROCESSES = None
_PROCESS_ID = None
_DISTRIBUTED = None
_PEER_TIMEOUT = None


def define_distributed_flags() -> None:
  global _COORDINATOR, _NUM_PROCESSES, _PROCESS_ID, _DISTRIBUTED, _PEER_TIMEOUT
  _COORDINATOR = flags.DEFINE_string(
      'coordinator_address', None,
      'host:port of process 0 for a multi-process run (auto-detected on TPU pods and SLURM).')
  _NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Number of processes.')
  _PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process index.')
  _DISTRIBUTED = flags.DEFINE_bool(
      'distributed', False,
      'Call jax.distributed.initialize() with JAX\'s own cluster detection. Needed on Cloud TPU pod '
      'slices created with gcloud (detected from the VM metadata, not the environment); SLURM, Open '
      'MPI and GKE are detected without it.')
  _PEER_TIMEOUT = flags.DEFINE_float(
      'peer_timeout_s', 30.0,
      'Multi-process runs: stop with one line when another process has sent no heartbeat for this '
      'many seconds (it died or hangs); 0 leaves it to JAX (an abort after ~100 s).')


def maybe_initialize_distributed() -> None:
  """``jax.distributed.initialize`` when running as one of several processes.

  Explicit flags win; otherwise JAX's own cluster detection is used when ``--distributed`` is given
  (Cloud TPU pod slices) or a SLURM, Open MPI or GKE TPU environment is present. A single plain process
  does nothing.
  """
  import jax  # pylint: disable=g-import-not-at-top
  explicit = _COORDINATOR is not None and _COORDINATOR.value is not None
  forced = _DISTRIBUTED is not None and _DISTRIBUTED.value
  cluster_env = ('SLURM_JOB_ID' in os.environ and int(os.environ.get('SLURM_NTASKS', '1')) > 1) or \
      'TPU_WORKER_HOSTNAMES' in os.environ or 'MEGASCALE_COORDINATOR_ADDRESS' in os.environ or \
      int(os.environ.get('OMPI_COMM_WORLD_SIZE', '1')) > 1
  if not (explicit or forced or cluster_env):
    return
  # CPU processes run their collectives over gloo: the default in jax 0.10, set here for versions
  # where it is not (without it a multi-process CPU run fails at its first cross-process reduction).
  try:
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  except (AttributeError, ValueError):  # an option this jax version does not have
    pass
  if explicit:
    jax.distributed.initialize(coordinator_address=_COORDINATOR.value,
                               num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value)
  else:
    jax.distributed.initialize()
  from kernelformer.training import peers  # pylint: disable=g-import-not-at-top
  peers.start(_PEER_TIMEOUT.value if _PEER_TIMEOUT is not None else 30.0)


def user_error_types() -> tuple[type, ...]:
  import lra_tasks  # pylint: disable=g-import-not-at-top
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  from kernelformer.training import sharding  # pylint: disable=g-import-not-at-top
  from kernelformer.training import validate  # pylint: disable=g-import-not-at-top
  from kernelformer.training import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  from kernelformer.training import population  # pylint: disable=g-import-not-at-top
  return (lra_tasks.DataError, registry.UnknownKernelError, sharding.ShardingError,
          validate.ConfigError, validate.WorkdirError, workdir_lib.RunError, population.PopulationError)


def run(get_config: Callable, workdir: str) -> dict:
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)  # orbax and jax log many INFO lines under absl
  maybe_initialize_distributed()
  from kernelformer.training import trainer  # pylint: disable=g-import-not-at-top
  config = get_config()
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_index() == 0:
    from kernelformer import data_location  # pylint: disable=g-import-not-at-top
    print(data_location.describe(config.data.data_dir), flush=True)
  from kernelformer.training import peers, population, population_run, signals  # pylint: disable=g-import-not-at-top
  members = population.members(config) if config.get('population') else None   # checked: one line
  names = [population.member_name(m) for m in config.population] if members else ['']
  workdirs = [os.path.join(workdir, n) for n in names]   # members: --workdir/<member name>
  try:
    results = (population_run.train_population(config, workdirs) if members else
               [trainer.train_and_evaluate(config, workdir)])
  except population_run.PopulationDiverged as e:
    _print_results(e.results, workdirs, names)
    raise
  peers.stop()  # finished: slower peers must not take this process's exit for a death
  _print_results(results, workdirs, names)
  signals.finished()
  return results if members else results[0]


def _print_results(results: list, workdirs: list, names: list) -> None:
  """One line per run (a population's: per member, named)."""
  import jax  # pylint: disable=g-import-not-at-top
  for results, workdir, name in zip(results, workdirs, names):
    prefix = f'{name}: ' if name else ''
    if jax.process_index() != 0 or results is None:
      continue
    if getattr(results, 'status', '') == 'finished':
      print(f"{prefix}this run is finished (step {results['final_step']}, test accuracy "
            f"{results['test_accuracy']:.4f}); nothing changed; --config.reevaluate=True re-tests it, "
            f"a new --workdir starts another run")
    else:
      print(f"{prefix}test accuracy {results['test_accuracy']:.4f} (best validation "
            f"{results['best_val_accuracy']:.4f} at step {results['best_step']}); "
            f"{results['steps_per_sec']:.1f} steps/s; results in {os.path.join(workdir, 'results.json')}")


def _is_config_override_error(exc: BaseException) -> bool:
  # ml_collections raises AttributeError/KeyError from inside flag parsing for a misspelled field.
  tb = traceback.extract_tb(exc.__traceback__)
  return any('ml_collections' in frame.filename or 'absl/flags' in frame.filename for frame in tb)


def _one_line(text) -> str:
  return ' '.join(str(text).split())


def _usage_error(message: str) -> None:
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def _flag_value(argv: list, name: str) -> Optional[str]:
  for i, a in enumerate(argv[1:], start=1):
    if a.startswith(f'--{name}='):
      return a[len(name) + 3:]
    if a == f'--{name}' and i + 1 < len(argv):
      return argv[i + 1]
  return None


def overridden_fields(argv: list) -> list[str]:
  """Dotted paths of the ``--config.<path>[=value]`` overrides in ``argv``."""
  return [a.split('=', 1)[0][len(p):] for a in argv[1:] for p in ('--config.', '--noconfig.')
          if a.startswith(p)]


def parse_flags_one_line(argv: list, flag_values=None) -> list:
  """``app.run``'s flags parser, with every parse error as one line and exit 2: a missing config file,
  one that fails to import (file:line), an unknown preset, a mistyped or misspelled ``--config.*``
  override, an unknown flag. Then the attention options given on the command line are checked against
  the chosen kind (``validate.check_attention_overrides``)."""
  fv = flags.FLAGS if flag_values is None else flag_values
  spec = _flag_value(argv, 'config')
  path = os.path.abspath(spec.rpartition(':')[0] if spec and ':' in spec and not
                         spec.endswith('.py') else spec) if spec else None
  from kernelformer import plugins  # pylint: disable=g-import-not-at-top
  try:
    with plugins.config_dir_on_path(path):  # the config file may ``import my_kernels`` beside it
      rest = fv(argv)
  except flags.Error as e:
    lines = [l.strip() for l in str(e).strip().splitlines() if l.strip()]
    if 'Error whilst parsing config file' in str(e) and lines:
      _usage_error(f'--config {spec}: {lines[-1]}')  # get_config raised, e.g. an unknown preset
    _usage_error(_one_line(e))
  except Exception as e:  # pylint: disable=broad-except
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if path and os.path.abspath(f.filename) == path]
    if frames:
      _usage_error(f'config file {frames[-1].filename}:{frames[-1].lineno} failed to load: '
                   f'{type(e).__name__}: {_one_line(e)}')
    if isinstance(e, SyntaxError) and path and e.filename and os.path.abspath(e.filename) == path:
      _usage_error(f'config file {e.filename}:{e.lineno} failed to load: SyntaxError: {e.msg}')
    if isinstance(e, AttributeError) and 'get_config' in str(e) and path:
      _usage_error(f'config file {path} defines no get_config() (a config file returns its '
                   'ConfigDict from get_config([preset]))')
    if spec and "<class 'NoneType'>" in str(e) and _is_config_override_error(e):
      _usage_error(f'--config {spec}: get_config() returned None, not an ml_collections.ConfigDict')
    if isinstance(e, (AttributeError, KeyError, TypeError, ValueError)) and \
        _is_config_override_error(e):
      msg = e.args[0] if isinstance(e, KeyError) and e.args else e
      while isinstance(msg, str) and len(msg) >= 2 and msg[0] in '\'"' and msg[-1] == msg[0]:
        msg = msg[1:-1].replace("\\'", "'").replace('\\n', ' ')  # KeyError quotes its message
      _usage_error(f'config: {_one_line(msg)} -- check the --config.* overrides against the fields '
                   'of the config file (they are locked: no new fields)')
    raise
  if 'config' in fv:
    config = fv['config'].value
    try:
      is_config = hasattr(config, 'to_dict')
    except OSError as e:  # ml_collections defers a failed load to the first access
      _usage_error(f'--config {spec}: {_one_line(e.__cause__ or e)}')
    if not is_config:
      _usage_error(f'--config {spec}: get_config() returned {type(config).__name__}, not an '
                   'ml_collections.ConfigDict')
    # The user's kernels register (docs/extending.md) and the kind resolves, once for the overrides.
    from kernelformer.training import validate  # pylint: disable=g-import-not-at-top
    validate.check_attention_overrides(config, overridden_fields(argv))
  return rest


def main_with_clean_errors(main: Callable) -> None:
  from kernelformer.training import signals  # pylint: disable=g-import-not-at-top
  try:
    with signals.guarded():  # a signal outside the training loop: one line, exit 130/143
      app.run(main, flags_parser=parse_flags_one_line)
  except SystemExit:
    raise
  except BaseException as e:  # pylint: disable=broad-except
    from kernelformer.training import peers  # pylint: disable=g-import-not-at-top
    peers.handle_collective_failure(e)  # a lost peer process: one line (exits), else falls through
    if isinstance(e, KeyboardInterrupt):
      # Outside the training loop (which turns signals into a checkpoint and a RunError).
      print('interrupted before training: nothing new to save; run the same command to start or '
            'resume.', file=sys.stderr)
      sys.exit(130)
    if isinstance(e, user_error_types()):
      code = getattr(e, 'exit_code', 1)
      print(f"{'' if code in (130, 143) else 'error: '}{e}", file=sys.stderr)
      sys.exit(code)
    if isinstance(e, (AttributeError, KeyError, TypeError, ValueError)) and \
        _is_config_override_error(e):
      msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
      print(f'config error: {msg} -- check the --config.* override against the fields of the '
            f'config file (they are locked: no new fields).', file=sys.stderr)
      sys.exit(2)
    raise
