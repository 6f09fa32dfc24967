"""Everything a user can get wrong, checked before a run creates or compiles anything.

``validate_run(config, workdir)`` is the first thing ``trainer.train_and_evaluate`` does:

* ``validate_config``: every field's type and range, the task, the attention kind and its options
  (types, values, relative-position-bias support, fused-kernel support), the model's shape constraints
  (``qkv_dim`` divisible by ``num_heads``), the batch against the devices and ``grad_accum_steps``.
* ``validate_workdir``: the workdir is (or can become) a writable directory on a disk with room for a
  checkpoint. Nothing is created: the write probe goes into the nearest existing directory and is
  removed at once, so a refused run leaves an existing workdir byte-identical.
* ``check_data``: the task's data files that are already on disk are read (the task modules cache what
  they read, so the trainer does not read them again) and every fault is a ``lra_tasks.DataError`` naming
  the file and line. Missing files that the task cannot make are reported now, not after compiling.

Each failure raises an exception whose message is one line naming the field (or path), the bad value and
what is valid; ``cli`` prints it and exits non-zero without a traceback.
"""
from __future__ import annotations

import math
import numbers
import os
import shutil
import tempfile
from typing import Any, Callable, Iterable, Optional, Sequence

import lra_tasks
from kernelformer import decoder
from kernelformer import encoder
from kernelformer import layers
from kernelformer import registry
from kernelformer import run_config
from kernelformer.attention import random_features as rf_lib
from kernelformer.features import catalog
from kernelformer.training import sharding
from kernelformer.training import workdir as workdir_lib


ConfigError = run_config.ConfigError


class WorkdirError(ValueError):
  """A workdir that cannot hold a run: a file, not writable, or on a disk without room (one line)."""


# ----------------------------------------------------------------------------------------------
# Field rules.


_INT, _BOOL = 'an integer', 'true or false'


def _is_int(v: Any) -> bool:
  return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
  return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _fail(field: str, value: Any, valid: str) -> None:
  raise ConfigError(f'config.{field}={value!r} is invalid: must be {valid}')


def _get(config: Any, field: str) -> Any:
  node = config
  for part in field.split('.'):
    try:
      node = node[part] if not hasattr(node, part) else getattr(node, part)
    except (KeyError, AttributeError, TypeError):
      raise ConfigError(f'config.{field} is missing: the config file must define it '
                        f'(see configs/common.py)') from None
  return node


def _check_int(config: Any, field: str, low: int) -> int:
  v = _get(config, field)
  if not _is_int(v):
    _fail(field, v, f'{_INT} >= {low}')
  if v < low:
    _fail(field, v, f'an integer >= {low}')
  return int(v)


def _check_float(config: Any, field: str, *, low: float, low_open: bool, high: float = math.inf) -> float:
  v = _get(config, field)
  lo = '(' if low_open else '['
  rng = f'{lo}{low:g}, {high:g})' if high != math.inf else (
      f'> {low:g}' if low_open else f'>= {low:g}')
  if not _is_number(v) or not math.isfinite(float(v)):
    _fail(field, v, f'a finite number {rng}' if high == math.inf else f'a finite number in {rng}')
  x = float(v)
  if (x <= low if low_open else x < low) or x >= high:
    _fail(field, v, f'a number {rng}' if high == math.inf else f'a number in {rng}')
  return x


def _check_choice(config: Any, field: str, choices: Sequence[Any]) -> Any:
  v = _get(config, field)
  if v not in choices or isinstance(v, bool) != any(isinstance(c, bool) for c in choices):
    _fail(field, v, 'one of ' + ', '.join(repr(c) for c in choices))
  return v


def _check_bool(config: Any, field: str) -> bool:
  v = _get(config, field)
  if not isinstance(v, bool):
    _fail(field, v, _BOOL)
  return v


def _check_str(config: Any, field: str) -> str:
  v = _get(config, field)
  if not isinstance(v, str) or not v:
    _fail(field, v, 'a non-empty string')
  return v


