"""Reusable measurement code behind ``scripts/benchmark_attention.py`` and ``scripts/approximation.py``.

* ``measure``: ahead-of-time compilation with XLA's cost and memory analysis, wall-clock timing of the
  compiled executable, and a dense-matmul reference for FLOP/s.
* ``attention_cost``: the time / memory / FLOPs grid of registry mechanisms versus length, the checks of
  the issue's claims, and the CSV / markdown / PNG writers.
* ``approximation``: the approximation-quality experiments of the papers (Performer note MSE vs features,
  Luo et al. fig. 1b, the Spectraformer component x weight grid, Skyformer fig. 1).
* ``output``: CSV, markdown and matplotlib (Agg) helpers shared by both.

The scripts only parse flags and call into these modules, so tests exercise the same code.
"""
from __future__ import annotations
