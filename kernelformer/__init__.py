"""kernelformer: kernelized (linear-complexity) attention for the Long Range Arena, in JAX/Flax.

``kernelformer.registry``, ``build_attention`` and ``list_kernels`` load on first use (PEP 562), so the
command line and the config files (``kernelformer.configs``) start without importing JAX.
"""
import importlib

__all__ = ['registry', 'build_attention', 'list_kernels']


def __getattr__(name):
  if name == 'registry':
    return importlib.import_module('kernelformer.registry')
  if name == 'build_attention':
    return importlib.import_module('kernelformer.registry').build
  if name == 'list_kernels':
    return importlib.import_module('kernelformer.registry').list_kernels
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
