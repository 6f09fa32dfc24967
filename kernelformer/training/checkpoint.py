"""Orbax checkpoints: the latest few for resuming, and the best one by validation accuracy.

``workdir/checkpoints/<step>``: saved every ``checkpoint_every`` steps and at the end (a crash loses at
most the steps since the last one). ``workdir/best/<step>``: saved whenever validation accuracy
improves; the final test accuracy is measured with it. Each checkpoint holds the train state (params,
optimizer state, model state, step — the step is also the data position) and a JSON ``meta`` item
(best validation accuracy so far, its step, and the metrics history needed to continue the run).
All processes save and restore together, as orbax requires on multi-host runs.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp


def _register_array_handler() -> None:
  # Replica-parallel saving slices every replicated array across devices with one small jit per
  # parameter shape (70+ compilations for a tiny model, seconds per run); our state is replicated and
  # modest, so one replica writing whole arrays is faster.
  ocp.type_handlers.register_type_handler(
      jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True)


_register_array_handler()


class Checkpoints:

  def __init__(self, directory: str, max_to_keep: int):
    self.directory = os.path.abspath(directory)
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                             enable_async_checkpointing=False),
        item_names=('state', 'meta'))

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def save(self, step: int, state: Any, meta: dict) -> None:
    if int(step) in self._manager.all_steps():
      # A resumed run re-reaches a step an interrupted run had saved (e.g. its best): replace it.
      self._manager.delete(int(step))
    self._manager.save(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
    self._manager.wait_until_finished()

  def restore(self, abstract_state: Any, step: Optional[int] = None) -> tuple[Any, dict]:
    """Restores into the shapes and shardings of ``abstract_state`` (a pytree of ShapeDtypeStruct)."""
    step = self.latest_step() if step is None else step
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    return restored['state'], dict(restored['meta'])

  def close(self) -> None:
    self._manager.close()


def abstract_like(tree: Any) -> Any:
  """ShapeDtypeStructs with the shardings of ``tree``, for restoring onto the same devices."""
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, 'sharding', None)), tree)
