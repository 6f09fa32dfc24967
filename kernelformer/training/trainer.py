"""``train_and_evaluate(config, workdir)``: the one training loop for every task and attention kind.

* Data: ``lra_tasks.get(config.data.task)``; missing data stops the run before any compilation.
* Model: ``kernelformer.encoder.Classifier`` (dual encoder for Retrieval).
* Parallelism: ``jax.jit`` over a 1-D ``data`` mesh of all devices, batch sharded, state replicated; the
  same code runs on 1 CPU, 8 GPUs or a TPU pod (``config.batch_size`` is global).
* Randomness: a run is a function of (config, seed). Dropout keys are ``fold_in(seed_key, step)``; the
  random-feature key is fixed and the attention modules fold in ``step // redraw_every`` themselves;
  batches are a function of the step (``input_pipeline``). So a resumed run equals an uninterrupted one.
* Outputs in ``workdir``: ``checkpoints/`` (latest, for resuming), ``best/`` (best validation accuracy),
  ``tensorboard/``, ``metrics.jsonl`` (one JSON object per log/eval event), ``results.json`` at the end.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import time
from typing import Any, Callable, Iterable, Optional, Sequence

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

import lra_tasks
from kernelformer import encoder
from kernelformer import plugins
from kernelformer import run_config
from kernelformer.attention import distill as distill_lib
from kernelformer.training import checkpoint as ckpt_lib
from kernelformer.training import input_pipeline
from kernelformer.training import lm_eval
from kernelformer.training import metrics as metrics_lib
from kernelformer.training import optim as optim_lib
from kernelformer.training import selection
from kernelformer.training import sharding
from kernelformer.training import signals as signals_lib
from kernelformer.training import workdir as workdir_lib
from kernelformer.training import validate


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  model_state: Any          # non-parameter collections (e.g. batch statistics of a generative sampler)


def build_model(run: run_config.Run, info: lra_tasks.TaskInfo) -> nn.Module:
  """The classifier (dual encoder for Retrieval), or for causal LM tasks (enwik8, MQAR, selective copy)
  the decoder-only model with per-token targets."""
  if is_language_model(info):
    from kernelformer import decoder  # pylint: disable=g-import-not-at-top
    return decoder.build_decoder(run.model, info)
  return encoder.build_classifier(run.model, info)


def is_language_model(info) -> bool:
  """Whether the task gives per-position next-token targets (``lra_tasks.mqar.LMTaskInfo``)."""
  return bool(getattr(info, 'language_model', False))


def is_decoder(model) -> bool:
  """Whether ``model`` is the decoder-only LM (per-token targets), not the classifier."""
  from kernelformer import decoder  # pylint: disable=g-import-not-at-top
  return isinstance(model, decoder.Decoder)


def input_names(info: lra_tasks.TaskInfo) -> tuple[str, ...]:
  return ('inputs1', 'inputs2') if info.dual else ('inputs',)


def run_keys(seed: int) -> dict:
  """The run's keys: parameter init, dropout (folded with the step) and the random features."""
  base = jax.random.key(seed)
  return {'init': jax.random.fold_in(base, 0), 'dropout': jax.random.fold_in(base, 1),
          'features': jax.random.fold_in(base, 2)}


def cross_entropy(logits, labels, weights=None):
  losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  if weights is None:
    weights = jnp.ones_like(losses)
  return losses * weights, correct * weights, weights


def make_steps(model: nn.Module, tx: optax.GradientTransformation, schedule, run: run_config.Run,
               keys: dict):
  """The jitted-to-be train and eval steps (pure functions of state and batch)."""
  lm = is_decoder(model)
  # Auxiliary losses sown by the model (Hedgehog's attention distillation, attention/distill.py): only
  # when asked for, so with weight 0 the step is the plain one.
  aux = (distill_lib.DISTILL_COLLECTION,) if run.model.attention.distills else ()
  grad_fn = jax.value_and_grad(functools.partial(step_loss, model, keys['features'], lm, aux),
                               has_aux=True)
  accum = run.optim.grad_accum_steps

  def train_step(state: TrainState, batch):
    dropout_key = jax.random.fold_in(keys['dropout'], state.step)
    if accum == 1:
      (loss, (acc, model_state)), grads = grad_fn(state.params, state.model_state, batch,
                                                  state.step, dropout_key)
    else:
      grads, loss, acc, model_state = accumulated_grads(grad_fn, state, batch, dropout_key, accum,
                                                        bool(aux))
    return apply_update(tx, schedule, state, grads, loss, acc, model_state, bool(aux))

  return train_step, functools.partial(eval_sums, model, keys['features'], lm)


def step_loss(model, features_key, lm: bool, aux: tuple, params, model_state, batch, step,
              dropout_key):
  """The training loss of ``batch`` and ``(accuracy, new model state)``; with ``aux`` (the sown
  collections) the loss includes their sum and the accuracy is ``{'acc', 'aux_loss'}``."""
  variables = {'params': params, **model_state}
  rngs = {'dropout': dropout_key, 'features': features_key}
  inputs = {k: v for k, v in batch.items() if k.startswith('inputs')}
  mutable = list(model_state.keys()) + list(aux)
  if mutable:
    logits, new_state = model.apply(variables, inputs, train=True, step=step, rngs=rngs,
                                    mutable=mutable)
  else:
    logits, new_state = model.apply(variables, inputs, train=True, step=step, rngs=rngs), {}
  if lm:
    # Next-token loss per position, weight 0 where targets == 0 (padding / not a query).
    losses, correct, w = cross_entropy(logits, batch['targets'],
                                       (batch['targets'] != 0).astype(jnp.float32))
    n = jnp.maximum(jnp.sum(w), 1.0)
    task, acc = jnp.sum(losses) / n, jnp.sum(correct) / n
  else:
    losses, correct, _ = cross_entropy(logits, batch['targets'])
    task, acc = jnp.mean(losses), jnp.mean(correct)
  if not aux:
    return task, (acc, new_state)
  new_state = dict(new_state)
  aux_loss = sum((jnp.sum(x) for x in jax.tree.leaves(new_state.pop(aux[0], {}))),
                 jnp.zeros((), jnp.float32))
  return task + aux_loss, ({'acc': acc, 'aux_loss': aux_loss}, new_state)


def accumulated_grads(grad_fn, state: TrainState, batch, dropout_key, accum: int, aux: bool):
  """Micro-batches of one global batch, gradients averaged: the update equals the large-batch one.
  Strided rows (micro-batch i = rows i, i+k, ...) keep each device's rows on that device: with the
  batch sharded on its leading axis, contiguous blocks would be resharded every step."""
  micro = jax.tree.map(
      lambda x: x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1), batch)

  def body(carry, xs):
    g_sum, l_sum, a_sum, mstate = carry
    mb, i = xs
    (l, (a, ms)), g = grad_fn(state.params, mstate, mb, state.step,
                              jax.random.fold_in(dropout_key, i))
    return (jax.tree.map(jnp.add, g_sum, g), l_sum + l, jax.tree.map(jnp.add, a_sum, a), ms), None

  zeros = jax.tree.map(jnp.zeros_like, state.params)
  acc0 = {'acc': 0.0, 'aux_loss': 0.0} if aux else 0.0
  (grads, loss, acc, model_state), _ = jax.lax.scan(
      body, (zeros, 0.0, acc0, state.model_state), (micro, jnp.arange(accum)))
  return (jax.tree.map(lambda g: g / accum, grads), loss / accum,
          jax.tree.map(lambda a: a / accum, acc), model_state)


def apply_update(tx, schedule, state: TrainState, grads, loss, acc, model_state, aux: bool):
  """The optimizer's update and the step's metrics (the sown auxiliary losses logged beside the total
  loss they are part of)."""
  extra = {}
  if aux:
    acc, extra = acc['acc'], {'aux_loss': acc['aux_loss']}
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                         model_state=model_state if model_state else state.model_state)
  metrics = {'loss': loss, 'accuracy': acc, 'learning_rate': schedule(state.step),
             'grad_norm': optax.global_norm(grads), **extra}
  return new_state, metrics


