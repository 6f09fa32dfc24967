"""Skyformer's instability score (Chen et al. 2021, appendix table 3): how much a model's output moves
per unit of parameter change in its first training steps, relative to softmax self-attention.

Protocol (``/work/shared/papers/skyformer-gaussian-kernel-nystrom.txt``, "Additional discussions about
the stability in model training", adapted from Liu et al. 2020a, figure 4): the table 1 setting (the
``skyformer`` preset of each task config), 20 training steps; at step i

    tau_i = ||f(x_i, W_i) - f(x_i, W_{i-1})||_F^2 / ||W_i - W_{i-1}||_F^2,

f the embedding after the two layers, x_i the i-th batch, W_0 the initial parameters, W_i those after
step i; each model's tau_i is divided by self-attention's tau_i at the same step and the ratios are
averaged over the steps (published: ``PUBLISHED``).

Skyformer's repository (pkuzengqi/Skyformer @ 1a677cb) has no code for this table, so what the paper
leaves open is chosen here, each choice for a stated reason:

* **f** is the encoder's token embeddings after the two blocks and the final LayerNorm, padded
  positions zeroed, ``[B, L, d]`` (``[2B, L, d]`` for Retrieval): Skyformer's encoder
  (``src/models/model_transformer.py`` ``Model.forward``) returns ``self.norm(X) * mask`` and pools in
  the head. It is read from our encoder's ``final_norm`` (flax ``capture_intermediates``).
* **W** is everything under ``encoder`` (f does not depend on the head, which would only add to the
  denominator); ``tau_all`` (every parameter in the denominator) is recorded as well.
* **f is evaluated deterministically** (no dropout) with the random features / landmarks of the step
  that produced W_i, the same draw for W_i and W_{i-1}: the difference is the parameter change's alone.
* **tau_i is computed in its first-order form**, ``||J_f(W_{i-1}) dW_i||^2 / ||dW_i||^2``, ``dW_i`` the
  optimizer's update (``jax.jvp``): at the warm-up's learning rates (a few 1e-6) ``W_i - W_{i-1}`` is of
  the order of float32's rounding of W and ``f(W_i) - f(W_{i-1})`` cancels; the first-order form equals
  the formula up to relative ``O(||dW_i||)``. The literal float32 quotient is ``tau_difference``; the
  tests check both against the formula at step sizes float32 resolves.
* A step whose update is exactly zero (0/0: learning rate 0 at step 1) is left out of the average.
* **Same starting point and data**: every kind trains on the same batches (the trainer's, a function
  of the seed and the step) and starts from softmax's initial parameters wherever the trees share a
  leaf (path and shape); only a kind's own parameters come from its own initialiser.
* **The update** is the trainer's loss, dropout keys and optimizer (``steps.make_steps``,
  ``optim.make_optimizer`` from the preset).

Skyformer's protocol as options (``--precision skyformer-amp``, ``PRECISIONS``; ListOps padded to 2048:
src/main.py 214, src/preprocess/create_listops.py 16; the controls ``--vary init`` / ``--vary batches``),
commands and cost: docs/reproduce.md.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import platform
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from kernelformer import run_config

TASKS = ('text', 'listops', 'retrieval', 'pathfinder', 'image')
REFERENCE = 'softmax'
KINDS = ('nystromformer', 'gaussian', 'skyformer')
STEPS = 20
PRESET = 'skyformer'
# Skyformer appendix table 3 (paper text lines ~1177-1210), kind -> task -> ratio.
PUBLISHED = {
    'nystromformer': {'text': 1.03, 'listops': 1.01, 'retrieval': 0.97, 'pathfinder': 0.99, 'image': 1.02},
    'gaussian': {'text': 0.83, 'listops': 0.77, 'retrieval': 0.64, 'pathfinder': 0.74, 'image': 0.62},
    'skyformer': {'text': 0.81, 'listops': 0.79, 'retrieval': 0.64, 'pathfinder': 0.79, 'image': 0.65},
}
PAPER_NAMES = {'nystromformer': 'Nystromformer', 'gaussian': 'Kernelized Attention',
               'skyformer': 'Skyformer'}
SOURCE = 'Skyformer (Chen et al. 2021) appendix table 3'


class InstabilityError(ValueError):
  """A bad request (unknown task or kind, missing data); the message is one line."""


@dataclasses.dataclass
class Trace:
  """One kind's per-step scores in one seed's run (index i-1 holds step i)."""

  kind: str
  tau: list            # first-order form, encoder parameters (the reported score); None if 0/0
  tau_difference: list  # the literal float32 difference quotient, encoder parameters
  tau_all: list        # first-order form, every parameter in the denominator
  loss: list           # training loss of each step
  shared_leaves: int   # parameter leaves copied from the reference's initial parameters
  own_leaves: int      # leaves from the kind's own initialiser
  seconds: float


def task_config(task: str, overrides: Sequence[tuple[str, Any]] = ()):
  """``configs/<task>.py:skyformer`` with ``overrides`` (dotted key, value) applied."""
  if task not in TASKS:
    raise InstabilityError(f'unknown task {task!r}; valid: {", ".join(TASKS)}')
  from kernelformer.reproduce import sweeps  # pylint: disable=g-import-not-at-top
  try:
    return sweeps.apply_overrides(sweeps.load_config(f'configs/{task}.py', PRESET), overrides)
  except sweeps.SweepError as e:
    raise InstabilityError(str(e)) from None


def with_kind(config, kind: str):
  c = config.copy_and_resolve_references()
  c.unlock()
  c.model.attention.kind = kind
  c.lock()
  return c


def leaf_paths(tree) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def share_initial(params, reference) -> tuple[Any, int, int]:
  """``params`` with every leaf that ``reference`` has at the same path and shape taken from it."""
  import jax  # pylint: disable=g-import-not-at-top
  ref = leaf_paths(reference)
  shared = own = 0

  def pick(path, x):
    nonlocal shared, own
    r = ref.get(jax.tree_util.keystr(path))
    if r is not None and r.shape == x.shape and r.dtype == x.dtype:
      shared += 1
      return r
    own += 1
    return x
  return jax.tree_util.tree_map_with_path(pick, params), shared, own


def token_mask(batch: Mapping[str, np.ndarray], pooling: str, length: int) -> np.ndarray:
  """``[rows, length]`` bool: the positions of f that are real tokens (the CLS column counts), in the
  encoder's row order (Retrieval: both documents stacked, each padded to the longer)."""
  inputs = [batch[k] for k in ('inputs', 'inputs1', 'inputs2') if k in batch]
  width = max(x.shape[1] for x in inputs)
  rows = np.concatenate([np.pad(x, ((0, 0), (0, width - x.shape[1]))) for x in inputs]) != 0
  if pooling == 'cls':
    rows = np.concatenate([np.ones((rows.shape[0], 1), bool), rows], axis=1)
  assert rows.shape[1] == length, (rows.shape, length)
  return rows


