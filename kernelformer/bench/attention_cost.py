"""Cost of attention mechanisms versus sequence length: time, compiled memory, FLOPs.

What is measured, for every registry name asked for and every length, in one process, and why:
docs/benchmarks.md, "Cost versus length"; time and memory are also given over softmax's at the same
length and mode. The mechanisms are the papers' (Spectraformer eq. 7 linear attention, Luo et al.
Algorithm 1 RPE by FFT, Skyformer eqs. 4-6, Nyströmformer, Linformer), built by ``registry.build`` with
one option set, the feature budget M mapped to each one's own name for it (``num_features``,
``num_landmarks``, ``linformer_k``).

Cells that would not fit are not run: one whose compiled memory exceeds ``max_memory_gb`` keeps its
memory and FLOPs but no time; one whose time, extrapolated from the previous length, would exceed
``max_call_s`` is skipped (the row's ``note`` says which). Calls predicted to take more than a quarter of
``cell_budget_s`` get no warm-up; every cell gets as many repeats as fit in ``cell_budget_s`` (>= 1).
XLA's buffer assignment is not the process's real peak on CPU (softmax at 16K fwd+bwd: 6.1 GiB
assigned, about 17 GB resident), so each row also carries ``peak_rss_mib``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import os
import statistics
import sys
import time
import traceback
from typing import Any, Callable, Iterable, Optional, Sequence

import jax
import jax.numpy as jnp

from kernelformer import registry
from kernelformer.attention.random_features import RandomFeatureAttention
from kernelformer.bench import measure, output
from kernelformer.features import catalog

Array = jax.Array

# A representative set: exact baselines, Nyström / low-rank methods, the random-feature grid's main
# components and samplers, learned kernels, the deterministic map and RPE by FFT.
DEFAULT_KINDS = ('softmax', 'gaussian', 'skyformer', 'nystromformer', 'linformer', 'posrf-orf',
                 'trigrf-orf', 'oprf-orf', 'saderf-orf', 'posrf-sorf', 'posrf-fastfood',
                 'linear-elu', 'gmm-prf', 'fastfood-prf', 'nprf-rpe')
DEFAULT_LENGTHS = (1024, 2048, 4096, 8192, 16384)
MODES = ('fwd', 'fwd+bwd')
MIB = float(1 << 20)

# The columns of the CSV, in order.
FIELDS = ('kind', 'family', 'mode', 'length', 'batch', 'heads', 'head_dim', 'num_features', 'dtype',
          'causal', 'status', 'note', 'time_ms', 'repeats', 'time_vs_softmax', 'total_mib', 'temp_mib',
          'argument_mib', 'output_mib', 'memory_vs_softmax', 'gflop', 'transcendentals',
          'gflop_per_s', 'frac_matmul', 'peak_rss_mib', 'compile_s')


def family(kind: str) -> str:
  """'quadratic' (softmax, gaussian), 'rpe-fft', 'feature-map' (random/deterministic features), 'low-rank'."""
  spec = registry.get(kind)
  if spec.name in ('softmax', 'gaussian'):
    return 'quadratic'
  if spec.requires_position_bias:
    return 'rpe-fft'
  if issubclass(spec.module, RandomFeatureAttention):
    return 'feature-map'
  return 'low-rank'


@dataclasses.dataclass(frozen=True)
class Setup:
  """One benchmark configuration (everything but the kind, the length and the mode)."""

  batch: int = 1
  heads: int = 2
  head_dim: int = 64
  num_features: int = 128
  dtype: str = 'float32'
  causal: bool = False
  repeats: int = 5
  max_memory_gb: float = 8.0     # cells whose compiled memory exceeds this are compiled but not run
  max_call_s: float = 120.0      # cells predicted to take longer per call are skipped
  cell_budget_s: float = 60.0    # warm-up + timed calls of one cell; fewer repeats when slow
  matmul_size: int = 2048        # n of the n x n x n matmul that sets the FLOP/s reference
  seed: int = 0


def attention_options(kind: str, length: int, num_features: int) -> dict[str, Any]:
  """The attention config for ``kind``: one feature budget M under each mechanism's own option name."""
  return {'kind': kind, 'num_features': num_features, 'num_landmarks': num_features,
          'linformer_k': num_features, 'max_length': length}