def eval_sums(model, features_key, lm: bool, state: TrainState, batch, draw_step=None):
  """Loss, correct and count sums. ``draw_step`` None: the random draws of the last training step
  (kept in ``state.model_state``, attention/draws.py); a step: that training step's draws."""
  variables = {'params': state.params, **state.model_state}
  inputs = {k: v for k, v in batch.items() if k.startswith('inputs')}
  logits = model.apply(variables, inputs, train=False, step=draw_step, rngs={'features': features_key})
  weights = batch['weights']
  if lm:
    weights = weights[:, None] * (batch['targets'] != 0).astype(jnp.float32)
  losses, correct, weights = cross_entropy(logits, batch['targets'], weights)
  return {'loss': jnp.sum(losses), 'correct': jnp.sum(correct), 'count': jnp.sum(weights)}


def init_state(model, tx, info, config, keys, mesh) -> TrainState:
  return jax.jit(initializer(model, tx, info, keys),
                 out_shardings=sharding.replicated(mesh))(keys['init'])


def initializer(model, tx, info, keys) -> Callable[[jax.Array], TrainState]:
  """``init(key)``: the fresh state, traceable (``population`` vmaps it over members)."""
  dummy = {n: jnp.ones((1, info.max_length), jnp.int32) for n in input_names(info)}

  def init(key):
    variables = dict(model.init({'params': key, 'dropout': key, 'features': keys['features']},
                                dummy, train=False))
    params = variables.pop('params')
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      model_state=variables)
  return init


def evaluate(eval_step, state, source, run: run_config.Run, mesh, *, max_batches: Optional[int] = None,
             on_batch: Optional[Callable[[int], None]] = None) -> dict[str, float]:
  """Loss, accuracy and example count over ``source`` (``max_batches``: None = the periodic-validation
  cap ``run.max_eval_batches``; 0 = the whole split, which the final test always uses).

  ``on_batch(i)`` is called before batch ``i`` (the watchdog counts evaluation batches as progress).
  The per-batch sums stay on the device and are read once, at the end (summed in float64 on the host).
  """
  if max_batches is None:
    max_batches = run.max_eval_batches
  outs = []
  for i, batch in enumerate(input_pipeline.eval_batches(source, run.test_batch_size, max_batches)):
    if on_batch is not None:
      on_batch(i)
    outs.append(eval_step(state, sharding.shard_batch(batch, mesh)))
  totals = {'loss': 0.0, 'correct': 0.0, 'count': 0.0}
  for out in jax.device_get(outs):
    for k in totals:
      totals[k] += float(out[k])
  n = max(totals['count'], 1.0)
  return {'loss': totals['loss'] / n, 'accuracy': totals['correct'] / n, 'examples': int(totals['count'])}


def count_params(params) -> int:
  return int(sum(np.prod(p.shape) for p in jax.tree.leaves(params)))


# on_nonfinite='skip': after this many consecutive non-finite steps the run stops anyway (a run that
# only skips is not training).
MAX_CONSECUTIVE_SKIPS = 10
# Steps dispatched ahead of the one the host waits for: the device always has the next steps queued,
# while the watchdog still names the first step that does not finish. Each holds only its batch and
# its window. When more than MAX_IN_FLIGHT are in flight the host waits until RESUME_IN_FLIGHT are:
# one wait (one wake-up of the host thread) per MAX_IN_FLIGHT - RESUME_IN_FLIGHT steps, not one per
# step -- on a loaded CPU a wake-up costs as much as a small step (docs/benchmarks.md, "The training
# loop against a bare loop").
MAX_IN_FLIGHT = 16
RESUME_IN_FLIGHT = 8
# best/ keeps the last two bests: the test falls back to the earlier if the newest does not restore.
KEEP_BEST = 2


class RunResults(dict):
  """The results dict, with ``status``: 'trained', 'reevaluated' or 'finished' (nothing was done)."""
  status = 'trained'


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       hooks: Iterable[Callable[[int, TrainState], None]] = (),
                       devices: Optional[list] = None) -> dict:
  """Trains ``config`` in ``workdir`` (resuming if it holds a checkpoint); returns the results dict.

  ``hooks`` are called after every step is dispatched, with (step, state); ``state`` may still be
  computing (reading it waits for it). Tests use them to interrupt a run.
  ``devices`` restricts the mesh (default: all devices).

  The loop never waits for the host between boundaries (logging, validation, checkpoint, stop): the
  step's loss, accuracy, gradient norm and learning rate are summed on the device (``loop_step``), a
  non-finite step is detected there and its update not applied, and the host reads the sums once per
  boundary. Batches are read and placed on the devices by a thread, ``input_pipeline.PREFETCH`` steps
  ahead (on CPU: placed by the step itself).

  Run safety (lock, one config per workdir, signals, divergence, watchdog, damaged checkpoints, the
  record written at once): docs/runs.md; each stop is a ``workdir_lib.RunError`` with the exit code.
  """
  logging.getLogger('absl').setLevel(logging.WARNING)
  run = validate.validate_run(config, workdir, devices)  # user mistakes: one line, before anything is created
  workdir = os.path.abspath(workdir)
  is_lead = jax.process_index() == 0
  os.makedirs(workdir, exist_ok=True)
  lock = workdir_lib.WorkdirLock(workdir)
  if is_lead:
    lock.acquire()
    workdir_lib.settle_record(workdir)   # a record write cut short: finished or undone
  watchdog = signals_lib.Watchdog()
  watchdog.on_fire = lock.release
  try:
    return _train_and_evaluate(config, run, workdir, hooks, devices, watchdog)
  finally:
    watchdog.close()
    lock.release()


def _train_and_evaluate(config, run, workdir, hooks, devices, watchdog) -> dict:
  """read the workdir -> build -> restore -> train (steps and boundaries: log, evaluate, save) -> test
  -> finish: each phase a function of the values the one before returned (``Setup``, ``RunMeta``,
  ``Segment``, ``Journal``, the state)."""
  t0, started = time.monotonic(), workdir_lib.now_iso()
  prior = read_prior(config, run, workdir)
  finished = finished_results(run, prior)
  if finished is not None:
    return finished
  setup, state = build(config, run, workdir, prior, hooks=hooks, devices=devices, watchdog=watchdog)
  setup, state, meta, segment, journal = restore(setup, state, t0=t0, started=started)
  completed = False
  try:
    with setup.stop:
      loop = Loop(setup, meta, segment, journal)
      state = loop.run(state, segment.start_step, setup.num_steps, setup.batches)
      meta = loop.meta
      tested = test(setup, meta, state, segment)
    completed = True
  finally:
    close(setup, segment, journal, completed)
  return finish(setup, meta, segment, journal, state, tested)


