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
import logging
import os
import time
from typing import Any, Callable, Iterable, Optional

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

import lra_tasks
from kernelformer import plugins
from kernelformer import registry
from kernelformer.attention import distill as distill_lib
from kernelformer.encoder import Classifier
from kernelformer.layers import DTYPES
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


def build_model(config: ml_collections.ConfigDict, info: lra_tasks.TaskInfo) -> Classifier:
  m = config.model
  if is_language_model(info):
    # Causal LM tasks (enwik8, MQAR, selective copy): the decoder-only model, per-token targets.
    if m.get('remat', 'none') != 'none' or m.get('scan_layers', False):
      raise ValueError('model.remat and model.scan_layers apply to the encoder of classification '
                       "tasks; the decoder of LM tasks does not take them (leave 'none' / False)")
    from kernelformer import decoder  # pylint: disable=g-import-not-at-top
    return decoder.build_decoder(m, info)
  if m.dtype not in DTYPES:
    raise ValueError(f"model.dtype must be one of {', '.join(DTYPES)}, got {m.dtype!r}")
  attention = m.attention.to_dict()
  plugins.load(attention.get('plugin'))  # the user's kernels (docs/extending.md), before the name is looked up
  registry.get(attention['kind'])  # an unknown kind fails here, with the list of valid kinds
  if attention.get('max_length') is None and 'max_length' in attention:
    attention['max_length'] = info.max_length + (1 if m.pooling == 'cls' else 0)
  encoder = dict(vocab_size=info.vocab_size, emb_dim=m.emb_dim, num_layers=m.num_layers,
                 num_heads=m.num_heads, qkv_dim=m.qkv_dim, mlp_dim=m.mlp_dim, attention=attention,
                 max_length=info.max_length, dropout_rate=m.dropout_rate,
                 pos_encoding=m.pos_encoding, pooling=m.pooling, rpe_per_layer=m.rpe_per_layer,
                 dtype=DTYPES[m.dtype], remat=m.get('remat', 'none'),
                 scan_layers=bool(m.get('scan_layers', False)), qkv_bias=bool(m.get('qkv_bias', True)))
  return Classifier(num_classes=info.num_classes, encoder=encoder, mlp_dim=m.mlp_dim, dual=info.dual,
                    retrieval_head=m.get('retrieval_head', 'nli'))


def is_language_model(info) -> bool:
  """Whether the task gives per-position next-token targets (``lra_tasks.mqar.LMTaskInfo``)."""
  return bool(getattr(info, 'language_model', False))


def _is_decoder(model) -> bool:
  from kernelformer import decoder  # pylint: disable=g-import-not-at-top
  return isinstance(model, decoder.Decoder)


def input_names(info: lra_tasks.TaskInfo) -> tuple[str, ...]:
  return ('inputs1', 'inputs2') if info.dual else ('inputs',)


def _keys(seed: int):
  base = jax.random.key(seed)
  return {'init': jax.random.fold_in(base, 0), 'dropout': jax.random.fold_in(base, 1),
          'features': jax.random.fold_in(base, 2)}


def cross_entropy(logits, labels, weights=None):
  losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  if weights is None:
    weights = jnp.ones_like(losses)
  return losses * weights, correct * weights, weights