# Attention options: the rule for each option a mechanism may read (``registry.option_names``).
# (kind of value, check, what is valid); None always means "the mechanism's own default".
_OPTION_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    'num_features': (lambda v: _is_int(v) and v >= 1, 'an integer >= 1'),
    'redraw_every': (lambda v: _is_int(v) and v >= 0, 'an integer >= 0 (0 = never redraw)'),
    'num_mixture_components': (lambda v: _is_int(v) and v >= 1, 'an integer >= 1'),
    'covariance': (lambda v: v in ('full', 'diag'), "one of 'full', 'diag'"),
    'fastfood_variant': (lambda v: v in ('fixed', 's', 'sgb'), "one of 'fixed', 's', 'sgb'"),
    'normalize_qk': (lambda v: isinstance(v, bool), _BOOL),
    'chunk_size': (lambda v: _is_int(v) and v >= 1, 'an integer >= 1'),
    'feature_eps': (lambda v: _is_number(v) and math.isfinite(v) and v > 0, 'a finite number > 0'),
    'share_heads': (lambda v: isinstance(v, bool), _BOOL),
    'impl': (lambda v: v in ('auto', 'pallas', 'xla'), "one of 'auto', 'pallas', 'xla'"),
    'linformer_k': (lambda v: _is_int(v) and v >= 1, 'an integer >= 1'),
    'max_length': (lambda v: _is_int(v) and v >= 1, 'an integer >= 1'),
    'num_landmarks': (lambda v: _is_int(v) and v >= 1, 'an integer >= 1'),
    'num_iterations': (lambda v: _is_int(v) and v >= 1, 'an integer >= 1'),
    'gamma': (lambda v: _is_number(v) and math.isfinite(v) and v > 0, 'a finite number > 0'),
    'attention_dropout': (lambda v: _is_number(v) and 0.0 <= v < 1.0, 'a number in [0, 1)'),
    'implementation': (lambda v: v in ('xla', 'cudnn'), "one of 'xla', 'cudnn' (or unset)"),
    'map_dim': (lambda v: _is_int(v) and v >= 0, 'an integer >= 0 (0 = no projection / the head dim)'),
    'cos_length': (lambda v: _is_int(v) and v >= 0, "an integer >= 0 (0 = each example's real length)"),
    'distill_weight': (lambda v: _is_number(v) and math.isfinite(v) and v >= 0, 'a finite number >= 0'),
}

POOLINGS = ('cls', 'mean')
POS_ENCODINGS = ('sinusoidal', 'learned', 'none')
STATE_MIXERS = ('mlp', 'identity', 'none')   # kernelformer/decoder.py STATE_MIXERS
DTYPES = tuple(layers.DTYPES)   # the model's table (layers.ModelConfig.of)


def _check_attention(attention: run_config.Attention) -> None:
  """The options the resolved kind reads (``_OPTION_RULES``), distillation and the fused kernels."""
  spec = attention.spec
  reads = registry.option_names(spec.name)
  for name in reads:
    v = attention.option(name)
    check, valid = _OPTION_RULES.get(name, (None, ''))
    if v is not None and check is not None and not check(v):
      _fail(f'model.attention.{name}', v, f'{valid} (for kind {spec.name!r})')
  if attention.distills and spec.fixed.get('weights') != 'map':
    learned = ', '.join(s.name for s in registry.specs() if s.fixed.get('weights') == 'map')
    raise ConfigError(f'config.model.attention.distill_weight > 0 is invalid for kind {spec.name!r}, '
                      f'which has no learned feature map to distil into; kinds that do: {learned}')
  if 'impl' in reads and attention.option('impl') == 'pallas':
    component = spec.fixed.get('component')
    fused = catalog.has(component) and catalog.get(component).pallas_feature
    if not fused or attention.position_bias:
      raise ConfigError(
          f"config.model.attention.impl='pallas' is invalid for kind {spec.name!r}: the fused "
          f'kernels cover components {", ".join(rf_lib.pallas_components())} without a position bias; '
          "use impl='xla' or 'auto'")


class EvalContextError(ConfigError):
  """A ``data.eval_context`` the model cannot run (one line)."""


def eval_scheme(config: Any) -> Optional[tuple[str, int]]:
  """``(eval_context, stride)`` of an enwik8 config (or record), None for other tasks."""
  if config.data.task != 'enwik8':
    return None
  from lra_tasks import enwik8  # pylint: disable=g-import-not-at-top
  return enwik8.eval_scheme(config.data)


