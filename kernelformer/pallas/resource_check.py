"""Offline resource check of every Pallas kernel (``kernelformer benchmark pallas-resources``):
registers, spills and shared memory per kernel as
ptxas reports them for sm_90a (H100) and sm_80 (A100), against the hardware limits. No GPU needed.

    kernelformer benchmark pallas-resources                 # the full matrix, both targets
    kernelformer benchmark pallas-resources --quick         # largest shapes only (CI)

How. Each case (mode 'bidirectional', feature, M, d, dtype) is exported with
``jax.export`` for platform 'cuda' (gradient of the output: the forward and backward kernels) at the
launch configuration ``feature_attention.tiling`` chooses. The Triton IR of each ``pallas_call`` is
taken from the exported module (the custom call's backend config), printed as text, deduplicated, and
compiled by ``ptxas_worker.py`` in an environment with a pip ``triton`` (triton's pipeline to PTX, then
its bundled ``ptxas -v``), in parallel. The Triton behind jaxlib is not pip triton, so the figures are
those of the pip version named in the report (triton 3.9.0 here; the IR parses as text).

Limits (NVIDIA CUDA C++ Programming Guide, "Features and Technical Specifications", table of
technical specifications per compute capability; Hopper and Ampere tuning guides): 255 registers per
thread for both; 64K 32-bit registers per block (registers x threads); shared memory per block at most
227 KB = 232,448 B on compute capability 9.0 (H100) and 163 KB = 166,912 B on 8.0 (A100), dynamic
shared memory beyond 48 KB being opted into by the launcher. A kernel fits when registers <= 255,
registers x 32 x num_warps <= 65,536, no spill stores or loads, and shared memory <= the limit.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Iterable, Optional

import jax.numpy as jnp

from kernelformer.pallas.feature_attention import FEATURES, feature_attention, tiling
from kernelformer.pallas import resources
from kernelformer.pallas.resources import KERNEL_SOURCE, TABLE_PATH, kernel_source_hash, load_table

__all__ = ['KERNEL_SOURCE', 'TABLE_PATH', 'kernel_source_hash', 'load_table']   # the reader's, re-exported

LIMITS = {
    # arch: (registers per thread, registers per block, shared memory per block in bytes)
    '90a': (255, 65536, 232448),
    '80': (255, 65536, 166912),
}
FEATURE_COUNTS = (64, 128, 256)
HEAD_DIMS = (32, 64, 128)
DTYPES = ('float32', 'bfloat16')
MODES = ('bidirectional',)     # the kernels have no causal form (feature_attention)
# Export shapes (only block shapes matter to the kernels; these give loops of several chunks).
BATCH, HEADS, LENGTH = 4, 8, 4096
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ptxas_worker.py')


@dataclasses.dataclass(frozen=True)
class Case:
  mode: str
  feature: str
  m: Optional[int]      # None for elu / relu (M = d)
  d: int
  dtype: str

  def label(self) -> str:
    return f'{self.mode} {self.feature} M={self.m or "-"} d={self.d} {self.dtype}'


def cases(quick: bool = False) -> list[Case]:
  """The matrix: every mode x feature x M x d x dtype (elu / relu have no M). ``quick``: the largest
  M and d only (each kernel's largest tiles)."""
  ms = FEATURE_COUNTS[-1:] if quick else FEATURE_COUNTS
  ds = HEAD_DIMS[-1:] if quick else HEAD_DIMS
  out = []
  for mode, feature, d, dtype in itertools.product(MODES, FEATURES, ds, DTYPES):
    for m in (ms if feature in ('exp', 'trig') else (None,)):
      out.append(Case(mode, feature, m, d, dtype))
  return out


# Triton's smallest dot operand side: the kernels pad every feature and head width to a power of two at
# least this (``feature_attention``'s own rule; tests/pallas/test_resources.py checks that they agree).
MIN_TILE = 16


def pow2_at_least(n: int, floor: int = MIN_TILE) -> int:
  """The padded width the kernels use for ``n``: the next power of two, at least ``floor``."""
  return max(floor, 1 << max(0, int(n) - 1).bit_length())


def padded_features(feature: str, m: Optional[int], d: int) -> int:
  if feature in ('exp', 'trig'):
    return pow2_at_least(m * (2 if feature == 'trig' else 1))
  return pow2_at_least(d)


def launch(case: Case):
  """The ``Tiling`` feature_attention would choose for this case."""
  d = pow2_at_least(case.d)
  return tiling(case.feature, padded_features(case.feature, case.m, case.d), d, d, jnp.dtype(case.dtype))


def export_kernels(case: Case, tl=None) -> list[dict]:
  """``[{name, ttir, num_warps, num_stages}]`` of every pallas_call of forward + backward, at the
  default launch configuration or at ``tl`` (a ``Tiling``)."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax._src.interpreters import mlir as jmlir  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir import ir  # pylint: disable=g-import-not-at-top
  from jaxlib.triton import dialect as tt_dialect  # pylint: disable=g-import-not-at-top

  dt = jnp.dtype(case.dtype)
  x = jax.ShapeDtypeStruct((BATCH, LENGTH, HEADS, case.d), dt)
  projected = case.feature in ('exp', 'trig')
  w = jax.ShapeDtypeStruct((HEADS, case.m, case.d), jnp.float32) if projected else None

  def loss(q, k, v, w):
    knobs = {} if tl is None else dict(block_q=tl.block, block_k=tl.block, block_m=tl.block_m,
                                       num_warps=tl.num_warps, num_stages=tl.num_stages)
    out = feature_attention(q, k, v, w, feature=case.feature, interpret=False, **knobs)
    return jnp.sum(out.astype(jnp.float32))

  fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3) if projected else (0, 1, 2)))
  # jaxlib > 0.10.2 compiles each kernel while lowering (through the compilation handler a GPU
  # plugin registers): capture the Triton IR, and the PTX jaxlib's own Triton made for this GPU.
  from jax._src.lib import triton as jax_triton  # pylint: disable=g-import-not-at-top
  captured, real_compile = [], jax_triton.compile

  def spy(platform, module, arch_name, **kw):
    res = real_compile(platform, module, arch_name, **kw)
    captured.append({'bytecode': bytes(module), 'num_warps': kw.get('num_warps'),
                     'num_stages': kw.get('num_stages'), 'ptx': getattr(res, 'asm', None),
                     'jax_shared': int(getattr(res, 'smem_bytes', 0)), 'jax_arch': arch_name})
    return res

  jax_triton.compile = spy
  try:
    exported = jax.export.export(
        fn, platforms=('cuda',),
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(t)
                         for t in ('__gpu$xla.gpu.triton', 'triton_kernel_call_ffi')])(x, x, x, w)
  finally:
    jax_triton.compile = real_compile
  found = []
  kernels = []
  with jmlir.make_ir_context() as ctx:
    tt_dialect.register_dialect(ctx)
    if captured:
      for c in captured:
        text = ir.Module.parse(c['bytecode']).operation.get_asm(enable_debug_info=False)
        name = re.search(r'tt\.func (?:public )?@(\w+)', text).group(1)
        kernels.append({'name': name.replace('feature_attention_', ''), 'ttir': text,
                        'num_warps': c['num_warps'], 'num_stages': c['num_stages'],
                        'ptx': c['ptx'], 'jax_shared': c['jax_shared'], 'jax_arch': c['jax_arch']})
      return kernels
    module = ir.Module.parse(exported.mlir_module())

    def walk(op):
      for region in op.regions:
        for block in region.blocks:
          for child in block.operations:
            o = child.operation
            if o.name == 'stablehlo.custom_call' and 'triton' in ir.StringAttr(
                o.attributes['call_target_name']).value:
              found.append(ir.DictAttr(o.attributes['mhlo.backend_config']))
            walk(o)

    walk(module.operation)
    for cfg in found:
      kernel = ir.Module.parse(ir.StringAttr(cfg['ir']).value_bytes)
      kernels.append({
          'name': ir.StringAttr(cfg['name']).value.replace('feature_attention_', ''),
          'ttir': kernel.operation.get_asm(enable_debug_info=False),
          'num_warps': ir.IntegerAttr(cfg['num_warps']).value,
          'num_stages': ir.IntegerAttr(cfg['num_stages']).value})
  return kernels


def _export_one(item):
  return export_kernels(*item)


def _export_all(items, jobs: int):
  """export_kernels per (case, tiling or None), in ``jobs`` processes when there are several (on a
  GPU machine each process opens the device: no preallocation)."""
  if jobs <= 1 or len(items) <= 1:
    return [export_kernels(*item) for item in items]
  import concurrent.futures  # pylint: disable=g-import-not-at-top
  import multiprocessing  # pylint: disable=g-import-not-at-top
  os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  with concurrent.futures.ProcessPoolExecutor(
      min(jobs, len(items)), mp_context=multiprocessing.get_context('spawn')) as pool:
    return list(pool.map(_export_one, items))


def fits(res: dict, arch: str, num_warps: int) -> bool:
  regs, per_block, smem = LIMITS[arch]
  return ('error' not in res and res['registers'] <= regs
          and res['registers'] * 32 * num_warps <= per_block
          and res['spill_stores'] == 0 and res['spill_loads'] == 0 and res['shared'] <= smem)


def find_triton_python(explicit: Optional[str] = None) -> Optional[str]:
  """The Python that can import triton: ``explicit``, $KERNELFORMER_TRITON_PYTHON, the repository's
  .venv-triton, or this interpreter."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  for cand in (explicit, os.environ.get('KERNELFORMER_TRITON_PYTHON'),
               os.path.join(root, '.venv-triton', 'bin', 'python'), sys.executable):
    if not cand:
      continue
    if cand != sys.executable and not os.path.exists(cand):
      if cand == explicit:
        return None
      continue
    ok = subprocess.run([cand, '-c', 'import triton'], capture_output=True).returncode == 0
    if ok:
      return cand
    if cand == explicit:
      return None
  return None


