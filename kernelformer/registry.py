"""Attention registry: one name -> one mechanism, with loud errors for unknown names.

Every mechanism (random-feature kernels, softmax, Skyformer, RPE, ...) is a Flax module with the
same call signature, so the encoder never special-cases one::

    module = kernelformer.registry.build(attention_config)       # a flax.linen.Module
    out = module(q, k, v, mask=mask, causal=False, step=step, deterministic=True)

* ``q, k, v``: ``[batch, length, heads, head_dim]`` (the layout of ``jax.nn.dot_product_attention``).
* ``mask``: ``[batch, length]`` bool, True = real token (key padding mask), or None.
* ``causal``: static bool.
* ``step``: the training step (int32 scalar) or None (evaluation: a fixed draw). Random-feature
  mechanisms redraw their projection every ``redraw_every`` steps from ``fold_in(rng, step // N)``.
* ``deterministic``: True disables dropout.
* ``position_bias``: ``[heads, 2 * length - 1]`` relative-position bias b_{j-i} for offsets
  -(L-1)..(L-1) (index ``j - i + L - 1``), or None. Owned by the encoder (shared across layers or per
  layer); only mechanisms whose spec says ``supports_position_bias`` accept a non-None value.
* returns ``[batch, length, heads, head_dim]`` in the dtype of ``v``.

A mechanism's options live in the attention ConfigDict (``config.model.attention``); ``build``
passes each module the fields it declares and ignores the rest, so one config can switch kinds with
a single ``--config.model.attention.kind=...`` override.
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Mapping

import flax.linen as nn


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
  """What the registry knows about one mechanism."""

  name: str
  # Flax module class; its dataclass fields are the options it reads from the attention config.
  module: type[nn.Module]
  # Fixed keyword arguments that distinguish this name from others sharing the module class
  # (e.g. component='positive', weights='orthogonal').
  fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  paper: str = ''            # paper and equation, for docs/kernels.md
  approximates: str = ''     # the kernel it computes or estimates
  complexity: str = ''       # time / space, as in table 1 of the kernel-learning paper
  learnable: str = '-'       # learnable parameters beyond q/k/v projections
  aliases: tuple[str, ...] = ()
  # Relative-position bias (Luo et al. 2021): True if the module accepts ``position_bias``; True in
  # ``requires_position_bias`` if the mechanism is defined with one (nprf-rpe), so the encoder creates it.
  supports_position_bias: bool = False
  requires_position_bias: bool = False
  # Non-empty where the mechanism depends on the sequence's absolute length or positions *by definition*
  # (the reason, one line; docs/kernels.md lists these). Every other mechanism gives the same output on
  # the real tokens whether a sequence is padded to L or to 4L (tests/attention/test_padding_invariance.py).
  length_dependent: str = ''


_REGISTRY: dict[str, AttentionSpec] = {}
_ALIASES: dict[str, str] = {}


def register(spec: AttentionSpec) -> AttentionSpec:
  """Adds ``spec`` under its name and aliases; re-registering a name is an error."""
  for n in (spec.name, *spec.aliases):
    key = n.lower()
    if key in _REGISTRY or key in _ALIASES:
      raise ValueError(f'attention name {n!r} is registered twice')
  _REGISTRY[spec.name.lower()] = spec
  for a in spec.aliases:
    _ALIASES[a.lower()] = spec.name.lower()
  return spec


def _ensure_loaded() -> None:
  # Mechanism modules register themselves on import; importing the package loads them all.
  import kernelformer.attention  # noqa: F401  pylint: disable=g-import-not-at-top


def list_kernels(include_aliases: bool = False) -> list[str]:
  """Every valid attention name, sorted (canonical names; aliases too if asked)."""
  _ensure_loaded()
  names = [s.name for s in _REGISTRY.values()]
  if include_aliases:
    names += list(_ALIASES)
  return sorted(names)


def specs() -> list[AttentionSpec]:
  _ensure_loaded()
  return sorted(_REGISTRY.values(), key=lambda s: s.name)


class UnknownKernelError(ValueError):
  pass


SEE_ALL = 'see `kernelformer kernels` for every kind'


def nearest(name: str, n: int = 3) -> list[str]:
  """The ``n`` registered names or aliases nearest to ``name`` (difflib's ratio), best first."""
  _ensure_loaded()
  return difflib.get_close_matches(str(name).lower(), list(_REGISTRY) + list(_ALIASES), n=n, cutoff=0.0)


def unknown_message(names: list[str] | tuple[str, ...]) -> str:
  """One line for unknown kinds: each with its three nearest names, and where to see them all."""
  show = lambda m: f'{m} (= {_ALIASES[m]})' if m in _ALIASES else m
  parts = [f'{n!r} (nearest: {", ".join(map(show, nearest(n)))})' for n in names]
  return f'unknown attention kind {"; ".join(parts)}; {SEE_ALL}'


def get(name: str) -> AttentionSpec:
  """The spec for ``name`` (case-insensitive, aliases allowed); a one-line error otherwise."""
  _ensure_loaded()
  key = str(name).lower()
  key = _ALIASES.get(key, key)
  if key not in _REGISTRY:
    raise UnknownKernelError(unknown_message([name]))
  return _REGISTRY[key]


# ----------------------------------------------------------------------------------------------------
# Families, for ``kernelformer kernels``: the common kernels first, then each family in turn.

FAMILIES = {
    'baselines': 'baselines: exact attention',
    'random-features': 'random features <component>-<sampler> (Spectraformer eq. 11), by component',
    'learnable': 'learnable random features (the spectral measure is trained)',
    'deterministic': 'deterministic feature maps (no random W)',
    'beyond-rf': 'beyond random features: low rank, Nystrom, and registered mechanisms',
}
_BASELINES = ('softmax', 'gaussian')
_LEARNED_WEIGHTS = ('fastfoodl', 'gmm', 'generative')
# Order within the families: the widely used first (FAVOR+ is posrf-orf, FAVOR++ oprf-orf, FAVOR# saderf-orf).
_COMPONENT_ORDER = ('posrf', 'oprf', 'saderf', 'trigrf', 'rks', 'hyperbolic', 'grelu')
_SAMPLER_ORDER = ('orf', 'iid', 'sorf', 'qmc', 'mm', 'sgq', 'fastfood')
_FIRST = ('softmax', 'gaussian', 'fastfood-prf', 'fastfood-rks', 'gmm-prf', 'gmm-rks', 'generative-prf',
          'generative-rks', 'linear-elu', 'performer-relu-det', 'relu', 'skyformer', 'nystromformer',
          'linformer')


def family(spec: AttentionSpec) -> str:
  """One of ``FAMILIES`` for ``spec``."""
  weights = spec.fixed.get('weights')
  if spec.name in _BASELINES:
    return 'baselines'
  if 'component' not in spec.fixed:
    return 'beyond-rf'
  if weights == 'none':
    return 'deterministic'
  if weights in _LEARNED_WEIGHTS:
    return 'learnable'
  return 'random-features'


def component_of(spec: AttentionSpec) -> str:
  """The feature-map component of a random-feature kernel ('' for the others)."""
  return str(spec.fixed.get('component', '')) if family(spec) == 'random-features' else ''


def _order_key(spec: AttentionSpec) -> tuple:
  comp, weights = spec.fixed.get('component', ''), spec.fixed.get('weights', '')
  rank = lambda seq, x: seq.index(x) if x in seq else len(seq)
  return (list(FAMILIES).index(family(spec)), rank(_COMPONENT_ORDER, comp), comp,
          rank(_FIRST, spec.name), len(spec.fixed) > 2, rank(_SAMPLER_ORDER, weights), spec.name)


def grouped_specs() -> list[AttentionSpec]:
  """Every spec in ``kernels`` order: by family, random features by component (the common component
  first, ORF first within one), user-registered ones after the built-ins of their group."""
  _ensure_loaded()
  return sorted(_REGISTRY.values(), key=_order_key)


def build(options: Mapping[str, Any] | Any, **overrides) -> nn.Module:
  """Builds the module for ``options['kind']`` from a ConfigDict or mapping of options.

  Only the options the module declares are passed; the spec's fixed arguments win over options.
  """
  if hasattr(options, 'to_dict'):
    options = options.to_dict()
  options = {**dict(options), **overrides}
  spec = get(options.pop('kind'))
  fields = {f.name for f in dataclasses.fields(spec.module)} - {'parent', 'name'}
  kwargs = {k: v for k, v in options.items() if k in fields}
  kwargs.update(spec.fixed)
  return spec.module(**kwargs)


def option_names(name: str) -> list[str]:
  """The attention-config options the mechanism ``name`` reads."""
  spec = get(name)
  fields = {f.name for f in dataclasses.fields(spec.module)} - {'parent', 'name'}
  return sorted(fields - set(spec.fixed))


ModuleFactory = Callable[..., nn.Module]


# ----------------------------------------------------------------------------------------------------
# Registering kernels from outside the package (docs/extending.md). A user's module calls these at
# import; ``kernelformer.plugins.load`` (``--config.model.attention.plugin=FILE.py|module``) or an
# import in the user's config file runs it.
# ----------------------------------------------------------------------------------------------------


# Where registered user code lives: ('component' | 'sampler' | 'mechanism', name) -> absolute file path.
# ``sources(kind)`` combines them, so results.json names the files a run's kernel came from.
_SOURCES: dict[tuple[str, str], str] = {}


def _source_file(obj: Any) -> str:
  import inspect  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  try:
    path = inspect.getsourcefile(obj)
  except TypeError:
    path = None
  if not path:
    path = getattr(sys.modules.get(getattr(obj, '__module__', ''), None), '__file__', None)
  return os.path.abspath(path) if path else ''


def sources(name: str) -> list[str]:
  """Files of user code (plugins, config files) that registered a part of kernel ``name``: its
  component, its sampler or the whole mechanism; empty for a built-in."""
  spec = get(name)
  keys = [('mechanism', spec.name.lower()), ('component', spec.fixed.get('component', '')),
          ('sampler', spec.fixed.get('weights', ''))]
  out = []
  for key in keys:
    path = _SOURCES.get(key)
    if path and path not in out:
      out.append(path)
  return out


class KernelPluginError(UnknownKernelError):
  """A plugin (``config.model.attention.plugin``) that cannot be found; the message says where we looked."""


def register_component(name: str, fn: Callable | None = None, *, target_kernel: str, parts: int,
                       positive: bool = False, paper: str = '', approximates: str = ''):
  """Registers a feature-map component and every kernel ``<name>-<sampler>`` it makes.

  ``fn(q, k, proj, *, mask=None, stabilize=True) -> (phi_q, phi_k)``: the contract of
  ``kernelformer.features.components`` (``proj`` a ``Projection``: ``projection.project(x, proj)`` is
  x W^T). ``parts``: features per row of W (Spectraformer eq. 11's l; 0: no W, one kernel named
  ``name``); ``target_kernel``: 'softmax', 'gaussian' or 'none'. Without ``fn`` it is a decorator.
  The new kernels pair ``name`` with every fixed sampler (and every registered one); the decorated
  function is returned unchanged.
  """
  def decorate(f):
    _ensure_loaded()
    from kernelformer.attention import random_features  # pylint: disable=g-import-not-at-top
    from kernelformer.features import components  # pylint: disable=g-import-not-at-top
    components.register_component(name, f, target_kernel=target_kernel, parts=parts, positive=positive)
    _SOURCES[('component', name)] = _source_file(f)
    random_features.register_grid_entries(component=name, paper=paper, approximates=approximates)
    return f
  return decorate if fn is None else decorate(fn)


def register_sampler(name: str, fn: Callable | None = None, *, paper: str = ''):
  """Registers a weight sampler ``fn(key, num_features, dim) -> Projection`` and its kernels.

  Every projection-based component (built-in and registered) gets ``<component>-<name>``. Without
  ``fn`` it is a decorator; the function is returned unchanged.
  """
  def decorate(f):
    _ensure_loaded()
    from kernelformer.attention import random_features  # pylint: disable=g-import-not-at-top
    from kernelformer.features import weights  # pylint: disable=g-import-not-at-top
    weights.register_sampler(name, f)
    _SOURCES[('sampler', name)] = _source_file(f)
    random_features.register_grid_entries(sampler=name, paper=paper)
    return f
  return decorate if fn is None else decorate(fn)


def register_mechanism(name: str, module: type[nn.Module] | None = None, **spec_fields):
  """Registers a whole mechanism: a Flax module class with the registry's call signature.

  ``spec_fields`` are the other ``AttentionSpec`` fields (``fixed``, ``paper``, ``approximates``,
  ``complexity``, ``learnable``, ``aliases``, ``supports_position_bias``, ...). The module's dataclass
  fields are its options; they are config fields only if the mechanism is registered before the config
  is built (import the plugin at the top of the config file). Without ``module`` it is a class decorator.
  """
  def decorate(cls):
    _ensure_loaded()
    register(AttentionSpec(name=name, module=cls, **spec_fields))
    _SOURCES[('mechanism', name.lower())] = _source_file(cls)
    return cls
  return decorate if module is None else decorate(module)


def canonical_name(name: str) -> str:
  """The registered name for ``name`` (aliases and case resolved); unknown names raise."""
  return get(name).name
