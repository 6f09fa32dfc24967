"""AdamW with the learning-rate schedules of the LRA papers (optax) and a choice of decayed parameters."""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from kernelformer import run_config

SCHEDULES = ('rsqrt', 'cosine', 'linear', 'constant', 'onecycle-linear', 'onecycle-cosine')

# torch.optim.lr_scheduler.OneCycleLR's defaults, which Skyformer's src/main.py 292-298 keeps
# (pkuzengqi/Skyformer @ cfe8c8c): the rate starts at max_lr / div_factor and ends at
# start / final_div_factor; with cycle_momentum=True Adam's beta1 runs max_momentum -> base_momentum
# during the warm-up phase and back to max_momentum by the last step.
ONECYCLE_DIV_FACTOR = 25.0
ONECYCLE_FINAL_DIV_FACTOR = 1e4
ONECYCLE_BASE_MOMENTUM = 0.85
ONECYCLE_MAX_MOMENTUM = 0.95


def _onecycle_boundaries(warmup: int, num_train_steps: int) -> tuple[int, int]:
  """OneCycleLR's phase ends (two phases): step ``pct_start * total - 1`` and ``total - 1``.

  Skyformer passes ``pct_start = warmup / num_train_steps`` (src/main.py 295), so the first phase
  ends at step ``warmup - 1``: the rate peaks there, one step before a linear warm-up of ``warmup``
  steps would.
  """
  if warmup < 2 or num_train_steps <= warmup:
    raise ValueError(f'optim.schedule onecycle-* needs 2 <= optim.warmup_steps < num_train_steps, '
                     f'got warmup_steps={warmup}, num_train_steps={num_train_steps}')
  return warmup - 1, num_train_steps - 1


def onecycle(start: float, peak: float, end: float, warmup: int, num_train_steps: int,
             anneal: str) -> optax.Schedule:
  """``start`` at step 0 -> ``peak`` at step ``warmup - 1`` -> ``end`` at ``num_train_steps - 1``
  (then constant), each phase annealed ``'linear'`` or ``'cosine'``: OneCycleLR's two phases on
  optax.piecewise_interpolate_schedule (``optax.cosine_onecycle_schedule`` puts its phase ends one
  step later, at ``pct_start * total`` and ``total``, and ``linear_onecycle_schedule`` has three phases).
  """
  first, last = _onecycle_boundaries(warmup, num_train_steps)
  return optax.piecewise_interpolate_schedule(anneal, start, {first: peak / start, last: end / peak})


def make_schedule(optim, num_train_steps: int) -> optax.Schedule:
  """The learning rate at each step.

  * ``rsqrt``: LRA's ``constant * linear_warmup * rsqrt_decay`` (the kernel-learning paper's "Sqrt
    Decay"): ``lr * min(1, step / warmup) / sqrt(max(step, warmup))``. NB the peak is
    ``lr / sqrt(warmup)``, so LRA's "learning rate 0.05" peaks at 1.6e-3 with 1000 warm-up steps.
  * ``cosine``: linear warm-up to ``lr``, cosine decay to 0 at the last step.
  * ``linear``: linear warm-up to ``lr``, linear decay to 0 at the last step (Skyformer/Spectraformer).
  * ``constant``: linear warm-up to ``lr``, then constant.
  * ``onecycle-linear`` / ``onecycle-cosine``: torch's ``OneCycleLR(max_lr=lr, pct_start=warmup /
    num_train_steps, anneal_strategy='linear' | 'cos', total_steps=num_train_steps)`` with its other
    defaults (``ONECYCLE_*``): ``lr / 25`` at step 0, ``lr`` at step ``warmup - 1``, ``lr / 25e4`` at
    the last step (``onecycle``). Skyformer's setting (src/main.py 292-298, src/config.py
    ``"lr_decay": "linear"``); ``make_optimizer`` cycles beta1 with it.
  """
  lr, warmup = float(optim.learning_rate), int(optim.warmup_steps)
  if optim.schedule == 'rsqrt':
    def schedule(step):
      step = jnp.asarray(step, jnp.float32)
      warm = jnp.minimum(1.0, step / max(warmup, 1))
      return lr * warm / jnp.sqrt(jnp.maximum(step, max(warmup, 1)))
    return schedule
  if optim.schedule == 'cosine':
    return optax.warmup_cosine_decay_schedule(0.0, lr, max(warmup, 1), max(num_train_steps, warmup + 1))
  if optim.schedule == 'linear':
    return optax.join_schedules([
        optax.linear_schedule(0.0, lr, max(warmup, 1)),
        optax.linear_schedule(lr, 0.0, max(num_train_steps - warmup, 1))], [max(warmup, 1)])
  if optim.schedule in ('onecycle-linear', 'onecycle-cosine'):
    return onecycle(lr / ONECYCLE_DIV_FACTOR, lr, lr / ONECYCLE_DIV_FACTOR / ONECYCLE_FINAL_DIV_FACTOR,
                    warmup, num_train_steps, optim.schedule.split('-')[1])
  if optim.schedule == 'constant':
    return optax.join_schedules([optax.linear_schedule(0.0, lr, max(warmup, 1)),
                                 optax.constant_schedule(lr)], [max(warmup, 1)])
  raise ValueError(f'unknown optim.schedule {optim.schedule!r}; valid: {", ".join(SCHEDULES)}')


