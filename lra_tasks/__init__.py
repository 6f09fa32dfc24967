"""The Long Range Arena tasks: ``lra_tasks.get(name)`` returns a ``common.Task``.

Task modules are imported lazily, so a task's optional dependencies (tensorflow-datasets, PIL) are only
imported when that task is used.
"""
from __future__ import annotations

import importlib

from lra_tasks.common import DataError, Task, TaskInfo  # noqa: F401

_MODULES = {
    'listops': 'lra_tasks.listops',
    'text': 'lra_tasks.text',
    'retrieval': 'lra_tasks.retrieval',
    'image': 'lra_tasks.image',
    'pathfinder': 'lra_tasks.pathfinder',
    # Causal language-model tasks (kernelformer/decoder.py): byte-level enwik8 and synthetic recall.
    'enwik8': 'lra_tasks.enwik8',
    'mqar': 'lra_tasks.mqar',
    'mqar_legacy': 'lra_tasks.mqar_legacy',
    'selective_copy': 'lra_tasks.selective_copy',
}


def names() -> list[str]:
  return sorted(_MODULES)


def get(name: str) -> Task:
  """The task called ``name``; an unknown name lists the valid ones."""
  if name not in _MODULES:
    raise ValueError(f'unknown task {name!r}; valid tasks: {", ".join(names())}')
  return importlib.import_module(_MODULES[name]).TASK
