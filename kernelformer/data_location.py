"""Where the task data lives when a config does not say: one rule, the same from any directory.

``config.data.data_dir`` defaults (``configs/common.py``) to

1. ``$KERNELFORMER_DATA``, when set (``~`` expanded, made absolute), else
2. the per-user cache directory of the XDG base-directory rule: ``$XDG_CACHE_HOME/kernelformer/data``
   when ``XDG_CACHE_HOME`` is an absolute path, else ``~/.cache/kernelformer/data``.

An explicit ``--config.data.data_dir=DIR`` (or a config file that sets it) wins. So a run started
from ``/`` or from a repository checkout reads and writes the same files, and nothing lands in the
current directory. ``kernelformer train`` prints the directory at the start of a run and
``prepare-data --check`` in its report. Imports nothing heavy (config files import it).
"""
from __future__ import annotations

import os
from typing import Optional

ENV_VAR = 'KERNELFORMER_DATA'


def cache_root() -> str:
  """``$XDG_CACHE_HOME`` (when absolute, as the XDG rule requires) else ``~/.cache``."""
  xdg = os.environ.get('XDG_CACHE_HOME', '')
  return xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser('~'), '.cache')


def default_data_dir() -> str:
  """``$KERNELFORMER_DATA`` if set, else ``<cache_root()>/kernelformer/data`` (absolute)."""
  env = os.environ.get(ENV_VAR, '').strip()
  if env:
    return os.path.abspath(os.path.expanduser(env))
  return os.path.join(cache_root(), 'kernelformer', 'data')


def describe(data_dir: Optional[str]) -> str:
  """One line: the absolute directory and why it is the one (for the start of a run and --check)."""
  path = os.path.abspath(os.path.expanduser(str(data_dir)))
  env = os.environ.get(ENV_VAR, '').strip()
  if path == default_data_dir():
    why = f'${ENV_VAR}' if env else f'the per-user default; set ${ENV_VAR} or --config.data.data_dir to move it'
  else:
    why = 'config.data.data_dir'
  return f'data: {path} ({why})'
