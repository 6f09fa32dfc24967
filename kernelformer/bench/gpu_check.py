"""The GPU check: one command proves the Pallas kernels, the cuDNN baseline and a training step.

    python scripts/gpu_check.py                    # on a GPU: <= ~14 min on one H100
    python scripts/gpu_check.py --dry_run --out_dir /tmp/gc   # on CPU: tiny shapes, same code paths

Sections (correctness, attention, train, report), their budgets and the dry run: docs/pallas.md, "The
GPU check". Correctness tolerances (max error over the largest reference entry,
``kernelformer.bench.pallas_reference``): float32 outputs 2e-4, gradients 2e-3; bfloat16 outputs 3e-2,
gradients 6e-2 (bf16 operands in the large matmuls; the CPU unit tests hold the kernels to first-order
rounding bounds). The attention section's predicted time is linear in L from the previous length
(quadratic for softmax).

Model FLOPs (for the fraction of matmul peak; XLA's cost analysis cannot see inside a Pallas call):
linear attention forward ``B H L (2 M' d (q and k features) + 4 M' dv)`` (``M'`` = 2M for trig), plus
``2 B H L C (M' + dv)`` for the causal in-chunk products; softmax forward ``4 B H L^2 d`` (half when
causal). Forward+backward counts 3x (linear) and 3.5x (softmax, as flash-attention reports) the forward.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from kernelformer import run_config
from kernelformer.bench import measure
from kernelformer.bench import pallas_reference as reference
from kernelformer.pallas import FEATURES, feature_attention
from kernelformer.pallas import validated

GPU_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
DRY_LENGTHS = (64,)
TOL = {'float32': (2e-4, 2e-3), 'bfloat16': (3e-2, 6e-2)}     # (outputs, gradients)
# Seconds per section on a GPU: 14 minutes in all, leaving a minute for start-up and the report.
GPU_BUDGETS = {'correctness': 180.0, 'attention': 450.0, 'train': 180.0}
# Dry run: generous (a shared 2-core CPU); it finishes in well under a minute on an idle one.
DRY_BUDGETS = {'correctness': 300.0, 'attention': 300.0, 'train': 300.0}
# Interpret-mode kernels are big while loops: XLA's backend optimizations only slow their compile.
DRY_COMPILER_OPTIONS = {'xla_backend_optimization_level': 0}


@dataclasses.dataclass
class Options:
  dry_run: bool = False
  out_dir: Optional[str] = None
  lengths: Optional[Sequence[int]] = None
  sections: Sequence[str] = ('correctness', 'attention', 'train')
  budget_scale: float = 1.0
  write_table: bool = True
  table_path: Optional[str] = None
  repeats: int = 10
  command: str = ''


class Budget:
  """Seconds left of one section."""

  def __init__(self, seconds: float):
    self.seconds = float(seconds)
    self.start = time.perf_counter()

  def used(self) -> float:
    return time.perf_counter() - self.start

  def left(self) -> float:
    return self.seconds - self.used()


# ------------------------------------------------------------------------------------------------
# Environment.
# ------------------------------------------------------------------------------------------------

def compile_with_stats(fn, args, dry_run: bool):
  """``measure.compile_with_stats``; in a dry run compiled without backend optimizations (faster)."""
  return measure.compile_with_stats(fn, *args, options=DRY_COMPILER_OPTIONS if dry_run else None)


def environment(command: str) -> dict[str, Any]:
  dev = jax.devices()[0]
  driver = ''
  try:
    driver = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'],
                            capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
  except (OSError, subprocess.SubprocessError, IndexError):
    driver = 'n/a (nvidia-smi not available)'
  import jaxlib  # pylint: disable=g-import-not-at-top
  return {'device_kind': dev.device_kind, 'backend': jax.default_backend(),
          'device_count': jax.device_count(), 'driver': driver, 'jax': jax.__version__,
          'jaxlib': getattr(jaxlib, '__version__', ''), 'python': platform.python_version(),
          'command': command, 'date_utc': time.strftime('%Y-%m-%d %H:%M', time.gmtime())}


def device_slug(kind: str) -> str:
  return re.sub(r'[^a-z0-9]+', '-', kind.lower()).strip('-') or 'device'


# ------------------------------------------------------------------------------------------------
# 1. Correctness of the compiled kernels.
# ------------------------------------------------------------------------------------------------

def correctness_cases(dry_run: bool) -> list[dict[str, Any]]:
  if dry_run:
    # Each feature once; both dtypes appear (the code paths, not the full product).
    picks = [('exp', False, 'float32'), ('trig', False, 'float32'), ('elu', False, 'bfloat16'),
             ('relu', False, 'bfloat16')]
    shape = dict(batch=2, length=37, heads=2, head_dim=8, num_features=16, block=16)
  else:
    picks = [(f, False, dt) for f in FEATURES for dt in ('bfloat16', 'float32')]
    shape = dict(batch=2, length=1031, heads=4, head_dim=64, num_features=256, block=None)
  return [dict(feature=f, causal=c, dtype=dt, **shape) for f, c, dt in picks]


def _qkvw(key, batch, length, heads, head_dim, num_features, feature, dtype):
  ks = jax.random.split(key, 5)
  scale = 0.25 if feature == 'trig' else 0.5
  q = scale * jax.random.normal(ks[0], (batch, length, heads, head_dim))
  k = scale * jax.random.normal(ks[1], (batch, length, heads, head_dim))
  v = jax.random.normal(ks[2], (batch, length, heads, head_dim))
  g = jax.random.normal(ks[3], (batch, length, heads, head_dim))
  w = None
  if feature in ('exp', 'trig'):
    w = jax.random.normal(ks[4], (heads, num_features, head_dim)) / math.sqrt(math.sqrt(head_dim))
  cast = lambda x: x.astype(dtype)
  return cast(q), cast(k), cast(v), w, cast(g)


def _rel_err(x, ref) -> float:
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  if not np.all(np.isfinite(x)):
    return math.inf
  return float(np.max(np.abs(x - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def check_case(case: dict[str, Any], interpret: bool) -> dict[str, Any]:
  """Compiled kernels vs the XLA path (float32 inputs) for one case; returns the row."""
  f, causal, dt = case['feature'], case['causal'], case['dtype']
  dtype = jnp.dtype(dt)
  b, length = case['batch'], case['length']
  q, k, v, w, g = _qkvw(jax.random.PRNGKey(17), b, length, case['heads'], case['head_dim'],
                        case['num_features'], f, dtype)
  mask = jnp.arange(length)[None, :] < jnp.asarray([length, length // 2 + 3])[:, None]
  uses_w = w is not None
  block = case.get('block')

  def kernel(q, k, v, w):
    return feature_attention(q, k, v, w, feature=f, mask=mask, causal=causal, block_q=block,
                             block_k=block, interpret=interpret)

  def xla(q, k, v, w):
    f32 = lambda x: x.astype(jnp.float32)
    return reference.xla_feature_attention(f32(q), f32(k), f32(v), w, feature=f, mask=mask,
                                           causal=causal, chunk_size=block or 64)

  def out_and_grads(fn, g):
    args = (q, k, v, w) if uses_w else (q, k, v)
    out, vjp = jax.vjp((lambda *a: fn(*a)) if uses_w else (lambda q, k, v: fn(q, k, v, None)), *args)
    return out, vjp(g.astype(out.dtype))

  row = dict(case, mode=validated.mode_name(causal), interpret=interpret, passed=False, error='')
  try:
    start = time.perf_counter()
    opts = DRY_COMPILER_OPTIONS if interpret else None
    out, grads = jax.jit(lambda g: out_and_grads(kernel, g), compiler_options=opts)(g)
    ref, ref_grads = jax.jit(lambda g: out_and_grads(xla, g), compiler_options=opts)(g)
    jax.block_until_ready((out, grads, ref, ref_grads))
    row['seconds'] = round(time.perf_counter() - start, 2)
  except Exception as e:  # pylint: disable=broad-except
    row['error'] = f'{type(e).__name__}: {str(e).splitlines()[0][:300]}'
    return row
  tol_out, tol_grad = TOL[dt]
  row['out_err'] = _rel_err(out, ref)
  names = ('q', 'k', 'v', 'w')
  row['grad_err'] = {n: _rel_err(a, r) for n, a, r in zip(names, grads, ref_grads)}
  row['passed'] = bool(row['out_err'] <= tol_out and
                       all(e <= tol_grad for e in row['grad_err'].values()))
  return row


def run_correctness(opts: Options, budget: Budget, log) -> list[dict[str, Any]]:
  rows = []
  for case in correctness_cases(opts.dry_run):
    if budget.left() <= 0:
      rows.append(dict(case, mode=validated.mode_name(case['causal']), passed=False,
                       interpret=opts.dry_run, error='skipped: correctness budget spent'))
      continue
    row = check_case(case, interpret=opts.dry_run)
    rows.append(row)
    log(f"correctness {row['feature']:4s} {row['mode']:13s} {row['dtype']:8s} "
        f"{'ok' if row['passed'] else 'FAIL'} out {row.get('out_err', float('nan')):.2e} "
        f"grads {json.dumps({k: float(f'{v:.2e}') for k, v in row.get('grad_err', {}).items()})} "
        f"{row['error']}")
  return rows


# ------------------------------------------------------------------------------------------------
# 2. Attention timing.
# ------------------------------------------------------------------------------------------------

def model_flops(impl: str, *, batch, length, heads, head_dim, num_features, causal, chunk=64,
                backward=False) -> float:
  """The module docstring's model FLOP counts (what the attention must compute, not what XLA does)."""
  if impl == 'softmax':
    fwd = 4.0 * batch * heads * length * length * head_dim * (0.5 if causal else 1.0)
    return fwd * (3.5 if backward else 1.0)
  m = num_features
  fwd = batch * heads * length * (2.0 * m * head_dim + 4.0 * m * head_dim)
  if causal:
    fwd += 2.0 * batch * heads * length * chunk * (m + head_dim)
  return fwd * (3.0 if backward else 1.0)