def make_steps(model: Classifier, tx: optax.GradientTransformation, schedule, config,
               keys: dict):
  """The jitted-to-be train and eval steps (pure functions of state and batch)."""
  accum = int(config.optim.grad_accum_steps)
  names = None  # filled lazily from the batch
  lm = _is_decoder(model)
  # Auxiliary losses sown by the model (Hedgehog's attention distillation, attention/distill.py): only
  # when asked for, so with weight 0 the step is the plain one.
  aux = ((distill_lib.DISTILL_COLLECTION,)
         if float(config.model.attention.get('distill_weight', 0.0) or 0.0) > 0 else ())

  def loss_fn(params, model_state, batch, step, dropout_key):
    variables = {'params': params, **model_state}
    rngs = {'dropout': dropout_key, 'features': keys['features']}
    inputs = {k: v for k, v in batch.items() if k.startswith('inputs')}
    mutable = list(model_state.keys()) + list(aux)
    if mutable:
      logits, new_state = model.apply(variables, inputs, train=True, step=step, rngs=rngs,
                                      mutable=mutable)
    else:
      logits, new_state = model.apply(variables, inputs, train=True, step=step, rngs=rngs), {}
    extra = {}
    if aux:
      new_state = dict(new_state)
      extra['aux_loss'] = sum((jnp.sum(x) for x in jax.tree.leaves(new_state.pop(aux[0], {}))),
                              jnp.zeros((), jnp.float32))
    if lm:
      # Next-token loss per position, weight 0 where targets == 0 (padding / not a query).
      losses, correct, w = cross_entropy(logits, batch['targets'],
                                         (batch['targets'] != 0).astype(jnp.float32))
      n = jnp.maximum(jnp.sum(w), 1.0)
      task, acc = jnp.sum(losses) / n, jnp.sum(correct) / n
    else:
      losses, correct, _ = cross_entropy(logits, batch['targets'])
      task, acc = jnp.mean(losses), jnp.mean(correct)
    if aux:
      return task + extra['aux_loss'], ({'acc': acc, **extra}, new_state)
    return task, (acc, new_state)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def train_step(state: TrainState, batch):
    dropout_key = jax.random.fold_in(keys['dropout'], state.step)
    if accum == 1:
      (loss, (acc, new_model_state)), grads = grad_fn(state.params, state.model_state, batch,
                                                      state.step, dropout_key)
    else:
      # Micro-batches of one global batch, gradients averaged: the update equals the large-batch one.
      # Strided rows (micro-batch i = rows i, i+k, ...) keep each device's rows on that device: with
      # the batch sharded on its leading axis, contiguous blocks would be resharded every step.
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
      (grads, loss, acc, new_model_state), _ = jax.lax.scan(
          body, (zeros, 0.0, acc0, state.model_state), (micro, jnp.arange(accum)))
      grads = jax.tree.map(lambda g: g / accum, grads)
      loss, acc = loss / accum, jax.tree.map(lambda a: a / accum, acc)
    extra = {}
    if aux:   # the sown auxiliary losses, logged beside the total loss they are part of
      acc, extra = acc['acc'], {'aux_loss': acc['aux_loss']}
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                           model_state=new_model_state if new_model_state else state.model_state)
    metrics = {'loss': loss, 'accuracy': acc, 'learning_rate': schedule(state.step),
               'grad_norm': optax.global_norm(grads), **extra}
    return new_state, metrics

  def eval_step(state: TrainState, batch):
    variables = {'params': state.params, **state.model_state}
    inputs = {k: v for k, v in batch.items() if k.startswith('inputs')}
    logits = model.apply(variables, inputs, train=False, step=None,
                         rngs={'features': keys['features']})
    weights = batch['weights']
    if lm:
      weights = weights[:, None] * (batch['targets'] != 0).astype(jnp.float32)
    losses, correct, weights = cross_entropy(logits, batch['targets'], weights)
    return {'loss': jnp.sum(losses), 'correct': jnp.sum(correct), 'count': jnp.sum(weights)}

  del names
  return train_step, eval_step


def init_state(model, tx, info, config, keys, mesh) -> TrainState:
  length = info.max_length
  dummy = {n: jnp.ones((1, length), jnp.int32) for n in input_names(info)}

  def init(key):
    variables = model.init({'params': key, 'dropout': key, 'features': keys['features']}, dummy,
                           train=False)
    variables = dict(variables)
    params = variables.pop('params')
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      model_state=variables)

  return jax.jit(init, out_shardings=sharding.replicated(mesh))(keys['init'])