def stateful_problem(attention: run_config.Attention, pos_encoding: str) -> Optional[str]:
  """Why a model of ``attention`` cannot carry a recurrent state across windows (one line), or None."""
  spec = attention.spec
  causal = decoder.causal_problem(spec.name)
  if causal:
    return causal
  if not issubclass(spec.module, rf_lib.RandomFeatureAttention):
    return (f"data.eval_context='stateful' needs a causal linear (feature-map) kernel with a "
            f'recurrent state; attention kind {spec.name!r} keeps every past key (a KV cache): use '
            "eval_context='sliding'")
  if attention.position_bias:
    return (f"data.eval_context='stateful' needs a finite recurrent state; attention kind "
            f'{spec.name!r} with a relative-position bias weights every past key by its offset '
            "(Luo et al. eq. 10, no recurrence): use eval_context='sliding'")
  if pos_encoding == 'learned':
    return ("data.eval_context='stateful' runs positions past max_length, which learned positions "
            "(model.pos_encoding='learned') do not have: use 'sinusoidal', 'none' or "
            "eval_context='sliding'")
  return None


def check_eval_context(run: run_config.Run) -> None:
  """Raises ``EvalContextError`` for ``eval_context='stateful'`` with a model that cannot run it."""
  s = eval_scheme(run)
  if s is not None and s[0] == 'stateful':
    problem = stateful_problem(run.model.attention, run.model.pos_encoding)
    if problem:
      raise EvalContextError(problem)


def _check_model_for_task(run: run_config.Run, info: Any) -> None:
  """The encoder's options are the encoder's, the decoder's the decoder's (left at their defaults
  otherwise); cosFormer's fixed horizon M (``cos_length`` > 0) covers the longest sequence the model
  sees: the data's ``max_length``, plus the CLS token of an encoder that pools by it."""
  lm = bool(getattr(info, 'language_model', False))
  for names, whose in ((('remat', 'scan_layers', 'param_init', 'layer_norm_eps', 'gelu_approximate'),
                        'the encoder of classification tasks'),
                       (('short_conv', 'state_mixer'), 'the decoder of LM tasks')):
    changed = [n for n in names if getattr(run.model, n) != run_config.legacy(f'model.{n}')]
    if changed and lm == whose.startswith('the encoder'):
      raise ConfigError(f"config.model.{' / model.'.join(changed)} apply to {whose}; task "
                        f'{run.data.task!r} does not take them (leave them at their defaults)')
  attention = run.model.attention
  reads = registry.option_names(attention.spec.name)
  if lm and 'impl' in reads and attention.option('impl') == 'pallas':
    raise ConfigError(f"config.model.attention.impl='pallas' is invalid for the causal decoder of task "
                      f"{run.data.task!r}: the fused kernels are bidirectional only; use impl='xla'")
  cos_length = attention.option('cos_length') or 0
  if not cos_length or 'cos_length' not in reads:
    return
  longest = int(info.max_length) + (0 if lm or run.model.pooling != 'cls' else 1)
  if cos_length < longest:
    raise ConfigError(f"config.model.attention.cos_length={cos_length} is invalid: cosFormer's horizon M "
                      f'must cover the longest sequence the model sees ({longest} tokens); set it to at '
                      f"least {longest}, or 0 for each example's own length")


def check_attention_overrides(config: Any, overridden: Iterable[str]) -> None:
  """An attention option given on the command line that the chosen kind does not read is an error.

  ``overridden``: dotted config paths given as ``--config.<path>=...``. Options set by the config file
  itself are not checked (presets set e.g. both ``num_features`` and ``num_landmarks`` so that
  ``kind`` can be switched alone).
  """
  spec = run_config.attention_of(_get(config, 'model.attention')).spec   # the plugin loaded first
  always = {'kind', 'rpe', 'plugin'}
  reads = set(registry.option_names(spec.name)) | always
  for path in overridden:
    prefix = 'model.attention.'
    if not path.startswith(prefix):
      continue
    name = path[len(prefix):]
    if name not in reads:
      raise ConfigError(
          f'--config.{path} is not read by attention kind {spec.name!r}; it reads: '
          f'{", ".join(sorted(reads - always)) or "no options"} (and rpe)')