def make_loop_step(train_step, policy: str, log_every: int = 1):
  """``loop_step(state, window, batch) -> (state, window)``: ``train_step`` plus on-device bookkeeping.

  ``window`` holds sums over the steps since the last log (loss, accuracy, learning rate, gradient
  norm, over applied steps only), counts, and the first step that stops the run (``bad_step``, -1
  while none). The step after a log step (``state.step`` a multiple of ``log_every``) starts a new
  window itself (``next_window``), so a log boundary costs the host one read and no dispatch. A step whose loss or gradient norm is non-finite is not applied (the state is kept,
  only its step advances under 'skip'); under 'stop', and under 'skip' after
  ``MAX_CONSECUTIVE_SKIPS`` in a row, ``bad_step`` is recorded and no later update is applied, so the
  host, reading ``window`` at the next boundary, stops with the exact step and the state before it.
  """

  def loop_step(state: TrainState, packed: jax.Array, batch):
    fresh = state.step % log_every == 0
    window = unpack_window(jnp.where(fresh, next_window(packed), packed))
    new_state, m = train_step(state, batch)
    finite = jnp.isfinite(m['loss']) & jnp.isfinite(m['grad_norm'])
    halted = window['bad_step'] >= 0
    apply = finite & ~halted
    done = (state.step + 1).astype(jnp.int32)
    consecutive = jnp.where(finite, 0, window['consecutive'] + 1).astype(jnp.int32)
    stops = ~finite if policy == 'stop' else consecutive >= MAX_CONSECUTIVE_SKIPS
    first_bad = ~halted & stops
    kept = jax.tree.map(lambda new, old: jnp.where(apply, new, old), new_state, state)
    kept = kept.replace(step=jnp.where(halted | first_bad, state.step, state.step + 1))
    w = dict(window)
    for k in ('loss', 'accuracy', 'learning_rate', 'grad_norm', 'aux_loss'):
      w[k] = window[k] + jnp.where(apply, m.get(k, jnp.zeros(())).astype(jnp.float32), 0.0)
    w['applied'] = window['applied'] + apply.astype(jnp.int32)
    skipped = ~finite & ~halted & ~first_bad
    w['skipped'] = window['skipped'] + skipped.astype(jnp.int32)
    w['first_skipped'] = jnp.where(skipped & (window['first_skipped'] < 0), done,
                                   window['first_skipped'])
    w['consecutive'] = jnp.where(halted, window['consecutive'], consecutive)
    w['bad_step'] = jnp.where(first_bad, done, window['bad_step'])
    w['bad_loss'] = jnp.where(first_bad, m['loss'].astype(jnp.float32), window['bad_loss'])
    w['bad_grad_norm'] = jnp.where(first_bad, m['grad_norm'].astype(jnp.float32),
                                   window['bad_grad_norm'])
    return kept, pack_window(w)

  return loop_step


# The window travels as one int32 array (the float fields as their bits), so that a boundary reads it
# in one transfer: ``np.asarray`` of one array costs the host ~2 us, ``jax.device_get`` of a dict of
# two ~25 us -- a fifth of a tiny step (docs/benchmarks.md, "The training loop against a bare loop").
WINDOW_INTS = ('applied', 'skipped', 'first_skipped', 'consecutive', 'bad_step')
WINDOW_FLOATS = ('loss', 'accuracy', 'learning_rate', 'grad_norm', 'aux_loss', 'bad_loss',
                 'bad_grad_norm')


def pack_window(window: dict) -> jax.Array:
  """``int32[12]``: the ``WINDOW_INTS`` fields, then the bits of the float32 ``WINDOW_FLOATS``."""
  floats = jnp.stack([jnp.asarray(window[k], jnp.float32) for k in WINDOW_FLOATS])
  return jnp.concatenate([jnp.stack([jnp.asarray(window[k], jnp.int32) for k in WINDOW_INTS]),
                          jax.lax.bitcast_convert_type(floats, jnp.int32)])


def unpack_window(packed: jax.Array) -> dict:
  """The named fields (scalar arrays) of a packed window, inside a traced function."""
  n = len(WINDOW_INTS)
  floats = jax.lax.bitcast_convert_type(packed[n:], jnp.float32)
  return {**{k: packed[i] for i, k in enumerate(WINDOW_INTS)},
          **{k: floats[i] for i, k in enumerate(WINDOW_FLOATS)}}


def window_values(packed) -> dict:
  """The named fields of a packed window as Python numbers: one read of the device array."""
  values = np.asarray(packed)
  n = len(WINDOW_INTS)
  return {**dict(zip(WINDOW_INTS, values[:n].tolist())),
          **dict(zip(WINDOW_FLOATS, values[n:].view(np.float32).tolist()))}


def empty_window() -> jax.Array:
  f, i = jnp.float32, jnp.int32
  return pack_window({
      'loss': jnp.zeros((), f), 'accuracy': jnp.zeros((), f), 'learning_rate': jnp.zeros((), f),
      'grad_norm': jnp.zeros((), f), 'aux_loss': jnp.zeros((), f),
      'applied': jnp.zeros((), i), 'skipped': jnp.zeros((), i),
      'first_skipped': -jnp.ones((), i), 'consecutive': jnp.zeros((), i),
      'bad_step': -jnp.ones((), i), 'bad_loss': jnp.zeros((), f), 'bad_grad_norm': jnp.zeros((), f)})


def next_window(window: jax.Array) -> jax.Array:
  """A new logging window that keeps the run-long fields (skips in a row, the stopping step)."""
  fresh, old = unpack_window(empty_window()), unpack_window(window)
  for k in ('consecutive', 'bad_step', 'bad_loss', 'bad_grad_norm'):
    fresh[k] = old[k]
  return pack_window(fresh)


def code_segments(previous, start: int, current: dict, resumed: bool) -> list:
  """The code that trained each stretch of the run: ``[{'from_step', 'code_version'}, ...]``.

  A run resumed under other code (another commit, a dirty tree, another package version) is legal --
  a fix can be picked up mid-run -- but it can change what the remaining steps compute (a numerics fix,
  a new default), so it is never silent: a new entry starts at the resume step, one warning line names
  both versions, and results.json carries the whole list. Checkpoints written before this field
  existed resume with an entry of unknown code for their steps.
  """
  segments = [dict(s) for s in previous] if isinstance(previous, list) else []
  if resumed and not segments and start > 0:
    segments = [{'from_step': 0, 'code_version': {'package_version': 'unknown (checkpoint older '
                                                                      'than code_versions)'}}]
  if segments and segments[-1].get('code_version') == current:
    return segments
  if segments:
    logging.warning('resumed at step %d under other code (%s) than trained the steps before it (%s); '
                    'both are recorded in results.json code_versions', start,
                    _describe_code(current), _describe_code(segments[-1].get('code_version') or {}))
  segments.append({'from_step': int(start), 'code_version': dict(current)})
  return segments


def _describe_code(version: dict) -> str:
  commit = version.get('git_commit')
  if commit:
    return f"commit {commit[:12]}{' (dirty tree)' if version.get('git_dirty') else ''}"
  return f"package {version.get('package_version', 'unknown')}"


# ---- the run's values ----------------------------------------------------------------------------------
# A run is a few values, each built by one function and handed to the next (``_train_and_evaluate``):
# ``Prior`` (the workdir as found) -> ``Setup`` (built once, never reassigned) -> ``restore`` -> the
# ``RunMeta`` record, the ``Segment`` and the ``Journal`` -> ``Loop.run`` (the steps) -> ``test`` ->
# ``finish``.


@dataclasses.dataclass(frozen=True)
class Prior:
  """The workdir as the run found it, read before anything is written."""
  record: workdir_lib.RunRecord   # run.json: the config the workdir belongs to
  allowed: Any                    # the config changes run.json allows (``config.allow_config_change``)
  previous: Optional[dict]        # results.json of a finished run, else None

  @property
  def provisional(self) -> bool:
    """A stretch continuing a finished run (a config change, more steps, a re-test): its record and
    best/ replace that run's only when it completes (docs/architecture.md, "The run's record")."""
    return self.previous is not None


def read_prior(config: ml_collections.ConfigDict, run: run_config.Run, workdir: str) -> Prior:
  record = workdir_lib.RunRecord(workdir)
  record.load()
  allowed = record.check(config, run.allow_config_change)
  previous, why = workdir_lib.read_results(workdir)
  if why:
    raise workdir_lib.RunError(f'{workdir}/results.json {why}; move it aside and re-run to re-test '
                               f'the final checkpoint')
  return Prior(record=record, allowed=allowed, previous=previous)


def finished_results(run: run_config.Run, prior: Prior) -> Optional[RunResults]:
  """A workdir belongs to one config; a finished run is finished. Decided before any write."""
  previous = prior.previous
  if previous is not None and not prior.allowed and not run.reevaluate and \
      (previous.get('final_step') == run.num_train_steps or previous.get('stopped_early')) and \
      previous.get('config_fingerprint') in (None, prior.record.fingerprint):
    done = RunResults(previous)
    done.status = 'finished'
    return done
  return None


