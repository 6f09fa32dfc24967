"""Attention mechanisms. Importing this package imports every submodule; each exports its ``SPECS``,
which ``kernelformer.registry`` collects.

Auto-discovery (rather than a hand-kept import list) means adding a mechanism is adding one file.
"""
import importlib as _importlib
import pkgutil as _pkgutil

for _info in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
  _importlib.import_module(f'{__name__}.{_info.name}')
