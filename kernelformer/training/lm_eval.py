"""How much context a scored byte sees: the test evaluation of byte-level language models (enwik8).

``data.eval_context`` names the scheme (``lra_tasks.enwik8.eval_scheme``; windows of L = data.max_length
inputs, ``lra_tasks.enwik8.WindowSource``); every byte of the test split but the first is scored
exactly once in each scheme:

* ``'disjoint'``: non-overlapping windows, each scored whole and independently. A byte at offset t of
  its window sees t bytes of context: 0 to L - 1, (L - 1)/2 on average. Cheapest; pessimistic.
* ``'sliding'``: windows at stride S (``data.eval_stride``, 0 = L // 2); window 0 scores all its
  targets, every later window only its last S, so every byte after the first window sees at least
  L - S bytes (>= L/2 for S <= L/2) and at most L - 1. Costs L / S times 'disjoint'. S = L equals
  'disjoint'. S = 1 is the evaluation of Al-Rfou et al. (2019) as Dai et al. (2019, "Transformer-XL",
  §3.1 and figure 1b) describe it: a window of the training length, shifted by one position per step,
  scoring only its last position (the Al-Rfou et al. paper itself is not in shared/papers; this
  follows Dai et al.'s account).
* ``'stateful'`` (causal linear kernels only): the disjoint windows one after another, batch 1, with
  the decoder's recurrent state (``decoder.Decoder(decode=True)``: the sums ``sum_j phi(k_j) v_j^T``,
  ``sum_j phi(k_j)`` and their running key shift, per layer and head) carried from each window into the
  next, so every byte is predicted from the whole test text before it -- Katharopoulos et al.'s RNN
  view of causal linear attention (2020, §3.4), run a window at a time by
  ``linear.causal_linear_attention``. Refused (one line, before training) for kinds with no finite
  recurrent state (softmax, Gaussian: a KV cache; relative-position biases such as nprf-rpe: a Toeplitz
  weight per offset) and for learned absolute positions (trained only on 0..L-1). With sinusoidal
  positions the positions continue past L (``decoder.sinusoid_at`` is defined everywhere); with
  ``pos_encoding='none'`` there are none.

Periodic validation always uses non-overlapping windows (it only selects the checkpoint). ``results.json``
records ``eval_context`` and ``eval_stride`` next to ``test_bits_per_byte``.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from kernelformer import decoder
from kernelformer import run_config
# The eval_context checks are config checks (``validate``); imported here under the names this module's
# callers use.
from kernelformer.training.validate import EvalContextError, eval_scheme as scheme, stateful_problem


def describe(config: Any) -> dict[str, Any]:
  """The fields ``results.json`` records about the scheme: ``eval_context`` and ``eval_stride``."""
  s = scheme(config)
  if s is None:
    return {}
  return {'eval_context': s[0], 'eval_stride': s[1]}


def is_stateful(config: Any) -> bool:
  s = scheme(config)
  return s is not None and s[0] == 'stateful'


def evaluate_stateful(model, variables: dict, source, *, features_key,
                      on_batch: Optional[Callable[[int], None]] = None) -> dict[str, float]:
  """Next-token loss, accuracy and count over ``source``'s windows in order, carrying the decoder state.

  ``model``: a ``decoder.Decoder``; ``variables``: its ``params`` and other non-cache collections
  (the ``features`` draws). Each window (``inputs``, ``targets`` ``[L]``) is one decode call of L tokens
  starting from the previous window's cache. Returns the same dict as ``steps.evaluate``:
  ``loss`` (mean nats per scored token), ``accuracy`` and ``examples`` (scored tokens).
  """
  problem = stateful_problem_of_model(model)
  if problem:
    raise EvalContextError(problem)
  dec = model.clone(decode=True)
  cache = decoder.init_cache(model, 1)

  @jax.jit
  def window(cache, inputs, targets):
    logits, new = dec.apply({**variables, 'cache': cache}, inputs, rngs={'features': features_key},
                            mutable=['cache'])
    losses, correct, weights = decoder.next_token_loss(logits, targets)
    return new['cache'], jnp.stack([jnp.sum(losses), jnp.sum(correct), jnp.sum(weights)])

  totals = np.zeros(3, np.float64)
  for i in range(len(source)):
    if on_batch is not None:
      on_batch(i)
    ex = source[i]
    cache, sums = window(cache, jnp.asarray(ex['inputs'])[None], jnp.asarray(ex['targets'])[None])
    totals += np.asarray(jax.device_get(sums), np.float64)
  n = max(totals[2], 1.0)
  return {'loss': float(totals[0] / n), 'accuracy': float(totals[1] / n), 'examples': int(totals[2])}


def evaluate_windows(model, variables: dict, source, *, features_key,
                     batch_size: int = 8) -> dict[str, float]:
  """``evaluate_stateful``'s numbers for independent windows ('disjoint', 'sliding'), on one device.

  Each window is scored from its own tokens only (batches of ``batch_size``; the last one padded with
  all-zero rows, whose targets weigh 0). The trainer's ``evaluate`` computes the same sums sharded over
  its mesh; this version needs no mesh (tests, ``docs/data.md``'s measurement).
  """

  @jax.jit
  def batch_sums(inputs, targets):
    logits = model.apply(variables, inputs, rngs={'features': features_key})
    losses, correct, weights = decoder.next_token_loss(logits, targets)
    return jnp.stack([jnp.sum(losses), jnp.sum(correct), jnp.sum(weights)])

  totals = np.zeros(3, np.float64)
  n = len(source)
  for b in range(0, n, batch_size):
    rows = [source[i] for i in range(b, min(b + batch_size, n))]
    pad = batch_size - len(rows)
    inputs = np.stack([r['inputs'] for r in rows] + [np.zeros_like(rows[0]['inputs'])] * pad)
    targets = np.stack([r['targets'] for r in rows] + [np.zeros_like(rows[0]['targets'])] * pad)
    totals += np.asarray(jax.device_get(batch_sums(inputs, targets)), np.float64)
  count = max(totals[2], 1.0)
  return {'loss': float(totals[0] / count), 'accuracy': float(totals[1] / count),
          'examples': int(totals[2])}


def stateful_problem_of_model(model) -> Optional[str]:
  """``stateful_problem`` for a built ``decoder.Decoder``."""
  return stateful_problem(run_config.attention_of(model.attention), model.pos_encoding)