def _is_final_norm(module, method_name: str) -> bool:
  return method_name == '__call__' and module.name == 'final_norm'


def make_functions(model, tx, config):
  """``(train_step, embed)``, jitted; the seed's keys are arguments, so one compile serves every seed.

  ``train_step(params, opt_state, model_state, batch, step, keys) -> (params, opt_state,
  model_state, updates, loss)``: the trainer's loss (``steps.step_loss``) and the optimizer's update
  (W_i - W_{i-1} before float32 rounding), a float16 model's under the trainer's loss scale
  (``optim.loss_scaled``: torch's GradScaler, Skyformer src/main.py 77-88), kept in ``opt_state``.
  ``embed(params, model_state, batch, step, keys)``: f, the final LayerNorm's output, ``[rows, L, d]``
  (deterministic, the draw of ``step``), unmasked.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from kernelformer.training import steps as steps_lib  # pylint: disable=g-import-not-at-top
  if run_config.of(config).model.attention.distills:
    raise InstabilityError('attention distillation (distill_weight > 0) is not supported here')

  def train_step(params, opt_state, model_state, batch, step, keys):
    loss_of = functools.partial(steps_lib.step_loss, model, keys['features'],
                                steps_lib.is_decoder(model), ())
    (loss, (_, new_model_state)), grads = steps_lib.value_and_grad(loss_of, opt_state)(
        params, model_state, batch, step, jax.random.fold_in(keys['dropout'], step))
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state, new_model_state or model_state, updates,
            loss)

  def embed(params, model_state, batch, step, keys):
    inputs = {k: v for k, v in batch.items() if k.startswith('inputs')}
    _, state = model.apply({'params': params, **model_state}, inputs, train=False, step=step,
                           rngs={'features': keys['features']}, capture_intermediates=_is_final_norm,
                           mutable=['intermediates'])
    found = [x for path, x in leaf_paths(state['intermediates']).items() if 'final_norm' in path]
    if len(found) != 1:
      raise RuntimeError(f'expected one final_norm output in the encoder, found {len(found)}')
    return found[0].astype(jax.numpy.float32)

  return jax.jit(train_step), jax.jit(embed)


def _sq(tree) -> float:
  import jax  # pylint: disable=g-import-not-at-top
  return float(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(tree)))


def _ratio(num: float, den: float) -> Optional[float]:
  return num / den if den > 0 else None


# --precision: 'float32', or torch AMP as Skyformer trains (model.dtype 'float16', ``layers.DTYPES``)
# under the trainer's loss scale (torch's GradScaler, ``optim.loss_scaled``).
PRECISIONS = {'float32': (), 'skyformer-amp': (('model.dtype', 'float16'),)}
# --vary: what the seed changes. 'all': W_0, batches, dropout and features; the controls keep seed
# 0's for everything but W_0 ('init') or but the batches ('batches').
VARY = ('all', 'init', 'batches')


def programs(config, kind: str) -> dict:
  """``kind``'s model, optimizer and jitted functions, built once per command (keys are arguments)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import lra_tasks  # pylint: disable=g-import-not-at-top
  from kernelformer.training import optim as optim_lib  # pylint: disable=g-import-not-at-top
  from kernelformer.training import steps as steps_lib  # pylint: disable=g-import-not-at-top
  c = with_kind(config, kind)
  if int(c.optim.grad_accum_steps) != 1:
    raise InstabilityError('optim.grad_accum_steps must be 1 (one update per batch x_i)')
  info = lra_tasks.get(c.data.task).info(c.data)
  run = run_config.of(c)
  model = steps_lib.build_model(run, info)
  tx, _ = optim_lib.make_optimizer(run.optim, run.num_train_steps, run.model.dtype == 'float16')
  dummy = {n: jnp.ones((1, info.max_length), jnp.int32) for n in steps_lib.input_names(info)}
  init = jax.jit(lambda keys: dict(model.init({'params': keys['init'], 'dropout': keys['init'],
                                               'features': keys['features']}, dummy, train=False)))
  train_step, embed = make_functions(model, tx, c)
  f_and_jvp = jax.jit(lambda p, ms, batch, step, keys, tangent: jax.jvp(
      lambda q: embed(q, ms, batch, step, keys), (p,), (tangent,)))
  return dict(config=c, tx=tx, init=init, train_step=train_step, embed=embed, f_and_jvp=f_and_jvp)