def _table_block(m: int, d: int, dtype) -> int:
  """The block feature_attention.tiling() chooses for the exp feature."""
  from kernelformer.pallas.feature_attention import tiling  # pylint: disable=g-import-not-at-top
  from kernelformer.pallas.resource_check import pow2_at_least  # pylint: disable=g-import-not-at-top
  dp = pow2_at_least(d)
  return tiling('exp', pow2_at_least(m), dp, dp, jnp.dtype(dtype)).block


def block_candidates(dry_run: bool) -> list[dict[str, Any]]:
  """The block settings tried per shape (the first is the default)."""
  if dry_run:
    return [{'block': 16, 'num_splits': None}, {'block': 32, 'num_splits': None}]
  # None = feature_attention.tiling()'s block, the configuration the offline resource check
  # (kernelformer benchmark pallas-resources) verified; the others are tried only as alternatives.
  return [{'block': None, 'num_splits': None}, {'block': 64, 'num_splits': None}]


def _attention_fn(impl: str, *, causal, mask, interpret, cand=None):
  """``f(q, k, v, w) -> out`` for one implementation."""
  if impl == 'pallas':
    return lambda q, k, v, w: feature_attention(q, k, v, w, feature='exp', mask=mask,
                                                block_q=cand['block'], block_k=cand['block'],
                                                num_splits=cand.get('num_splits'), interpret=interpret)
  if impl == 'xla':
    return lambda q, k, v, w: reference.xla_feature_attention(q, k, v, w, feature='exp', mask=mask,
                                                              causal=causal)
  from kernelformer.attention.softmax import softmax_attention  # pylint: disable=g-import-not-at-top
  implementation = 'xla' if interpret else 'cudnn'
  return lambda q, k, v, w: softmax_attention(q, k, v, mask=mask, causal=causal,
                                              implementation=implementation)


