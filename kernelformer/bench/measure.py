"""Compile once, read XLA's cost and memory analysis, then time the compiled executable.

Timing and memory come from the *same* compiled executable (``jax.jit(f).lower(*args).compile()``), so the
reported FLOPs and bytes describe exactly the program that was timed:

* ``compiled.memory_analysis()``: argument, output and temp (scratch) bytes of the executable. The
  reported "compiled memory" is temp + argument + output, the peak the executable can need on top of
  nothing else; temp is reported separately because it is what the algorithm adds (the arguments and
  outputs have the same size for every mechanism at one shape).
* ``compiled.cost_analysis()``: XLA's FLOP count (multiply-adds count 2) and transcendental count.
  XLA counts what its HLO cost model knows: dots, convolutions and elementwise ops; an FFT custom call may
  count as 0 FLOPs on some backends, so FLOP/s of FFT-based programs is a lower bound. A negative count is
  XLA's "unknown" (the GPU backend gives -1 for programs that are one cuBLAS custom call, e.g. a plain
  matmul) and is reported as None, never used as a count.
* Time: one untimed warm-up call, then the median wall time of ``repeats`` calls, each ended by
  ``block_until_ready`` (JAX dispatch is asynchronous). The median, not the mean, because a shared machine
  adds one-sided outliers. Calls of many seconds may skip the warm-up and get fewer repeats (a budget).
* XLA's memory analysis is its buffer assignment; the process's real peak can be much larger on CPU
  (the runtime maps fresh pages for large buffers on every call), which is why the benchmark also
  records the process's peak resident set.

``matmul_flops_per_second`` measures a large dense matmul in the same process: achieved FLOP/s of a
mechanism is reported as a fraction of it, which is meaningful across machines where absolute times
are not.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class CompiledStats:
  """What XLA says about one compiled executable (bytes and FLOPs; None where XLA reports nothing)."""

  flops: Optional[float]
  transcendentals: Optional[float]
  bytes_accessed: Optional[float]
  temp_bytes: int
  argument_bytes: int
  output_bytes: int

  @property
  def total_bytes(self) -> int:
    """temp + argument + output: the memory the executable needs while it runs."""
    return self.temp_bytes + self.argument_bytes + self.output_bytes


def _cost_dict(compiled) -> dict[str, float]:
  # jax returned a one-element list of dicts (one per computation) before 0.4.3x and a dict since.
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  return dict(cost or {})


def compile_with_stats(fn: Callable[..., Any], *args, options=None) -> tuple[Any, CompiledStats]:
  """``jax.jit(fn)`` lowered and compiled (XLA ``options``) for ``args``; returns ``(compiled, stats)``."""
  compiled = jax.jit(fn).lower(*args).compile(options)
  cost = _cost_dict(compiled)
  mem = compiled.memory_analysis()
  # XLA marks a count it does not know with a negative number (-1 for a cuBLAS custom call on GPU).
  get = lambda name: float(cost[name]) if name in cost and float(cost[name]) >= 0 else None
  stats = CompiledStats(
      flops=get('flops'), transcendentals=get('transcendentals'),
      bytes_accessed=get('bytes accessed'),
      temp_bytes=int(getattr(mem, 'temp_size_in_bytes', 0)),
      argument_bytes=int(getattr(mem, 'argument_size_in_bytes', 0)),
      output_bytes=int(getattr(mem, 'output_size_in_bytes', 0)))
  return compiled, stats


@dataclasses.dataclass(frozen=True)
class Timing:
  """Wall times of the timed calls (seconds) after the warm-up call."""

  warmup_s: float
  times_s: tuple[float, ...]

  @property
  def median_s(self) -> float:
    return statistics.median(self.times_s)


def time_compiled(compiled, args: Sequence[Any], *, repeats: int,
                  budget_s: Optional[float] = None, warmup: bool = True) -> Timing:
  """One warm-up call (unless ``warmup=False``), then up to ``repeats`` timed calls of ``compiled(*args)``.

  With ``budget_s`` the number of timed calls is cut so that all calls stay near the budget (at least
  one timed call is always made): slow cells of a long benchmark then get fewer repeats instead of
  stretching the run. The count actually made is ``len(times_s)``. Skipping the warm-up is meant for
  calls of many seconds, where the one-off costs of a first call (page-ins, thread start) are noise.
  """
  def call() -> float:
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    return time.perf_counter() - start

  warmup_s = call() if warmup else 0.0
  times = [] if warmup else [call()]
  per_call = warmup_s if warmup else times[0]
  n = max(1, int(repeats))
  if budget_s is not None and per_call > 0:
    n = max(1, min(n, int((budget_s - warmup_s - sum(times)) // per_call) + len(times)))
  while len(times) < n:
    times.append(call())
  return Timing(warmup_s=warmup_s, times_s=tuple(times))


def matmul_flops_per_second(size: int = 2048, dtype=jnp.float32, repeats: int = 5,
                            seed: int = 0) -> tuple[float, float]:
  """Achieved FLOP/s of a dense ``[size, size] @ [size, size]`` matmul; returns ``(flop_per_s, flops)``.

  The FLOP count is ``2 n^3`` (one multiply-add = 2 FLOPs, XLA's own convention for dots); XLA's
  cost analysis is not used here: on GPU it reports -1 ("unknown") for the cuBLAS call, which once
  made the peak print as -0.0 TFLOP/s.
  """
  ka, kb = jax.random.split(jax.random.PRNGKey(seed))
  a = jax.random.normal(ka, (size, size), jnp.float32).astype(dtype)
  b = jax.random.normal(kb, (size, size), jnp.float32).astype(dtype)
  compiled, _ = compile_with_stats(jnp.matmul, a, b)
  flops = 2.0 * size ** 3
  timing = time_compiled(compiled, (a, b), repeats=repeats)
  return flops / timing.median_s, flops


def load_average() -> str:
  """The 1-, 5- and 15-minute load averages, as every benchmark table states them ('n/a' if none)."""
  try:
    return ' '.join(f'{x:.1f}' for x in os.getloadavg())
  except (OSError, AttributeError):
    return 'n/a'


def peak_rss_mib() -> Optional[float]:
  """This process's resident high-water mark ``VmHWM`` in MiB (None where /proc is not Linux's)."""
  try:
    with open('/proc/self/status') as f:
      for line in f:
        if line.startswith('VmHWM:'):
          return int(line.split()[1]) / 1024.0
  except OSError:
    pass
  return None
