"""The catalog of feature maps: every ``FeatureMap`` record, built-in and registered, by name.

The built-in records come from the modules that define the maps (``components.FEATURE_MAPS``,
``maps.FEATURE_MAPS``); a user's map joins through ``register`` (``kernelformer.plugins``). Nothing else
holds a per-map table: what a map is (its function, target kernel, parts, positivity, log-space form,
causal shift, ...) is read from ``get(name)``.
"""
from __future__ import annotations

from kernelformer.features import components, maps
from kernelformer.features.feature_map import FeatureMap

_RECORDS: dict[str, FeatureMap] = {}


def register(record: FeatureMap) -> FeatureMap:
  """Adds ``record`` under its name; a name registered twice is an error. Returns the record."""
  if not isinstance(record, FeatureMap):
    raise TypeError(f'expected a kernelformer.features.feature_map.FeatureMap, got {record!r}')
  if record.name in _RECORDS:
    raise ValueError(f'component {record.name!r} is registered twice')
  _RECORDS[record.name] = record
  return record


for _record in (*components.FEATURE_MAPS, *maps.FEATURE_MAPS):
  register(_record)


def get(name: str) -> FeatureMap:
  """The record of component ``name``; a one-line error listing the valid names otherwise."""
  record = _RECORDS.get(name)
  if record is None:
    raise ValueError(f'unknown component {name!r}; valid: {", ".join(sorted(_RECORDS))}')
  return record


def names() -> list[str]:
  """Every component name, in registration order (built-ins first)."""
  return list(_RECORDS)


def records() -> list[FeatureMap]:
  """Every record, in registration order."""
  return list(_RECORDS.values())


def has(name: str) -> bool:
  return name in _RECORDS