def _program(fn, mode):
  if mode == 'fwd':
    return fn

  def fwd_bwd(q, k, v, w, g):
    out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, w), q, k, v)
    return out, vjp(g)
  return fwd_bwd


def time_cell(impl, mode, length, causal, shape, opts: Options, cand=None) -> dict[str, Any]:
  b, h, d, m = shape['batch'], shape['heads'], shape['head_dim'], shape['num_features']
  q, k, v, w, g = _qkvw(jax.random.PRNGKey(length), b, length, h, d, m, 'exp', jnp.bfloat16)
  # Key padding: the second half of the batch has 7/8 of its keys (lengths for cuDNN, a mask elsewhere).
  lengths = jnp.asarray([length] * (b - b // 2) + [length - length // 8] * (b // 2))
  mask = jnp.arange(length)[None, :] < lengths[:, None]
  fn = _attention_fn(impl, causal=causal, mask=mask, interpret=opts.dry_run, cand=cand)
  args = (q, k, v, w) if mode == 'fwd' else (q, k, v, w, g)
  row = {'impl': impl, 'mode': mode, 'length': length, 'causal': causal, 'status': 'ok', 'note': ''}
  if cand is not None:
    row['blocks'] = json.dumps(cand, sort_keys=True)
  if impl == 'softmax' and opts.dry_run:
    row['note'] = 'dry run: XLA softmax stands in for cuDNN'
  try:
    compiled, stats = compile_with_stats(_program(fn, mode), args, opts.dry_run)
    timing = measure.time_compiled(compiled, args, repeats=opts.repeats,
                                   budget_s=2.0 if opts.dry_run else 10.0)
  except Exception as e:  # pylint: disable=broad-except
    row.update(status='error', note=f'{type(e).__name__}: {str(e).splitlines()[0][:200]}')
    return row
  flops = model_flops('softmax' if impl == 'softmax' else 'linear', batch=b, length=length, heads=h,
                      head_dim=d, num_features=m, causal=causal, backward=mode != 'fwd',
                      chunk=(cand or {}).get('block') or _table_block(m, d, jnp.bfloat16))
  row.update(time_ms=timing.median_s * 1e3, repeats=len(timing.times_s),
             temp_mib=stats.temp_bytes / 2 ** 20, model_tflops=flops / timing.median_s / 1e12)
  return row


def run_attention(opts: Options, budget: Budget, log) -> tuple[list[dict], dict[str, Any]]:
  shape = (dict(batch=2, heads=2, head_dim=16, num_features=16) if opts.dry_run else
           dict(batch=4, heads=8, head_dim=64, num_features=256))
  size = 256 if opts.dry_run else 8192
  peak, _ = measure.matmul_flops_per_second(size=size, dtype=jnp.bfloat16, repeats=5)
  info = {'shape': shape, 'matmul_bf16_tflops': peak / 1e12, 'matmul_size': size}
  log(f'dense bf16 matmul {size}^3: {peak / 1e12:.1f} TFLOP/s')
  lengths = list(opts.lengths or (DRY_LENGTHS if opts.dry_run else GPU_LENGTHS))
  rows: list[dict] = []
  last: dict[tuple, tuple[int, float]] = {}      # (impl, mode, causal) -> (length, seconds spent)
  for length in lengths:
    for causal in (False, True):
      for impl in ('xla', 'softmax') if causal else ('pallas', 'xla', 'softmax'):
        for mode in ('fwd', 'fwd+bwd'):
          key = (impl, mode, causal)
          skip = None
          if budget.left() <= 0:
            skip = 'skipped: attention budget spent'
          elif key in last:
            prev_len, prev_s = last[key]
            power = 2 if impl == 'softmax' else 1
            predicted = prev_s * (length / prev_len) ** power
            if predicted > budget.left():
              skip = f'skipped: predicted {predicted:.0f} s > {budget.left():.0f} s left of the budget'
          if last.get(key, (0, 0.0))[1] < 0:
            skip = 'skipped: failed at a shorter length'
          if skip:
            rows.append({'impl': impl, 'mode': mode, 'length': length, 'causal': causal,
                         'status': 'skipped', 'note': skip})
            continue
          start = time.perf_counter()
          cands = block_candidates(opts.dry_run) if impl == 'pallas' else [None]
          cell_rows = [time_cell(impl, mode, length, causal, shape, opts, cand) for cand in cands]
          spent = time.perf_counter() - start
          ok = [r for r in cell_rows if r['status'] == 'ok']
          best = min(ok, key=lambda r: r['time_ms']) if ok else cell_rows[0]
          if impl == 'pallas':
            best['tried'] = [{'blocks': r.get('blocks'), 'time_ms': r.get('time_ms'),
                              'status': r['status'], 'note': r['note']} for r in cell_rows]
          if 'model_tflops' in best:
            best['frac_matmul'] = best['model_tflops'] * 1e12 / peak
          rows.append(best)
          last[key] = (length, spent if ok else -1.0)
          log(f"attention L={length:6d} {'causal' if causal else 'bidir ':6s} {impl:7s} {mode:7s} "
              f"{best.get('time_ms', float('nan')):9.3f} ms  temp {best.get('temp_mib', float('nan')):8.1f}"
              f" MiB  {best['status']} {best['note']}")
  info['crossover'] = crossovers(rows)
  return rows, info


def _time(rows, impl, mode, length, causal) -> Optional[float]:
  for r in rows:
    if (r['impl'], r['mode'], r['length'], r['causal']) == (impl, mode, length, causal) \
        and r['status'] == 'ok':
      return r['time_ms']
  return None


def _versus(rows, other: str, causal: bool) -> list[tuple[int, float, float]]:
  """``(L, Pallas ms, other ms)`` of fwd+bwd at every L where both ran."""
  pairs = [(n, _time(rows, 'pallas', 'fwd+bwd', n, causal), _time(rows, other, 'fwd+bwd', n, causal))
           for n in sorted({r['length'] for r in rows})]
  return [(n, a, b) for n, a, b in pairs if a is not None and b is not None]


def crossovers(rows) -> dict[str, Optional[int]]:
  """Smallest measured L from which Pallas fwd+bwd is faster than the other impl at every longer L
  (bidirectional)."""
  out = {}
  for other in ('softmax', 'xla'):
    pairs = _versus(rows, other, False)
    out[f'bidirectional vs {other}'] = next(
        (n for i, (n, _, _) in enumerate(pairs) if all(a < b for _, a, b in pairs[i:])), None)
  return out


# ------------------------------------------------------------------------------------------------
# 3. An LRA-Text-shaped training step.
# ------------------------------------------------------------------------------------------------

def text_config(variant: str, dry_run: bool):
  """configs/text.py's LRA model with one attention variant: 'pallas', 'xla' (posrf-orf) or 'cudnn'."""
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  from kernelformer.configs import text  # pylint: disable=g-import-not-at-top
  c = text.get_config('tiny' if dry_run else 'lra')
  with c.unlocked():
    c.data.max_length = 63 if dry_run else 4095           # + CLS = 64 / 4096 tokens
    c.model.dtype = 'bfloat16'
    c.model.dropout_rate = 0.0
    # No attention dropout: cuDNN flash (jax.nn.dot_product_attention) takes none, and with it the
    # softmax model forms every [B, H, L, L] weight (74 GiB asked at L=4096 on the H100, 2026-11-26).
    # The linear variants ignore it; off for all three, the step is the same model.
    c.model.attention.attention_dropout = 0.0
    if not dry_run:
      c.batch_size = 32
    if variant == 'cudnn':
      c.model.attention.kind = 'softmax'
      c.model.attention.implementation = 'xla' if dry_run else 'cudnn'
    else:
      c.model.attention.kind = 'posrf-orf'
      c.model.attention.num_features = 16 if dry_run else 256
      c.model.attention.impl = variant
  return c


def time_train_step(variant: str, opts: Options) -> dict[str, Any]:
  import lra_tasks  # pylint: disable=g-import-not-at-top
  from kernelformer.training import optim as optim_lib  # pylint: disable=g-import-not-at-top
  from kernelformer.training import steps as steps_lib  # pylint: disable=g-import-not-at-top
  config = text_config(variant, opts.dry_run)
  row = {'variant': variant, 'status': 'ok', 'note': '',
         'attention': config.model.attention.kind, 'length': config.data.max_length + 1,
         'batch': config.batch_size}
  if variant == 'cudnn' and opts.dry_run:
    row['note'] = 'dry run: XLA softmax stands in for cuDNN'
  try:
    info = lra_tasks.get('text').info(config.data)
    run = run_config.of(config)
    model = steps_lib.build_model(run, info)
    tx, schedule = optim_lib.make_optimizer(run.optim, run.num_train_steps, run.model.dtype == 'float16')
    keys = steps_lib.run_keys(config.seed)
    train_step, _ = steps_lib.make_steps(model, tx, schedule, run, keys)
    length = info.max_length
    state = steps_lib.initializer(model, tx, info, keys)(keys['init'])
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, info.vocab_size, size=(config.batch_size, length)).astype(np.int32)
    tokens[1::2, length - length // 4:] = 0                  # padded reviews
    batch = {'inputs': jnp.asarray(tokens),
             'targets': jnp.asarray(rng.integers(0, 2, size=(config.batch_size,)), jnp.int32)}
    compiled, stats = compile_with_stats(train_step, (state, batch), opts.dry_run)
    timing = measure.time_compiled(compiled, (state, batch), repeats=min(opts.repeats, 5),
                                   budget_s=2.0 if opts.dry_run else 20.0)
    row.update(time_ms=timing.median_s * 1e3, temp_mib=stats.temp_bytes / 2 ** 20,
               repeats=len(timing.times_s))
  except Exception as e:  # pylint: disable=broad-except
    row.update(status='error', note=f'{type(e).__name__}: {str(e).splitlines()[0][:200]}')
    if os.environ.get('GPU_CHECK_TRACEBACK'):
      traceback.print_exc()
  return row


def run_train(opts: Options, budget: Budget, log) -> list[dict[str, Any]]:
  rows = []
  for variant in ('pallas', 'xla', 'cudnn'):
    if budget.left() <= 0:
      rows.append({'variant': variant, 'status': 'skipped', 'note': 'skipped: train budget spent'})
      continue
    row = time_train_step(variant, opts)
    rows.append(row)
    log(f"train step {variant:6s} L={row.get('length')} {row.get('time_ms', float('nan')):9.2f} ms "
        f"{row['status']} {row['note']}")
  return rows


# ------------------------------------------------------------------------------------------------
# Targets and report.
# ------------------------------------------------------------------------------------------------

def targets(att_rows, info, train_rows) -> list[dict[str, Any]]:
  """The Pallas kernels' targets (docs/pallas.md), each met / not met / not measured."""
  at = lambda impl, causal, n=16384: _time(att_rows, impl, 'fwd+bwd', n, causal)
  out = []

  def add(name, a, b, factor, what):
    if a is None or b is None:
      out.append({'target': name, 'status': 'not measured', 'detail': what})
    else:
      ratio = b / a
      out.append({'target': name, 'status': 'met' if ratio >= factor else 'not met',
                  'detail': f'{what}: {ratio:.2f}x'})

  add('Pallas >= 3x the XLA path, 16K fwd+bwd', at('pallas', False), at('xla', False), 3.0,
      'XLA / Pallas time')
  add('Pallas >= 5x cuDNN, 16K fwd+bwd', at('pallas', False), at('softmax', False), 5.0,
      'cuDNN / Pallas time')
  cross = (info or {}).get('crossover', {}).get('bidirectional vs softmax')
  out.append({'target': 'crossover with cuDNN <= 2K (bidirectional fwd+bwd)',
              'status': 'not measured' if cross is None else ('met' if cross <= 2048 else 'not met'),
              'detail': f'crossover {cross}'})
  step = {r['variant']: r.get('time_ms') for r in train_rows if r.get('status') == 'ok'}
  add('Text step (L=4K) with Pallas faster than with cuDNN softmax', step.get('pallas'),
      step.get('cudnn'), 1.0, 'cuDNN / Pallas step time')
  return out


def _fmt(x, spec='.3g'):
  if x is None or (isinstance(x, float) and not math.isfinite(x)):
    return '-'
  return format(x, spec) if isinstance(x, (int, float)) else str(x)


def markdown(result: dict[str, Any]) -> str:
  env = result['environment']
  lines = [f"# GPU check: {env['device_kind']}", '',
           '| | |', '|---|---|']
  for k in ('device_kind', 'backend', 'driver', 'jax', 'jaxlib', 'python', 'date_utc'):
    lines.append(f'| {k} | {env[k]} |')
  lines += [f"| command | `{env['command']}` |", '']
  if result['dry_run']:
    lines += ['**Dry run** (CPU, Pallas interpret mode, tiny shapes; XLA softmax stands in for cuDNN): '
              'these numbers say nothing about a GPU.', '']
  lines += ['Bounded: ' + ', '.join(f'{k} {v:.0f} s' for k, v in result['budgets'].items()) +
            ' (cells that did not fit are listed as skipped).', '']
  lines += ['## Correctness (compiled kernels vs the XLA path)', '',
            '| feature | mode | dtype | L | passed | out err | worst grad err | note |',
            '|---|---|---|---|---|---|---|---|']
  for r in result['correctness']:
    worst = max(r.get('grad_err', {}).values(), default=None)
    lines.append(f"| {r['feature']} | {r['mode']} | {r['dtype']} | {r['length']} | "
                 f"{'yes' if r['passed'] else '**NO**'} | {_fmt(r.get('out_err'))} | {_fmt(worst)} | "
                 f"{r.get('error', '')} |")
  att = result.get('attention', {})
  if att.get('rows'):
    info = att['info']
    lines += ['', '## Attention (posrf exp features, B={batch}, H={heads}, d={head_dim}, M={num_features}, '
              'bf16)'.format(**info['shape']), '',
              f"Dense bf16 matmul: {info['matmul_bf16_tflops']:.1f} TFLOP/s (the peak for frac).", '',
              '| L | causal | impl | mode | ms | temp MiB | model TFLOP/s | frac matmul | blocks | note |',
              '|---|---|---|---|---|---|---|---|---|---|']
    for r in att['rows']:
      lines.append(f"| {r['length']} | {r['causal']} | {r['impl']} | {r['mode']} | "
                   f"{_fmt(r.get('time_ms'))} | {_fmt(r.get('temp_mib'))} | "
                   f"{_fmt(r.get('model_tflops'))} | {_fmt(r.get('frac_matmul'), '.1%')} | "
                   f"{r.get('blocks', '')} | {r['note']} |")
    lines += ['', 'Crossover (smallest L from which Pallas fwd+bwd wins at every longer L): ' +
              ', '.join(f'{k}: {_fmt(v)}' for k, v in info['crossover'].items())]
  if result.get('train'):
    lines += ['', '## LRA-Text-shaped training step', '',
              '| variant | attention | L | batch | ms | temp MiB | note |', '|---|---|---|---|---|---|---|']
    for r in result['train']:
      lines.append(f"| {r['variant']} | {r.get('attention', '')} | {r.get('length', '')} | "
                   f"{r.get('batch', '')} | {_fmt(r.get('time_ms'))} | {_fmt(r.get('temp_mib'))} | "
                   f"{r['note']} |")
  lines += ['', '## Pallas targets', '', '| target | status | detail |', '|---|---|---|']
  for t in result['targets']:
    lines.append(f"| {t['target']} | {t['status']} | {t['detail']} |")
  lines += ['', f"Validation table entries written: {len(result['validated_entries'])} "
            f"({result['table_note']})", '']
  return '\n'.join(lines)


def run(opts: Options, log=print) -> tuple[dict[str, Any], int]:
  """Runs the sections; returns ``(result, exit code)`` (1 when a correctness case failed)."""
  if not opts.dry_run and jax.default_backend() != 'gpu':
    raise SystemExit(f'gpu_check needs a GPU (default backend is {jax.default_backend()!r}); '
                     'on CPU run it with --dry_run')
  budgets = {k: v * opts.budget_scale
             for k, v in (DRY_BUDGETS if opts.dry_run else GPU_BUDGETS).items()}
  env = environment(opts.command)
  log(f"gpu_check on {env['device_kind']} ({env['backend']}), jax {env['jax']}"
      f"{' [dry run: interpret mode, tiny shapes]' if opts.dry_run else ''}")
  result: dict[str, Any] = {'environment': env, 'dry_run': opts.dry_run, 'budgets': budgets,
                            'correctness': [], 'attention': {}, 'train': []}
  if 'correctness' in opts.sections:
    result['correctness'] = run_correctness(opts, Budget(budgets['correctness']), log)
  if 'attention' in opts.sections:
    rows, info = run_attention(opts, Budget(budgets['attention']), log)
    result['attention'] = {'rows': rows, 'info': info}
  if 'train' in opts.sections:
    result['train'] = run_train(opts, Budget(budgets['train']), log)
  att_rows = result['attention'].get('rows', [])
  result['targets'] = targets(att_rows, result['attention'].get('info'), result['train'])
  if opts.dry_run:
    for t in result['targets']:
      t['status'] = 'n/a (dry run: not a GPU)'

  # Validation entries: compiled GPU cases only; a feature measured slower than XLA is withheld.
  speed = {}
  for causal in (False, True):
    times = _versus(att_rows, 'xla', causal)
    if times:
      speed[('exp', validated.mode_name(causal))] = times[-1][1] <= times[-1][2]
  out_dir = opts.out_dir
  slug = device_slug(env['device_kind'])
  source = f'docs/benchmarks/gpu-{slug}.json'
  entries = validated.entries_from_results(
      result['correctness'], backend=env['backend'], device_kind=env['device_kind'],
      jax_version=env['jax'], source=source, speed=speed)
  result['validated_entries'] = entries
  table = opts.table_path or (os.path.join(out_dir, 'validated.json') if opts.dry_run
                              else validated.TABLE_PATH)
  if opts.write_table and entries:
    validated.merge(entries, table)
    result['table_note'] = f'merged into {table}'
  else:
    result['table_note'] = ('none: dry run (interpret mode validates nothing about a GPU)'
                            if opts.dry_run else 'not written' if entries else
                            'none: no combination passed compiled on a GPU')

  os.makedirs(out_dir, exist_ok=True)
  base = os.path.join(out_dir, f'gpu-{slug}')
  with open(base + '.json', 'w') as f:
    json.dump(result, f, indent=1, default=str)
  with open(base + '.md', 'w') as f:
    f.write(markdown(result))
  result['paths'] = [base + '.md', base + '.json']
  failed = [r for r in result['correctness'] if not r['passed']]
  for r in failed:
    log(f"FAILED: feature={r['feature']} mode={r['mode']} dtype={r['dtype']} L={r['length']} "
        f"out_err={_fmt(r.get('out_err'))} grad_err={r.get('grad_err')} {r.get('error', '')}")
  log(f'wrote {base}.md and {base}.json')
  return result, (1 if failed else 0)


def parse_args(argv: Sequence[str]) -> Options:
  p = argparse.ArgumentParser(prog='gpu_check.py', description=__doc__.split('\n\n')[0])
  p.add_argument('--dry_run', action='store_true',
                 help='CPU: tiny shapes through the same code paths (interpret mode)')
  p.add_argument('--out_dir', default=None,
                 help='where the report goes (default docs/benchmarks on a GPU, a new temp dir for '
                      '--dry_run)')
  p.add_argument('--lengths', default=None, help='comma-separated lengths for the attention section')
  p.add_argument('--sections', default='correctness,attention,train')
  p.add_argument('--budget_scale', type=float, default=1.0,
                 help='multiply every section budget (default budgets fit 14 min on one H100)')
  p.add_argument('--no_write_table', action='store_true',
                 help='do not merge validated entries into kernelformer/pallas/validated.json')
  p.add_argument('--table_path', default=None)
  p.add_argument('--repeats', type=int, default=10)
  a = p.parse_args(list(argv))
  sections = [s.strip() for s in a.sections.split(',') if s.strip()]
  bad = [s for s in sections if s not in ('correctness', 'attention', 'train')]
  if bad:
    p.error(f'unknown section(s) {", ".join(bad)}; valid: correctness, attention, train')
  try:
    lengths = [int(x) for x in a.lengths.split(',')] if a.lengths else None
  except ValueError:
    p.error(f'--lengths must be comma-separated integers; got {a.lengths!r}')
  out_dir = a.out_dir
  if out_dir is None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out_dir = (tempfile.mkdtemp(prefix='gpu_check_') if a.dry_run
               else os.path.join(root, 'docs', 'benchmarks'))
  return Options(dry_run=a.dry_run, out_dir=out_dir, lengths=lengths, sections=sections,
                 budget_scale=a.budget_scale, write_table=not a.no_write_table,
                 table_path=a.table_path, repeats=a.repeats,
                 command='python scripts/gpu_check.py ' + ' '.join(shlex.quote(x) for x in argv))


def main(argv: Sequence[str]) -> int:
  opts = parse_args(argv)
  _, code = run(opts)
  return code