def make_inputs(setup: Setup, length: int, seed: int = 0) -> dict[str, Array]:
  """q, k, v ~ N(0, 1) ``[B, L, H, D]``, a cotangent of the same shape, and a small RPE bias ``[H, 2L-1]``."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 5)
  shape = (setup.batch, length, setup.heads, setup.head_dim)
  dtype = jnp.dtype(setup.dtype)
  normal = lambda k, s: jax.random.normal(k, s, jnp.float32)
  return {'q': normal(keys[0], shape).astype(dtype), 'k': normal(keys[1], shape).astype(dtype),
          'v': normal(keys[2], shape).astype(dtype), 'cotangent': normal(keys[3], shape).astype(dtype),
          'position_bias': 0.1 * normal(keys[4], (setup.heads, 2 * length - 1))}


def build_programs(kind: str, setup: Setup, inputs: dict[str, Array],
                   options: Optional[dict[str, Any]] = None):
  """The forward and forward+backward functions of ``kind`` and their arguments.

  ``options``: attention options over ``attention_options`` (e.g. ``{'map_dim': 16}``). Returns
  ``(fwd, fwd_args, fwd_bwd, fwd_bwd_args)``. Variables are initialized under ``jax.jit`` (the
  forward inside ``init`` is then dead code and costs nothing at 16K).
  """
  length = inputs['q'].shape[1]
  module = registry.build({**attention_options(kind, length, setup.num_features), **(options or {})})
  spec = registry.get(kind)
  bias = inputs['position_bias'] if spec.requires_position_bias else None
  rng = jax.random.PRNGKey(setup.seed + 1)
  k_params, k_features = jax.random.split(rng)
  causal = setup.causal

  def init(kp, kf, q, k, v, pb):
    return module.init({'params': kp, 'features': kf}, q, k, v, causal=causal, position_bias=pb)

  variables = jax.jit(init)(k_params, k_features, inputs['q'], inputs['k'], inputs['v'], bias)

  def fwd(variables, key, q, k, v, pb):
    return module.apply(variables, q, k, v, causal=causal, position_bias=pb,
                        rngs={'features': key})

  def fwd_bwd(variables, key, q, k, v, pb, cotangent):
    _, vjp = jax.vjp(lambda q_, k_, v_: fwd(variables, key, q_, k_, v_, pb), q, k, v)
    return vjp(cotangent)

  args = (variables, k_features, inputs['q'], inputs['k'], inputs['v'], bias)
  return fwd, args, fwd_bwd, args + (inputs['cotangent'],)


def _row(kind: str, mode: str, length: int, setup: Setup) -> dict[str, Any]:
  return {'kind': kind, 'family': family(kind), 'mode': mode, 'length': length,
          'batch': setup.batch, 'heads': setup.heads, 'head_dim': setup.head_dim,
          'num_features': setup.num_features, 'dtype': setup.dtype, 'causal': setup.causal,
          'status': 'ok', 'note': ''}


def _fill_stats(row: dict[str, Any], stats: measure.CompiledStats) -> None:
  row['total_mib'] = stats.total_bytes / MIB
  row['temp_mib'] = stats.temp_bytes / MIB
  row['argument_mib'] = stats.argument_bytes / MIB
  row['output_mib'] = stats.output_bytes / MIB
  row['gflop'] = None if stats.flops is None else stats.flops / 1e9
  row['transcendentals'] = stats.transcendentals


def _predicted_s(history: list[tuple[int, float]], length: int, quadratic: bool) -> Optional[float]:
  """Per-call time at ``length`` extrapolated from the last measured length (L^2 or L^1.3 growth)."""
  if not history:
    return None
  last_len, last_s = history[-1]
  exponent = 2.0 if quadratic else 1.3
  return last_s * (length / last_len) ** exponent


def run(kinds: Sequence[str], lengths: Sequence[int], setup: Setup, *,
        log: Callable[[str], None] = print) -> tuple[list[dict[str, Any]], dict[str, Any]]:
  """Measures every (kind, length, mode); returns ``(rows, info)``.

  ``info`` holds the matmul reference (``matmul_gflop_per_s``) and the kinds that failed to build
  (``skipped``: name -> one-line reason). Softmax is measured first when present so that each row can
  carry its ratio to softmax.
  """
  kinds = list(dict.fromkeys(kinds))
  if 'softmax' in kinds:
    kinds.remove('softmax')
    kinds.insert(0, 'softmax')
  matmul_flop_s, _ = measure.matmul_flops_per_second(setup.matmul_size, dtype=jnp.dtype(setup.dtype))
  log(f'dense matmul reference: {matmul_flop_s / 1e9:.1f} GFLOP/s ({setup.dtype})')
  rows: list[dict[str, Any]] = []
  skipped: dict[str, str] = {}
  inputs_cache: dict[int, dict[str, Array]] = {}
  for kind in kinds:
    try:
      registry.get(kind)
    except registry.UnknownKernelError as e:
      skipped[kind] = str(e).split('.')[0]
      log(f'skip {kind}: {skipped[kind]}')
      continue
    quadratic = family(kind) == 'quadratic'
    history: dict[str, list[tuple[int, float]]] = {m: [] for m in MODES}
    for length in sorted(lengths):
      inputs = inputs_cache.setdefault(length, make_inputs(setup, length, setup.seed))
      try:
        fwd, fwd_args, fwd_bwd, fwd_bwd_args = build_programs(kind, setup, inputs)
      except Exception as e:  # pylint: disable=broad-except
        # A mechanism that cannot be built at this configuration (e.g. no causal form) is reported
        # and skipped, not a crash of the whole run.
        skipped[kind] = f'{type(e).__name__}: {e}'.splitlines()[0][:200]
        log(f'skip {kind}: {skipped[kind]}')
        break
      for mode, fn, args in (('fwd', fwd, fwd_args), ('fwd+bwd', fwd_bwd, fwd_bwd_args)):
        row = _row(kind, mode, length, setup)
        rows.append(row)
        try:
          start = time.perf_counter()
          compiled, stats = measure.compile_with_stats(fn, *args)
          row['compile_s'] = time.perf_counter() - start
        except Exception as e:  # pylint: disable=broad-except
          row['status'], row['note'] = 'error', f'compile: {type(e).__name__}: {e}'.splitlines()[0][:200]
          log(f'{kind} L={length} {mode}: {row["note"]}')
          log(traceback.format_exc(limit=2))
          continue
        _fill_stats(row, stats)
        predicted = _predicted_s(history[mode], length, quadratic)
        if stats.total_bytes > setup.max_memory_gb * (1 << 30):
          row['status'] = 'not run'
          row['note'] = (f'compiled memory {stats.total_bytes / (1 << 30):.1f} GiB > '
                         f'--max_memory_gb {setup.max_memory_gb:g}')
        elif predicted is not None and predicted > setup.max_call_s:
          row['status'] = 'not run'
          row['note'] = f'predicted {predicted:.0f} s per call > --max_call_s {setup.max_call_s:g}'
        else:
          # Calls predicted to take more than a quarter of the cell budget get no warm-up call.
          warmup = predicted is None or predicted < setup.cell_budget_s / 4
          if not warmup:
            row['note'] = f'no warm-up (predicted {predicted:.0f} s per call)'
          timing = measure.time_compiled(compiled, args, repeats=setup.repeats,
                                         budget_s=setup.cell_budget_s, warmup=warmup)
          row['time_ms'] = timing.median_s * 1e3
          row['repeats'] = len(timing.times_s)
          history[mode].append((length, timing.median_s))
          if stats.flops:
            row['gflop_per_s'] = stats.flops / timing.median_s / 1e9
            row['frac_matmul'] = stats.flops / timing.median_s / matmul_flop_s
        del compiled
        row['peak_rss_mib'] = peak_rss_mib()
        log(_progress(row))
      del fwd_args, fwd_bwd_args
      gc.collect()
  add_softmax_ratios(rows)
  return rows, {'matmul_gflop_per_s': matmul_flop_s / 1e9, 'skipped': skipped}


def peak_rss_mib() -> Optional[float]:
  """The process's peak resident set so far (MiB; ``getrusage`` high-water mark), None if unknown.

  Monotone over the run: a row whose value is larger than every earlier row's set a new peak, and then
  it is that cell's real peak memory (XLA's buffer assignment above does not see allocator overheads).
  """
  try:
    import resource  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  # ru_maxrss is in KiB on Linux (bytes on macOS).
  scale = 1.0 / 1024 if not sys.platform.startswith('darwin') else 1.0 / MIB
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _progress(row: dict[str, Any]) -> str:
  t = output.fmt(row.get('time_ms'), '.4g')
  return (f'{row["kind"]:>16s} L={row["length"]:<6d} {row["mode"]:<7s} time {t} ms  '
          f'mem {output.fmt(row.get("total_mib"), ".4g")} MiB (temp {output.fmt(row.get("temp_mib"), ".4g")})'
          f'  {row["status"]} {row["note"]}')


def add_softmax_ratios(rows: list[dict[str, Any]]) -> None:
  """Adds ``time_vs_softmax`` and ``memory_vs_softmax`` (kind / softmax; < 1 means cheaper)."""
  ref = {(r['mode'], r['length']): r for r in rows if r['kind'] == 'softmax'}
  for r in rows:
    s = ref.get((r['mode'], r['length']))
    if s is None:
      continue
    if r.get('time_ms') and s.get('time_ms'):
      r['time_vs_softmax'] = r['time_ms'] / s['time_ms']
    if r.get('total_mib') and s.get('total_mib'):
      r['memory_vs_softmax'] = r['total_mib'] / s['total_mib']


# ---------------------------------------------------------------------------------------------------
# Claims of the issue, checked on the rows of one run.
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Claim:
  name: str
  status: str      # 'met', 'not met' or 'not measured'
  detail: str


def _lookup(rows, kind, mode, length, key):
  for r in rows:
    if r['kind'] == kind and r['mode'] == mode and r['length'] == length:
      value = r.get(key)
      return value if value not in (None, '') else None
  return None


def _versus_softmax(rows, fmap, l_max, mode, speedup, memory_saving) -> list[Claim]:
  """Claims 1 and 2: the best feature-map kernel's time and compiled memory against softmax's."""
  claims = []
  for key, unit, what, factor, missing in (
      ('time_ms', 'ms', 'fwd+bwd time', speedup, 'softmax (or every linear kernel) was not timed at this length'),
      ('total_mib', 'MiB', 'compiled memory', memory_saving,
       'no softmax (or linear-kernel) compilation at this length')):
    soft = _lookup(rows, 'softmax', mode, l_max, key)
    values = {k: _lookup(rows, k, mode, l_max, key) for k in fmap}
    values = {k: x for k, x in values.items() if x}
    name = f'{what} at L={l_max}: best linear kernel >= {factor:g}x below softmax'
    if soft is None or not values:
      claims.append(Claim(name, 'not measured', missing))
      continue
    best = min(values, key=values.get)
    ratio = soft / values[best]
    claims.append(Claim(name, 'met' if ratio >= factor else 'not met',
                        f'{best} {values[best]:.4g} {unit} vs softmax {soft:.4g} {unit}: {ratio:.1f}x'))
  return claims


def _memory_growth(rows, fmap, l_max, mode, memory_growth) -> Claim:
  """Claim 3: feature-map memory grows linearly from L_max / 4 to L_max."""
  quarter = l_max // 4
  growth = {}
  for k in fmap:
    hi, lo = _lookup(rows, k, mode, l_max, 'total_mib'), _lookup(rows, k, mode, quarter, 'total_mib')
    if hi and lo:
      growth[k] = hi / lo
  if not growth:
    return Claim(f'memory linear: memory({l_max}) / memory({quarter}) <= {memory_growth:g}',
                 'not measured', f'needs lengths {quarter} and {l_max}')
  worst = max(growth, key=growth.get)
  return Claim(f'memory linear: memory({l_max}) / memory({quarter}) <= {memory_growth:g} (fwd+bwd)',
               'met' if growth[worst] <= memory_growth else 'not met',
               f'worst {worst} {growth[worst]:.2f}; median {statistics.median(growth.values()):.2f} '
               f'over {len(growth)} kernels')


def _rpe_scaling(rows, fmap, l_min, l_max, mode, rpe_tolerance) -> list[Claim]:
  """Claim 4: RPE by FFT scales like the linear kernels from L_min to L_max."""
  def time_ratio(k):
    hi, lo = _lookup(rows, k, mode, l_max, 'time_ms'), _lookup(rows, k, mode, l_min, 'time_ms')
    return hi / lo if hi and lo else None
  rpe_kinds = sorted({r['kind'] for r in rows if r['family'] == 'rpe-fft'})
  lin_ratios = [x for x in (time_ratio(k) for k in fmap) if x]
  rpe_ratios = {k: time_ratio(k) for k in rpe_kinds}
  rpe_ratios = {k: x for k, x in rpe_ratios.items() if x}
  name = (f'RPE by FFT n log n: time({l_max}) / time({l_min}) within {rpe_tolerance:g}x of the linear '
          'kernels\'')
  if not rpe_ratios or not lin_ratios:
    return [Claim(name, 'not measured', 'nprf-rpe or the linear kernels were not timed at both ends')]
  lin = statistics.median(lin_ratios)
  claims = []
  for k, x in rpe_ratios.items():
    rel = x / lin
    ok = 1.0 / rpe_tolerance <= rel <= rpe_tolerance
    claims.append(Claim(name, 'met' if ok else 'not met',
                        f'{k} {x:.1f}x vs linear-kernel median {lin:.1f}x (ratio {rel:.2f}); '
                        f'ideal linear {l_max / l_min:.0f}x, n log n '
                        f'{l_max * math.log2(l_max) / (l_min * math.log2(l_min)):.1f}x'))
  return claims


def _structured(rows, fmap, l_max, head_dim, structured_tolerance) -> list[Claim]:
  """Claim 5: FastFood / SORF against the dense projection (ORF) of the same component."""
  name = f'FastFood / SORF not slower than a dense projection (ORF) at the same M, d={head_dim}'
  if head_dim < 64:
    return [Claim(name, 'not measured', 'the claim is for head_dim >= 64')]
  claims = []
  for comp in sorted({k.split('-')[0] for k in fmap}):
    dense = f'{comp}-orf'
    for structured in (f'{comp}-fastfood', f'{comp}-sorf'):
      for m in MODES:
        t_d = _lookup(rows, dense, m, l_max, 'time_ms')
        t_s = _lookup(rows, structured, m, l_max, 'time_ms')
        if t_d and t_s:
          claims.append(Claim(f'{name}: {structured} vs {dense}, {m}, L={l_max}',
                              'met' if t_s <= structured_tolerance * t_d else 'not met',
                              f'{t_s:.4g} ms vs {t_d:.4g} ms (ratio {t_s / t_d:.2f})'))
  return claims or [Claim(name, 'not measured', 'no (component-fastfood or -sorf, component-orf) pair')]


def check_claims(rows: Sequence[dict[str, Any]], *, head_dim: int,
                 speedup: float = 20.0, memory_saving: float = 20.0, memory_growth: float = 4.5,
                 rpe_tolerance: float = 1.5, structured_tolerance: float = 1.05) -> list[Claim]:
  """The issue's claims, each met / not met / not measured, with the numbers behind the verdict.

  1. At the largest length, the fastest feature-map kernel's fwd+bwd time is ``speedup`` x below softmax's.
  2. ... and its compiled memory ``memory_saving`` x below (known from compilation even if not run).
  3. Feature-map memory is linear: memory(L_max) / memory(L_max / 4) <= ``memory_growth`` for every one.
  4. NPRF+RPE is n log n: its time(L_max) / time(L_min) is within ``rpe_tolerance`` x of the median of
     the feature-map kernels' ratios.
  5. FastFood / SORF are not slower than the dense projection (ORF) of the same component and M for
     head_dim >= 64, at the largest length: time ratio <= ``structured_tolerance`` (5% timing noise).
  """
  lengths = sorted({r['length'] for r in rows})
  if not lengths:
    return [Claim('all', 'not measured', 'no rows')]
  l_max, l_min = lengths[-1], lengths[0]
  mode = 'fwd+bwd'
  fmap = sorted({r['kind'] for r in rows if r['family'] == 'feature-map'})
  return (_versus_softmax(rows, fmap, l_max, mode, speedup, memory_saving)
          + [_memory_growth(rows, fmap, l_max, mode, memory_growth)]
          + _rpe_scaling(rows, fmap, l_min, l_max, mode, rpe_tolerance)
          + _structured(rows, fmap, l_max, head_dim, structured_tolerance))


def format_claims(claims: Iterable[Claim]) -> str:
  return '\n'.join(f'[{c.status.upper():>12s}] {c.name}: {c.detail}' for c in claims)


# ---------------------------------------------------------------------------------------------------
# Outputs.
# ---------------------------------------------------------------------------------------------------

TABLE_COLUMNS = (
    ('kind', 'kind', str), ('mode', 'mode', str), ('L', 'length', 'd'),
    ('time ms', 'time_ms', output.num), ('n', 'repeats', 'd'),
    ('time / softmax', 'time_vs_softmax', '.3g'),
    ('memory MiB', 'total_mib', output.num), ('temp MiB', 'temp_mib', output.num),
    ('memory / softmax', 'memory_vs_softmax', '.3g'), ('GFLOP', 'gflop', '.3g'),
    ('GFLOP/s', 'gflop_per_s', '.3g'), ('of matmul', 'frac_matmul', '.1%'),
    ('peak RSS MiB', 'peak_rss_mib', '.0f'), ('note', 'note', str))


def markdown(rows: Sequence[dict[str, Any]], mode: Optional[str] = None) -> str:
  """The markdown table of ``rows`` (one mode or all), sorted by mode, kind, length."""
  selected = [r for r in rows if mode is None or r['mode'] == mode]
  return output.markdown_table(selected, TABLE_COLUMNS)


# Line style by family (quadratic dashed, low-rank dash-dot, feature maps solid, RPE dotted).
_LINESTYLES = {'quadratic': '--', 'low-rank': '-.', 'feature-map': '-', 'rpe-fft': ':'}
_MARKERS = ('.', 's', '^', 'v', 'D', 'x', '+', '*')


def pivot_markdown(rows: Sequence[dict[str, Any]], mode: str, key: str,
                   spec: str | Callable[[Any], str] = '.3g') -> str:
  """A kind x length table of one column (e.g. ``time_ms``) for one mode; '-' where not measured."""
  lengths = sorted({r['length'] for r in rows})
  table = []
  for kind in dict.fromkeys(r['kind'] for r in rows):
    line: dict[str, Any] = {'kind': kind}
    for r in rows:
      if r['kind'] == kind and r['mode'] == mode:
        line[str(r['length'])] = r.get(key)
    table.append(line)
  columns = [('kind', 'kind', str)] + [(f'L={n}', str(n), spec) for n in lengths]
  return output.markdown_table(table, columns)


def plot(rows: Sequence[dict[str, Any]], path_prefix: str, title: str = '') -> list[str]:
  """``<prefix>_time.png`` and ``<prefix>_memory.png``: log-log vs length, one panel per mode."""
  plt = output.pyplot()
  paths = []
  kinds = list(dict.fromkeys(r['kind'] for r in rows))
  for key, ylabel, suffix in (('time_ms', 'median time (ms)', 'time'),
                              ('total_mib', 'compiled memory: temp + args + out (MiB)', 'memory')):
    fig, axes = plt.subplots(1, len(MODES), figsize=(6.5 * len(MODES), 5.0), squeeze=False)
    for ax, mode in zip(axes[0], MODES):
      for i, kind in enumerate(kinds):
        pts = sorted((r['length'], r[key]) for r in rows
                     if r['kind'] == kind and r['mode'] == mode and r.get(key))
        if not pts:
          continue
        xs, ys = zip(*pts)
        is_ref = kind == 'softmax'
        ax.plot(xs, ys, marker='o' if is_ref else _MARKERS[i % len(_MARKERS)],
                markersize=6 if is_ref else 4, linewidth=3.0 if is_ref else 1.3,
                color='black' if is_ref else plt.cm.tab10(i % 10),
                linestyle='-' if is_ref else _LINESTYLES[family(kind)], label=kind)
      ax.set_xscale('log', base=2)
      ax.set_yscale('log')
      ax.set_xlabel('sequence length L')
      ax.set_ylabel(ylabel)
      ax.set_title(f'{mode} {title}'.strip())
      ax.grid(True, which='both', alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1.0))
    paths.append(output.save_figure(fig, f'{path_prefix}_{suffix}.png'))
  return paths


# ----------------------------------------------------------------------------------------------
# ``--compare official``: the project's posrf-orf against the official Performer FAVOR+.
# ----------------------------------------------------------------------------------------------

COMPARE_FIELDS = ('causal', 'mode', 'length', 'batch', 'heads', 'head_dim', 'num_features',
                  'masked_keys', 'ours_ms', 'official_ms', 'speedup', 'ours_temp_mib',
                  'official_temp_mib', 'ours_total_mib', 'official_total_mib', 'ours_peak_rss_mib',
                  'official_peak_rss_mib', 'max_abs_diff', 'repeats', 'load_1min', 'note')


def _reset_peak_rss() -> bool:
  """Resets this process's resident high-water mark (``VmHWM``; Linux ``clear_refs`` value 5)."""
  try:
    with open('/proc/self/clear_refs', 'w') as f:
      f.write('5')
    return True
  except OSError:
    return False