def _field_rules() -> tuple[dict[str, Callable[[Any, str], Any]], dict[str, Callable[[Any, str], Any]]]:
  """Each field's check: the required fields', and the optional ones', which a config written before
  the field existed lacks (the record's default then applies, ``run_config``)."""
  from kernelformer.training import optim, selection  # pylint: disable=g-import-not-at-top
  from lra_tasks import image  # pylint: disable=g-import-not-at-top
  at_least = lambda low: lambda c, f: _check_int(c, f, low)
  choice = lambda choices: lambda c, f: _check_choice(c, f, choices)
  number = lambda **kw: lambda c, f: _check_float(c, f, **kw)
  nonneg, fraction = number(low=0.0, low_open=False), number(low=0.0, low_open=False, high=1.0)
  rules = {'seed': at_least(0), 'data.data_dir': _check_str,
           **{f'model.{n}': at_least(1) for n in ('emb_dim', 'num_layers', 'num_heads', 'qkv_dim',
                                                  'mlp_dim')},
           'model.dropout_rate': fraction, 'model.pos_encoding': choice(POS_ENCODINGS),
           'model.pooling': choice(POOLINGS), 'model.rpe_per_layer': _check_bool,
           'model.dtype': choice(DTYPES), 'model.attention.kind': _check_str,
           'model.attention.rpe': _check_bool,
           'optim.learning_rate': number(low=0.0, low_open=True), 'optim.schedule': choice(optim.SCHEDULES),
           'optim.warmup_steps': at_least(0), 'optim.weight_decay': nonneg, 'optim.b1': fraction,
           'optim.b2': fraction, 'optim.eps': number(low=0.0, low_open=True),
           'optim.grad_clip_norm': nonneg, 'optim.grad_accum_steps': at_least(1),
           'batch_size': at_least(1), 'eval_batch_size': at_least(0), 'num_train_steps': at_least(1),
           **{n: at_least(1) for n in ('eval_every', 'checkpoint_every', 'log_every', 'keep_checkpoints')},
           'max_eval_batches': at_least(0), 'profile_steps': at_least(0), 'progress': _check_bool}
  optional = {'model.remat': choice(layers.REMAT_CHOICES), 'model.scan_layers': _check_bool,
              'model.qkv_bias': _check_bool, 'model.retrieval_head': choice(encoder.RETRIEVAL_HEADS),
              'model.param_init': choice(layers.INITS), 'model.layer_norm_eps': number(low=0.0, low_open=True),
              'model.gelu_approximate': _check_bool, 'model.short_conv': at_least(0),
              'model.state_mixer': choice(STATE_MIXERS), 'optim.decay_mask': choice(optim.DECAY_MASKS),
              'optim.grad_clip_value': nonneg, 'data.pixel_padding': choice(image.PIXEL_PADDINGS),
              'eval.test_checkpoint': lambda c, f: _parse(selection.parse, _get(c, f)),
              'on_nonfinite': choice(('stop', 'skip')), 'watchdog_step_s': nonneg,
              'watchdog_compile_s': nonneg, 'allow_config_change': _check_bool,
              'reevaluate': _check_bool, 'start_over': _check_bool}
  return rules, optional


def _parse(parse: Callable[[Any], Any], value: Any) -> None:
  try:
    parse(value)
  except ValueError as e:   # the parser's one line
    raise ConfigError(str(e)) from None


def _present(config: Any, field: str) -> bool:
  node = config
  for part in field.split('.'):
    if part not in node:
      return False
    node = node[part]
  return True


def validate_config(config: Any, devices: Optional[list] = None) -> run_config.Run:
  """Raises ``ConfigError`` (or the registry's / sharding's one-line errors) for a bad config; returns
  the run's record, built here once (``run_config.of``: plugins loaded, the kind resolved).

  ``devices``: the devices the run will use (default: all), for the batch divisibility checks.
  """
  task = _check_str(config, 'data.task')
  if task not in lra_tasks.names():
    _fail('data.task', task, 'one of ' + ', '.join(repr(n) for n in lra_tasks.names()))
  _check_int(config, 'data.max_length', 0 if task in ('image', 'pathfinder') else 1)
  required, optional = _field_rules()
  for field, check in [*required.items(), *((f, c) for f, c in optional.items() if _present(config, f))]:
    check(config, field)
  run = run_config.of(config)
  if run.population:
    raise ConfigError('config.population lists members: kernelformer train (or population_run.'
                      'train_population) trains them, each in its own workdir')
  m, o = run.model, run.optim
  if m.qkv_dim % m.num_heads:
    raise ConfigError(f'config.model.qkv_dim={m.qkv_dim} is invalid: must be divisible by '
                      f'model.num_heads={m.num_heads} (head_dim = qkv_dim / num_heads)')
  if o.schedule.startswith('onecycle-') and not 2 <= o.warmup_steps < run.num_train_steps:
    raise ConfigError(f'config.optim.warmup_steps={o.warmup_steps} is invalid with optim.schedule='
                      f'{o.schedule!r}: must be >= 2 and < num_train_steps={run.num_train_steps} '
                      '(the one-cycle rate peaks at step warmup_steps - 1)')
  _check_attention(m.attention)
  # The task's own data fields (pure checks: nothing is read or created).
  info = lra_tasks.get(task).info(config.data)
  _check_model_for_task(run, info)
  for split in ('train', 'val', 'test'):   # generated tasks: a split of 0 examples cannot train/test
    v = config.data[f'num_{split}'] if f'num_{split}' in config.data else 1
    if not _is_int(v) or v < 1:
      _fail(f'data.num_{split}', v, f'an integer >= 1 (the {split} split would be empty)')
  check_eval_context(run)   # eval_context='stateful' with a model that has no recurrent state
  if task == 'listops':
    from lra_tasks import listops  # pylint: disable=g-import-not-at-top
    listops.GeneratorParams.from_data(config.data).validate()
  check_batches(run, sharding.make_mesh(devices))
  return run