def trace_kind(config, kind: str, batches: Sequence[Mapping[str, np.ndarray]], *, keys=None,
               reference_params=None, on_step: Optional[Callable[[int], None]] = None,
               keep_params: bool = False, program: Optional[dict] = None):
  """Trains ``kind`` for ``len(batches)`` steps on ``batches`` (keys: default ``run_keys(config.seed)``;
  ``program``: ``programs(config, kind)``) and scores each step.
  Returns ``(trace, initial params, [W_0, W_1, ...] if keep_params else [])``."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from kernelformer.training import steps as steps_lib  # pylint: disable=g-import-not-at-top

  t0 = time.perf_counter()
  pr = program or programs(config, kind)
  c, embed = pr['config'], pr['embed']
  keys = keys if keys is not None else steps_lib.run_keys(int(config.seed))
  model_state = pr['init'](keys)
  params = model_state.pop('params')
  shared, own = 0, len(jax.tree.leaves(params))
  if reference_params is not None:
    params, shared, own = share_initial(params, reference_params)
  initial = params
  opt_state = pr['tx'].init(params)
  trace = Trace(kind=kind, tau=[], tau_difference=[], tau_all=[], loss=[], shared_leaves=shared,
                own_leaves=own, seconds=0.0)
  trajectory = [params] if keep_params else []
  for i, batch in enumerate(batches, start=1):
    step = jnp.asarray(i - 1, jnp.int32)
    new_params, opt_state, model_state_new, updates, loss = pr['train_step'](
        params, opt_state, model_state, batch, step, keys)
    f_old, jf = pr['f_and_jvp'](params, model_state, batch, step, keys, updates)
    f_new = embed(new_params, model_state, batch, step, keys)
    mask = token_mask(batch, c.model.pooling, f_old.shape[1])[..., None]
    jf, diff = np.where(mask, np.asarray(jf), 0.0), np.where(mask, np.asarray(f_new) - np.asarray(f_old), 0.0)
    num_jvp = float(np.sum(np.square(jf.astype(np.float64))))
    num_diff = float(np.sum(np.square(diff.astype(np.float64))))
    den_enc = _sq(updates['encoder'])
    stored = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64),
                          new_params['encoder'], params['encoder'])
    trace.tau.append(_ratio(num_jvp, den_enc))
    trace.tau_difference.append(_ratio(num_diff, _sq(stored)))
    trace.tau_all.append(_ratio(num_jvp, _sq(updates)))
    trace.loss.append(float(loss))
    params, model_state = new_params, model_state_new
    if keep_params:
      trajectory.append(params)
    if on_step is not None:
      on_step(i)
  trace.seconds = time.perf_counter() - t0
  return trace, initial, trajectory


def seed_batches(config, seed: int, steps: int) -> list[dict]:
  """The trainer's batches 0..steps-1 of a run with ``seed`` (x_1 .. x_steps)."""
  import lra_tasks  # pylint: disable=g-import-not-at-top
  from kernelformer.training import input_pipeline  # pylint: disable=g-import-not-at-top
  task = lra_tasks.get(config.data.task)
  try:
    task.prepare(config.data)
    missing = task.check(config.data)
  except lra_tasks.DataError as e:
    raise InstabilityError(str(e)) from None
  if missing:
    raise InstabilityError(f'{task.name}: data missing: ' + '; '.join(missing))
  source = task.source(config.data, 'train')
  batches = input_pipeline.TrainBatches(source, int(config.batch_size), seed)
  return [batches.batch(s) for s in range(steps)]