# The choices of ``optim.decay_mask`` (configs/common.py), i.e. which parameters AdamW decays.
DECAY_MASKS = ('matrices', 'all')

# Parameter names that 'matrices' never decays: Dense/DenseGeneral and LayerNorm offsets ('bias', which
# for the per-head q/k/v projections and vmapped samplers is 2-D), LayerNorm gains ('scale') and the
# CLS token (one vector, stored as [1, 1, emb]).
_NO_DECAY = frozenset({'bias', 'scale', 'cls'})
# The module name under which a random-feature attention keeps a learned sampler's parameters
# (``attention/random_features.py``: ``build_learned(..., name='sampler')``): GMM ``means``/``factors``,
# learnable FastFood ``row_len``/``g``/``b``, the generator's dense layers and batch norms.
SAMPLER_SCOPE = 'sampler'
# The learned feature maps' parameters (``features/maps.py``: hedgehog/t2r ``map_w``, t2r ``map_b``,
# rebased ``map_gamma``/``map_beta``, taylor's ``map_w`` projection) define the kernel as a sampler's do.
MAP_PARAM_PREFIX = 'map_'


def _names(path) -> list[str]:
  return [str(getattr(k, 'key', getattr(k, 'name', k))) for k in path]


def decay_mask(params, mode: str = run_config.Optim.decay_mask):
  """AdamW's decay mask for ``params``: a tree of bools, True where the parameter is decayed.

  * ``'all'``: every parameter, as LRA's optimizer: flax ``optim.Adam(weight_decay=...)``
    (google-research/long-range-arena lra_benchmarks/listops/train.py lines 72-80 @ cd31e5c, the same in
    the other tasks' train.py) runs ``apply_param_gradient`` on every leaf of the model, and that does
    ``new_param -= learning_rate * weight_decay * param`` (google/flax flax/optim/adam.py @ 03590a4), and the kernel-learning paper's code
    (cs1160701/OnLearningTheKernel listops/train.py lines 173-179 @ a8e3d3b:
    ``optim.AdamW(model.parameters(), ..., weight_decay=1e-1)``, which includes biases, LayerNorm, the
    CLS token and the learned samplers' parameters).
  * ``'matrices'``: weight matrices and embeddings only (standard AdamW practice), chosen by the
    parameter's name, not its rank: never ``bias``, ``scale`` (LayerNorm) or the CLS token (per-head
    biases are 2-D and the CLS token 3-D), nothing under a learned sampler (``sampler/...``) and no
    learned feature-map parameter (``map_*``: Hedgehog's identity-initialised W, ReBased's gamma/beta). A
    sampler's parameters define the kernel's spectral distribution -- GMM means and factors (factors
    start at the identity), FastFood row lengths, Gaussian and sign diagonals, and the generator that
    outputs W -- so decaying them towards 0 shrinks the frequencies, i.e. widens the kernel's
    bandwidth, instead of regularising a map.
  """
  if mode not in DECAY_MASKS:
    raise ValueError(f'unknown optim.decay_mask {mode!r}; valid: {", ".join(DECAY_MASKS)}')

  def decays(path, p):
    if mode == 'all':
      return True
    names = _names(path)
    name = names[-1] if names else ''
    return (p.ndim > 1 and name not in _NO_DECAY and SAMPLER_SCOPE not in names[:-1]
            and not name.startswith(MAP_PARAM_PREFIX))
  return jax.tree_util.tree_map_with_path(decays, params)


def momentum_schedule(optim, num_train_steps: int) -> optax.Schedule | None:
  """Adam's beta1 at each step under a one-cycle schedule (torch OneCycleLR ``cycle_momentum=True``:
  ``ONECYCLE_MAX_MOMENTUM`` -> ``ONECYCLE_BASE_MOMENTUM`` at the rate's peak -> back at the last step,
  annealed as the rate); None (``optim.b1`` throughout) for the other schedules. OneCycleLR overwrites
  the optimizer's beta1 with ``max_momentum`` when it is built, so ``optim.b1`` is not read here
  (the Skyformer presets set it to 0.95, the value of the first step)."""
  if not str(optim.schedule).startswith('onecycle-'):
    return None
  return onecycle(ONECYCLE_MAX_MOMENTUM, ONECYCLE_BASE_MOMENTUM, ONECYCLE_MAX_MOMENTUM,
                  int(optim.warmup_steps), num_train_steps, optim.schedule.split('-')[1])