def check_batches(run: run_config.Run, mesh: Any) -> None:
  """The global batches divide over ``mesh``, the per-process batch over ``grad_accum_steps``."""
  import jax  # pylint: disable=g-import-not-at-top
  sharding.check_batch_size(run.batch_size, mesh, 'batch_size')
  if run.eval_batch_size:
    sharding.check_batch_size(run.eval_batch_size, mesh, 'eval_batch_size')
  per_process, accum = run.batch_size // jax.process_count(), run.optim.grad_accum_steps
  if per_process % accum:
    raise sharding.ShardingError(
        f'optim.grad_accum_steps={accum} must divide the per-process batch {per_process}; set '
        f'--config.optim.grad_accum_steps to a divisor of it')


# ----------------------------------------------------------------------------------------------
# Workdir.

_MIB = 1 << 20
MIN_FREE_BYTES = 1 * _MIB         # config.json, run.json, results.json, the lock, orbax's directories
CHECKPOINT_OVERHEAD = 256 << 10   # per checkpoint: orbax metadata (~30 KiB), OCDBT manifests, meta
EVENT_BYTES = 1 << 10             # per logged event: a metrics.jsonl line and its TensorBoard scalars


def estimate_param_count(run: run_config.Run) -> int:
  """An upper-bound estimate of the model's parameter count from the record (no model is built)."""
  m = run.model
  info = lra_tasks.get(run.data.task).info(run.data)
  emb, qkv, mlp, layers = int(m.emb_dim), int(m.qkv_dim), int(m.mlp_dim), int(m.num_layers)
  length = info.max_length + 1
  per_layer = 4 * emb * qkv + 4 * qkv + 2 * emb * mlp + mlp + emb + 4 * emb
  # Generous allowance for mechanism parameters (learned samplers, projections, position biases).
  per_layer += 4 * qkv * qkv + 2 * length * int(m.num_heads)
  head_in = (4 if info.dual else 1) * emb
  return (info.vocab_size * emb + length * emb + layers * per_layer + head_in * mlp + mlp
          + mlp * info.num_classes + 4 * emb)


def checkpoint_bytes_needed(run: run_config.Run) -> int:
  """Free space a run needs, proportional to what it writes.

  One checkpoint is the parameters and the two Adam moments in float32 plus orbax's per-checkpoint
  files (``CHECKPOINT_OVERHEAD``). At most ``keep_checkpoints + 1`` latest checkpoints exist at once
  (the oldest is deleted after a new one is complete) and two of ``best/``; metrics and TensorBoard
  take ``EVENT_BYTES`` per logged event; ``MIN_FREE_BYTES`` covers the small JSON files. (The tiny
  ListOps run writes 0.45 MB and is asked for 2.6 MiB.)
  """
  one = 3 * 4 * estimate_param_count(run) + CHECKPOINT_OVERHEAD
  events = 2 + run.num_train_steps // run.log_every + run.num_train_steps // run.eval_every
  return (run.keep_checkpoints + 3) * one + events * EVENT_BYTES + MIN_FREE_BYTES


def _nearest_existing(path: str) -> str:
  p = path
  while not os.path.exists(p):
    parent = os.path.dirname(p)
    if parent == p:
      break
    p = parent
  return p