def ratios(trace: Trace, reference: Trace, field: str = 'tau') -> list:
  """Per-step ratio kind / reference (None where either is undefined)."""
  out = []
  for a, b in zip(getattr(trace, field), getattr(reference, field)):
    out.append(a / b if a is not None and b not in (None, 0.0) else None)
  return out


def mean_ratio(per_step: Sequence[Optional[float]]) -> tuple[float, int]:
  vals = [r for r in per_step if r is not None]
  return (float(np.mean(vals)) if vals else float('nan')), len(vals)


# What a result must share with a new request for its seeds to be taken over (besides the seeds).
SETTINGS = ('task', 'preset', 'steps', 'reference', 'kinds', 'overrides', 'optimizer', 'precision',
            'vary')


def reusable(previous: Optional[dict], settings: Mapping[str, Any], env: Mapping[str, Any]
             ) -> tuple[dict, str]:
  """``(seed -> per-seed entry, why not)``: the seeds of an earlier result that a new run with
  ``settings`` on ``env`` may take over instead of computing them again. Only seeds whose every kind
  finished, and only when the settings, the device, the jax version and the code (a clean git commit)
  are the same: a seed's ratios are then the same bit for bit (a rerun of seed 0 of the ListOps column
  reproduced every per-step ratio). ``why not`` says in a few words what differed ('' when reused)."""
  if not previous:
    return {}, ''
  for key in SETTINGS:
    if previous.get(key) != settings.get(key):
      return {}, f'its {key} differs ({previous.get(key)!r}, now {settings.get(key)!r})'
  old_env = previous.get('environment') or {}
  for key in ('device', 'backend', 'jax'):
    if old_env.get(key) != env.get(key):
      return {}, f'it ran on another {key} ({old_env.get(key)!r}, now {env.get(key)!r})'
  old_code, code = old_env.get('code') or {}, env.get('code') or {}
  if not code.get('git_commit') or code.get('git_dirty') or old_code.get('git_dirty'):
    return {}, 'the code is not a clean git checkout, so it cannot be told to be the same code'
  if old_code.get('git_commit') != code['git_commit']:
    return {}, f"it ran other code (commit {str(old_code.get('git_commit'))[:12]}, now {code['git_commit'][:12]})"
  done = set(previous.get('seeds') or [])
  return {int(e['seed']): e for e in previous.get('per_seed') or [] if e.get('seed') in done}, ''