def make_optimizer(optim, num_train_steps: int, loss_scale: bool = False,
                   **member) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """AdamW at ``make_schedule``'s rate, after the optional clipping (``optim.grad_clip_value``:
  optax.clip, each gradient element to [-v, v], as torch ``clip_grad_value_``; then
  ``optim.grad_clip_norm``: optax.clip_by_global_norm). Under a one-cycle schedule beta1 follows
  ``momentum_schedule`` (optax.inject_hyperparams, so the optimizer state also holds the current
  rate and beta1). ``member`` (``population``): a member's ``schedule``, ``momentum`` (callables of
  the step), ``b1``, ``b2``, ``weight_decay`` (traced) in place of ``optim``'s; same state tree.
  ``loss_scale`` (a float16 model): wrapped in ``loss_scaled``."""
  schedule = member.get('schedule') or make_schedule(optim, num_train_steps)
  parts = []
  if optim.grad_clip_value > 0:
    parts.append(optax.clip(float(optim.grad_clip_value)))
  if optim.grad_clip_norm and optim.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(float(optim.grad_clip_norm)))
  adamw = dict(b2=member.get('b2', float(optim.b2)), eps=float(optim.eps),
               weight_decay=member.get('weight_decay', float(optim.weight_decay)),
               mask=functools.partial(decay_mask, mode=optim.decay_mask))
  b1 = member.get('momentum') or momentum_schedule(optim, num_train_steps)
  if b1 is None:
    parts.append(optax.adamw(schedule, b1=member.get('b1', float(optim.b1)), **adamw))
  else:
    parts.append(optax.inject_hyperparams(optax.adamw, static_args=('mask',))(
        learning_rate=schedule, b1=b1, **adamw))
  # Gradient accumulation is done inside the train step (a scan over micro-batches of one global
  # batch), so steps, schedules and checkpoints always count optimizer updates.
  return (loss_scaled if loss_scale else lambda tx: tx)(optax.chain(*parts)), schedule


# torch.amp.GradScaler, as Skyformer trains (pytorch/pytorch torch/amp/grad_scaler.py @ 0202916:
# ``__init__`` defaults init_scale 2**16, growth_factor 2, backoff_factor 0.5, growth_interval 2000;
# ``step`` skips optimizer.step when the unscaled gradients hold an inf/nan; ``update`` runs
# ``_amp_update_scale_``: a skipped step halves the scale and resets the tracker, growth_interval
# finite steps in a row double it). torch's LR scheduler steps whether or not the optimizer did: the
# schedule's count advances on a skipped step, AdamW's moments and count do not.
LOSS_SCALE_INIT, LOSS_SCALE_GROWTH_INTERVAL = 2.0 ** 16, 2000


class LossScaleState(NamedTuple):
  scale: jax.Array        # float32: the train step differentiates scale * loss (steps.value_and_grad)
  good_steps: jax.Array   # finite steps since the scale last changed (torch's growth tracker)
  inner: Any


def loss_scaled(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """``tx`` behind torch's dynamic loss scale: a non-finite gradient skips the update (zero updates,
  ``tx``'s state kept but for its schedule's count) and halves the scale. Not ``optax.apply_if_finite``:
  it holds no scale and applies the update anyway after ``max_consecutive_errors``."""

  def init(params):
    return LossScaleState(jnp.float32(LOSS_SCALE_INIT), jnp.zeros((), jnp.int32), tx.init(params))

  def update(grads, state, params=None):
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
    updates, inner = tx.update(grads, state.inner, params)
    good = jnp.where(finite, state.good_steps + 1, 0)
    grow = good >= LOSS_SCALE_GROWTH_INTERVAL
    scale = state.scale * jnp.where(finite, jnp.where(grow, 2.0, 1.0), 0.5)
    return (jax.tree.map(lambda u: jnp.where(finite, u, 0), updates),
            LossScaleState(scale, jnp.where(grow, 0, good), skip(finite, inner, state.inner)))
  return optax.GradientTransformation(init, update)


def skip(applied, new, old, advance=True):
  """Optimizer state ``new`` where ``applied``, else ``old`` -- except the schedule's count (and the
  hyperparameters it sets), which is ``new`` where ``advance``: a skipped step still counts for the
  schedule, as torch's scheduler steps, so the rate stays a function of the step."""
  inject = (optax.InjectHyperparamsState, optax.InjectStatefulHyperparamsState)
  sched = (optax.ScaleByScheduleState, *inject)
  counted = lambda n, o: n if advance is True else jax.tree.map(
      lambda a, b: jnp.where(advance, a, b), n, o)

  def pick(n, o):
    if isinstance(n, inject):
      return counted(n, o)._replace(inner_state=skip(applied, n.inner_state, o.inner_state, advance))
    return counted(n, o) if isinstance(n, sched) else jnp.where(applied, n, o)
  return jax.tree.map(pick, new, old, is_leaf=lambda x: isinstance(x, sched))
