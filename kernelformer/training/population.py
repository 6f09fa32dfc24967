"""A population: runs that differ only in fields that keep the program's shapes, trained as one program.

``config.population`` (or ``build(..., population=)``) lists each member's overrides of ``FIELDS``, e.g.
``[{'seed': 0}, {'seed': 1, 'optim.learning_rate': 1e-3}]``. A member is its single run: its seed's
parameters, data order (``input_pipeline.TrainBatches``), dropout and feature keys (``steps_lib.run_keys``),
its schedule and AdamW values (``optim.make_optimizer(**member)``) and dropout rates. One jitted step --
the trainer's ``make_loop_step(make_steps(...))``, vmapped over a leading member axis of state, window
and batch -- trains them all, on a 2-D mesh: ``members`` (each device group trains its own members)
x ``data`` (each member's batch split, as the single run's). A field shared by every member stays the
single run's Python constant, a varying one is traced; a population of one is the single run's program.
``population_run.train_population`` trains one; the step's ``active`` argument freezes stopped members.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from kernelformer import run_config
from kernelformer.training import input_pipeline
from kernelformer.training import optim as optim_lib
from kernelformer.training import steps as steps_lib
from kernelformer.training import validate

FIELDS = ('seed', 'optim.learning_rate', 'optim.warmup_steps', 'optim.weight_decay', 'optim.b1',
          'optim.b2', 'model.dropout_rate', 'model.attention.attention_dropout')
# A varying dropout field is built into the model at this rate, so its Dropout layers exist and are
# told apart by their rate (``_dropout``); each member's own rate replaces it inside the step.
PLACEHOLDER_RATES = {'model.dropout_rate': 0.3141592653589793,
                     'model.attention.attention_dropout': 0.2718281828459045}


class PopulationError(ValueError):
  """A population one program cannot train (one line)."""


def _node(config, field: str):
  *parents, leaf = field.split('.')
  for name in parents:
    config = config[name]
  return config, leaf


def _get(config, field: str):
  return (lambda node, leaf: node[leaf])(*_node(config, field))


def members(config: ml_collections.ConfigDict, population=None) -> list:
  """Each member's config: ``config`` (less ``population``) with the member's overrides."""
  population = config.get('population') if population is None else population
  if not population:
    raise PopulationError('config.population is empty: list each member\'s overrides, e.g. '
                          "[{'seed': 0}, {'seed': 1}]")
  out = []
  for i, overrides in enumerate(population):
    c = ml_collections.ConfigDict({k: v for k, v in config.to_dict().items() if k != 'population'})
    if not hasattr(overrides, 'items'):
      raise PopulationError(f'config.population[{i}]: a dict of field: value, got {overrides!r}')
    for field, value in overrides.items():
      if field not in FIELDS:
        raise PopulationError(f'config.population[{i}]: {field!r} cannot differ between members (one '
                              f"program); a population varies only {', '.join(FIELDS)}")
      node, leaf = _node(c, field)
      try:
        node[leaf] = value
      except TypeError as e:
        raise PopulationError(f'config.population[{i}]: {field}: {e}') from None
    out.append(c)
  return out


def member_name(overrides) -> str:
  """A member's workdir name: its overrides, e.g. ``seed=1,optim.learning_rate=0.001``."""
  return ','.join(f'{k}={v}' for k, v in overrides.items()) or 'base'


def make_mesh(size: int, devices=None) -> Mesh:
  """``members`` x ``data``: gcd(size, devices) groups of devices, each training its share of the
  members with their batches split over the group (8 members on 8 devices: one each; 2 on 8: 4-way)."""
  devices = np.asarray(jax.devices() if devices is None else devices)
  groups = math.gcd(size, devices.size)
  auto = jax.sharding.AxisType.Auto
  return Mesh(devices.reshape(groups, -1), ('members', 'data'), axis_types=(auto, auto))


def _dropout(keep: dict):
  """Flax ``Dropout.__call__`` with each placeholder rate replaced by the member's keep probability
  (traced): the same mask draw and scaling as ``nn.Dropout`` (flax 0.12.8 flax/linen/stochastic.py
  99-107)."""
  def interceptor(next_fun, args, kwargs, context):
    module = context.module
    p = keep.get(getattr(module, 'rate', None)) if isinstance(module, nn.Dropout) else None
    if p is None or context.method_name != '__call__' or kwargs.get('deterministic',
                                                                     module.deterministic):
      return next_fun(*args, **kwargs)
    x = args[0]
    mask = jax.random.bernoulli(module.make_rng(module.rng_collection), p=p, shape=x.shape)
    return jax.lax.select(mask, x / p.astype(x.dtype), jnp.zeros_like(x))
  return interceptor