def compare_official(lengths: Sequence[int], setup: Setup, *, causal_modes: Sequence[bool] = (False, True),
                     modes: Sequence[str] = MODES,
                     log: Callable[[str], None] = print) -> list[dict[str, Any]]:
  """Ours (registry ``posrf-orf``) vs ``official_favor.favor_attention`` at equal B, H, d, M, W and mask.

  Both get the same W (``share_heads=True``: the official code has one projection for all heads) and
  the same key-padding mask (the last eighth of the keys); both programs are compiled, then timed
  interleaved (``setup.repeats`` rounds after one warm-up call each, order alternating; docs/benchmarks.md,
  "Against the official FAVOR+"): median per side, ``speedup = official / ours``, XLA temp memory, the
  max |ours - official| of the forward with the official ``eps`` set to 0 (the same estimate: float32
  rounding) and the 1-minute load at the end of the cell. A cell where either program needs more than
  ``setup.max_memory_gb`` is compiled but not run (``note`` says so). ``modes``: the subset of ``MODES``
  (the difference check only with ``'fwd'``; without ``'fwd+bwd'`` no cotangent is kept).

  Memory: only one side runs at a time and nothing of a side is kept between calls (each call's
  output is dropped when the call returns), so the process peak is the larger side's, not the sum;
  ``*_total_mib`` is XLA's temp + arguments + outputs of each executable and ``*_peak_rss_mib`` the
  process's resident high-water mark over that side's warm-up call alone (reset before it where Linux
  allows; it includes the shared inputs and the runtime). The difference check runs the official
  program first, so only its ``[B, L, H, d]`` output is held while ours runs. A cell whose run fails in
  the runtime (``JaxRuntimeError``, e.g. out of device memory) keeps its compiled memory, has no
  times, and its ``note`` starts with ``failed:``; the other cells still run and are written.
  """
  rows = []
  for causal in causal_modes:
    for length in sorted(lengths):
      args, fns, official_eps0 = _favor_pair(setup, length, causal, 'fwd+bwd' in modes)
      diff = None
      for mode in [m for m in MODES if m in modes]:
        compiled = [measure.compile_with_stats(f, *args) for f in fns[mode]]
        row = {'causal': causal, 'mode': mode, 'length': length, 'batch': setup.batch,
               'heads': setup.heads, 'head_dim': setup.head_dim, 'num_features': setup.num_features,
               'masked_keys': length // 8, 'ours_temp_mib': compiled[0][1].temp_bytes / MIB,
               'official_temp_mib': compiled[1][1].temp_bytes / MIB,
               'ours_total_mib': compiled[0][1].total_bytes / MIB,
               'official_total_mib': compiled[1][1].total_bytes / MIB,
               'ours_peak_rss_mib': None, 'official_peak_rss_mib': None, 'note': ''}
        cell = f'{"causal" if causal else "bidirectional"} L={length} {mode}'
        too_big, note = max(st.total_bytes for _, st in compiled), ''
        if too_big > setup.max_memory_gb * (1 << 30):
          note = (f'not run: compiled memory {too_big / (1 << 30):.1f} GiB > '
                  f'--max_memory_gb {setup.max_memory_gb:g}')
          log(f'{cell}: {note} (ours {row["ours_total_mib"]:.0f} MiB, official '
              f'{row["official_total_mib"]:.0f} MiB compiled)')
        else:
          try:
            if diff is None and mode == 'fwd':
              reference = jax.block_until_ready(jax.jit(official_eps0)(*args))   # the big side first
              diff = float(jnp.max(jnp.abs(compiled[0][0](*args) - reference)))
              del reference
            times = _time_interleaved(compiled, args, row, setup.repeats)
          except jax.errors.JaxRuntimeError as e:     # e.g. RESOURCE_EXHAUSTED on an accelerator
            note = f'failed: {(str(e).strip().splitlines() or [type(e).__name__])[0][:200]}'
            log(f'{cell}: {note}')
        del compiled
        if note:
          row.update(ours_ms=None, official_ms=None, speedup=None, max_abs_diff=diff, repeats=0,
                     load_1min=_load_1min(), note=note)
          rows.append(row)
          continue
        t_ours, t_off = (statistics.median(t) * 1e3 for t in times)
        row.update(ours_ms=t_ours, official_ms=t_off, speedup=t_off / t_ours, max_abs_diff=diff,
                   repeats=len(times[0]), load_1min=_load_1min())
        rows.append(row)
        rss = lambda x: '?' if x is None else f'{x:.0f}'
        log(f'{cell}: ours {t_ours:.1f} ms, official {t_off:.1f} ms, official/ours {t_off / t_ours:.2f}x; '
            f'temp {row["ours_temp_mib"]:.0f} vs {row["official_temp_mib"]:.0f} MiB; peak RSS '
            f'{rss(row["ours_peak_rss_mib"])} vs {rss(row["official_peak_rss_mib"])} MiB')
      gc.collect()
  return rows