def seed_inputs(config, seed: int, steps: int, vary: str = 'all') -> tuple[dict, list]:
  """``(keys, batches)`` of ``seed`` under ``vary`` (``VARY``): the controls take seed 0's keys and
  batches for everything the seed does not vary."""
  from kernelformer.training import steps as steps_lib  # pylint: disable=g-import-not-at-top
  keys = steps_lib.run_keys(seed if vary == 'all' else 0)
  if vary == 'init':
    keys['init'] = steps_lib.run_keys(seed)['init']
  return keys, seed_batches(config, 0 if vary == 'init' else seed, steps)


def run(task: str, seeds: Sequence[int], *, kinds: Sequence[str] = KINDS, steps: int = STEPS,
        overrides: Sequence[tuple[str, Any]] = (), log: Callable[[str], None] = print,
        on_seed: Optional[Callable[[dict], None]] = None, previous: Optional[dict] = None,
        precision: str = 'float32', vary: str = 'all') -> dict:
  """The table-3 column of ``task``: per seed, the reference and each kind for ``steps`` steps, each
  kind compiled once (the first seed's time includes it). ``on_seed(partial_result)`` runs after each
  kind of each seed (the command writes it; ``seeds`` lists the seeds whose every kind finished).
  ``previous``: an earlier result whose finished seeds are taken over where ``reusable`` allows."""
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  for k in (REFERENCE, *kinds):
    try:
      registry.get(k)
    except registry.UnknownKernelError as e:
      raise InstabilityError(str(e)) from None
  if steps < 1:
    raise InstabilityError(f'--steps must be >= 1, got {steps}')
  if not seeds:
    raise InstabilityError('at least one seed')
  if precision not in PRECISIONS or vary not in VARY:
    raise InstabilityError(f'unknown --precision {precision!r} or --vary {vary!r}')
  base = task_config(task, [*PRECISIONS[precision], *overrides])
  t0 = time.perf_counter()
  per_seed = []
  env = environment()
  settings = {'task': task, 'preset': PRESET, 'steps': steps, 'reference': REFERENCE,
              'kinds': list(kinds), 'overrides': [list(o) for o in overrides],
              'optimizer': describe_optimizer(base), 'precision': precision, 'vary': vary}
  reuse, why_not = reusable(previous, settings, env)
  if why_not:
    log(f'the earlier result is not taken over: {why_not}; every seed is computed')
  reused = [int(s) for s in seeds if int(s) in reuse]

  def result() -> dict:
    done = [e['seed'] for e in per_seed if len(e['kinds']) == len(kinds)]
    return {**settings, 'seeds': done, 'seeds_planned': [int(s) for s in seeds],
            'reused_seeds': reused, 'summary': summarize(per_seed, kinds, task),
            'per_seed': per_seed, 'wall_seconds': time.perf_counter() - t0, 'environment': env,
            'source': SOURCE}

  def progress(kind):
    return lambda i: log(f'  {kind}: step {i}/{steps} ({time.perf_counter() - t0:.0f} s)') if (
        i % 5 == 0) else None
  progs = {k: programs(base, k) for k in (REFERENCE, *kinds)}
  for seed in seeds:
    if int(seed) in reuse:
      per_seed.append(reuse[int(seed)])
      log(f'seed {seed}: taken over from the earlier result (same settings, device, jax and commit)')
      continue
    t_seed = time.perf_counter()
    keys, batches = seed_inputs(base, int(seed), steps, vary)
    run_kind = lambda kind, **kw: trace_kind(base, kind, batches, keys=keys, program=progs[kind],
                                             on_step=progress(kind), **kw)
    ref, ref_params, _ = run_kind(REFERENCE)
    log(f'seed {seed}: {REFERENCE} {ref.seconds:.0f} s')
    entry = {'seed': int(seed), 'reference': dataclasses.asdict(ref), 'kinds': {}, 'seconds': 0.0}
    per_seed.append(entry)
    for kind in kinds:
      tr, _, _ = run_kind(kind, reference_params=ref_params)
      entry['kinds'][kind] = {**dataclasses.asdict(tr), 'ratio': ratios(tr, ref),
                              'ratio_difference': ratios(tr, ref, 'tau_difference'),
                              'ratio_all': ratios(tr, ref, 'tau_all')}
      m, n = mean_ratio(entry['kinds'][kind]['ratio'])
      log(f'seed {seed}: {kind} mean ratio {m:.3f} over {n} steps ({tr.seconds:.0f} s)')
      entry['seconds'] = time.perf_counter() - t_seed
      if on_seed is not None:
        on_seed(result())
  return result()


