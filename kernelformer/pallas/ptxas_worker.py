"""Compiles Triton IR (text) for an NVIDIA target and reports ptxas's resource usage; no GPU needed.

Run by ``kernelformer.pallas.resource_check`` with the Python of an environment that has a pip ``triton``
(it ships ptxas); imports nothing but the standard library and triton, so it can live in a venv of its
own (.ci/run makes ``.venv-triton``):

    python kernelformer/pallas/ptxas_worker.py JOBS.json RESULTS.json [--jobs N]

JOBS.json: ``[{"id", "ttir", "arch": "90a" | "80", "num_warps", "num_stages"}]``. Each kernel goes
through triton's own pipeline (ttir passes, ttgir, llir, ptx) for ``GPUTarget('cuda', 90|80, 32)``,
exactly as ``triton.compile`` would, and the PTX through ``ptxas -v --gpu-name sm_90a|sm_80``.
RESULTS.json: per id ``registers``, ``spill_stores``, ``spill_loads`` (bytes), ``shared`` (bytes:
triton's dynamic shared memory plus ptxas's static), ``stack``, or ``error``.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile


def _ptxas_candidates():
  """$KERNELFORMER_PTXAS, triton's bundled ptxas (the newer first: it reads newer PTX), then any
  ptxas of a pip CUDA package (nvidia/*/bin)."""
  import glob  # pylint: disable=g-import-not-at-top
  import site  # pylint: disable=g-import-not-at-top
  import triton  # pylint: disable=g-import-not-at-top
  out = [os.environ['KERNELFORMER_PTXAS']] if os.environ.get('KERNELFORMER_PTXAS') else []
  bin_dir = os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin')
  out += [os.path.join(bin_dir, n) for n in ('ptxas-blackwell', 'ptxas')]
  for sp in site.getsitepackages():
    out += sorted(glob.glob(os.path.join(sp, 'nvidia', '**', 'bin', 'ptxas'), recursive=True))
  return [p for p in out if os.path.exists(p)]


def parse_ptxas(text: str) -> dict:
  """Registers, spills, stack and static shared memory from ``ptxas -v`` output (one kernel)."""
  out = {}
  m = re.search(r'Used (\d+) registers', text)
  if m:
    out['registers'] = int(m.group(1))
  m = re.search(r'(\d+) bytes spill stores, (\d+) bytes spill loads', text)
  if m:
    out['spill_stores'], out['spill_loads'] = int(m.group(1)), int(m.group(2))
  m = re.search(r'(\d+) bytes stack frame', text)
  out['stack'] = int(m.group(1)) if m else 0
  m = re.search(r'(\d+) bytes smem', text)
  out['static_shared'] = int(m.group(1)) if m else 0
  return out


def compile_one(job: dict) -> dict:
  os.environ.setdefault('TRITON_DEFAULT_FP_FUSION', '1')
  import triton  # pylint: disable=g-import-not-at-top
  from triton._C.libtriton import ir  # pylint: disable=g-import-not-at-top
  from triton.backends.compiler import GPUTarget  # pylint: disable=g-import-not-at-top
  from triton.compiler import compiler as tc  # pylint: disable=g-import-not-at-top
  res = {'id': job['id']}
  try:
    arch = job['arch']
    target = GPUTarget('cuda', int(arch.rstrip('a')), 32)
    backend = tc.make_backend(target)
    ctx = ir.context()
    ir.load_dialects(ctx)
    backend.load_dialects(ctx)
    with tempfile.TemporaryDirectory() as tmp:
      if job.get('ptx'):                      # PTX made by jaxlib's own Triton: ptxas only
        return _ptxas_report(res, job['ptx'], arch, int(job.get('shared', 0)), tmp,
                             'jaxlib triton', triton.__version__)
      src = os.path.join(tmp, 'kernel.ttir')
      with open(src, 'w') as f:
        f.write(job['ttir'])
      mod = ir.parse_mlir_module(src, ctx)
      mod.context = ctx
      opts = backend.parse_options({'num_warps': job['num_warps'], 'num_stages': job['num_stages']})
      stages = {}
      lang = getattr(tc, 'Language', None)
      if lang is not None:
        backend.add_stages(stages, opts, lang.TRITON)
      else:                                              # older triton: add_stages(stages, options)
        backend.add_stages(stages, opts)
      metadata = {'hash': job['id'], 'target': target, **opts.__dict__}
      cur = mod
      for ext, fn in stages.items():
        if ext == 'cubin':
          break
        cur = fn(cur, metadata)
      return _ptxas_report(res, cur, arch, int(metadata.get('shared', 0)), tmp,
                           f'pip triton {triton.__version__}', triton.__version__)
  except Exception as e:  # pylint: disable=broad-except
    res['error'] = f'{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ""}'
  return res


def _ptxas_report(res, ptx, arch, dynamic_shared, tmp, source, version):
  ptx_path = os.path.join(tmp, 'kernel.ptx')
  with open(ptx_path, 'w') as f:
    f.write(ptx)
  res['dynamic_shared'] = dynamic_shared
  last = ''
  for ptxas in _ptxas_candidates():
    r = subprocess.run([ptxas, '-v', f'--gpu-name=sm_{arch}', ptx_path, '-o', os.devnull],
                       capture_output=True, text=True)
    last = r.stdout + r.stderr
    if r.returncode == 0:
      break
  else:
    raise RuntimeError(f'ptxas failed: {last.strip()[-400:]}')
  res.update(parse_ptxas(last))
  res['shared'] = res['dynamic_shared'] + res['static_shared']
  res['toolchain'] = f'{source} + {os.path.basename(ptxas)}'
  res['triton'] = version
  return res


def main(argv) -> int:
  jobs_path, out_path = argv[0], argv[1]
  workers = int(argv[argv.index('--jobs') + 1]) if '--jobs' in argv else (os.cpu_count() or 1)
  with open(jobs_path) as f:
    jobs = json.load(f)
  results = []
  # Progress: one line per finished kernel in RESULTS.json.partial (a long run can be watched).
  with open(out_path + '.partial', 'w') as progress:
    if workers > 1 and len(jobs) > 1:
      with multiprocessing.get_context('spawn').Pool(min(workers, len(jobs))) as pool:
        for res in pool.imap_unordered(compile_one, jobs, chunksize=1):
          results.append(res)
          progress.write(json.dumps(res) + '\n')
          progress.flush()
    else:
      for job in jobs:
        results.append(compile_one(job))
        progress.write(json.dumps(results[-1]) + '\n')
        progress.flush()
  with open(out_path, 'w') as f:
    json.dump(results, f)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