# A markdown cell of the comparison tables: '—' for a missing value.
_cell = lambda x, spec: '—' if x is None or x == '' else format(float(x), spec)


def _load_1min() -> Optional[float]:
  return os.getloadavg()[0] if hasattr(os, 'getloadavg') else None


def _favor_pair(setup: Setup, length: int, causal: bool, keep_cotangent: bool):
  """One cell's inputs, and ours / the official FAVOR+ per mode on them (the same W and key mask), and
  the official forward with its ``eps`` off (the same estimate as ours: the difference check)."""
  from kernelformer.bench import official_favor  # pylint: disable=g-import-not-at-top
  inputs = make_inputs(setup, length, setup.seed)
  q, k, v = inputs['q'], inputs['k'], inputs['v']
  cot = inputs['cotangent'] if keep_cotangent else None   # 1 GiB at B=8 H=8 L=64K: not kept when unused
  del inputs
  mask = jnp.broadcast_to(jnp.arange(length)[None, :] < length - length // 8, (setup.batch, length))
  module = registry.build(attention_options('posrf-orf', length, setup.num_features),
                          share_heads=True, impl='xla')
  kf = jax.random.PRNGKey(setup.seed + 1)
  variables = jax.jit(lambda key: module.init({'params': key, 'features': key}, q, k, v,
                                              mask=mask, causal=causal))(kf)
  (w,) = [x for x in jax.tree.leaves(variables.get('features', {})) if x.ndim == 2][:1]

  def ours(q_, k_, v_):
    return module.apply(variables, q_, k_, v_, mask=mask, causal=causal, rngs={'features': kf})

  def official(q_, k_, v_, eps=official_favor.NUMERICAL_STABILIZER):
    return official_favor.favor_attention(q_, k_, v_, w, mask=mask, causal=causal, eps=eps)

  def with_bwd(f):
    def fb(q_, k_, v_):
      _, vjp = jax.vjp(f, q_, k_, v_)
      return vjp(cot)
    return fb

  fns = {'fwd': (ours, official), 'fwd+bwd': (with_bwd(ours), with_bwd(official))}
  return (q, k, v), fns, lambda q_, k_, v_: official(q_, k_, v_, eps=0.0)


def _time_interleaved(compiled, args, row: dict, repeats: int) -> list[list[float]]:
  """A warm-up call per side (its peak RSS into ``row``), then ``_rounds``."""
  for (c, _), side in zip(compiled, ('ours', 'official')):
    reset = _reset_peak_rss()
    jax.block_until_ready(c(*args))          # warm-up
    row[f'{side}_peak_rss_mib'] = measure.peak_rss_mib() if reset else None
  return _rounds([c for c, _ in compiled], [args] * 2, repeats, warmup=False)


def _rounds(compiled, args, repeats: int, warmup: bool = True) -> list[list[float]]:
  """A warm-up call of each ``compiled[i](*args[i])`` (``warmup``), then ``repeats`` rounds of one call
  of each, the order rotating between rounds; the seconds of each call, per function."""
  for c, a in zip(compiled, args) if warmup else ():
    jax.block_until_ready(c(*a))
  times: list[list[float]] = [[] for _ in compiled]
  n = max(1, len(compiled))
  for r in range(max(1, repeats)):
    for i in [*range(r % n, len(compiled)), *range(r % n)]:
      start = time.perf_counter()
      jax.block_until_ready(compiled[i](*args[i]))
      times[i].append(time.perf_counter() - start)
  return times


def compare_markdown(rows: Sequence[dict[str, Any]]) -> str:
  """The ``compare_official`` rows as one markdown table (cells not run: their note instead of times)."""
  head = ('| attention | mode | L | B | H | ours (ms) | official (ms) | official / ours | temp ours (MiB) | '
          'temp official (MiB) | compiled ours / official (MiB) | peak RSS ours / official (MiB) | '
          'max abs diff (eps 0) | rounds | load |')
  lines = [head, '|' + '---|' * 15]
  for r in rows:
    times = (f'{_cell(r["ours_ms"], ".1f")} | {_cell(r["official_ms"], ".1f")} | {_cell(r["speedup"], ".2f")}'
             if r.get('ours_ms') is not None else f'{r.get("note", "not run")} | — | —')
    lines.append(f'| {"causal" if r["causal"] else "bidirectional"} | {r["mode"]} | {r["length"]} | '
                 f'{r["batch"]} | {r["heads"]} | {times} | '
                 f'{r["ours_temp_mib"]:.1f} | {r["official_temp_mib"]:.1f} | '
                 f'{_cell(r.get("ours_total_mib"), ".0f")} / {_cell(r.get("official_total_mib"), ".0f")} | '
                 f'{_cell(r.get("ours_peak_rss_mib"), ".0f")} / {_cell(r.get("official_peak_rss_mib"), ".0f")} | '
                 f'{_cell(r["max_abs_diff"], ".1e")} | {r["repeats"]} | {_cell(r["load_1min"], ".1f")} |')
  return '\n'.join(lines)


# ----------------------------------------------------------------------------------------------
# ``--compare projections``: SORF and FastFood against a dense W.
# ----------------------------------------------------------------------------------------------

PROJECTION_FIELDS = ('what', 'size', 'num_features', 'rows', 'dense_ms', 'sorf_ms',
                     'fastfood_ms', 'fastfood_rowwise_ms', 'butterfly_ms', 'matmul_ms',
                     'repeats', 'load_1min')


def _interleaved_medians(fns: Sequence[Callable[..., Any]], args: Sequence[Sequence[Any]],
                         repeats: int) -> list[float]:
  """Compiles every ``fns[i](*args[i])``, one warm-up each, then ``repeats`` rounds of one call of
  each (order rotating between rounds); the median seconds of each, in order."""
  compiled = [jax.jit(f).lower(*a).compile() for f, a in zip(fns, args)]
  return [statistics.median(t) for t in _rounds(compiled, args, repeats)]


def compare_projections(dims: Sequence[int], setup: Setup, *, rows: int = 16384,
                        log: Callable[[str], None] = print) -> list[dict[str, Any]]:
  """Time of ``x W^T`` for ``x [rows, d]`` (``rows`` = B * H * L positions) by each form of W, and of
  the Walsh-Hadamard transform by butterfly and by dense matmul, interleaved in one process.

  Projection rows (``what='projection'``, M = ``setup.num_features``): a dense ORF matrix
  (``dense_ms``), SORF as the project builds it (dense after its O(M d log d) construction:
  ``sorf_ms``), FastFood as ``projection.project`` applies it (materialized per call for
  d <= FASTFOOD_DENSE_MAX_DIM: ``fastfood_ms``) and FastFood by the structured transform of every row
  (``FastFoodBlocks.apply``, O(M log d) per row: ``fastfood_rowwise_ms``). The construction of the
  structure (sampling) is not timed: it happens once per redraw window. Transform rows
  (``what='fwht'``): ``hadamard.fwht`` on ``[rows * 64 / n, n]`` (a fixed amount of data) by butterfly
  and by dense matmul. Attention rows (``what='attention fwd'`` / ``'attention fwd+bwd'``): the
  registry's posrf-orf, posrf-sorf and posrf-fastfood modules at d = 64, L = rows / (B H), the
  benchmark's fwd and fwd+bwd programs. Times in ms, medians of ``setup.repeats`` interleaved rounds.
  """
  from kernelformer.features import hadamard, projection, weights  # pylint: disable=g-import-not-at-top
  out = []
  m = setup.num_features
  for d in dims:
    x = jax.random.normal(jax.random.PRNGKey(setup.seed), (rows, d))
    keys = jax.random.split(jax.random.PRNGKey(setup.seed + 1), 3)
    dense = weights.SAMPLERS['orf'](keys[0], m, d)
    sorf = weights.SAMPLERS['sorf'](keys[1], m, d)
    ff = weights.SAMPLERS['fastfood'](keys[2], m, d)
    t = _interleaved_medians(
        [projection.project, projection.project, projection.project, lambda x, p: p.fastfood.apply(x)],
        [(x, dense), (x, sorf), (x, ff), (x, ff)], setup.repeats)
    row = {'what': 'projection', 'size': d, 'num_features': m, 'rows': rows, 'dense_ms': t[0] * 1e3,
           'sorf_ms': t[1] * 1e3, 'fastfood_ms': t[2] * 1e3, 'fastfood_rowwise_ms': t[3] * 1e3,
           'repeats': setup.repeats, 'load_1min': _load_1min()}
    out.append(row)
    log(f'projection d={d} M={m}: dense {row["dense_ms"]:.2f} ms, SORF {row["sorf_ms"]:.2f}, '
        f'FastFood {row["fastfood_ms"]:.2f} (row-wise transform {row["fastfood_rowwise_ms"]:.2f})')
  # The whole attention (module, fwd and fwd+bwd) at d = 64 for each form of W, interleaved: the
  # claim "FastFood / SORF not slower than a dense projection" measured without load drift.
  length = max(1, rows // (setup.batch * setup.heads))
  att = dataclasses.replace(setup, head_dim=64)
  inputs = make_inputs(att, length, setup.seed)
  programs = [build_programs(kind, att, inputs) for kind in ('posrf-orf', 'posrf-sorf', 'posrf-fastfood')]
  for mode, pick in (('fwd', lambda p: (p[0], p[1])), ('fwd+bwd', lambda p: (p[2], p[3]))):
    fns, fargs = zip(*(pick(p) for p in programs))
    t = _interleaved_medians(fns, fargs, setup.repeats)
    row = {'what': f'attention {mode}', 'size': 64, 'num_features': m, 'rows': length,
           'dense_ms': t[0] * 1e3, 'sorf_ms': t[1] * 1e3, 'fastfood_ms': t[2] * 1e3,
           'repeats': setup.repeats, 'load_1min': _load_1min()}
    out.append(row)
    log(f'attention {mode} L={length} d=64 M={m}: posrf-orf {row["dense_ms"]:.2f} ms, posrf-sorf '
        f'{row["sorf_ms"]:.2f}, posrf-fastfood {row["fastfood_ms"]:.2f}')
  for n in sorted({hadamard.next_pow2(d) for d in dims}):
    x = jax.random.normal(jax.random.PRNGKey(setup.seed), (max(1, rows * 64 // n), n))
    t = _interleaved_medians([lambda x: hadamard.fwht(x, method='butterfly'),
                              lambda x: hadamard.fwht(x, method='dense')], [(x,), (x,)],
                             setup.repeats)
    row = {'what': 'fwht', 'size': n, 'rows': x.shape[0], 'butterfly_ms': t[0] * 1e3,
           'matmul_ms': t[1] * 1e3, 'repeats': setup.repeats, 'load_1min': _load_1min()}
    out.append(row)
    log(f'fwht n={n} ({x.shape[0]} rows): butterfly {row["butterfly_ms"]:.2f} ms, dense matmul '
        f'{row["matmul_ms"]:.2f} ms')
  return out


def projections_markdown(rows: Sequence[dict[str, Any]]) -> str:
  """Two markdown tables: projections by form of W, and the Hadamard transform by method."""
  proj = [r for r in rows if r['what'] == 'projection']
  fw = [r for r in rows if r['what'] == 'fwht']
  att = [r for r in rows if r['what'].startswith('attention')]
  lines = ['| d | M | rows | dense W (ms) | SORF (ms) | FastFood (ms) | FastFood row-wise transform (ms) | '
           'FastFood / dense | load |', '|' + '---|' * 9]
  for r in proj:
    lines.append(f'| {r["size"]} | {r["num_features"]} | {r["rows"]} | {r["dense_ms"]:.2f} | '
                 f'{r["sorf_ms"]:.2f} | {r["fastfood_ms"]:.2f} | {r["fastfood_rowwise_ms"]:.2f} | '
                 f'{r["fastfood_ms"] / r["dense_ms"]:.2f} | {r["load_1min"]:.1f} |')
  lines += ['', '| attention (B=1 x heads, d=64) | L | M | posrf-orf (ms) | posrf-sorf (ms) | posrf-fastfood (ms) | '
            'sorf / orf | fastfood / orf | load |', '|' + '---|' * 9]
  for r in att:
    lines.append(f'| {r["what"]} | {r["rows"]} | {r["num_features"]} | {r["dense_ms"]:.2f} | '
                 f'{r["sorf_ms"]:.2f} | {r["fastfood_ms"]:.2f} | {r["sorf_ms"] / r["dense_ms"]:.2f} | '
                 f'{r["fastfood_ms"] / r["dense_ms"]:.2f} | {r["load_1min"]:.1f} |')
  lines += ['', '| n | rows | butterfly (ms) | dense matmul (ms) | butterfly / matmul | load |',
            '|' + '---|' * 6]
  for r in fw:
    lines.append(f'| {r["size"]} | {r["rows"]} | {r["butterfly_ms"]:.2f} | {r["matmul_ms"]:.2f} | '
                 f'{r["butterfly_ms"] / r["matmul_ms"]:.2f} | {r["load_1min"]:.1f} |')
  return '\n'.join(lines)


# ----------------------------------------------------------------------------------------------
# ``--compare maps``: the deterministic and learned feature maps at long lengths, lean and stored.
# ----------------------------------------------------------------------------------------------

MAPS_FIELDS = ('kind', 'path', 'causal', 'length', 'batch', 'heads', 'head_dim', 'features', 'time_ms',
               'time_vs_lean', 'temp_mib', 'total_mib', 'repeats', 'load_1min', 'note')
DEFAULT_MAP_KINDS = ('softmax', 'posrf-orf', 'taylor', 'taylor:map_dim=16', 'hedgehog', 't2r', 'dpfp',
                     'rebased', 'cosformer', 'squared-relu', 'linear-elu')


def parse_kind_variant(text: str) -> tuple[str, dict[str, Any]]:
  """``'taylor:map_dim=16'`` -> ``('taylor', {'map_dim': 16})``: a kind and attention options (ints,
  floats or strings); a one-line ``ValueError`` for a malformed option."""
  kind, *opts = text.strip().split(':')
  options: dict[str, Any] = {}
  for opt in opts:
    key, sep, value = opt.partition('=')
    if not sep or not key:
      raise ValueError(f'kind variant {text!r}: options are name=value after the kind, e.g. '
                       'taylor:map_dim=16')
    for cast in (int, float):
      try:
        value = cast(value)
        break
      except ValueError:
        pass
    options[key] = value
  return kind, options


def _feature_width(kind: str, options: dict[str, Any], setup: Setup) -> Optional[int]:
  """M' of a feature-map kind (None for other mechanisms)."""
  spec = registry.get(kind)
  if not issubclass(spec.module, RandomFeatureAttention):
    return None
  fixed = {**options, **spec.fixed}
  return catalog.get(fixed['component']).feature_count(fixed.get('num_features', setup.num_features),
                                                      setup.head_dim, map_dim=fixed.get('map_dim', 0))


def compare_maps(kinds: Sequence[str], lengths: Sequence[int], setup: Setup, *,
                 causal_modes: Sequence[bool] = (False, True),
                 log: Callable[[str], None] = print) -> tuple[list[dict[str, Any]], dict[str, str]]:
  """Forward+backward time and XLA memory of feature maps, lean and stored, timed interleaved.

  ``kinds``: registry names, each optionally with attention options (``taylor:map_dim=16``). For each
  (causal, length) every kind's fwd+bwd program (``build_programs``: ``jax.vjp`` of the module at B, H,
  d of ``setup``, every key real) is compiled; row-wise maps (records with ``row_wise``) also as
  the stored path (``random_features.STORED_FEATURES_ONLY`` while tracing: features of all L rows formed, then
  ``linear.linear_attention``) with ``path='stored'``. Programs whose compiled memory (temp + arguments
  + outputs) exceeds ``setup.max_memory_gb`` are compiled, not run (their memory is reported). The
  others are timed *interleaved* in this one process: one warm-up call each, then ``setup.repeats``
  rounds of one call of each, the order rotating between rounds, so load changes on a shared machine
  hit all alike; the median is reported with the 1-minute load average at the end of the cell.
  Returns ``(rows, skipped)``; ``skipped``: kind -> one-line reason (unknown, or cannot be built).
  """
  from unittest import mock  # pylint: disable=g-import-not-at-top
  from kernelformer.attention import random_features as rf  # pylint: disable=g-import-not-at-top
  variants, skipped = [], {}
  for text in kinds:
    kind, options = parse_kind_variant(text)
    try:
      registry.get(kind)
    except registry.UnknownKernelError as e:
      skipped[text] = str(e).split('.')[0]
      log(f'skip {text}: {skipped[text]}')
      continue
    variants.append((text, kind, options))
  limit = setup.max_memory_gb * (1 << 30)
  rows: list[dict[str, Any]] = []
  for causal in causal_modes:
    cell_setup = dataclasses.replace(setup, causal=causal)
    for length in sorted(lengths):
      inputs = make_inputs(cell_setup, length, setup.seed)
      programs = []      # (row, compiled, args)
      for text, kind, options in variants:
        if text in skipped:
          continue
        comp = registry.get(kind).fixed.get('component')
        paths = ['lean', 'stored'] if comp and catalog.get(comp).row_wise else ['-']
        for path in paths:
          row = {'kind': text, 'path': path, 'causal': causal, 'length': length, 'batch': setup.batch,
                 'heads': setup.heads, 'head_dim': setup.head_dim,
                 'features': _feature_width(kind, options, setup), 'note': ''}
          patch = (mock.patch.object(rf, 'STORED_FEATURES_ONLY', True) if path == 'stored'
                   else contextlib.nullcontext())
          try:
            with patch:
              _, _, fwd_bwd, args = build_programs(kind, cell_setup, inputs, options)
              compiled, stats = measure.compile_with_stats(fwd_bwd, *args)
          except Exception as e:  # pylint: disable=broad-except
            skipped[text] = f'{type(e).__name__}: {e}'.splitlines()[0][:200]
            log(f'skip {text}: {skipped[text]}')
            break
          row['temp_mib'], row['total_mib'] = stats.temp_bytes / MIB, stats.total_bytes / MIB
          rows.append(row)
          if stats.total_bytes > limit:
            row['note'] = (f'not run: compiled memory {stats.total_bytes / (1 << 30):.1f} GiB > '
                           f'--max_memory_gb {setup.max_memory_gb:g}')
            log(f'{"causal" if causal else "bidirectional"} L={length} {text} {path}: {row["note"]}')
            del compiled
            continue
          programs.append((row, compiled, args))
      times = _rounds([c for _, c, _ in programs], [a for _, _, a in programs], setup.repeats)
      load = _load_1min()
      for (row, _, _), t in zip(programs, times):
        row.update(time_ms=statistics.median(t) * 1e3, repeats=len(t))
      cell = [r for r in rows if r['length'] == length and r['causal'] == causal]
      lean_ms = {r['kind']: r.get('time_ms') for r in cell if r['path'] == 'lean'}
      for row in cell:
        row['load_1min'] = load
        if row['path'] == 'stored' and row.get('time_ms') and lean_ms.get(row['kind']):
          row['time_vs_lean'] = row['time_ms'] / lean_ms[row['kind']]
        log(f'{"causal" if causal else "bidirectional"} L={length} {row["kind"]} {row["path"]}: '
            f'{row.get("time_ms") or float("nan"):.1f} ms, total {row["total_mib"]:.1f} MiB')
      del programs
      gc.collect()
  return rows, skipped


def maps_markdown(rows: Sequence[dict[str, Any]]) -> str:
  """``compare_maps`` rows as one markdown table (memory for every cell, times where run)."""
  head = ('| mode | L | kind | path | M\' | fwd+bwd (ms) | stored / lean | compiled total (MiB) | '
          'temp (MiB) | rounds | load | note |')
  lines = [head, '|' + '---|' * 12]
  for r in rows:
    lines.append(f'| {"causal" if r["causal"] else "bidirectional"} | {r["length"]} | {r["kind"]} | '
                 f'{r["path"]} | {r["features"] if r["features"] is not None else "—"} | '
                 f'{_cell(r.get("time_ms"), ",.0f")} | {_cell(r.get("time_vs_lean"), ".2f")} | '
                 f'{_cell(r["total_mib"], ",.1f")} | {_cell(r["temp_mib"], ",.1f")} | '
                 f'{r.get("repeats") or "—"} | {_cell(r.get("load_1min"), ".1f")} | {r.get("note", "")} |')
  return '\n'.join(lines)