def _probe_write(directory: str) -> Optional[OSError]:
  """Creates and removes one temporary file in ``directory``; the OSError if that fails."""
  try:
    fd, name = tempfile.mkstemp(prefix='.kernelformer-write-test-', dir=directory)
  except OSError as e:
    return e
  os.close(fd)
  os.unlink(name)
  return None


def validate_workdir(workdir: str, run: Optional[run_config.Run] = None) -> None:
  """Raises ``WorkdirError`` unless ``workdir`` is (or can be made) a writable directory with room.

  Nothing is created: only a temporary probe file, removed at once, in the workdir or in the nearest
  existing directory above it.
  """
  if not workdir:
    raise WorkdirError('workdir is empty: pass --workdir DIR')
  path = os.path.abspath(os.path.expanduser(workdir))
  if os.path.exists(path) and not os.path.isdir(path):
    raise WorkdirError(f'workdir {path} is a file, not a directory: pass another --workdir')
  existing = _nearest_existing(path)
  if not os.path.isdir(existing):
    raise WorkdirError(f'workdir {path} cannot be created: {existing} is a file, not a directory')
  targets = [(existing, f'workdir {path}' if existing == path else
              f'workdir {path} cannot be created: {existing}')]
  for sub in ('checkpoints', 'best'):
    d = os.path.join(path, sub)
    if os.path.lexists(d):
      if not os.path.isdir(d):
        raise WorkdirError(f'{d} is not a directory: the workdir holds something else; pass another '
                           '--workdir')
      targets.append((d, d))
  if os.path.isdir(path):
    # The run's own files are read back (resume, re-run): each a regular file of bounded size.
    try:
      workdir_lib.check_run_files(path)
    except workdir_lib.RunError as e:
      raise WorkdirError(str(e)) from None
  for d, what in targets:
    err = _probe_write(d)
    if err is not None:
      raise WorkdirError(f'{what} is not writable ({err.strerror or err}); pass a writable --workdir')
  if run is not None:
    need = checkpoint_bytes_needed(run)
    free = shutil.disk_usage(existing).free
    if free < need:
      raise WorkdirError(
          f'not enough free disk space for workdir {path}: {free / _MIB:.1f} MiB free, a run of '
          f'this config needs about {need / _MIB:.1f} MiB for its checkpoints; free space or pass '
          'a --workdir on another disk')


# ----------------------------------------------------------------------------------------------
# Data files.


def check_data(config: Any) -> None:
  """Reads the task's data files that are on disk, so that their faults stop the run before compiling.

  Raises ``lra_tasks.DataError`` naming the file (and line) of a fault. Missing files the task cannot
  make (``data.generate`` unset) are reported here as well; files the task will generate are left to
  ``task.prepare``.
  """
  data = config.data
  root = os.path.expanduser(str(data.data_dir))
  if os.path.exists(root) and not os.path.isdir(root):
    raise lra_tasks.DataError(f'config.data.data_dir={root!r} is a file, not a directory: point it '
                              'at the data directory (see docs/data.md)')
  task = lra_tasks.get(data.task)
  missing = task.check(data)
  if missing:
    if bool(getattr(data, 'generate', False)):
      return  # task.prepare makes the files
    raise lra_tasks.DataError(f'{task.name}: data missing: ' + '; '.join(missing))
  for split in lra_tasks.common.SPLITS:
    if len(task.source(data, split)) == 0:
      raise lra_tasks.DataError(f'{task.name}: the {split} split is empty; check {root}')


def validate_population(config: Any, members: list, workdirs: list,
                        devices: Optional[list] = None) -> list:
  """``validate_run`` of each member (``population.members(config)``) in its workdir."""
  if len(workdirs) != len(members) or len({os.path.abspath(w) for w in workdirs}) != len(members):
    raise ConfigError(f'{len(members)} population members need {len(members)} distinct workdirs, '
                      f'got {list(workdirs)}')
  if config.keep_checkpoints < 2:   # members' checkpoints are written one after another
    _fail('keep_checkpoints', config.keep_checkpoints, '>= 2 in a population (a kill between members\' '
          'checkpoints resumes at the one before)')
  return [validate_run(c, w, devices) for c, w in zip(members, workdirs)]


def validate_run(config: Any, workdir: str, devices: Optional[list] = None) -> run_config.Run:
  """All checks of a run, in order: config, workdir, data files. Creates nothing; returns the record."""
  run = validate_config(config, devices)
  validate_workdir(workdir, run)
  check_data(run)
  return run