class Watch:
  """The run's watchdog with its two limits (``watchdog_step_s``; ``watchdog_compile_s`` while
  compiling). The run's first evaluation batch compiles the eval step and gets the compile limit."""

  def __init__(self, watchdog: signals_lib.Watchdog, run: run_config.Run):
    self.watchdog = watchdog
    self.step_limit = float(run.watchdog_step_s)
    self.compile_limit = float(run.watchdog_compile_s)
    self.eval_compiled = False

  def step(self, what, progress: Optional[Callable[[], int]] = None) -> None:
    self.watchdog.arm(what, self.step_limit, progress)

  def compiling(self, what: str) -> None:
    self.watchdog.arm(what, self.compile_limit)

  def disarm(self) -> None:
    self.watchdog.disarm()

  def eval_progress(self, what: str) -> Callable[[int], None]:
    def on_batch(i):
      first = not self.eval_compiled
      self.eval_compiled = True
      self.watchdog.arm(f'{what}, batch {i + 1}' + (' (compiling)' if first else ''),
                        self.compile_limit if first else self.step_limit)
    return on_batch


@dataclasses.dataclass(frozen=True)
class Setup:
  """What a run is built from, once (``build``, ``refuse_silent_restart``): nothing in it is reassigned
  while the run trains. The bench's loop (``benchmark_loop``) has no sources and no checkpoints."""
  config: ml_collections.ConfigDict   # the user's, as recorded (run.json, config.json, results.json)
  run: run_config.Run                 # what the run reads
  workdir: str
  prior: Optional[Prior]
  is_lead: bool
  num_steps: int
  policy: str                     # on_nonfinite: 'stop' | 'skip'
  hooks: tuple
  stop: signals_lib.StopSignals
  watch: Watch
  info: lra_tasks.TaskInfo
  mesh: jax.sharding.Mesh
  model: nn.Module
  features_key: jax.Array         # the random-feature key (stateful LM testing, ``lm_eval``)
  loop_step: jax.stages.Wrapped   # jitted ``make_loop_step``: (state, window, batch) -> (state, window)
  eval_step: jax.stages.Wrapped   # jitted: (state, batch) -> loss, correct and count sums
  task: Optional[lra_tasks.Task] = None
  val_source: Optional[Sequence[dict]] = None
  batches: Optional[input_pipeline.TrainBatches] = None   # the training split's
  checkpoints: Optional[ckpt_lib.Checkpoints] = None   # checkpoints/: the latest, for resuming
  best: Optional[ckpt_lib.Checkpoints] = None          # best/: the last KEEP_BEST bests


def prepare_data(run: run_config.Run, is_lead: bool):
  """The task and its ``TaskInfo``; missing data stops here, before any compilation."""
  task = lra_tasks.get(run.data.task)
  if is_lead:
    try:
      task.prepare(run.data)
    except OSError as e:   # a read-only or unwritable data directory: one line, not a traceback
      line = workdir_lib.unwritable_data(e, str(run.data.data_dir))
      if line is None:
        raise
      raise lra_tasks.DataError(f'{task.name}: {line}') from None
  _sync('prepare_data')
  missing = task.check(run.data)
  if missing:
    raise lra_tasks.DataError(f'{task.name}: data missing: ' + '; '.join(missing))
  return task, task.info(run.data)


def build_steps(run: run_config.Run, info, devices) -> tuple[dict, TrainState]:
  """Mesh, model, optimizer, the jitted loop and eval steps (``Setup`` fields) and a fresh state."""
  mesh = sharding.make_mesh(devices)
  validate.check_batches(run, mesh)
  model = build_model(run, info)
  keys = run_keys(run.seed)
  tx, schedule = optim_lib.make_optimizer(run.optim, run.num_train_steps)
  train_step, eval_step = make_steps(model, tx, schedule, run, keys)
  repl, data_sh = sharding.replicated(mesh), sharding.batch_sharded(mesh)
  loop_step = jax.jit(make_loop_step(train_step, run.on_nonfinite, run.log_every),
                      in_shardings=(repl, repl, data_sh), out_shardings=(repl, repl), donate_argnums=0)
  eval_step = jax.jit(eval_step, in_shardings=(repl, data_sh), out_shardings=repl)
  state = init_state(model, tx, info, run, keys, mesh)
  return dict(mesh=mesh, model=model, features_key=keys['features'], loop_step=loop_step,
              eval_step=eval_step), state


def build(config: ml_collections.ConfigDict, run: run_config.Run, workdir: str, prior: Prior, *,
          hooks: Iterable = (), devices: Optional[list] = None,
          watchdog: Optional[signals_lib.Watchdog] = None) -> tuple[Setup, TrainState]:
  """Data (missing data stops here), mesh, model, the compiled-to-be steps, the sources, the checkpoint
  managers, and a fresh state."""
  is_lead = jax.process_index() == 0
  task, info = prepare_data(run, is_lead)
  parts, state = build_steps(run, info, devices)
  setup = Setup(
      config=config, run=run, workdir=workdir, prior=prior, is_lead=is_lead,
      num_steps=run.num_train_steps, policy=run.on_nonfinite, hooks=tuple(hooks),
      stop=signals_lib.StopSignals(), watch=Watch(watchdog, run), info=info, task=task, **parts,
      val_source=task.source(run.data, 'val'),
      batches=input_pipeline.TrainBatches(task.source(run.data, 'train'), run.batch_size, run.seed),
      checkpoints=ckpt_lib.Checkpoints(os.path.join(workdir, 'checkpoints'), run.keep_checkpoints),
      best=ckpt_lib.Checkpoints(os.path.join(workdir, 'best.next' if prior.provisional else 'best'),
                                KEEP_BEST))
  return setup, state


@dataclasses.dataclass(frozen=True)
class RunMeta:
  """The run's record: what every checkpoint carries as its meta and results.json reports. Restored with
  the state (``from_meta``), replaced at the loop's boundaries (``Loop.update``), written by ``as_meta``."""
  started: str                                # when the run's first segment started (ISO)
  code_versions: list                         # ``code_segments``
  data_order: list                            # ``input_pipeline.data_order_segments``
  best_val_accuracy: float = -1.0
  best_step: int = -1
  lowest_val_loss: Optional[float] = None     # the rule for a good checkpoint (``good_loss``)
  val_examples: Optional[int] = None          # of the last validation
  steps_trained: int = 0                      # steps dispatched over the run (a resumed step counts again)
  timed_steps: int = 0                        # steps inside timed spans (a segment's first is not)
  train_seconds: float = 0.0                  # the seconds of those spans
  wall_seconds: float = 0.0                   # the wall time of the earlier segments
  compiled_memory_bytes: Optional[int] = None
  stopped_early: Optional[dict] = None        # {step, val_accuracy, threshold}: ``early_stop_accuracy``
  carried: dict = dataclasses.field(default_factory=dict)   # meta keys of other code, kept as they were

  @classmethod
  def from_meta(cls, meta: dict, start: int, resumed: bool, started: str) -> tuple['RunMeta', dict]:
    """The record of a checkpoint's ``meta`` (of a fresh run: ``{}``) resumed at ``start``, and the
    events that meta held (``uncommitted``: not yet in metrics.jsonl)."""
    meta = dict(meta)
    held = meta.pop('uncommitted', None) or {}
    own = {f.name for f in dataclasses.fields(cls)}
    record = cls(
        started=meta.get('started') or started,
        code_versions=code_segments(meta.get('code_versions'), start, workdir_lib.code_version(),
                                    resumed),
        data_order=input_pipeline.data_order_segments(meta.get('data_order'), start, resumed),
        best_val_accuracy=meta.get('best_val_accuracy', -1.0), best_step=meta.get('best_step', -1),
        lowest_val_loss=meta.get('lowest_val_loss'), val_examples=meta.get('val_examples'),
        steps_trained=int(meta.get('steps_trained', start)),
        timed_steps=int(meta.get('timed_steps', 0)),
        train_seconds=float(meta.get('train_seconds', 0.0)),
        wall_seconds=float(meta.get('wall_seconds', 0.0)),
        compiled_memory_bytes=meta.get('compiled_memory_bytes'),
        stopped_early=meta.get('stopped_early'),
        carried={k: v for k, v in meta.items() if k not in own})
    return record, held

  def as_meta(self, wall_seconds: float) -> dict:
    """The checkpoint meta, with the wall time of the run so far."""
    meta = {**self.carried, 'best_val_accuracy': self.best_val_accuracy, 'best_step': self.best_step,
            'steps_trained': self.steps_trained, 'timed_steps': self.timed_steps,
            'train_seconds': self.train_seconds, 'wall_seconds': wall_seconds,
            'started': self.started, 'code_versions': self.code_versions,
            'data_order': self.data_order}
    for name in ('lowest_val_loss', 'val_examples', 'stopped_early'):   # absent until set
      if getattr(self, name) is not None:
        meta[name] = getattr(self, name)
    meta['compiled_memory_bytes'] = self.compiled_memory_bytes
    return meta


