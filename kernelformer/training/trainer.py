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

import contextlib
import json
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
from kernelformer.encoder import Classifier
from kernelformer.training import checkpoint as ckpt_lib
from kernelformer.training import input_pipeline
from kernelformer.training import lm_eval
from kernelformer.training import metrics as metrics_lib
from kernelformer.training import optim as optim_lib
from kernelformer.training import sharding
from kernelformer.training import signals as signals_lib
from kernelformer.training import workdir as workdir_lib
from kernelformer.training import validate

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


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
                 scan_layers=bool(m.get('scan_layers', False)))
  return Classifier(num_classes=info.num_classes, encoder=encoder, mlp_dim=m.mlp_dim, dual=info.dual)


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

  def loss_fn(params, model_state, batch, step, dropout_key):
    variables = {'params': params, **model_state}
    rngs = {'dropout': dropout_key, 'features': keys['features']}
    inputs = {k: v for k, v in batch.items() if k.startswith('inputs')}
    mutable = list(model_state.keys())
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
      return jnp.sum(losses) / n, (jnp.sum(correct) / n, new_state)
    losses, correct, _ = cross_entropy(logits, batch['targets'])
    return jnp.mean(losses), (jnp.mean(correct), new_state)

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
        return (jax.tree.map(jnp.add, g_sum, g), l_sum + l, a_sum + a, ms), None

      zeros = jax.tree.map(jnp.zeros_like, state.params)
      (grads, loss, acc, new_model_state), _ = jax.lax.scan(
          body, (zeros, 0.0, 0.0, state.model_state), (micro, jnp.arange(accum)))
      grads = jax.tree.map(lambda g: g / accum, grads)
      loss, acc = loss / accum, acc / accum
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                           model_state=new_model_state if new_model_state else state.model_state)
    metrics = {'loss': loss, 'accuracy': acc, 'learning_rate': schedule(state.step),
               'grad_norm': optax.global_norm(grads)}
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
  """
  batch_size = config.eval_batch_size or config.batch_size
  if max_batches is None:
    max_batches = config.max_eval_batches
  totals = {'loss': 0.0, 'correct': 0.0, 'count': 0.0}
  for i, batch in enumerate(input_pipeline.eval_batches(source, batch_size, max_batches)):
    if on_batch is not None:
      on_batch(i)
    out = eval_step(state, sharding.shard_batch(batch, mesh))
    for k in totals:
      totals[k] += float(out[k])
  n = max(totals['count'], 1.0)
  return {'loss': totals['loss'] / n, 'accuracy': totals['correct'] / n, 'examples': int(totals['count'])}


def count_params(params) -> int:
  return int(sum(np.prod(p.shape) for p in jax.tree.leaves(params)))


# on_nonfinite='skip': after this many consecutive non-finite gradients the run stops anyway (a run
# that only skips is not training). optax.apply_if_finite would apply the update after
# max_consecutive_errors; it is set one higher, so a non-finite update is never applied.
MAX_CONSECUTIVE_SKIPS = 10
ON_NONFINITE = ('stop', 'skip')


class RunResults(dict):
  """The results dict, with ``status``: 'trained', 'reevaluated' or 'finished' (nothing was done)."""
  status = 'trained'


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       hooks: Iterable[Callable[[int, TrainState], None]] = (),
                       devices: Optional[list] = None) -> dict:
  """Trains ``config`` in ``workdir`` (resuming if it holds a checkpoint); returns the results dict.

  ``hooks`` are called after every step with (step, state): tests use one to interrupt a run.
  ``devices`` restricts the mesh (default: all devices).

  Run safety (``workdir_lib.RunError`` carries the exit code the CLI uses; each is one line):
  * the workdir is locked (``workdir/lock``) while the run is in progress;
  * a workdir started with another config is refused before compiling (``workdir/run.json``), unless
    ``config.allow_config_change``; a finished run returns its results unchanged unless
    ``config.reevaluate``;
  * SIGINT/SIGTERM: the step in flight finishes, its state is checkpointed, exit 130/143;
  * a non-finite loss or gradient norm stops the run at that step, saving nothing from it (exit 3), or
    with ``on_nonfinite='skip'`` the update is skipped (``optax.apply_if_finite``). Checking needs the
    step's loss and gradient norm on the host: one scalar-pair transfer per step, which on an
    accelerator costs the overlap of one step's dispatch with the next (free on CPU);
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
  t_segment = time.monotonic()
  segment_started = workdir_lib.now_iso()
  is_lead = jax.process_index() == 0
  num_steps = int(config.num_train_steps)
  on_nonfinite = config.get('on_nonfinite', 'stop')
  if on_nonfinite not in ON_NONFINITE:
    raise workdir_lib.RunError(f"on_nonfinite must be one of {', '.join(ON_NONFINITE)}, got "
                               f'{on_nonfinite!r}')
  step_limit = float(config.get('watchdog_step_s', 0) or 0)
  compile_limit = float(config.get('watchdog_compile_s', 0) or 0)

  # A workdir belongs to one config; a finished run is finished. Both decided before anything is
  # written or compiled.
  record = workdir_lib.RunRecord(workdir)
  record.load()
  allowed = record.check(config, None)
  previous = workdir_lib.read_results(workdir)
  reevaluate = bool(config.get('reevaluate', False))
  if previous is not None and not allowed and not reevaluate and \
      previous.get('final_step') == num_steps and \
      previous.get('config_fingerprint') in (None, record.fingerprint):
    done = RunResults(previous)
    done.status = 'finished'
    return done

  task = lra_tasks.get(config.data.task)
  if is_lead:
    task.prepare(config.data)
  _sync('prepare_data')
  missing = task.check(config.data)
  if missing:
    raise lra_tasks.DataError(f'{task.name}: data missing: ' + '; '.join(missing))
  info = task.info(config.data)

  mesh = sharding.make_mesh(devices)
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
  tx, schedule = optim_lib.make_optimizer(config.optim, config.num_train_steps)
  if on_nonfinite == 'skip':
    tx = optax.apply_if_finite(tx, max_consecutive_errors=MAX_CONSECUTIVE_SKIPS + 1)
  train_step, eval_step = make_steps(model, tx, schedule, config, keys)
  repl, data_sh = sharding.replicated(mesh), sharding.batch_sharded(mesh)
  train_step = jax.jit(train_step, in_shardings=(repl, data_sh), out_shardings=(repl, repl),
                       donate_argnums=0)
  eval_step = jax.jit(eval_step, in_shardings=(repl, data_sh), out_shardings=repl)

  state = init_state(model, tx, info, config, keys, mesh)
  checkpoints = ckpt_lib.Checkpoints(os.path.join(workdir, 'checkpoints'), config.keep_checkpoints)
  best = ckpt_lib.Checkpoints(os.path.join(workdir, 'best'), 1)
  meta = {'best_val_accuracy': -1.0, 'best_step': -1}
  restored = checkpoints.restore_latest(ckpt_lib.abstract_like(state))
  if restored is not None:
    state, meta = restored
    logging.warning('resumed from %s at step %d', checkpoints.directory, int(state.step))
  start_step = int(state.step)
  if start_step > num_steps:
    raise workdir_lib.RunError(
        f'workdir {workdir} holds a checkpoint at step {start_step}, past num_train_steps='
        f'{num_steps}; use a new --workdir (a run cannot be shortened)')
  base = {'steps_trained': int(meta.get('steps_trained', start_step)),
          'timed_steps': int(meta.get('timed_steps', 0)),
          'train_seconds': float(meta.get('train_seconds', 0.0)),
          'wall_seconds': float(meta.get('wall_seconds', 0.0))}
  meta = {**meta, **base, 'started': meta.get('started') or segment_started}

  # From here the workdir is written: the config record, then metrics without the events after the
  # restored step (the resumed run logs them again).
  if is_lead:
    record.write(config, allowed, start_step)
    workdir_lib.truncate_metrics(workdir, start_step)
  writer = metrics_lib.MetricsWriter(workdir, enabled=is_lead)
  if start_step == 0 or allowed:
    writer.write_config(config)
  train_source = task.source(config.data, 'train')
  val_source = task.source(config.data, 'val')
  batches = input_pipeline.TrainBatches(train_source, config.batch_size, config.seed)

  progress = metrics_lib.Progress(num_steps, start_step, enabled=is_lead and config.progress)
  window: list[dict] = []
  timer = metrics_lib.StepTimer()
  compiled_train_step = None
  compiled_memory = meta.get('compiled_memory_bytes')
  eval_compiled = [False]
  last_saved = start_step if restored is not None else None
  stop = signals_lib.StopSignals()
  completed = False

  def eval_progress(what):
    def on_batch(i):
      first = not eval_compiled[0]
      eval_compiled[0] = True
      watchdog.arm(f'{what}, batch {i + 1}' + (' (compiling)' if first else ''),
                   compile_limit if first else step_limit)
    return on_batch

  def timed_meta(now_meta):
    return {**now_meta, 'wall_seconds': base['wall_seconds'] + time.monotonic() - t_segment,
            'compiled_memory_bytes': compiled_memory}

  def save(manager, step, at_meta):
    watchdog.disarm()  # a slow disk is not a hang, and a write is never cut short
    with stop.deferred():
      manager.save(step, state, timed_meta(at_meta))

  try:
    with stop:
      segment_steps = 0
      for step, batch in zip(range(start_step, num_steps), batches.iterate(start_step, num_steps)):
        watchdog.arm(f'training step {step + 1}', step_limit)
        batch = sharding.shard_batch(batch, mesh)
        if compiled_train_step is None:
          # Compile ahead of time once: the same executable runs every step and reports its memory.
          watchdog.arm(f'compiling the train step (before step {step + 1})', compile_limit)
          compiled_train_step = train_step.lower(state, batch).compile()
          compiled_memory = metrics_lib.memory_of(compiled_train_step)
          if stop.requested:
            raise stop.stop_error(last_saved, workdir)
          watchdog.arm(f'training step {step + 1}', step_limit)
        t0 = time.perf_counter()
        with _maybe_profile(config, workdir, step, start_step):
          state, m = compiled_train_step(state, batch)
        loss, grad_norm = (float(x) for x in jax.device_get((m['loss'], m['grad_norm'])))
        seconds = time.perf_counter() - t0
        done = step + 1
        if not (np.isfinite(loss) and np.isfinite(grad_norm)):
          _nonfinite(on_nonfinite, done, loss, grad_norm, state, last_saved)
        meta['steps_trained'] += 1
        if segment_steps:  # the segment's first step warms up (allocation, autotuning): not timed
          meta['timed_steps'] += 1
          meta['train_seconds'] += seconds
        segment_steps += 1
        window.append(m)
        timer.tick(done)
        if done % config.log_every == 0 or done == num_steps:
          summary = {k: float(np.mean([float(x[k]) for x in window])) for k in window[0]}
          summary['steps_per_sec'] = timer.rate()
          writer.write('train', done, summary)
          progress.update(done, summary, seconds=seconds)
          window = []
        else:
          progress.update(done, seconds=seconds)
        if done % config.eval_every == 0 or done == num_steps:
          val = evaluate(eval_step, state, val_source, config, mesh,
                         on_batch=eval_progress(f'validating at step {done}'))
          writer.write('val', done, val)
          meta['val_examples'] = val['examples']
          if val['accuracy'] > meta['best_val_accuracy']:
            meta = {**meta, 'best_val_accuracy': val['accuracy'], 'best_step': done}
            save(best, done, meta)
        if done % config.checkpoint_every == 0 or done == num_steps:
          save(checkpoints, done, meta)
          last_saved = done
        watchdog.arm(f'after step {done} (logging, hooks)', step_limit)
        for hook in hooks:
          hook(done, state)
        if stop.requested:
          # The state returned by this step is live (only the previous one was donated): save it.
          if last_saved != done:
            save(checkpoints, done, meta)
            last_saved = done
          raise stop.stop_error(done, workdir)

      if stop.requested:
        raise stop.stop_error(last_saved, workdir)
      # Test accuracy of the best checkpoint (by validation accuracy), on the whole test split.
      best_state = state
      if best.latest_step() is not None:
        restored_best = best.restore_latest(ckpt_lib.abstract_like(state))
        if restored_best is not None:
          best_state = restored_best[0]
      test_source = task.source(config.data, 'test')
      if lm_eval.is_stateful(config):   # enwik8: windows in order, the decoder's state carried
        test = lm_eval.evaluate_stateful(
            model, {'params': best_state.params, **best_state.model_state}, test_source,
            features_key=keys['features'], on_batch=eval_progress('testing the best checkpoint'))
      else:
        test = evaluate(eval_step, best_state, test_source, config, mesh,
                        max_batches=0, on_batch=eval_progress('testing the best checkpoint'))
      watchdog.disarm()
      if stop.requested:
        raise stop.stop_error(last_saved, workdir)
    completed = True
  finally:
    watchdog.disarm()
    progress.close()
    _stop_profile()
    if not completed:
      writer.close()
      checkpoints.close()
      best.close()

  writer.write('test', int(meta['best_step']), test)
  timed = meta['timed_steps']
  cap = int(config.max_eval_batches or 0)
  val_examples = meta.get('val_examples')
  results = {
      'task': config.data.task,
      'attention': registry.canonical_name(config.model.attention.kind),  # aliases resolved
      'plugins': plugins.provenance(config.model.attention),  # [{file, sha256}] of user kernel code
      'test_accuracy': test['accuracy'],
      'test_loss': test['loss'],
      'test_examples': test['examples'],
      'best_val_accuracy': meta['best_val_accuracy'],
      'best_step': meta['best_step'],
      'selected_on': (f"validation accuracy every {config.eval_every} steps over {val_examples} "
                      f"examples" + (f' (periodic validation capped at max_eval_batches={cap})'
                                     if cap else ' (the whole validation split)')),
      'final_step': int(state.step),
      'num_params': count_params(state.params),
      'steps_per_sec': meta['timed_steps'] / meta['train_seconds'] if timed else 0.0,
      'steps_trained': meta['steps_trained'],
      'train_seconds': meta['train_seconds'],
      'wall_time_s': base['wall_seconds'] + time.monotonic() - t_segment,
      'started': meta['started'],
      'finished': workdir_lib.now_iso(),
      'compiled_memory_bytes': compiled_memory,
      'num_devices': int(mesh.devices.size),
      'num_processes': jax.process_count(),
      'backend': jax.default_backend(),
      'code_version': workdir_lib.code_version(),
      'config_fingerprint': record.fingerprint,
      'config_changes': record.changes,
      'config': config.to_dict(),
  }
  if getattr(info, 'metric', None) == 'bits_per_byte':
    # Byte-level LM (enwik8): mean next-byte cross-entropy in bits (nats / ln 2).
    results['test_bits_per_byte'] = test['loss'] / float(np.log(2.0))
    results.update(lm_eval.describe(config))   # the context scheme of the test (eval_context, stride)
  writer.write_results(results)
  writer.close()
  checkpoints.close()
  best.close()
  out = RunResults(results)
  out.status = 'reevaluated' if start_step == num_steps and previous is not None else 'trained'
  return out


