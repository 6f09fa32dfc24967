"""Which random draw a call uses: the redraw schedule shared by the random-feature kernels and Skyformer.

A module that draws (a random-feature W, a learned sampler's noise, Skyformer's landmarks) folds the
draw index into its ``make_rng('features')`` key: ``step // redraw_every`` (0 when ``redraw_every`` is
0: never redraw). W is constant within a window of ``redraw_every`` steps and changes between windows.

Evaluation (``step`` None) uses the draw of the last training step: the module's ``features``
collection keeps that index (``current_draw_index``), as the public PyTorch codes keep W in a buffer
that evaluation reads (Spectraformer's, dukenguyenxyz/spectraformer @ b79b91b:
src/models/attention_performer.py 230-231 registers W once, its ``redraw_projection_matrix`` (259-262)
is never called; src/models/weight_matrices_learner.py 338-356 redraws a learner's buffer on a call
counter). Within a redraw window the model adapts to its draw, so a fixed or fresh evaluation draw
measures robustness to a redraw rather than the trained model (measured: docs/benchmarks.md, "A
trained model and its draw"; ``kernelformer benchmark redraw``). Without the collection (``apply``
with parameters only) evaluation uses draw 0.
"""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array


def draw_index(step: Optional[Array], redraw_every: int) -> Array:
  """``step // redraw_every``; 0 for ``step`` None and for ``redraw_every == 0``."""
  if step is None or redraw_every <= 0:
    return jnp.zeros((), jnp.int32)
  return jnp.asarray(step, jnp.int32) // redraw_every


def tracks_draws(module: nn.Module) -> bool:
  """Whether ``module``'s call has the ``features`` collection (not ``apply`` with parameters only)."""
  return module.is_initializing() or module.has_variable('features', 'train_index')


def current_draw_index(module: nn.Module, step: Optional[Array], redraw_every: int) -> Array:
  """The draw index of ``module``'s call: ``step // redraw_every`` in training, stored in its
  ``features`` collection where that is mutable; in evaluation (``step`` None) the stored index, the
  last training step's (0 before any training step, and 0 without the collection)."""
  index = draw_index(step, redraw_every)
  if not tracks_draws(module):
    return index
  stored = module.variable('features', 'train_index', lambda: jnp.zeros((), jnp.int32))
  if step is None:
    return stored.value
  if module.is_mutable_collection('features') and not module.is_initializing():
    stored.value = index
  return index
