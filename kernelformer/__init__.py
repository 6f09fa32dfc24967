"""kernelformer: kernelized (linear-complexity) attention for the Long Range Arena, in JAX/Flax.

The package's names load on first use (PEP 562): ``import kernelformer`` costs nothing until
``kernelformer.registry`` / ``build_attention`` / ``list_kernels`` is touched, so the ``kernelformer``
command can take over Ctrl-C before jax and flax load (``kernelformer.training.signals``), and the
command line and the config files (``kernelformer.configs``) start without importing JAX.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ['registry', 'build_attention', 'list_kernels']


def __getattr__(name: str) -> Any:
  if name == 'registry':
    return importlib.import_module('kernelformer.registry')
  if name in ('build_attention', 'list_kernels'):
    registry = importlib.import_module('kernelformer.registry')
    return registry.build if name == 'build_attention' else registry.list_kernels
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
