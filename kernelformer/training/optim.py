"""AdamW with the learning-rate schedules of the LRA papers (optax)."""
from __future__ import annotations

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


# Parameter names that are never decayed: Dense/DenseGeneral and LayerNorm offsets ('bias', which
# for the per-head q/k/v projections and vmapped samplers is 2-D), LayerNorm gains ('scale') and the
# CLS token (one vector, stored as [1, 1, emb]).
_NO_DECAY = frozenset({'bias', 'scale', 'cls'})


def _decay_mask(params):
  """AdamW's decay mask: True for weight matrices and embeddings, False for the names in _NO_DECAY.

  Standard AdamW practice (no decay on biases, LayerNorm parameters and vectors). Decided by the
  parameter's name, not its rank: per-head biases are 2-D and the CLS token is 3-D.
  """
  def decays(path, p):
    name = getattr(path[-1], 'key', path[-1]) if path else ''
    return p.ndim > 1 and str(name) not in _NO_DECAY
  return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(optim, num_train_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  schedule = make_schedule(optim, num_train_steps)
  parts = []
  if optim.grad_clip_norm and optim.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(float(optim.grad_clip_norm)))
  parts.append(optax.adamw(schedule, b1=float(optim.b1), b2=float(optim.b2), eps=float(optim.eps),
                           weight_decay=float(optim.weight_decay), mask=_decay_mask))
  # Gradient accumulation is done inside the train step (a scan over micro-batches of one global
  # batch), so steps, schedules and checkpoints always count optimizer updates.
  return optax.chain(*parts), schedule
