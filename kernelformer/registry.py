"""Attention registry: one name -> one mechanism, with loud errors for unknown names.

Every mechanism (random-feature kernels, softmax, Skyformer, RPE, ...) is a Flax module with the
same call signature, so the encoder never special-cases one::

    module = kernelformer.registry.build(attention_config)       # a flax.linen.Module
    out = module(q, k, v, mask=mask, causal=False, step=step, deterministic=True)

* ``q, k, v``: ``[batch, length, heads, head_dim]`` (the layout of ``jax.nn.dot_product_attention``).
* ``mask``: ``[batch, length]`` bool, True = real token (key padding mask), or None.
* ``causal``: static bool.
* ``step``: the training step (int32 scalar) or None (evaluation: the last training step's draw, kept
  in the ``features`` collection). Random-feature mechanisms redraw their projection every
  ``redraw_every`` steps from ``fold_in(rng, step // N)`` (``attention/draws.py``).
* ``deterministic``: True disables dropout.
* ``position_bias``: ``[heads, 2 * length - 1]`` relative-position bias b_{j-i} for offsets
  -(L-1)..(L-1) (index ``j - i + L - 1``), or None. Owned by the encoder (shared across layers or per
  layer); only mechanisms whose spec says ``supports_position_bias`` accept a non-None value.
* returns ``[batch, length, heads, head_dim]`` in the dtype of ``v``.

Every module of ``kernelformer.attention`` exports its mechanisms as ``SPECS`` (``attention/spec.py``'s
``AttentionSpec``); this module collects them on first use and never is imported by them. A user's
mechanism joins through ``kernelformer.plugins.register_mechanism``.

A mechanism's options live in the attention ConfigDict (``config.model.attention``); ``build``
passes each module the fields it declares and ignores the rest, so one config can switch kinds with
a single ``--config.model.attention.kind=...`` override.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import pkgutil
from typing import Any, Callable, Mapping

import flax.linen as nn

from kernelformer import attention as attention_pkg
from kernelformer.attention.spec import AttentionSpec

__all__ = ['AttentionSpec', 'register', 'get', 'build', 'list_kernels', 'specs']


_REGISTRY: dict[str, AttentionSpec] = {}
_ALIASES: dict[str, str] = {}


_LOADED = False


def _add(spec: AttentionSpec) -> AttentionSpec:
  for n in (spec.name, *spec.aliases):
    key = n.lower()
    if key in _REGISTRY or key in _ALIASES:
      raise ValueError(f'attention name {n!r} is registered twice')
  _REGISTRY[spec.name.lower()] = spec
  for a in spec.aliases:
    _ALIASES[a.lower()] = spec.name.lower()
  return spec


def _ensure_loaded() -> None:
  """Collects the ``SPECS`` of every module of ``kernelformer.attention`` (once, in module order)."""
  global _LOADED
  if _LOADED:
    return
  _LOADED = True
  for info in sorted(pkgutil.iter_modules(attention_pkg.__path__), key=lambda m: m.name):
    module = importlib.import_module(f'{attention_pkg.__name__}.{info.name}')
    for spec in getattr(module, 'SPECS', ()):
      _add(spec)


def register(spec: AttentionSpec) -> AttentionSpec:
  """Adds ``spec`` under its name and aliases; re-registering a name is an error."""
  _ensure_loaded()
  return _add(spec)


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


def option_types(of: list[AttentionSpec] | None = None) -> dict[str, type]:
  """Option name -> type for every option the mechanisms ``of`` (default: all) read; an option whose
  default is None keeps its value's type (str where the value has none)."""
  options: dict[str, type] = {}
  for spec in specs() if of is None else of:
    for f in dataclasses.fields(spec.module):
      if f.name not in ('parent', 'name', *spec.fixed, *options):
        default = f.default
        options[f.name] = ({'feature_eps': float}.get(f.name, str)
                           if default is dataclasses.MISSING or default is None else type(default))
  return options


def option_names(name: str) -> list[str]:
  """The attention-config options the mechanism ``name`` reads."""
  spec = get(name)
  fields = {f.name for f in dataclasses.fields(spec.module)} - {'parent', 'name'}
  return sorted(fields - set(spec.fixed))


ModuleFactory = Callable[..., nn.Module]


class KernelPluginError(UnknownKernelError):
  """A plugin (``config.model.attention.plugin``) that cannot be found; the message says where we looked."""


def canonical_name(name: str) -> str:
  """The registered name for ``name`` (aliases and case resolved); unknown names raise."""
  return get(name).name