def compile_all(kernels: list[dict], archs: Iterable[str], triton_python: str, jobs: int) -> dict:
  """Results per (ttir digest, arch, warps, stages), compiling each distinct kernel once."""
  todo = {}
  for k in kernels:
    for arch in archs:
      key = _key(k, arch)
      job = {'id': key, 'ttir': k['ttir'], 'arch': arch, 'num_warps': k['num_warps'],
             'num_stages': k['num_stages']}
      if k.get('ptx') and _same_arch(k.get('jax_arch', ''), arch):
        job.update(ptx=k['ptx'], shared=k['jax_shared'])   # jaxlib's own PTX for this GPU
      todo.setdefault(key, job)
  with tempfile.TemporaryDirectory() as tmp:
    jobs_path, out_path = os.path.join(tmp, 'jobs.json'), os.path.join(tmp, 'out.json')
    with open(jobs_path, 'w') as f:
      json.dump(list(todo.values()), f)
    env = dict(os.environ, TRITON_DEFAULT_FP_FUSION='1')
    r = subprocess.run([triton_python, WORKER, jobs_path, out_path, '--jobs', str(jobs)], env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
      raise RuntimeError(f'ptxas worker failed: {(r.stderr or r.stdout).strip()[-600:]}')
    with open(out_path) as f:
      return {res['id']: res for res in json.load(f)}


def _same_arch(jax_arch: str, arch: str) -> bool:
  """'9.0' (jaxlib's compute capability) against '90a'."""
  return jax_arch.replace('.', '') == arch.rstrip('a')


def _key(kernel: dict, arch: str) -> str:
  h = hashlib.sha256(kernel['ttir'].encode()).hexdigest()[:16]
  return f'{h}-{arch}-{kernel["num_warps"]}-{kernel["num_stages"]}'


def run(quick: bool, archs: tuple[str, ...], triton_python: str, jobs: int,
        only: Optional[list[Case]] = None, log=print) -> tuple[list[dict], dict]:
  """Rows ``{case..., kernel, tiling, <arch>: result}`` for every kernel of every case; timings."""
  t0 = time.perf_counter()
  rows, kernels = [], []
  items = [item if isinstance(item, tuple) else (item, None)
           for item in (only if only is not None else cases(quick))]
  for (case, tl), exported in zip(items, _export_all(items, jobs)):
    tl = tl or launch(case)
    for k in exported:
      rows.append({'case': case, 'tiling': tl, **k})
      kernels.append(k)
  t1 = time.perf_counter()
  distinct = len({_key(k, a) for k in kernels for a in archs})
  log(f'exported {len(rows)} kernels of {len(rows) and len({r["case"] for r in rows})} cases in '
      f'{t1 - t0:.0f} s; compiling {distinct} distinct (kernel, target) pairs with {jobs} processes')
  results = compile_all(kernels, archs, triton_python, jobs)
  t2 = time.perf_counter()
  out = []
  for r in rows:
    row = {'case': r['case'], 'tiling': r['tiling'], 'kernel': r['name'],
           'num_warps': r['num_warps'], 'num_stages': r['num_stages']}
    for arch in archs:
      res = results[_key(r, arch)]
      row[arch] = dict(res, fits=fits(res, arch, r['num_warps']))
    out.append(row)
  return out, {'export_s': t1 - t0, 'compile_s': t2 - t1, 'distinct': distinct}


def cell(res: dict) -> str:
  if 'error' in res:
    return 'ERROR'
  spill = res['spill_stores'] + res['spill_loads']
  return f"{res['registers']} / {spill} / {res['shared']:,}" + ('' if res['fits'] else ' **NO**')


def markdown(rows: list[dict], archs: tuple[str, ...]) -> str:
  """One line per (case, kernel): tiling and, per target, registers / spill bytes / shared bytes."""
  head = ('| case | kernel | block, block_m, warps, stages | '
          + ' | '.join(f'sm_{a} regs / spill B / smem B' for a in archs) + ' |')
  lines = [head, '|' + '---|' * (3 + len(archs))]
  for r in rows:
    c, tl = r['case'], r['tiling']
    lines.append(f'| {c.label()} | {r["kernel"]} | {tl.block}, {tl.block_m}, '
                 f'{r["num_warps"]}, {r["num_stages"]} | '
                 + ' | '.join(cell(r[a]) for a in archs) + ' |')
  return '\n'.join(lines)


def table_entries(rows: list[dict], arch: str = '90a') -> list[dict]:
  """For resources.json: per case, whether all its kernels fit ``arch``, keyed with its tiling."""
  by_case = {}
  for r in rows:
    by_case.setdefault(r['case'], []).append(r)
  entries = []
  for case, rs in by_case.items():
    tl = rs[0]['tiling']
    entries.append({'mode': case.mode, 'feature': case.feature,
                    'num_features': padded_features(case.feature, case.m, case.d),
                    'head_dim': case.d, 'dtype': case.dtype, 'tiling': list(tl),
                    'fits': all(r[arch]['fits'] for r in rs),
                    'max_registers': max(r[arch].get('registers', 0) for r in rs),
                    'max_shared': max(r[arch].get('shared', 0) for r in rs),
                    'toolchain': rs[0][arch].get('toolchain', ''),
                    'kernel_source': kernel_source_hash()})
  return entries


def write_table(entries: list[dict], path: Optional[str] = None) -> None:
  """Merges ``entries`` into resources.json (an entry replaces the one with the same case key)."""
  path = path or resources.TABLE_PATH
  key = lambda e: (e['mode'], e['feature'], e['num_features'], e['head_dim'], e['dtype'])
  merged = {key(e): e for e in load_table(path)}
  merged.update({key(e): e for e in entries})
  with open(path, 'w') as f:
    json.dump({'note': 'written by kernelformer benchmark pallas-resources --write_table; fits = '
                       'every kernel of the case fits sm_90a (registers <= 255, no spills, shared '
                       'memory <= 232448 B) at the listed tiling (block, block_m, warps, stages), '
                       'for the kernel code whose hash is kernel_source (resources.kernel_source_hash)',
               'entries': sorted(merged.values(), key=key)}, f, indent=1)
    f.write('\n')