def describe_optimizer(config) -> dict:
  return {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v))
          for k, v in config.optim.to_dict().items()}


def environment() -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  from kernelformer.training import workdir  # pylint: disable=g-import-not-at-top
  return {'device': str(jax.devices()[0].device_kind), 'backend': jax.default_backend(),
          'cpu': platform.processor() or platform.machine(), 'cores': os.cpu_count(),
          'jax': jax.__version__, 'code': workdir.code_version()}


BELOW = 0.85   # between the published KA/Skyformer ratios (0.62-0.83) and Nystromformer's (0.97-1.03)


def spread(vals: Sequence[float]) -> dict:
  """Median, geometric mean with its 95 % t-interval (on the log ratios), fraction below ``BELOW``."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  logs = np.log(np.asarray(vals, np.float64))
  n = len(logs)
  half = (stats.t.ppf(0.975, n - 1) * np.std(logs, ddof=1) / math.sqrt(n)) if n > 1 else math.nan
  return {'median': float(np.median(vals)) if n else math.nan,
          'geomean': float(np.exp(np.mean(logs))) if n else math.nan,
          'geomean_ci95': [float(np.exp(np.mean(logs) - half)), float(np.exp(np.mean(logs) + half))]
                          if n > 1 else [math.nan, math.nan],
          'below': float(np.mean(np.asarray(vals) < BELOW)) if n else math.nan}


def summarize(per_seed: Sequence[dict], kinds: Sequence[str], task: str) -> dict:
  """kind -> mean and sd over seeds of the per-seed averaged ratio (and the alternative forms); for
  the reported form also ``spread``."""
  out = {}
  for kind in kinds:
    row = {'published': PUBLISHED.get(kind, {}).get(task)}
    for field in ('ratio', 'ratio_difference', 'ratio_all'):
      have = [e for e in per_seed if kind in e['kinds']]
      means = [mean_ratio(e['kinds'][kind][field]) for e in have]
      vals = np.asarray([m for m, _ in means], np.float64)
      row[field] = {'mean': float(np.mean(vals)) if len(vals) else float('nan'),
                    'sd': float(np.std(vals, ddof=1)) if len(vals) > 1 else float('nan'),
                    'per_seed': vals.tolist(), 'seeds': [e['seed'] for e in have],
                    'steps_used': [n for _, n in means]}
    row['ratio'].update(spread(row['ratio']['per_seed']))
    out[kind] = row
  return out


def _fmt(x: Optional[float], digits: int = 2) -> str:
  return '—' if x is None or (isinstance(x, float) and math.isnan(x)) else f'{x:.{digits}f}'


def markdown(result: dict, command: str = '') -> str:
  s, task = result['summary'], result['task']
  planned = result.get('seeds_planned', result['seeds'])
  secs = [e['seconds'] for e in result['per_seed'] if e.get('seconds')]
  lines = [f"Instability ratio to {result['reference']} ({SOURCE}), {task}, preset "
           f"`{result['preset']}`, precision {result.get('precision')}, the seed varying "
           f"{result.get('vary')}, {result['steps']} steps, over the seeds of each row (planned: "
           f"{', '.join(map(str, planned))}; finished: {', '.join(map(str, result['seeds'])) or 'none'}"
           f"); per seed {', '.join(f'{x:.0f}' for x in secs) or '—'} s (the first compiles).", '']
  if result.get('reused_seeds'):
    lines += [f"Seeds {', '.join(map(str, result['reused_seeds']))} were taken over from an earlier "
              'run of the same settings and code; the time below is for the others.', '']
  if command:
    lines += [f'`{command}`; {result["wall_seconds"] / 60:.1f} min on '
              f"{result['environment']['device']} ({result['environment']['cores']} cores), jax "
              f"{result['environment']['jax']}.", '']
  lines += ['| model | kind | published | ours (first-order τ), mean ± sd | median | geometric mean '
            f'[95 %] | seeds < {BELOW} | float32 difference | τ over all parameters | per seed | '
            'steps averaged |', '|---|---|---|---|---|---|---|---|---|---|---|']
  for kind, row in s.items():
    r = row['ratio']
    cells = [f"{_fmt(row[f]['mean'])} ± {_fmt(row[f]['sd'])}" for f in ('ratio_difference', 'ratio_all')]
    lines.append(f"| {PAPER_NAMES.get(kind, kind)} | `{kind}` | {_fmt(row['published'])} | "
                 f"{_fmt(r['mean'])} ± {_fmt(r['sd'])} | {_fmt(r['median'])} | {_fmt(r['geomean'])} "
                 f"[{_fmt(r['geomean_ci95'][0])}, {_fmt(r['geomean_ci95'][1])}] | "
                 f"{_fmt(r['below'])} | {' | '.join(cells)} | {' / '.join(map(_fmt, r['per_seed']))} | "
                 f"{'/'.join(map(str, r['steps_used'])) or '—'} |")
  opt = result['optimizer']
  lines += ['', 'Optimizer (from the preset, kernelformer/training/optim.py): ' +
            ', '.join(f'{k}={v}' for k, v in sorted(opt.items()))]
  return '\n'.join(lines) + '\n'


def paths_of(task: str, out_dir: str, suffix: str = '') -> dict:
  name = f'instability-{task}{suffix}'
  return {'json': os.path.join(out_dir, name + '.json'), 'md': os.path.join(out_dir, name + '.md')}


def read(task: str, out_dir: str, log: Callable[[str], None] = print) -> Optional[dict]:
  """The result an earlier command left in ``out_dir`` (None if none or unreadable). It is first
  copied to ``instability-TASK.previous.{json,md}``, since this run's result takes its place."""
  import shutil  # pylint: disable=g-import-not-at-top
  paths = paths_of(task, out_dir)
  if not os.path.exists(paths['json']):
    return None
  kept = paths_of(task, out_dir, '.previous')
  for key in ('json', 'md'):
    if os.path.exists(paths[key]):
      shutil.copyfile(paths[key], kept[key])
  try:
    with open(paths['json']) as fh:
      previous = json.load(fh)
  except (OSError, ValueError) as e:
    log(f"{paths['json']} is unreadable ({type(e).__name__}); kept as {kept['json']}, not taken over")
    return None
  if not isinstance(previous, dict):
    log(f"{paths['json']} is not a result of this command; kept as {kept['json']}, not taken over")
    return None
  log(f"an earlier result in {paths['json']} (kept as {kept['json']}): its finished seeds "
      f"{previous.get('seeds')} are taken over if its settings and code are this run's")
  return previous


def write(result: dict, out_dir: str, command: str = '') -> dict:
  os.makedirs(out_dir, exist_ok=True)
  paths = paths_of(result['task'], out_dir)
  with open(paths['json'], 'w') as fh:
    json.dump({**result, 'command': command}, fh, indent=1)
  with open(paths['md'], 'w') as fh:
    fh.write(markdown(result, command))
  return paths