@dataclasses.dataclass
class Segment:
  """This process's stretch of the run: its first step, the last step it checkpointed, its clocks."""
  start_step: int
  last_saved: Optional[int]       # the step of the newest checkpoint (None: none yet)
  t0: float                       # ``time.monotonic()`` when the segment started
  progress: metrics_lib.Progress
  timer: metrics_lib.StepTimer
  span: tuple = (0, 0.0)          # (step, ``time.perf_counter()``) where the current timed span began

  def wall_seconds(self, meta: RunMeta) -> float:
    return meta.wall_seconds + time.monotonic() - self.t0


class Journal:
  """metrics.jsonl and the run's record (run.json, config.json). Events are held until the run has
  something to keep (``commit``: its first checkpoint, or -- continuing a finished run -- its results),
  then written as they come; until then every checkpoint carries them (``uncommitted``)."""

  def __init__(self, setup: Setup, stretch_from: int, start_step: int, events: Iterable = (),
               writer: Optional[metrics_lib.MetricsWriter] = None):
    self.setup = setup
    self.stretch_from = stretch_from    # the step the workdir's record was last written at
    self.start_step = start_step
    self.pending = list(events)
    self.writer = writer                # given: the journal is committed already (the bench's loop)
    self.committed = writer is not None

  def commit(self, root: Optional[str] = None) -> None:
    """Writes the run's record -- run.json, config.json, metrics.jsonl without the events after the
    step the record was last written at (the resumed run logs them again) -- into the workdir, or
    ``root``: the run's final record (``finish``; metrics.jsonl copied). A run that stops before
    (divergence, signal, error) leaves the workdir's record as it was, so its command still runs."""
    if self.committed and root is None:
      return
    setup, prior, was = self.setup, self.setup.prior, self.committed
    if setup.is_lead:
      if not was:
        prior.record.write(setup.config, prior.allowed, self.stretch_from, root)
      workdir_lib.truncate_metrics(setup.workdir, setup.num_steps if was else self.stretch_from,
                                   out=root and os.path.join(root, 'metrics.jsonl'))
    self.close()
    self.committed = True
    self.writer = metrics_lib.MetricsWriter(setup.workdir, enabled=setup.is_lead, root=root)
    if not was and (self.start_step == 0 or prior.allowed):
      self.writer.write_config(setup.config)
    for event in self.pending:
      self.writer.write(*event)
    self.pending = []

  def write(self, split: str, step: int, values: dict) -> None:
    """A metrics event: written once the run is committed, held until then."""
    if self.committed:
      self.writer.write(split, step, values)
    else:
      self.pending.append((split, step, values))

  def uncommitted(self) -> Optional[dict]:
    """What a checkpoint carries while the record is unwritten (None once it is)."""
    if self.committed:
      return None
    return {'from_step': self.stretch_from, 'events': [
        [split, int(at), {k: v.item() if hasattr(v, 'item') else v for k, v in values.items()}]
        for split, at, values in self.pending]}

  def close(self) -> None:
    if self.writer is not None:
      self.writer.close()


def restore(setup: Setup, state: TrainState, *, t0: float, started: str
            ) -> tuple[Setup, TrainState, RunMeta, Segment, Journal]:
  """The newest checkpoint that restores (damaged newer ones set aside), or step 0 -- never step 0
  silently when checkpoints existed: that stops with one line unless ``config.start_over``
  (``refuse_silent_restart``, which may give a new ``Setup``: best/ moved aside)."""
  restored = setup.checkpoints.restore_latest(  # a stretch beyond a re-tested finished run: not it
      ckpt_lib.abstract_like(state), setup.num_steps if setup.prior.provisional else None)
  meta = {'best_val_accuracy': -1.0, 'best_step': -1}
  if restored is not None:
    state, meta = restored
    logging.warning('resumed from %s at step %d', setup.checkpoints.directory, int(state.step))
  else:
    setup = refuse_silent_restart(setup)
  start = int(state.step)
  if start > setup.num_steps:
    raise workdir_lib.RunError(
        f'workdir {setup.workdir} holds a checkpoint at step {start}, past num_train_steps='
        f'{setup.num_steps}; use a new --workdir (a run cannot be shortened)')
  record, held = RunMeta.from_meta(meta, start, restored is not None, started)
  # Events not yet in metrics.jsonl travel in the checkpoint meta (``uncommitted``), with the step the
  # record was last written at: a stretch resumed before its record was written loses none.
  stretch_from = int(held.get('from_step', start)) if restored is not None else start
  events = [tuple(e) for e in held.get('events', []) if int(e[1]) <= start]
  if setup.prior.provisional:   # its bests go to best.next: a copy of best/ unless resumed beyond it
    setup.checkpoints.keep_through(stretch_from)
    if start <= int(setup.prior.previous.get('final_step') or start):
      setup.best.copy_of(os.path.join(setup.workdir, 'best'))
  segment = Segment(start_step=start, last_saved=start if restored is not None else None, t0=t0,
                    progress=metrics_lib.Progress(setup.num_steps, start,
                                                  enabled=setup.is_lead and setup.run.progress),
                    timer=metrics_lib.StepTimer())
  return setup, state, record, segment, Journal(setup, stretch_from, start, events)


def refuse_silent_restart(setup: Setup) -> Setup:
  """No checkpoint restores: if some existed (set aside as damaged) or the run had finished, stop
  with one line; with ``start_over`` the earlier best/ is moved aside (never overwritten)."""
  checkpoints, best, prior = setup.checkpoints, setup.best, setup.prior
  damaged = checkpoints.damaged()
  # run.json (config.json in older workdirs) is written only once a checkpoint exists (``save``).
  started = prior.record.data is not None
  if not damaged and prior.previous is None and not started:
    return setup  # a new workdir, or a run that stopped before its first checkpoint
  what = (f"none of its checkpoints restores ({', '.join(damaged)} in "
          f'{checkpoints.directory})' if damaged else
          f'it holds results.json but no checkpoint in {checkpoints.directory}'
          if prior.previous is not None else
          f"{'config.json' if prior.record.data.get('from') == 'config.json' else 'run.json'} "
          f'records a run started here, but {checkpoints.directory} holds no checkpoint '
          f'(emptied or removed)')
  if not setup.run.start_over:
    raise workdir_lib.RunError(
        f'workdir {setup.workdir}: {what}; nothing was trained or overwritten; put the checkpoints '
        f'back, or pass --config.start_over=True to train from step 0 (best/ is then moved aside)')
  finished = os.path.join(setup.workdir, 'best')   # a stretch's best.next is then refilled from it
  if setup.is_lead and os.path.isdir(finished) and os.listdir(finished):
    best.close()
    n = 1
    while os.path.exists(f'{finished}.before-start-over-{n}'):
      n += 1
    os.rename(finished, f'{finished}.before-start-over-{n}')
    workdir_lib.say(f'start_over: {what}; training from step 0; the earlier best/ is kept as '
                    f'best.before-start-over-{n}')
  _sync('start-over')
  return dataclasses.replace(setup, best=ckpt_lib.Checkpoints(best.directory, KEEP_BEST))


def next_boundary(run: run_config.Run, num_steps: int, step: int) -> int:
  """The first step after ``step`` that ends with validation, a checkpoint or the end: the host waits
  for the device there (computed once per boundary, not per step)."""
  candidates = [step + every - step % every
                for every in (run.eval_every, run.checkpoint_every) if every > 0]
  if num_steps > step:
    candidates.append(num_steps)
  return min(candidates, default=step + 1)


