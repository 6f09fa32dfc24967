"""Driver for test_lapack_deadlock.py (run as a subprocess, so a hang can be timed out and killed).

Several batched QR/SVD custom calls ready at once deadlocked XLA's CPU thread pool. This runs
(1) the issue's minimal program: four vmapped ORF draws in one jit, each followed by work using W;
(2) for each LAPACK-based sampler, a 4-layer, 4-head random-feature encoder's jitted train step
(value_and_grad, the ``features`` collection mutable, a redraw every step) for a few steps.
Prints one 'ok <case>' line per case that finished.
"""
from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import optax

from kernelformer.encoder import Encoder
from kernelformer.features import weights


def minimal_program() -> None:
  @jax.jit
  def f(key, x):
    out = 0.0
    for layer in range(4):
      keys = jax.random.split(jax.random.fold_in(key, layer), 4)
      w = jax.vmap(lambda k: weights.orthogonal(k, 128, 64).matrix)(keys)
      x = jnp.tanh(jnp.einsum('bld,hmd->blm', x, w)[..., :64])
      out = out + x.sum()
    return out

  jax.block_until_ready(f(jax.random.PRNGKey(0), jnp.ones((1, 256, 64))))


def train_steps(sampler: str, num_steps: int = 3) -> None:
  model = Encoder(vocab_size=32, emb_dim=64, num_layers=4, num_heads=4, qkv_dim=256, mlp_dim=64,
                  max_length=64, dropout_rate=0.0, pooling='mean',
                  attention={'kind': f'posrf-{sampler}', 'num_features': 128, 'redraw_every': 1})
  x = jax.random.randint(jax.random.PRNGKey(1), (2, 64), 1, 32)
  rngs = {'features': jax.random.PRNGKey(2)}
  variables = model.init({'params': jax.random.PRNGKey(0), **rngs}, x)
  params, state = variables['params'], {'features': variables['features']}
  tx = optax.adam(1e-3)
  opt_state = tx.init(params)

  @jax.jit
  def step(params, state, opt_state, i):
    def loss(p):
      y, new_state = model.apply({'params': p, **state}, x, train=True, step=i, rngs=rngs,
                                 mutable=['features'])
      return jnp.mean(y ** 2), new_state
    (_, new_state), grads = jax.value_and_grad(loss, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state)
    return optax.apply_updates(params, updates), new_state, opt_state

  for i in range(num_steps):
    params, state, opt_state = step(params, state, opt_state, jnp.int32(i))
  jax.block_until_ready(params)


if __name__ == '__main__':
  for case in sys.argv[1:]:
    if case == 'minimal':
      minimal_program()
    else:
      train_steps(case)
    print('ok', case, flush=True)
