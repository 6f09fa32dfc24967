"""One code path for 1 CPU, 8 GPUs or a TPU pod: a 1-D ``data`` mesh over every device.

Parameters and optimizer state are replicated; each batch is sharded along its leading axis. Each process
supplies only its own slice of the global batch (``jax.make_array_from_process_local_data``), so the same
code runs single- and multi-host.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


class ShardingError(ValueError):
  pass


def make_mesh(devices=None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  # Auto axis types: jit propagates shardings (jax.make_mesh would default to Explicit).
  return Mesh(np.asarray(devices), ('data',), axis_types=(jax.sharding.AxisType.Auto,))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharded(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(*mesh.axis_names))   # a population's: members x data


def check_batch_size(global_batch: int, mesh: Mesh, what: str = 'batch_size') -> int:
  """The per-process batch; a one-line error when the global batch does not split evenly."""
  n_dev = mesh.devices.size
  if global_batch % n_dev:
    raise ShardingError(
        f'{what}={global_batch} is not divisible by the {n_dev} devices; set --config.{what} to a '
        f'multiple of {n_dev} (e.g. {max(n_dev, global_batch // n_dev * n_dev)}).')
  return global_batch // jax.process_count()


def local_slice(global_batch: int) -> slice:
  """The rows of each global batch that this process reads."""
  per = global_batch // jax.process_count()
  start = jax.process_index() * per
  return slice(start, start + per)


def shard_batch(batch: dict, mesh: Mesh) -> dict:
  """Host-local numpy batch -> globally sharded jax arrays."""
  sharding = batch_sharded(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in batch.items()}
