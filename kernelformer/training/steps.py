"""The pure parts of a run: the model, the jitted-to-be train and eval steps, the loop step with its
on-device window of sums, the fresh state, and evaluation over a split."""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

import lra_tasks
from kernelformer import encoder
from kernelformer import run_config
from kernelformer.attention import distill as distill_lib
from kernelformer.training import input_pipeline
from kernelformer.training import optim as optim_lib
from kernelformer.training import sharding
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
  if getattr(info, 'language_model', False):   # per-position targets (``lra_tasks.mqar.LMTaskInfo``)
    from kernelformer import decoder  # pylint: disable=g-import-not-at-top
    return decoder.build_decoder(run.model, info)
  return encoder.build_classifier(run.model, info)


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
  loss_fn = functools.partial(step_loss, model, keys['features'], lm, aux)
  accum = run.optim.grad_accum_steps

  def train_step(state: TrainState, batch):
    dropout_key = jax.random.fold_in(keys['dropout'], state.step)
    grad_fn = value_and_grad(loss_fn, state.opt_state)
    if accum == 1:
      (loss, (acc, model_state)), grads = grad_fn(state.params, state.model_state, batch,
                                                  state.step, dropout_key)
    else:
      grads, loss, acc, model_state = accumulated_grads(grad_fn, state, batch, dropout_key, accum,
                                                        bool(aux))
    return apply_update(tx, schedule, state, grads, loss, acc, model_state, bool(aux))

  return train_step, functools.partial(eval_sums, model, keys['features'], lm)


def value_and_grad(loss_fn, opt_state):
  """``jax.value_and_grad(loss_fn, has_aux=True)``; under a loss scale (``opt_state`` of
  ``optim.loss_scaled``: a float16 model) the gradients of ``scale * loss``, divided by the scale
  (torch GradScaler ``scale``, ``unscale_``), and the loss unscaled."""
  if not isinstance(opt_state, optim_lib.LossScaleState):
    return jax.value_and_grad(loss_fn, has_aux=True)
  scale = opt_state.scale
  grad_fn = jax.value_and_grad(lambda *a: (lambda l, e: (l * scale, e))(*loss_fn(*a)), has_aux=True)

  def unscaled(*args):
    (loss, extra), grads = grad_fn(*args)
    return (loss / scale, extra), jax.tree.map(lambda g: g / scale, grads)
  return unscaled


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
  cap ``run.max_eval_batches``; 0 = the whole split). ``on_batch(i)`` is called before batch ``i``
  (watchdog progress); the per-batch sums are read once, at the end, and summed in float64."""
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


def make_loop_step(train_step, policy: str, log_every: int = 1):
  """``loop_step(state, window, batch) -> (state, window)``: ``train_step`` plus on-device bookkeeping.

  ``window``: sums since the last log over applied steps, counts, and the first step that stops the
  run (``bad_step``, -1 while none); the step after a log step starts a new one (``next_window``), so
  a log boundary costs the host one read and no dispatch. Non-finite steps: docs/architecture.md.
  """

  def loop_step(state: TrainState, packed: jax.Array, batch):
    fresh = state.step % log_every == 0
    window = unpack_window(jnp.where(fresh, next_window(packed), packed))
    new_state, m = train_step(state, batch)
    finite = jnp.isfinite(m['loss']) & jnp.isfinite(m['grad_norm'])
    halted = window['bad_step'] >= 0
    apply = finite & ~halted
    # A loss-scaled optimizer (optim.loss_scaled) skips a non-finite update itself and halves its scale.
    take = (finite | isinstance(state.opt_state, optim_lib.LossScaleState)) & ~halted
    done = (state.step + 1).astype(jnp.int32)
    consecutive = jnp.where(finite, 0, window['consecutive'] + 1).astype(jnp.int32)
    stops = ~finite if policy == 'stop' else consecutive >= MAX_CONSECUTIVE_SKIPS
    first_bad = ~halted & stops
    advance = ~halted & ~first_bad
    kept = jax.tree.map(lambda new, old: jnp.where(take, new, old), new_state, state)
    kept = kept.replace(step=jnp.where(advance, state.step + 1, state.step),
                        opt_state=optim_lib.skip(take, new_state.opt_state, state.opt_state, advance))
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


# The window travels as one int32 array (the float fields as their bits): a boundary reads it in one
# transfer (docs/benchmarks.md, "The training loop against a bare loop").
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
  return pack_window({**dict.fromkeys(WINDOW_INTS + WINDOW_FLOATS, 0), 'first_skipped': -1,
                      'bad_step': -1})


def next_window(window: jax.Array) -> jax.Array:
  """A new logging window that keeps the run-long fields (skips in a row, the stopping step)."""
  fresh, old = unpack_window(empty_window()), unpack_window(window)
  for k in ('consecutive', 'bad_step', 'bad_loss', 'bad_grad_norm'):
    fresh[k] = old[k]
  return pack_window(fresh)


def build_steps(run: run_config.Run, info, devices, fresh: bool = True) -> tuple[dict, TrainState]:
  """Mesh, model, optimizer, the jitted loop and eval steps (``Setup`` fields) and a fresh state
  (``fresh``; else None: a population member's state is the population's)."""
  mesh = sharding.make_mesh(devices)
  validate.check_batches(run, mesh)
  model = build_model(run, info)
  keys = run_keys(run.seed)
  tx, schedule = optim_lib.make_optimizer(run.optim, run.num_train_steps, run.model.dtype == 'float16')
  train_step, eval_step = make_steps(model, tx, schedule, run, keys)
  repl, data_sh = sharding.replicated(mesh), sharding.batch_sharded(mesh)
  loop_step = jax.jit(make_loop_step(train_step, run.policy, run.log_every),
                      in_shardings=(repl, repl, data_sh), out_shardings=(repl, repl), donate_argnums=0)
  eval_step = jax.jit(eval_step, in_shardings=(repl, data_sh), out_shardings=repl)
  state = init_state(model, tx, info, run, keys, mesh) if fresh else None
  return dict(mesh=mesh, model=model, features_key=keys['features'], loop_step=loop_step,
              eval_step=eval_step), state