@dataclasses.dataclass(frozen=True)
class Population:
  """The members' configs, the mesh, the jitted step and each member's training batches."""
  configs: tuple
  mesh: Mesh
  step: Any          # jitted (state, window, batch, *extra(active)) -> (state, window), members leading
  batches: tuple     # each member's ``input_pipeline.TrainBatches``

  def batch(self, step: int) -> dict:
    """Training batch ``step`` of every member, stacked: ``[members, batch, ...]``."""
    each = [b.batch(step) for b in self.batches]
    return each[0] if len(each) == 1 else {k: np.stack([b[k] for b in each]) for k in each[0]}

  def member(self, tree, i: int, mesh=None):
    """Member ``i``'s ``TrainState`` (or window) out of the population's (one member: no member axis);
    ``mesh``: placed on it, replicated (the single run's)."""
    if len(self.configs) == 1:
      return tree
    tree = jax.tree.map(lambda x: x[i], tree)
    return tree if mesh is None else jax.device_put(tree, NamedSharding(mesh, P()))

  def extra(self, active=None) -> tuple:
    """The step's last argument (several members): which members it trains (default: all); the
    others' state and window are kept (frozen: stopped early or diverged)."""
    size = len(self.configs)
    return () if size == 1 else (np.ones(size, bool) if active is None else np.asarray(active),)

  def compile(self, state, window, batch, extra=None):
    """The step compiled ahead for these arguments (``extra``: default ``extra()``): the one executable
    every step runs, and what XLA's memory analysis (``metrics.memory_of``) reads."""
    return self.step.lower(state, window, batch, *(self.extra() if extra is None else extra)).compile()

  def stack(self, trees: list):
    """The population's state (or window) of its members' (``member``'s inverse)."""
    if len(trees) == 1:
      return trees[0]
    return jax.device_put(jax.tree.map(lambda *x: jnp.stack(x), *trees),
                          NamedSharding(self.mesh, P('members')))


def build(config: ml_collections.ConfigDict, info, source=None, *, population=None,
          devices=None) -> tuple[Population, Any, jax.Array]:
  """The population of ``config`` (``source``: the training split, for ``Population.batch``), its
  fresh state and window (leading member axis)."""
  configs = members(config, population)
  runs = [validate.validate_config(c, jax.devices()[:1]) for c in configs]   # each field's range
  size, n = len(configs), runs[0].num_train_steps
  batches = tuple(input_pipeline.TrainBatches(source, config.batch_size, int(c.seed), whole=True)
                  for c in configs) if source is not None else ()
  if size == 1:   # the single run's program: vmap, a reshape, even donation change XLA's rounding
    parts, state = steps_lib.build_steps(runs[0], info, devices)
    return Population(tuple(configs), parts['mesh'], parts['loop_step'], batches), state, \
        steps_lib.empty_window()
  varying = {f for f in FIELDS if len({_get(c, f) for c in configs}) > 1}
  program = ml_collections.ConfigDict(configs[0].to_dict())
  for field in varying & set(PLACEHOLDER_RATES):
    node, leaf = _node(program, field)
    node[leaf] = PLACEHOLDER_RATES[field]
  program = run_config.of(program)
  mesh = make_mesh(size, devices)
  data = mesh.shape['data']
  if config.batch_size % data:
    raise PopulationError(f'batch_size={config.batch_size} is not divisible by the {data}-way data '
                          f'axis of {size} members on {mesh.devices.size} devices')
  model = steps_lib.build_model(program, info)
  keys = jax.tree.map(lambda *k: jnp.stack(k), *[steps_lib.run_keys(r.seed) for r in runs])
  keep = {PLACEHOLDER_RATES[f]: jnp.asarray([np.float32(1.0 - _get(c, f)) for c in configs])
          for f in varying & set(PLACEHOLDER_RATES)}
  schedules = [optim_lib.make_schedule(r.optim, n) for r in runs]
  momenta = [optim_lib.momentum_schedule(r.optim, n) for r in runs]

  def optimizer(index):
    """Member ``index``'s optimizer: only what varies is traced (``lax.switch`` on scalars)."""
    member = {}
    if varying & {'optim.learning_rate', 'optim.warmup_steps'}:
      member['schedule'] = lambda count: jax.lax.switch(index, schedules, count)
    if momenta[0] is not None and 'optim.warmup_steps' in varying:
      member['momentum'] = lambda count: jax.lax.switch(index, momenta, count)
    for name in ('b1', 'b2', 'weight_decay'):
      if f'optim.{name}' in varying:
        member[name] = jnp.asarray([getattr(r.optim, name) for r in runs], jnp.float32)[index]
    return optim_lib.make_optimizer(program.optim, n, program.model.dtype == 'float16', **member)

  def init(index, member_keys):
    return steps_lib.initializer(model, optimizer(index)[0], info, member_keys)(member_keys['init'])

  def member_step(index, member_keys, state, window, batch, active):
    tx, schedule = optimizer(index)
    train_step, _ = steps_lib.make_steps(model, tx, schedule, program, member_keys)
    loop_step = steps_lib.make_loop_step(train_step, program.policy, program.log_every)
    with nn.intercept_methods(_dropout({r: k[index] for r, k in keep.items()})):
      new = loop_step(state, window, batch)
    return jax.tree.map(lambda n, o: jnp.where(active, n, o), new, (state, window))

  index = jnp.arange(size)
  members_sh = NamedSharding(mesh, P('members'))
  state = jax.jit(jax.vmap(init), out_shardings=members_sh)(index, keys)
  step = jax.jit(
      lambda *args: jax.vmap(member_step, spmd_axis_name='members')(index, keys, *args),
      in_shardings=(members_sh, members_sh, NamedSharding(mesh, P('members', 'data')),
                    NamedSharding(mesh, P())),   # active: numpy, the same in every process
      out_shardings=(members_sh, members_sh), donate_argnums=0)
  window = jax.device_put(jnp.stack([steps_lib.empty_window()] * size), members_sh)
  return Population(configs=tuple(configs), mesh=mesh, step=step, batches=batches), state, window
