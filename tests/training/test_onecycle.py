"""Skyformer's optimizer: torch OneCycleLR (two phases, cycled beta1) and clip_grad_value_, on optax.

The reference is torch.optim.lr_scheduler.OneCycleLR's formula transcribed to numpy: phase ends
``float(pct_start * total_steps) - 1`` and ``total_steps - 1``; the rate goes max_lr / div_factor ->
max_lr -> initial / final_div_factor, beta1 max_momentum -> base_momentum -> max_momentum, each phase
annealed linearly (``(end - start) * pct + start``) or by cosine (``end + (start - end) / 2 * (cos(pi
pct) + 1)``). Step k of the reference is the value torch's optimizer uses in its (k+1)-th update
(``lr_scheduler.step()`` follows ``optimizer.step()``), i.e. optax's count k.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import image
from configs import listops
from configs import pathfinder
from configs import retrieval
from configs import text
from kernelformer.training import optim as optim_lib


def torch_onecycle(step, max_lr, total, pct_start, anneal, div=25.0, final_div=1e4, base_m=0.85,
                   max_m=0.95):
  """(lr, beta1) of torch's OneCycleLR (three_phase=False) at ``step``."""
  initial = max_lr / div
  phases = [(float(pct_start * total) - 1, initial, max_lr, max_m, base_m),
            (total - 1, max_lr, initial / final_div, base_m, max_m)]
  if anneal == 'linear':
    f = lambda a, b, p: (b - a) * p + a
  else:
    f = lambda a, b, p: b + (a - b) / 2.0 * (np.cos(np.pi * p) + 1)
  start = 0
  for i, (end, lr0, lr1, m0, m1) in enumerate(phases):
    if step <= end or i == len(phases) - 1:
      p = (step - start) / (end - start)
      return f(lr0, lr1, p), f(m0, m1, p)
    start = end
  raise AssertionError


def _optim(schedule='onecycle-linear', lr=2e-4, warmup=312, clip_value=1.0):
  return ml_collections.ConfigDict(dict(
      learning_rate=lr, schedule=schedule, warmup_steps=warmup, weight_decay=0.0, decay_mask='all',
      b1=0.95, b2=0.999, eps=1e-6, grad_clip_norm=0.0, grad_clip_value=clip_value))


@pytest.mark.parametrize('anneal', ['linear', 'cosine'])
@pytest.mark.parametrize('lr,warmup,total', [(2e-4, 312, 50000), (1e-4, 175, 50000), (1e-3, 7, 40)])
def test_rate_and_beta1_are_torch_onecycle(anneal, lr, warmup, total):
  o = _optim(f'onecycle-{anneal}', lr, warmup)
  rate = optim_lib.make_schedule(o, total)
  beta1 = optim_lib.momentum_schedule(o, total)
  steps = sorted({0, 1, warmup // 2, warmup - 2, warmup - 1, warmup, warmup + 1, total // 3,
                  total // 2, total - 2, total - 1})
  for s in steps:
    want_lr, want_b1 = torch_onecycle(s, lr, total, warmup / total, 'linear' if anneal == 'linear' else 'cos')
    # float32 interpolation: near the end the rate is a difference of values ~lr, so its error is a
    # few float32 ulps of lr, not of the (10^5 times smaller) result.
    np.testing.assert_allclose(float(rate(s)), want_lr, rtol=2e-6, atol=4 * 2.0 ** -24 * lr,
                               err_msg=f'lr at {s}')
    np.testing.assert_allclose(float(beta1(s)), want_b1, rtol=2e-6, err_msg=f'beta1 at {s}')
  # The peak is one step before a warm-up of `warmup` steps would end; the end is lr / 25e4.
  assert float(rate(warmup - 1)) == pytest.approx(lr, rel=1e-6)
  assert float(rate(total - 1)) == pytest.approx(lr / 25 / 1e4, rel=1e-5)
  assert optim_lib.momentum_schedule(_optim('linear'), total) is None


def test_updates_are_torch_adamw_with_cycled_beta1_and_value_clipping():
  """Five AdamW updates under the one-cycle schedule against torch's AdamW formula in float64."""
  o, total = _optim('onecycle-linear', lr=1e-2, warmup=3), 10
  tx, _ = optim_lib.make_optimizer(o, total)
  params = {'w': jnp.array([0.5, -1.0, 2.0, 0.1]), 'b': jnp.array([0.3])}
  state = tx.init(params)
  rng = np.random.default_rng(0)
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(v) for k, v in p.items()}
  for t in range(5):
    grads = {k: rng.normal(0.0, 3.0, x.shape) for k, x in p.items()}   # many entries beyond [-1, 1]
    updates, state = tx.update(jax.tree_util.tree_map(jnp.asarray, grads), state, params)
    params = jax.tree_util.tree_map(lambda a, u: a + u, params, updates)
    lr, b1 = torch_onecycle(t, o.learning_rate, total, o.warmup_steps / total, 'linear')
    for k in p:
      g = np.clip(grads[k], -1.0, 1.0)                        # torch clip_grad_value_(..., 1)
      m[k] = b1 * m[k] + (1 - b1) * g
      v[k] = o.b2 * v[k] + (1 - o.b2) * g * g
      denom = np.sqrt(v[k]) / np.sqrt(1 - o.b2 ** (t + 1)) + o.eps
      p[k] = p[k] - lr / (1 - b1 ** (t + 1)) * m[k] / denom
      np.testing.assert_allclose(params[k], p[k], rtol=1e-5, atol=1e-7, err_msg=f'{k} after {t + 1}')


def test_skyformer_presets_use_it():
  for module in (listops, text, retrieval, image, pathfinder):
    c = module.get_config('skyformer')
    o = c.optim
    assert (o.schedule, o.b2, o.eps, o.grad_clip_value, o.weight_decay) == (
        'onecycle-linear', 0.999, 1e-6, 1.0, 0.0), module.__name__
    tx, schedule = optim_lib.make_optimizer(o, c.num_train_steps)
    assert float(schedule(0)) == pytest.approx(o.learning_rate / 25)


def test_a_warmup_too_short_for_a_cycle_is_refused():
  with pytest.raises(ValueError, match='warmup_steps'):
    optim_lib.make_schedule(_optim(warmup=1), 100)
