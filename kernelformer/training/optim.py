"""AdamW with the learning-rate schedules of the LRA papers (optax) and a choice of decayed parameters."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ('rsqrt', 'cosine', 'linear', 'constant')


def make_schedule(optim, num_train_steps: int) -> optax.Schedule:
  """The learning rate at each step.

  * ``rsqrt``: LRA's ``constant * linear_warmup * rsqrt_decay`` (the kernel-learning paper's "Sqrt
    Decay"): ``lr * min(1, step / warmup) / sqrt(max(step, warmup))``. NB the peak is
    ``lr / sqrt(warmup)``, so LRA's "learning rate 0.05" peaks at 1.6e-3 with 1000 warm-up steps.
  * ``cosine``: linear warm-up to ``lr``, cosine decay to 0 at the last step.
  * ``linear``: linear warm-up to ``lr``, linear decay to 0 at the last step (Skyformer/Spectraformer).
  * ``constant``: linear warm-up to ``lr``, then constant.
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
  if optim.schedule == 'constant':
    return optax.join_schedules([optax.linear_schedule(0.0, lr, max(warmup, 1)),
                                 optax.constant_schedule(lr)], [max(warmup, 1)])
  raise ValueError(f'unknown optim.schedule {optim.schedule!r}; valid: {", ".join(SCHEDULES)}')


# The choices of ``optim.decay_mask`` (configs/common.py), i.e. which parameters AdamW decays.
DECAY_MASKS = ('matrices', 'all')
# Configs written before the field existed decayed by the 'matrices' rule.
DEFAULT_DECAY_MASK = 'matrices'

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


def decay_mask(params, mode: str = DEFAULT_DECAY_MASK):
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


def decay_mode(optim) -> str:
  """``optim.decay_mask``, or 'matrices' for a config written before the field existed."""
  return str(optim.get('decay_mask', DEFAULT_DECAY_MASK)) if hasattr(optim, 'get') else DEFAULT_DECAY_MASK


def make_optimizer(optim, num_train_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  schedule = make_schedule(optim, num_train_steps)
  parts = []
  if optim.grad_clip_norm and optim.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(float(optim.grad_clip_norm)))
  parts.append(optax.adamw(schedule, b1=float(optim.b1), b2=float(optim.b2), eps=float(optim.eps),
                           weight_decay=float(optim.weight_decay),
                           mask=functools.partial(decay_mask, mode=decay_mode(optim))))
  # Gradient accumulation is done inside the train step (a scan over micro-batches of one global
  # batch), so steps, schedules and checkpoints always count optimizer updates.
  return optax.chain(*parts), schedule