def advice(policy: str) -> str:
  """What to change after a divergence (skipping non-finite steps only where it is not already on)."""
  return ('lower optim.learning_rate or set optim.grad_clip_norm' if policy == 'skip' else
          "lower optim.learning_rate, set optim.grad_clip_norm, or on_nonfinite='skip'")


def divergence_error(window: dict, policy: str, kept: str) -> workdir_lib.RunError:
  """The line that stops the run at the first non-finite step of ``window`` (policy 'stop', or 'skip'
  after too many in a row); ``kept``: what the stopped run leaves (``kept``)."""
  step = window['bad_step']
  if policy == 'skip':
    return workdir_lib.RunError(
        f'step {step}: {window["consecutive"]} non-finite steps (loss or gradient norm) in a row; the '
        f'run diverged and was stopped, nothing from it saved; {kept}; {advice(policy)}',
        workdir_lib.EXIT_DIVERGED)
  loss, norm = window['bad_loss'], window['bad_grad_norm']
  bad = ' and '.join(n for n, v in (('loss', loss), ('gradient norm', norm)) if not np.isfinite(v))
  return workdir_lib.RunError(
      f'step {step}: non-finite {bad or "loss or gradient norm"} (loss {loss:.4g}, gradient norm '
      f'{norm:.4g}); the run diverged and was stopped, nothing from this step saved; {kept}; '
      f'{advice(policy)}', workdir_lib.EXIT_DIVERGED)


def kept(setup: Setup) -> str:
  """What a stopped run leaves: the newest checkpoint on disk (each one passed ``check_finite``), and
  a finished run continued here is unchanged (its record is written only when the stretch ends)."""
  last = setup.checkpoints.latest_step() if setup.checkpoints is not None else None
  out = (f'the last good checkpoint (step {last}) and best/ are kept' if last is not None
         else 'no checkpoint had been written')
  if setup.prior is not None and setup.prior.provisional:
    out += (f"; the finished run (results.json, step {setup.prior.previous.get('final_step')}) and "
            f'its record are unchanged')
  return out


