"""Environment for the tests' subprocesses (a ``kernelformer`` command run as a user runs it).

Import as ``from tests import procs`` (``tests`` is a namespace package found through pytest.ini's
``pythonpath = .``).
"""
from __future__ import annotations

import os


def xla_flags(devices: int = 1) -> str:
  """``devices`` CPU devices, plus the suite's other XLA flags (tests/conftest.py: fast compilation,
  and any ``--xla_cpu_max_isa`` the run was given): none of them changes what a command does, only how
  long XLA spends compiling it."""
  others = [f for f in os.environ.get('XLA_FLAGS', '').split()
            if not f.startswith('--xla_force_host_platform_device_count')]
  return ' '.join([f'--xla_force_host_platform_device_count={devices}', *others])


def env(devices: int = 1, **extra: str) -> dict[str, str]:
  """This process's environment (the suite's data folder and compilation cache included) on the CPU
  with ``devices`` devices, plus ``extra``."""
  return {**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': xla_flags(devices), **extra}
