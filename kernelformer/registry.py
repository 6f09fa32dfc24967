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


def get(name: str) -> AttentionSpec:
  """The spec for ``name`` (case-insensitive, aliases allowed); a one-line error otherwise."""
  _ensure_loaded()
  key = name.lower()
  key = _ALIASES.get(key, key)
  if key not in _REGISTRY:
    valid = list_kernels()
    close = difflib.get_close_matches(key, valid + list(_ALIASES), n=3)
    hint = f' Did you mean {", ".join(close)}?' if close else ''
    raise UnknownKernelError(
        f'unknown attention kind {name!r}.{hint} Valid kinds: {", ".join(valid)} '
        f'(aliases: {", ".join(sorted(_ALIASES))}).')
  return _REGISTRY[key]


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