class Loop:
  """The step loop of one segment. It owns what only it touches: the compiled step, the steps in
  flight, the logs queued for reading and the window of on-device sums since the last log. Its
  boundaries (log, validation, checkpoint, stop) update the run's ``RunMeta``, ``Segment`` and
  ``Journal`` it is given; the state is an argument and the result of ``run``."""

  def __init__(self, setup: Setup, meta: RunMeta, segment: Segment, journal: Journal):
    self.setup, self.meta, self.segment, self.journal = setup, meta, segment, journal
    self.compiled = None     # the loop step, compiled ahead of time at the first batch
    self.window = jax.device_put(empty_window(), sharding.replicated(setup.mesh))
    self.in_flight = collections.deque()      # (step, its window) of steps dispatched, not waited for
    self.pending_logs = collections.deque()   # (log step, its window), read once the step is done
    self.dispatching = self.dispatched = segment.start_step
    self.steps_before = meta.steps_trained - segment.start_step   # steps_trained = this + dispatched

  def update(self, **changes) -> RunMeta:
    """The run's record with ``changes``: every change of ``RunMeta`` in a run is one of these."""
    self.meta = dataclasses.replace(self.meta, **changes)
    return self.meta

  # ---- the steps ----------------------------------------------------------------------------------
  def run(self, state: TrainState, start: int, until: int, batches) -> TrainState:
    """Dispatches steps start..``until`` of ``batches``; the host waits for the device only at
    validation and checkpoint boundaries (and after step ``until``). A log boundary queues the window
    of its step and reads it once that step is done, while later steps run. Returns the state."""
    setup, segment, watch, run = self.setup, self.segment, self.setup.watch, self.setup.run
    self.in_flight.clear()
    self.pending_logs.clear()
    if self.meta.stopped_early is not None:   # restored from the checkpoint where the run stopped early
      return state
    self.steps_before = self.meta.steps_trained - start
    placed = batches.device_iterate(start, until, setup.mesh)   # placed ahead, by a thread
    boundary = next_boundary(run, setup.num_steps, start)
    for step, batch in zip(range(start, until), placed):
      done = step + 1
      if self.compiled is None:
        self.compile(state, batch, done)
      # Armed before the dispatch too: a backend may run a step inline (e.g. CPU with a host callback).
      self.dispatching = done
      watch.step(self.unfinished_steps, self.first_unfinished)
      if run.profile_steps > 0:
        with _maybe_profile(run, setup.workdir, step, start):
          state, self.window = self.compiled(state, self.window, batch)
      else:
        state, self.window = self.compiled(state, self.window, batch)
      self.dispatched = done
      self.in_flight.append((done, self.window))
      if done == start + 1:
        self.wait(0)
      elif len(self.in_flight) > MAX_IN_FLIGHT:
        self.wait(RESUME_IN_FLIGHT)
      if done == start + 1:  # the segment's first step warms up (allocation, autotuning): not timed
        segment.span = (done, time.perf_counter())
        segment.timer.tick(done)
      if done == boundary:
        self.boundary(done, state)
        boundary = next_boundary(run, setup.num_steps, done)
        if self.meta.stopped_early is not None:
          break
      else:
        if done % run.log_every == 0:
          self.pending_logs.append((done, self.window))   # the next step starts a new window
        if done == until:   # (a log step too: it is read and written here, with every step done)
          self.read_window(done)
      segment.progress.update(done)   # after a boundary's read, so the bar shows the trainer's rate
      if setup.hooks:
        watch.step(f'after step {done} (hooks)')
        for hook in setup.hooks:
          hook(done, state)
      if setup.stop.requested:
        self.stop_now(done, state)
    if setup.stop.requested:
      raise setup.stop.stop_error(segment.last_saved, setup.workdir)
    return state

  def compile(self, state: TrainState, batch, done: int) -> None:
    """Compiles the loop step ahead of time once: the same executable runs every step."""
    self.setup.watch.compiling(f'compiling the train step (before step {done})')
    self.compiled = self.setup.loop_step.lower(state, self.window, batch).compile()
    self.update(compiled_memory_bytes=metrics_lib.memory_of(self.compiled))
    if self.setup.stop.requested:
      raise self.setup.stop.stop_error(self.segment.last_saved, self.setup.workdir)

  def wait(self, keep: int) -> None:
    """Waits (no transfer) until at most ``keep`` steps are in flight -- one wait, for the newest step
    that must finish (steps finish in order) -- with the watchdog naming the first unfinished step;
    logs whose step is done are read and written."""
    if len(self.in_flight) <= keep:
      return
    done, window = self.in_flight[-keep - 1]
    if not window.is_ready():
      self.setup.watch.step(self.unfinished_steps, self.first_unfinished)
      window.block_until_ready()   # the steps before it are done too; they leave the queue after it
    while len(self.in_flight) > keep:
      self.in_flight.popleft()
    self.flush_logs(done)

  def first_unfinished(self) -> int:
    """The first training step dispatched (or being dispatched) that has not finished; called by the
    watchdog's thread (steps finish in order; reading ``is_ready`` transfers nothing)."""
    for done, window in list(self.in_flight):
      if not window.is_ready():
        return done
    return self.dispatching

  def unfinished_steps(self) -> str:
    """What the watchdog names when a training step does not finish."""
    first = self.first_unfinished()
    return (f'training step {first}' if first >= self.dispatching else
            f'training steps {first}-{self.dispatching} (dispatched; {first} has not finished)')

  def flush_logs(self, upto: int) -> None:
    while self.pending_logs and self.pending_logs[0][0] <= upto:
      done, window = self.pending_logs.popleft()
      self.log(done, self.read(done, window))

  # ---- boundaries: the only places the host reads the device ----------------------------------------
  def read(self, done: int, window) -> dict:
    """Reads a window (the one transfer of a boundary); stops a diverged run."""
    window = window_values(window)
    segment = self.segment
    first, t0 = segment.span
    meta = self.update(timed_steps=self.meta.timed_steps + done - first,
                       train_seconds=self.meta.train_seconds + time.perf_counter() - t0,
                       steps_trained=self.steps_before + self.dispatched)
    segment.span = (done, time.perf_counter())
    segment.timer.tick(done)
    segment.progress.timed(meta.timed_steps, meta.train_seconds)  # the rate results.json gives
    if window['bad_step'] >= 0:
      raise divergence_error(window, self.setup.policy, kept(self.setup))
    return window

  def read_window(self, done: int) -> dict:
    """Waits for every step in flight and reads the current window."""
    self.wait(0)
    self.flush_logs(done)
    return self.read(done, self.window)

  def boundary(self, done: int, state: TrainState) -> None:
    """Logging, validation and checkpoints due after step ``done``."""
    run, num_steps = self.setup.run, self.setup.num_steps
    window = self.read_window(done)
    if done % run.log_every == 0 or done == num_steps:
      self.log(done, window)
    val = None
    if done % run.eval_every == 0 or done == num_steps:
      val = self.validate(done, state)
      update, keep = selection.on_validation(
          run.eval.test_checkpoint, val['accuracy'], done, num_steps,
          {'best_val_accuracy': self.meta.best_val_accuracy, 'best_step': self.meta.best_step})
      if update:
        self.check_finite(done, state, val)
        self.update(**update)   # best_val_accuracy, and best_step where best/ keeps this step
        if keep:
          self.save(self.setup.best, done, state)
      lowest = self.meta.lowest_val_loss
      if good_loss(val['loss'], lowest):
        self.update(lowest_val_loss=val['loss'] if lowest is None else min(lowest, val['loss']))
      self.stop_early(done, val)
    if done % run.checkpoint_every == 0 or done == num_steps or self.meta.stopped_early is not None:
      self.save_checkpoint(done, state, val)
    self.setup.watch.step(f'after step {done}')
    self.segment.span = (done, time.perf_counter())

  def stop_early(self, done: int, val: dict) -> None:
    """``config.early_stop_accuracy`` > 0: validation accuracy above it ends the training here
    (Zoology's rule, ``zoology/train.py`` 198-200 @ d88d6f5: strictly above); the checkpoint written
    then carries the reason, so a resumed or re-run workdir does not train further; results.json says so."""
    threshold = self.setup.run.early_stop_accuracy
    if threshold > 0 and val['accuracy'] > threshold:
      self.update(stopped_early={'step': done, 'val_accuracy': val['accuracy'], 'threshold': threshold})
      workdir_lib.say(f"step {done}: validation accuracy {val['accuracy']:.4f} > {threshold}: "
                      f'training ends here (early_stop_accuracy)')

  def stop_now(self, done: int, state: TrainState) -> None:
    """SIGINT/SIGTERM: the state of the last dispatched step is live (only earlier ones were donated);
    checked and saved, then the run stops."""
    if self.segment.last_saved != done:
      self.read_window(done)
      self.save_checkpoint(done, state)
    raise self.setup.stop.stop_error(done, self.setup.workdir)

  def validate(self, done: int, state: TrainState) -> dict:
    setup = self.setup
    val = evaluate(setup.eval_step, state, setup.val_source, setup.run, setup.mesh,
                   on_batch=setup.watch.eval_progress(f'validating at step {done}'))
    self.journal.write('val', done, val)
    self.update(val_examples=val['examples'])
    return val

  def save_checkpoint(self, done: int, state: TrainState, val: Optional[dict] = None) -> None:
    if self.segment.last_saved != done:
      self.check_finite(done, state, val)
      self.save(self.setup.checkpoints, done, state)
      self.segment.last_saved = done

  def check_finite(self, done: int, state: TrainState, val: Optional[dict]) -> None:
    """A checkpoint is written only when it is good (``good_loss``): finite parameters, and a
    validation loss (``val`` of this step, else one validation batch) that is finite and not orders of
    magnitude above the lowest the run has seen; otherwise the run stops as diverged at ``done``."""
    setup = self.setup
    if not bool(_all_finite(state.params)):
      reason = 'non-finite parameters'
    else:
      if val is None:
        val = evaluate(setup.eval_step, state, setup.val_source, setup.run, setup.mesh,
                       max_batches=1, on_batch=setup.watch.eval_progress(f'checking step {done}'))
      lowest = self.meta.lowest_val_loss
      if good_loss(val['loss'], lowest):
        return
      reason = (f"non-finite validation loss {val['loss']}" if not np.isfinite(val['loss']) else
                f"validation loss {val['loss']:.4g}, over {DIVERGED_FACTOR:g} x "
                f'max(1, the lowest so far {lowest:.4g})')
    raise workdir_lib.RunError(
        f'step {done}: {reason}; the run diverged and was stopped, nothing from this step saved; '
        f'{kept(setup)}; {advice(setup.policy)}', workdir_lib.EXIT_DIVERGED)

  def log(self, done: int, window: dict) -> None:
    n = window['applied']
    summary = {k: window[k] / n if n else float('nan')
               for k in ('loss', 'accuracy', 'learning_rate', 'grad_norm')}
    if self.setup.run.model.attention.distills:
      summary['aux_loss'] = window['aux_loss'] / n if n else float('nan')   # part of 'loss'
    summary['steps_per_sec'] = self.segment.timer.rate()
    if window['skipped']:
      summary['skipped_steps'] = window['skipped']
      workdir_lib.say(f"step {done}: {window['skipped']} non-finite updates skipped since the last "
                      f"log (the first at step {window['first_skipped']}; {window['consecutive']} "
                      f'in a row now)')
    self.journal.write('train', done, summary)
    self.segment.progress.update(self.dispatched, summary)  # a queued log is read a step or two later

  def save(self, manager: ckpt_lib.Checkpoints, step: int, state: TrainState) -> None:
    """A checkpoint, then (the first time, unless continuing a finished run) the run's record."""
    setup = self.setup
    setup.watch.disarm()  # a slow disk is not a hang, and a write is never cut short
    meta = self.meta.as_meta(self.segment.wall_seconds(self.meta))
    held = self.journal.uncommitted()
    if held is not None:
      meta['uncommitted'] = held
    with setup.stop.deferred():
      manager.save(step, state, meta)
      if not setup.prior.provisional:
        self.journal.commit()


def benchmark_loop(config: ml_collections.ConfigDict, info, workdir: str) -> tuple[Loop, TrainState]:
  """The trainer's step loop for ``config`` and ``info`` set up without a workdir's files: no data
  preparation, no checkpoint, no record, no progress bar, and no final boundary (``num_train_steps``
  taken as unbounded; set ``eval_every`` and ``checkpoint_every`` past the steps run) -- the loop alone,
  for timing it against a bare loop (``kernelformer benchmark loop``). ``Loop.run(state, start,
  until, batches)`` runs it; ``workdir`` is only where a profile would go."""
  run = run_config.of(config)
  parts, state = build_steps(run, info, None)
  num_steps = 1 << 30
  setup = Setup(config=config, run=run, workdir=workdir, prior=None, is_lead=jax.process_index() == 0,
                num_steps=num_steps, policy=run.on_nonfinite, hooks=(), stop=signals_lib.StopSignals(),
                watch=Watch(signals_lib.Watchdog(), run), info=info, **parts)
  meta, _ = RunMeta.from_meta({}, 0, False, workdir_lib.now_iso())
  segment = Segment(start_step=0, last_saved=None, t0=time.monotonic(),
                    progress=metrics_lib.Progress(0, 0, enabled=False), timer=metrics_lib.StepTimer())
  journal = Journal(setup, 0, 0, writer=metrics_lib.MetricsWriter(workdir, enabled=False))
  return Loop(setup, meta, segment, journal), state


# ---- the end ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Tested:
  """The test of the run: its loss, accuracy and examples, which checkpoint was tested
  (``{'which': 'best' | 'final', 'step', 'rule': eval.test_checkpoint}``) and that checkpoint's meta
  (None: the final state's)."""
  result: dict
  checkpoint: dict
  meta: Optional[dict]