def evaluate(eval_step, state, source, config, mesh, *, max_batches: Optional[int] = None,
             on_batch: Optional[Callable[[int], None]] = None) -> dict[str, float]:
  """Loss, accuracy and example count over ``source`` (``max_batches``: None = the periodic-validation
  cap ``config.max_eval_batches``; 0 = the whole split, which the final test always uses).

  ``on_batch(i)`` is called before batch ``i`` (the watchdog counts evaluation batches as progress).
  The per-batch sums stay on the device and are read once, at the end (summed in float64 on the host).
  """
  batch_size = config.eval_batch_size or config.batch_size
  if max_batches is None:
    max_batches = config.max_eval_batches
  outs = []
  for i, batch in enumerate(input_pipeline.eval_batches(source, batch_size, max_batches)):
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
ON_NONFINITE = ('stop', 'skip')
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

  Run safety (``workdir_lib.RunError`` carries the exit code the CLI uses; each is one line):
  * the workdir is locked (``workdir/lock``) while the run is in progress;
  * a workdir started with another config is refused before compiling (``workdir/run.json``), unless
    ``config.allow_config_change``; a finished run returns its results unchanged unless
    ``config.reevaluate``;
  * SIGINT/SIGTERM: the step in flight finishes, its state is checkpointed, exit 130/143;
  * a non-finite loss or gradient norm: the update of that step is not applied and the run stops at
    the next boundary naming that exact step, saving nothing from it (exit 3); with
    ``on_nonfinite='skip'`` such updates are skipped, and the run stops after
    ``MAX_CONSECUTIVE_SKIPS`` in a row;
  * the watchdog ends a run that makes no progress within ``watchdog_step_s`` (``watchdog_compile_s``
    while compiling) with one line naming the step (exit 4);
  * damaged checkpoints are set aside and the newest good one is resumed; metrics.jsonl drops the events
    after the restored step.
  """
  logging.getLogger('absl').setLevel(logging.WARNING)
  validate.validate_run(config, workdir, devices)  # user mistakes: one line, before anything is created
  workdir = os.path.abspath(workdir)
  is_lead = jax.process_index() == 0
  os.makedirs(workdir, exist_ok=True)
  lock = workdir_lib.WorkdirLock(workdir)
  if is_lead:
    lock.acquire()
  watchdog = signals_lib.Watchdog()
  watchdog.on_fire = lock.release
  try:
    return _train_and_evaluate(config, workdir, hooks, devices, watchdog)
  finally:
    watchdog.close()
    lock.release()


def _train_and_evaluate(config, workdir, hooks, devices, watchdog) -> dict:
  """restore -> train (steps and boundaries: log, evaluate, save) -> test -> finish."""
  run = _Run(config, workdir, hooks, devices, watchdog)
  finished = run.finished_results()
  if finished is not None:
    return finished
  run.build()
  run.restore()
  completed = False
  try:
    with run.stop:
      run.train()
      test = run.test()
    completed = True
  finally:
    run.close(completed)
  return run.finish(test)


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


class _Run:
  """One training run in a workdir; each method is one phase (see ``_train_and_evaluate``)."""

  def __init__(self, config, workdir, hooks, devices, watchdog):
    self.config, self.workdir, self.hooks, self.devices = config, workdir, list(hooks), devices
    self.watchdog = watchdog
    self.t_segment = time.monotonic()
    self.segment_started = workdir_lib.now_iso()
    self.is_lead = jax.process_index() == 0
    self.num_steps = int(config.num_train_steps)
    self.policy = config.get('on_nonfinite', 'stop')
    if self.policy not in ON_NONFINITE:
      raise workdir_lib.RunError(f"on_nonfinite must be one of {', '.join(ON_NONFINITE)}, got "
                                 f'{self.policy!r}')
    self.step_limit = float(config.get('watchdog_step_s', 0) or 0)
    self.compile_limit = float(config.get('watchdog_compile_s', 0) or 0)
    self.stop = signals_lib.StopSignals()
    self.compiled = None
    self.eval_compiled = False
    self.writer = self.progress = self.checkpoints = self.best = None

  # ---- before anything is written -----------------------------------------------------------------
  def finished_results(self) -> Optional[RunResults]:
    """A workdir belongs to one config; a finished run is finished. Decided before any write."""
    config = self.config
    self.record = workdir_lib.RunRecord(self.workdir)
    self.record.load()
    self.allowed = self.record.check(config, None)
    self.previous = workdir_lib.read_results(self.workdir)
    reevaluate = bool(config.get('reevaluate', False))
    if self.previous is not None and not self.allowed and not reevaluate and \
        (self.previous.get('final_step') == self.num_steps or self.previous.get('stopped_early')) and \
        self.previous.get('config_fingerprint') in (None, self.record.fingerprint):
      done = RunResults(self.previous)
      done.status = 'finished'
      return done
    return None

  def build(self) -> None:
    """Data (missing data stops here), mesh, model, the compiled-to-be steps and a fresh state."""
    config = self.config
    self.task = task = lra_tasks.get(config.data.task)
    if self.is_lead:
      try:
        task.prepare(config.data)
      except OSError as e:   # a read-only or unwritable data directory: one line, not a traceback
        line = workdir_lib.unwritable_data(e, str(config.data.data_dir))
        if line is None:
          raise
        raise lra_tasks.DataError(f'{task.name}: {line}') from None
    _sync('prepare_data')
    missing = task.check(config.data)
    if missing:
      raise lra_tasks.DataError(f'{task.name}: data missing: ' + '; '.join(missing))
    self.info = task.info(config.data)
    self.build_steps()

  def build_steps(self) -> None:
    """Mesh, model, optimizer, the jitted loop and eval steps, and a fresh state (from ``self.info``)."""
    config, info = self.config, self.info
    self.mesh = mesh = sharding.make_mesh(self.devices)
    sharding.check_batch_size(config.batch_size, mesh, 'batch_size')
    sharding.check_batch_size(config.eval_batch_size or config.batch_size, mesh,
                              'eval_batch_size' if config.eval_batch_size else 'batch_size')
    accum = int(config.optim.grad_accum_steps)
    if accum < 1 or (config.batch_size // jax.process_count()) % accum:
      raise sharding.ShardingError(
          f'optim.grad_accum_steps={accum} must divide the per-process batch '
          f'{config.batch_size // jax.process_count()}')
    model = build_model(config, info)
    keys = _keys(config.seed)
    self.model, self.features_key = model, keys['features']   # stateful LM testing (lm_eval)
    tx, schedule = optim_lib.make_optimizer(config.optim, config.num_train_steps)
    train_step, eval_step = make_steps(model, tx, schedule, config, keys)
    repl, data_sh = sharding.replicated(mesh), sharding.batch_sharded(mesh)
    self.loop_step = jax.jit(make_loop_step(train_step, self.policy, int(config.log_every)),
                             in_shardings=(repl, repl, data_sh), out_shardings=(repl, repl),
                             donate_argnums=0)
    self.eval_step = jax.jit(eval_step, in_shardings=(repl, data_sh), out_shardings=repl)
    self.state = init_state(model, tx, info, config, keys, mesh)
    self.window = jax.device_put(empty_window(), repl)

  def restore(self) -> None:
    """The newest checkpoint that restores (damaged newer ones set aside), or step 0 -- never step 0
    silently when checkpoints existed: that stops with one line unless ``config.start_over``."""
    config, workdir = self.config, self.workdir
    self.checkpoints = ckpt_lib.Checkpoints(os.path.join(workdir, 'checkpoints'),
                                            config.keep_checkpoints)
    # Two bests: the test falls back to the earlier one if the newest does not restore.
    self.best = ckpt_lib.Checkpoints(os.path.join(workdir, 'best'), KEEP_BEST)
    meta = {'best_val_accuracy': -1.0, 'best_step': -1}
    restored = self.checkpoints.restore_latest(ckpt_lib.abstract_like(self.state))
    if restored is not None:
      self.state, meta = restored
      meta = dict(meta)
      logging.warning('resumed from %s at step %d', self.checkpoints.directory, int(self.state.step))
    else:
      self.refuse_silent_restart()
    self.start_step = start = int(self.state.step)
    if start > self.num_steps:
      raise workdir_lib.RunError(
          f'workdir {workdir} holds a checkpoint at step {start}, past num_train_steps='
          f'{self.num_steps}; use a new --workdir (a run cannot be shortened)')
    self.last_saved = start if restored is not None else None
    self.base = {'steps_trained': int(meta.get('steps_trained', start)),
                 'timed_steps': int(meta.get('timed_steps', 0)),
                 'train_seconds': float(meta.get('train_seconds', 0.0)),
                 'wall_seconds': float(meta.get('wall_seconds', 0.0))}
    self.meta = {**meta, **self.base, 'started': meta.get('started') or self.segment_started,
                 'code_versions': code_segments(meta.get('code_versions'), start,
                                                workdir_lib.code_version(), restored is not None),
                 'data_order': input_pipeline.data_order_segments(meta.get('data_order'), start,
                                                                  restored is not None)}
    self.compiled_memory = meta.get('compiled_memory_bytes')
    # Events not yet in metrics.jsonl travel in the checkpoint meta (``uncommitted``), with the step
    # the record was last written at: a stretch resumed before its record was written loses none.
    held = self.meta.pop('uncommitted', None) or {}
    self.stretch_from = int(held.get('from_step', start)) if restored is not None else start
    self.committed = False
    self.pending_events = [tuple(e) for e in held.get('events', []) if int(e[1]) <= start]
    # A workdir holding results.json holds a finished run: a stretch that continues it (a config
    # change, more steps, a re-test) writes its record only when it completes, and never rotates away
    # the checkpoints and bests that the finished run had (docs/architecture.md, "The run's record").
    self.provisional = self.previous is not None
    if self.provisional:
      self.checkpoints.keep_through(self.stretch_from)
      self.best.keep_through(self.stretch_from)
    self.val_source = self.task.source(config.data, 'val')
    self.batches = input_pipeline.TrainBatches(self.task.source(config.data, 'train'),
                                               config.batch_size, config.seed)
    self.progress = metrics_lib.Progress(self.num_steps, start,
                                         enabled=self.is_lead and config.progress)
    self.timer = metrics_lib.StepTimer()

  def refuse_silent_restart(self) -> None:
    """No checkpoint restores: if some existed (set aside as damaged) or the run had finished, stop
    with one line; with ``start_over`` the earlier best/ is moved aside (never overwritten)."""
    damaged = self.checkpoints.damaged()
    # run.json (config.json in older workdirs) is written only once a checkpoint exists (``save``).
    started = self.record.data is not None
    if not damaged and self.previous is None and not started:
      return  # a new workdir, or a run that stopped before its first checkpoint
    what = (f"none of its checkpoints restores ({', '.join(damaged)} in "
            f'{self.checkpoints.directory})' if damaged else
            f'it holds results.json but no checkpoint in {self.checkpoints.directory}'
            if self.previous is not None else
            f"{'config.json' if self.record.data.get('from') == 'config.json' else 'run.json'} "
            f'records a run started here, but {self.checkpoints.directory} holds no checkpoint '
            f'(emptied or removed)')
    if not self.config.get('start_over', False):
      raise workdir_lib.RunError(
          f'workdir {self.workdir}: {what}; nothing was trained or overwritten; put the checkpoints '
          f'back, or pass --config.start_over=True to train from step 0 (best/ is then moved aside)')
    if self.is_lead and (self.best.all_steps() or self.best.damaged()):
      self.best.close()
      n = 1
      while os.path.exists(f'{self.best.directory}.before-start-over-{n}'):
        n += 1
      os.rename(self.best.directory, f'{self.best.directory}.before-start-over-{n}')
      workdir_lib.say(f'start_over: {what}; training from step 0; the earlier best/ is kept as '
                      f'best.before-start-over-{n}')
    _sync('start-over')
    self.best = ckpt_lib.Checkpoints(self.best.directory, KEEP_BEST)

  def commit(self) -> None:
    """Writes the run's record -- run.json, config.json, metrics.jsonl without the events after the
    step the record was last written at (the resumed run logs them again) -- once this run has
    something to keep: its first checkpoint, or (continuing a finished run) its results. A run that
    stops before (divergence, signal, error) leaves the record of the workdir as it was, so the
    command that made it still runs."""
    if self.committed:
      return
    self.committed = True
    if self.is_lead:
      self.record.write(self.config, self.allowed, self.stretch_from)
      workdir_lib.truncate_metrics(self.workdir, self.stretch_from)
    self.writer = metrics_lib.MetricsWriter(self.workdir, enabled=self.is_lead)
    if self.start_step == 0 or self.allowed:
      self.writer.write_config(self.config)
    for event in self.pending_events:
      self.writer.write(*event)
    self.pending_events = []

  def write_event(self, split: str, step: int, values: dict) -> None:
    """A metrics event: written once the run is committed, held until then."""
    if self.committed:
      self.writer.write(split, step, values)
    else:
      self.pending_events.append((split, step, values))

  # ---- the step loop --------------------------------------------------------------------------------
  def train(self, until: Optional[int] = None) -> None:
    """Dispatches steps start..``until`` (default num_steps); the host waits for the device only at
    validation and checkpoint boundaries (and after step ``until``). A log boundary queues the window
    of its step and reads it once that step is done, while later steps run."""
    start = self.start_step
    until = self.num_steps if until is None else until
    self.in_flight, self.pending_logs = collections.deque(), collections.deque()
    if 'stopped_early' in self.meta:   # restored from the checkpoint where the run stopped early
      return
    batches = self.batches.device_iterate(start, until, self.mesh)   # placed ahead, by a thread
    self.ahead = batches   # closed (its thread waited for) by close(), however the loop ends
    log_every, profile = int(self.config.log_every), int(self.config.get('profile_steps', 0)) > 0
    next_boundary = self.next_boundary(start)
    for step, batch in zip(range(start, until), batches):
      done = step + 1
      if self.compiled is None:
        self.compile(batch, done)
      # Armed before the dispatch too: a backend may run a step inline (e.g. CPU with a host callback).
      self.dispatching = done
      self.watchdog.arm(self.unfinished_steps, self.step_limit, self.first_unfinished)
      if profile:
        with _maybe_profile(self.config, self.workdir, step, start):
          self.state, self.window = self.compiled(self.state, self.window, batch)
      else:
        self.state, self.window = self.compiled(self.state, self.window, batch)
      self.meta['steps_trained'] += 1
      self.dispatched = done
      self.in_flight.append((done, self.window))
      if done == start + 1:
        self.wait(0)
      elif len(self.in_flight) > MAX_IN_FLIGHT:
        self.wait(RESUME_IN_FLIGHT)
      if done == start + 1:  # the segment's first step warms up (allocation, autotuning): not timed
        self.span = (done, time.perf_counter())
        self.timer.tick(done)
      if done == next_boundary:
        self.boundary(done)
        next_boundary = self.next_boundary(done)
        if 'stopped_early' in self.meta:
          break
      else:
        if done % log_every == 0:
          self.pending_logs.append((done, self.window))   # the next step starts a new window
        if done == until:   # (a log step too: it is read and written here, with every step done)
          self.read_window(done)
      self.progress.update(done)   # after a boundary's read, so the bar shows the trainer's rate
      if self.hooks:
        self.watchdog.arm(f'after step {done} (hooks)', self.step_limit)
        for hook in self.hooks:
          hook(done, self.state)
      if self.stop.requested:
        self.stop_now(done)
    if self.stop.requested:
      raise self.stop.stop_error(self.last_saved, self.workdir)

  def compile(self, batch, done: int) -> None:
    """Compiles the loop step ahead of time once: the same executable runs every step."""
    self.watchdog.arm(f'compiling the train step (before step {done})', self.compile_limit)
    self.compiled = self.loop_step.lower(self.state, self.window, batch).compile()
    self.compiled_memory = metrics_lib.memory_of(self.compiled)
    if self.stop.requested:
      raise self.stop.stop_error(self.last_saved, self.workdir)

  def wait(self, keep: int) -> None:
    """Waits (no transfer) until at most ``keep`` steps are in flight -- one wait, for the newest step
    that must finish (steps finish in order) -- with the watchdog naming the first unfinished step;
    logs whose step is done are read and written."""
    if len(self.in_flight) <= keep:
      return
    done, window = self.in_flight[-keep - 1]
    if not window.is_ready():
      self.watchdog.arm(self.unfinished_steps, self.step_limit, self.first_unfinished)
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

  def next_boundary(self, step: int) -> int:
    """The first step after ``step`` that ends with validation, a checkpoint or the end: the host
    waits for the device there (computed once per boundary, not per step)."""
    c = self.config
    candidates = [step + every - step % every
                  for every in (int(c.eval_every), int(c.checkpoint_every)) if every > 0]
    if self.num_steps > step:
      candidates.append(self.num_steps)
    return min(candidates, default=step + 1)

  # ---- boundaries: the only places the host reads the device ----------------------------------------
  def read(self, done: int, window) -> dict:
    """Reads a window (the one transfer of a boundary); stops a diverged run."""
    window = window_values(window)
    first, t0 = self.span
    self.meta['timed_steps'] += done - first
    self.meta['train_seconds'] += time.perf_counter() - t0
    self.span = (done, time.perf_counter())
    self.timer.tick(done)
    self.progress.timed(self.meta['timed_steps'], self.meta['train_seconds'])  # the rate results.json gives
    if window['bad_step'] >= 0:
      self.diverged(window)
    return window

  def read_window(self, done: int) -> dict:
    """Waits for every step in flight and reads the current window."""
    self.wait(0)
    self.flush_logs(done)
    return self.read(done, self.window)

  def boundary(self, done: int) -> None:
    """Logging, validation and checkpoints due after step ``done``."""
    c = self.config
    window = self.read_window(done)
    if done % c.log_every == 0 or done == self.num_steps:
      self.log(done, window)
    val = None
    if done % c.eval_every == 0 or done == self.num_steps:
      val = self.validate(done)
      update, keep = selection.on_validation(selection.rule_of(c), val['accuracy'], done,
                                             self.num_steps, self.meta)
      if update:
        self.check_finite(done, val)
        self.meta = {**self.meta, **update}
        if keep:
          self.save(self.best, done)
      if good_loss(val['loss'], self.meta.get('lowest_val_loss')):
        lowest = self.meta.get('lowest_val_loss')
        self.meta['lowest_val_loss'] = val['loss'] if lowest is None else min(lowest, val['loss'])
      self.stop_early(done, val)
    if done % c.checkpoint_every == 0 or done == self.num_steps or 'stopped_early' in self.meta:
      self.save_checkpoint(done, val)
    self.watchdog.arm(f'after step {done}', self.step_limit)
    self.span = (done, time.perf_counter())

  def stop_early(self, done: int, val: dict) -> None:
    """``config.early_stop_accuracy`` > 0: validation accuracy above it ends the training here
    (Zoology's rule, ``zoology/train.py`` 197-205); the checkpoint then written carries the reason, so
    a resumed or re-run workdir does not train further, and results.json records it."""
    threshold = float(self.config.get('early_stop_accuracy', 0.0) or 0.0)
    if threshold > 0 and val['accuracy'] > threshold:
      self.meta['stopped_early'] = {'step': done, 'val_accuracy': val['accuracy'],
                                    'threshold': threshold}
      workdir_lib.say(f"step {done}: validation accuracy {val['accuracy']:.4f} > {threshold}: "
                      f'training ends here (early_stop_accuracy)')

  def stop_now(self, done: int) -> None:
    """SIGINT/SIGTERM: the state of the last dispatched step is live (only earlier ones were donated);
    checked and saved, then the run stops."""
    if self.last_saved != done:
      self.read_window(done)
      self.save_checkpoint(done)
    raise self.stop.stop_error(done, self.workdir)

  def validate(self, done: int) -> dict:
    val = evaluate(self.eval_step, self.state, self.val_source, self.config, self.mesh,
                   on_batch=self.eval_progress(f'validating at step {done}'))
    self.write_event('val', done, val)
    self.meta['val_examples'] = val['examples']
    return val

  def save_checkpoint(self, done: int, val: Optional[dict] = None) -> None:
    if self.last_saved != done:
      self.check_finite(done, val)
      self.save(self.checkpoints, done)
      self.last_saved = done

  def check_finite(self, done: int, val: Optional[dict]) -> None:
    """A checkpoint is written only when it is good (``good_loss``): finite parameters, and a
    validation loss (``val`` of this step, else one validation batch) that is finite and not orders of
    magnitude above the lowest the run has seen; otherwise the run stops as diverged at ``done``."""
    if not bool(_all_finite(self.state.params)):
      reason = 'non-finite parameters'
    else:
      if val is None:
        val = evaluate(self.eval_step, self.state, self.val_source, self.config, self.mesh,
                       max_batches=1, on_batch=self.eval_progress(f'checking step {done}'))
      lowest = self.meta.get('lowest_val_loss')
      if good_loss(val['loss'], lowest):
        return
      reason = (f"non-finite validation loss {val['loss']}" if not np.isfinite(val['loss']) else
                f"validation loss {val['loss']:.4g}, over {DIVERGED_FACTOR:g} x "
                f'max(1, the lowest so far {lowest:.4g})')
    raise workdir_lib.RunError(
        f'step {done}: {reason}; the run diverged and was stopped, nothing from this step saved; '
        f'{self.kept()}; {self.advice()}', workdir_lib.EXIT_DIVERGED)

  def advice(self) -> str:
    """What to change after a divergence (skipping non-finite steps only where it is not already on)."""
    return ('lower optim.learning_rate or set optim.grad_clip_norm' if self.policy == 'skip' else
            "lower optim.learning_rate, set optim.grad_clip_norm, or on_nonfinite='skip'")

  def kept(self) -> str:
    """What a stopped run leaves: the newest checkpoint on disk (each one passed check_finite), and
    a finished run continued here is unchanged (its record is written only when the stretch ends)."""
    last = self.checkpoints.latest_step()
    out = (f'the last good checkpoint (step {last}) and best/ are kept' if last is not None
           else 'no checkpoint had been written')
    if self.provisional:
      out += (f"; the finished run (results.json, step {self.previous.get('final_step')}) and its "
              f'record are unchanged')
    return out

  def log(self, done: int, window: dict) -> None:
    n = window['applied']
    summary = {k: window[k] / n if n else float('nan')
               for k in ('loss', 'accuracy', 'learning_rate', 'grad_norm')}
    if float(self.config.model.attention.get('distill_weight', 0.0) or 0.0) > 0:
      summary['aux_loss'] = window['aux_loss'] / n if n else float('nan')   # part of 'loss'
    summary['steps_per_sec'] = self.timer.rate()
    if window['skipped']:
      summary['skipped_steps'] = window['skipped']
      workdir_lib.say(f"step {done}: {window['skipped']} non-finite updates skipped since the last "
                      f"log (the first at step {window['first_skipped']}; {window['consecutive']} "
                      f'in a row now)')
    self.write_event('train', done, summary)
    self.progress.update(self.dispatched, summary)  # a queued log is read a step or two later

  def diverged(self, window: dict) -> None:
    """Stops the run at the first non-finite step (policy 'stop', or 'skip' after too many)."""
    step, where = window['bad_step'], self.kept()
    if self.policy == 'skip':
      raise workdir_lib.RunError(
          f'step {step}: {window["consecutive"]} non-finite steps (loss or gradient norm) in a row; the '
          f'run diverged and was stopped, nothing from it saved; {where}; {self.advice()}',
          workdir_lib.EXIT_DIVERGED)
    loss, norm = window['bad_loss'], window['bad_grad_norm']
    bad = ' and '.join(n for n, v in (('loss', loss), ('gradient norm', norm)) if not np.isfinite(v))
    raise workdir_lib.RunError(
        f'step {step}: non-finite {bad or "loss or gradient norm"} (loss {loss:.4g}, gradient norm '
        f'{norm:.4g}); the run diverged and was stopped, nothing from this step saved; {where}; '
        f'{self.advice()}', workdir_lib.EXIT_DIVERGED)

  def eval_progress(self, what: str):
    def on_batch(i):
      first = not self.eval_compiled
      self.eval_compiled = True
      self.watchdog.arm(f'{what}, batch {i + 1}' + (' (compiling)' if first else ''),
                        self.compile_limit if first else self.step_limit)
    return on_batch

  def timed_meta(self) -> dict:
    return {**self.meta, 'wall_seconds': self.base['wall_seconds'] + time.monotonic() - self.t_segment,
            'compiled_memory_bytes': self.compiled_memory}

  def save(self, manager, step: int) -> None:
    """A checkpoint, then (the first time, unless continuing a finished run) the run's record."""
    self.watchdog.disarm()  # a slow disk is not a hang, and a write is never cut short
    meta = self.timed_meta()
    if not self.committed:
      meta['uncommitted'] = {'from_step': self.stretch_from, 'events': [
          [split, int(at), {k: v.item() if hasattr(v, 'item') else v for k, v in values.items()}]
          for split, at, values in self.pending_events]}
    with self.stop.deferred():
      manager.save(step, self.state, meta)
      if not self.provisional:
        self.commit()

  # ---- the end ------------------------------------------------------------------------------------------
  def test(self) -> dict:
    """Test loss and accuracy of the best checkpoint (by validation accuracy) on the whole test split.

    If the newest best/ does not restore (set aside with one line), the earlier kept one is tested
    and named; if none restores, the run stops with one line -- other weights are never tested under
    the best step's name. ``self.tested``: which checkpoint was tested ('best' or 'final', its step).
    """
    state, self.tested_meta = self.state, None
    rule = selection.rule_of(self.config)   # eval.test_checkpoint
    self.tested = {'which': 'final', 'step': int(self.state.step), 'rule': rule}
    if selection.tests_best(rule) and (self.best.all_steps() or self.best.damaged()):
      restored = self.best.restore_latest(ckpt_lib.abstract_like(self.state))
      if restored is None:
        raise workdir_lib.RunError(
            f"best/ in {self.workdir} holds no checkpoint that restores ({', '.join(self.best.damaged())}"
            f'); the test was not run and results.json is unchanged; put best/ back from a copy, or '
            f'train again in a new --workdir')
      state, self.tested_meta = restored
      self.tested = {'which': 'best', 'step': int(self.best.latest_step()), 'rule': rule}
      if self.tested['step'] != self.meta['best_step']:
        workdir_lib.say(f"testing best/{self.tested['step']} (validation accuracy "
                        f"{self.tested_meta.get('best_val_accuracy')}): the newest best/ that "
                        f"restores; best/{self.meta['best_step']} did not")
    test_source = self.task.source(self.config.data, 'test')
    on_batch = self.eval_progress(f"testing the {self.tested['which']} checkpoint")
    if lm_eval.is_stateful(self.config):   # enwik8: windows in order, the decoder's state carried
      test = lm_eval.evaluate_stateful(
          self.model, {'params': state.params, **state.model_state}, test_source,
          features_key=self.features_key, on_batch=on_batch)
    else:
      test = evaluate(self.eval_step, state, test_source, self.config, self.mesh, max_batches=0,
                      on_batch=on_batch)
    self.watchdog.disarm()
    if self.stop.requested:
      raise self.stop.stop_error(self.last_saved, self.workdir)
    return test

  def close(self, completed: bool) -> None:
    self.watchdog.disarm()
    if getattr(self, 'ahead', None) is not None:
      self.ahead.close()
    if self.progress is not None:
      self.progress.close()
    _stop_profile()
    if not completed:
      for part in (self.writer, self.checkpoints, self.best):
        if part is not None:
          part.close()

  def finish(self, test: dict) -> RunResults:
    """Writes the test event and results.json; closes the writer and the checkpoint managers."""
    with workdir_lib.all_or_nothing(self.workdir, enabled=self.provisional and self.is_lead):
      results = self.write_results(test)
    self.writer.close()
    self.checkpoints.close()
    self.best.close()
    out = RunResults(results)
    out.status = ('reevaluated' if self.start_step == self.num_steps and self.previous is not None
                  else 'trained')
    return out

  def write_results(self, test: dict) -> dict:
    config, meta = self.config, self.meta
    self.commit()
    tested = self.tested_meta or meta
    self.write_event('test', self.tested['step'], test)
    cap = int(config.max_eval_batches or 0)
    results = {
        'task': config.data.task,
        'attention': registry.canonical_name(config.model.attention.kind),  # aliases resolved
        'plugins': plugins.provenance(config.model.attention),  # [{file, sha256}] of user kernel code
        'test_accuracy': test['accuracy'],
        'test_loss': test['loss'],
        'test_examples': test['examples'],
        'tested_checkpoint': self.tested,   # {'which': 'best' | 'final', 'step', 'rule': eval.test_checkpoint}
        'best_val_accuracy': tested['best_val_accuracy'],
        'best_step': tested['best_step'],
        'selected_on': (f"validation accuracy every {config.eval_every} steps over "
                        f"{meta.get('val_examples')} examples" +
                        (f' (periodic validation capped at max_eval_batches={cap})' if cap
                         else ' (the whole validation split)')),
        'final_step': int(self.state.step),
        'stopped_early': meta.get('stopped_early'),   # {step, val_accuracy, threshold} or None
        'num_params': count_params(self.state.params),
        'steps_per_sec': (meta['timed_steps'] / meta['train_seconds'] if meta['timed_steps']
                          else 0.0),
        'steps_trained': meta['steps_trained'],
        'train_seconds': meta['train_seconds'],
        'wall_time_s': self.base['wall_seconds'] + time.monotonic() - self.t_segment,
        'started': meta['started'],
        'finished': workdir_lib.now_iso(),
        'compiled_memory_bytes': self.compiled_memory,
        'num_devices': int(self.mesh.devices.size),
        'num_processes': jax.process_count(),
        'backend': jax.default_backend(),
        'code_version': workdir_lib.code_version(),
        'code_versions': self.meta['code_versions'],   # one entry per code that trained (code_segments)
        'data_order': self.meta['data_order'],   # one entry per data order (input_pipeline.DATA_ORDER)
        'config_fingerprint': self.record.fingerprint,
        'config_changes': self.record.changes,
        'config': config.to_dict(),
    }
    if getattr(self.info, 'metric', None) == 'bits_per_byte':
      # Byte-level LM (enwik8): mean next-byte cross-entropy in bits (nats / ln 2).
      results['test_bits_per_byte'] = test['loss'] / float(np.log(2.0))
      results.update(lm_eval.describe(self.config))   # the test's context scheme (eval_context, stride)
    self.writer.write_results(results)
    return results


# The rule for a good checkpoint (``_Run.check_finite``): finite parameters and a validation loss that
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


def _maybe_profile(config, workdir: str, step: int, start_step: int):
  """A jax.profiler trace of ``config.profile_steps`` steps, starting after the first (compiled) one."""
  n = int(config.profile_steps)
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