def _nonfinite(policy, step, loss, grad_norm, state, last_saved) -> None:
  """Stops the run (policy 'stop', or 'skip' after too many skips in a row) at a non-finite step."""
  where = (f'the last good checkpoint (step {last_saved}) and best/ are kept'
           if last_saved is not None else 'no checkpoint had been written')
  if policy == 'skip':
    skipped = int(jax.device_get(state.opt_state.notfinite_count))
    if skipped < MAX_CONSECUTIVE_SKIPS:
      workdir_lib.say(f'step {step}: non-finite gradients (loss {loss}, grad norm {grad_norm}); update '
                      f'skipped ({skipped} in a row)')
      return
    raise workdir_lib.RunError(
        f'step {step}: {skipped} non-finite gradients in a row; the run diverged and was stopped, '
        f'nothing from it saved; {where}; lower optim.learning_rate or set optim.grad_clip_norm',
        workdir_lib.EXIT_DIVERGED)
  raise workdir_lib.RunError(
      f'step {step}: non-finite loss {loss} / gradient norm {grad_norm}; the run diverged and was '
      f'stopped, nothing from this step saved; {where}; lower optim.learning_rate, set '
      f"optim.grad_clip_norm, or on_nonfinite='skip'", workdir_lib.EXIT_DIVERGED)


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