def test(setup: Setup, meta: RunMeta, state: TrainState, segment: Segment) -> Tested:
  """Test loss and accuracy of the best checkpoint (by validation accuracy) on the whole test split.

  If the newest best/ does not restore (set aside with one line), the earlier kept one is tested
  and named; if none restores, the run stops with one line -- other weights are never tested under
  the best step's name.
  """
  best, tested_meta = setup.best, None
  rule = setup.run.eval.test_checkpoint
  checkpoint = {'which': 'final', 'step': int(state.step), 'rule': rule}
  if selection.tests_best(rule) and (best.all_steps() or best.damaged()):
    restored = best.restore_latest(ckpt_lib.abstract_like(state))
    if restored is None:
      raise workdir_lib.RunError(
          f"best/ in {setup.workdir} holds no checkpoint that restores ({', '.join(best.damaged())}"
          f'); the test was not run and results.json is unchanged; put best/ back from a copy, or '
          f'train again in a new --workdir')
    state, tested_meta = restored
    checkpoint = {'which': 'best', 'step': int(best.latest_step()), 'rule': rule}
    if checkpoint['step'] != meta.best_step:
      workdir_lib.say(f"testing best/{checkpoint['step']} (validation accuracy "
                      f"{tested_meta.get('best_val_accuracy')}): the newest best/ that "
                      f'restores; best/{meta.best_step} did not')
  test_source = setup.task.source(setup.run.data, 'test')
  on_batch = setup.watch.eval_progress(f"testing the {checkpoint['which']} checkpoint")
  if lm_eval.is_stateful(setup.run):   # enwik8: windows in order, the decoder's state carried
    result = lm_eval.evaluate_stateful(
        setup.model, {'params': state.params, **state.model_state}, test_source,
        features_key=setup.features_key, on_batch=on_batch)
  else:
    result = evaluate(setup.eval_step, state, test_source, setup.run, setup.mesh, max_batches=0,
                      on_batch=on_batch)
  setup.watch.disarm()
  if setup.stop.requested:
    raise setup.stop.stop_error(segment.last_saved, setup.workdir)
  return Tested(result=result, checkpoint=checkpoint, meta=tested_meta)


def close(setup: Setup, segment: Segment, journal: Journal, completed: bool) -> None:
  setup.watch.disarm()
  segment.progress.close()
  _stop_profile()
  if not completed:
    journal.close()
    setup.best.close()
    if setup.prior.provisional and setup.is_lead and (setup.checkpoints.latest_step() or 0) <= int(
        setup.prior.previous.get('final_step') or 0):   # the next start refills best.next (restore)
      shutil.rmtree(setup.best.directory, ignore_errors=True)
    setup.checkpoints.close()


def finish(setup: Setup, meta: RunMeta, segment: Segment, journal: Journal, state: TrainState,
           tested: Tested) -> RunResults:
  """Writes the test event and results.json with the rest of the record (a stretch's: run.json,
  config.json, metrics.jsonl, best/), made current at once (``workdir_lib.new_record``)."""
  with workdir_lib.new_record(setup.workdir) if setup.is_lead else contextlib.nullcontext() as staged:
    results = write_results(setup, meta, segment, journal, state, tested, staged)
    journal.close()
    setup.checkpoints.close()
    setup.best.close()
    if staged and setup.prior.provisional:
      shutil.copytree(setup.best.directory, os.path.join(staged, 'best'), copy_function=os.link)
  out = RunResults(results)
  out.status = ('reevaluated' if segment.start_step == setup.num_steps and setup.prior.provisional
                else 'trained')
  return out


def write_results(setup: Setup, meta: RunMeta, segment: Segment, journal: Journal,
                  state: TrainState, tested: Tested, staged: Optional[str]) -> dict:
  config, run, test_result = setup.config, setup.run, tested.result
  journal.commit(staged)
  journal.write('test', tested.checkpoint['step'], test_result)
  cap = run.max_eval_batches
  selected = tested.meta if tested.meta else {'best_val_accuracy': meta.best_val_accuracy,
                                              'best_step': meta.best_step}
  results = {
      'task': run.data.task,
      'attention': run.model.attention.spec.name,  # aliases resolved
      'plugins': plugins.provenance(config.model.attention),  # [{file, sha256}] of user kernel code
      'test_accuracy': test_result['accuracy'],
      'test_loss': test_result['loss'],
      'test_examples': test_result['examples'],
      'tested_checkpoint': tested.checkpoint,   # {'which': 'best' | 'final', 'step', 'rule'}
      'best_val_accuracy': selected['best_val_accuracy'],
      'best_step': selected['best_step'],
      'selected_on': (f"validation accuracy every {run.eval_every} steps over "
                      f"{meta.val_examples} examples" +
                      (f' (periodic validation capped at max_eval_batches={cap})' if cap
                       else ' (the whole validation split)')),
      'final_step': int(state.step),
      'stopped_early': meta.stopped_early,   # {step, val_accuracy, threshold} or None
      'num_params': count_params(state.params),
      'steps_per_sec': (meta.timed_steps / meta.train_seconds if meta.timed_steps else 0.0),
      'steps_trained': meta.steps_trained,
      'train_seconds': meta.train_seconds,
      'wall_time_s': segment.wall_seconds(meta),
      'started': meta.started,
      'finished': workdir_lib.now_iso(),
      'compiled_memory_bytes': meta.compiled_memory_bytes,
      'num_devices': int(setup.mesh.devices.size),
      'num_processes': jax.process_count(),
      'backend': jax.default_backend(),
      'code_version': workdir_lib.code_version(),
      'code_versions': meta.code_versions,   # one entry per code that trained (code_segments)
      'data_order': meta.data_order,   # one entry per data order (input_pipeline.DATA_ORDER)
      'config_fingerprint': setup.prior.record.fingerprint,
      'config_changes': setup.prior.record.changes,
      'config': config.to_dict(),
  }
  if getattr(setup.info, 'metric', None) == 'bits_per_byte':
    # Byte-level LM (enwik8): mean next-byte cross-entropy in bits (nats / ln 2).
    results['test_bits_per_byte'] = test_result['loss'] / float(np.log(2.0))
    results.update(lm_eval.describe(run))   # the test's context scheme (eval_context, stride)
  journal.writer.write_results(results)
  return results


# The rule for a good checkpoint (``Loop.check_finite``): finite parameters and a validation loss that
# is finite and at most DIVERGED_FACTOR x max(1, the lowest validation loss of the run so far). A run
# whose loss has blown up by orders of magnitude (1e14 where it was 2) is diverged even while finite;
# the floor of 1 nat keeps a well-fitted run (lowest 0.01) from being stopped by ordinary overfitting.
DIVERGED_FACTOR = 1000.0


def good_loss(loss: float, lowest: Optional[float]) -> bool:
  return bool(np.isfinite(loss)) and (lowest is None or
                                      loss <= DIVERGED_FACTOR * max(1.0, float(lowest)))


@jax.jit
def _all_finite(tree) -> jax.Array:
  return jnp.all(jnp.asarray([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def _sync(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


def _maybe_profile(run: run_config.Run, workdir: str, step: int, start_step: int):
  """A jax.profiler trace of ``run.profile_steps`` steps, starting after the first (compiled) one."""
  n = run.profile_steps
  if n <= 0 or jax.process_index() != 0:
    return contextlib.nullcontext()
  first = start_step + 1
  if step == first and not _TRACING:
    jax.profiler.start_trace(os.path.join(workdir, 'profile'))
    _TRACING.append(True)
  if step == first + n - 1:
    return _StopTrace()
  return contextlib.nullcontext()


_TRACING = []  # non-empty while this process has a profiler trace open


def _stop_profile() -> None:
  if _TRACING:
    _TRACING.clear()
    jax.effects_barrier()
    jax.profiler.stop_trace()


class _StopTrace(contextlib.AbstractContextManager):

  def __exit__(self, *exc):
    _stop_profile()
    return False
