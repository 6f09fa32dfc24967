"""Registers, spills and shared memory of every Pallas kernel, compiled offline for sm_90a and sm_80.

  kernelformer benchmark pallas-resources                # full matrix (modes x features x M x d x dtype)
  kernelformer benchmark pallas-resources --quick        # M = 256, d = 128 only
  kernelformer benchmark pallas-resources --markdown t.md --write_table

Needs a Python with a pip ``triton`` (it ships ptxas): --triton_python, $KERNELFORMER_TRITON_PYTHON,
the repository's .venv-triton (made by .ci/run) or this interpreter. No GPU. Exits 1 if any kernel
does not fit (registers > 255, any spill, shared memory over the block limit), 0 if all fit.
``--write_table`` records per case whether all its kernels fit sm_90a, with the launch configuration,
in kernelformer/pallas/resources.json: ``impl='auto'`` takes the kernels only for cases listed as
fitting there (``feature_attention.fits``). Method and limits: kernelformer/pallas/resource_check.py.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str]) -> int:
  from kernelformer.pallas import resource_check as resources  # pylint: disable=g-import-not-at-top
  p = argparse.ArgumentParser(prog='kernelformer benchmark pallas-resources', description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--quick', action='store_true', help='largest M and d only')
  p.add_argument('--case', action='append', default=[],
                 help='only this case, MODE:FEATURE:M:D:DTYPE (M "-" for elu / relu); repeatable')
  p.add_argument('--arch', default='90a,80', help='targets, comma separated (90a, 80)')
  p.add_argument('--jobs', type=int, default=os.cpu_count() or 1, help='parallel compiles')
  p.add_argument('--triton_python', default=None)
  p.add_argument('--markdown', default=None, help='write the table here')
  p.add_argument('--json', default=None, help='write every result here')
  p.add_argument('--require', choices=('all', 'table'), default='all',
                 help="all: exit 1 if any kernel does not fit; table: only if a case that "
                      "resources.json lists as fitting (at today's tiling) does not")
  p.add_argument('--write_table', action='store_true',
                 help='record the sm_90a verdict per case in kernelformer/pallas/resources.json')
  args = p.parse_args(argv)
  archs = tuple(a.strip() for a in args.arch.split(',') if a.strip())
  bad = [a for a in archs if a not in resources.LIMITS]
  if bad or not archs:
    print(f'error: --arch takes {", ".join(resources.LIMITS)}; got {args.arch!r}', file=sys.stderr)
    return 2
  py = resources.find_triton_python(args.triton_python)
  if py is None:
    print('error: no Python with triton found (pip install triton in a venv of its own and pass '
          '--triton_python, or run .ci/run which makes .venv-triton)', file=sys.stderr)
    return 2
  only = None
  if args.case:
    only = []
    for spec in args.case:
      parts = spec.split(':')
      try:
        mode, feature, m, d, dtype = parts
        only.append(resources.Case(mode, feature, None if m == '-' else int(m), int(d), dtype))
      except ValueError:
        print(f'error: --case takes MODE:FEATURE:M:D:DTYPE, e.g. bidirectional:exp:256:64:bfloat16; got '
              f'{spec!r}', file=sys.stderr)
        return 2
      if (mode not in resources.MODES or dtype not in resources.DTYPES
          or (m == '-') != (feature in ('elu', 'relu'))):
        print(f'error: --case {spec!r}: mode {"/".join(resources.MODES)}, dtype '
              f'{"/".join(resources.DTYPES)}, M "-" exactly for elu / relu', file=sys.stderr)
        return 2
  t0 = time.perf_counter()
  rows, timing = resources.run(args.quick, archs, py, max(1, args.jobs), only=only)
  table = resources.markdown(rows, archs)
  print(table)
  bad_rows = [r for r in rows if not all(r[a]['fits'] for a in archs)]
  total = time.perf_counter() - t0
  print(f'\n{len(rows) - len(bad_rows)} of {len(rows)} kernels fit {", ".join("sm_" + a for a in archs)}'
        f' ({timing["distinct"]} distinct compiles; export {timing["export_s"]:.0f} s, compile '
        f'{timing["compile_s"]:.0f} s, total {total:.0f} s)')
  for r in bad_rows:
    why = '; '.join(f'sm_{a}: {r[a].get("error") or resources.cell(r[a])}'
                    for a in archs if not r[a]['fits'])
    print(f'DOES NOT FIT: {r["case"].label()} {r["kernel"]} ({why})')
  if args.markdown:
    with open(args.markdown, 'w') as f:
      f.write(table + '\n')
  if args.json:
    with open(args.json, 'w') as f:
      json.dump([dict(r, case=r['case'].label(), tiling=list(r['tiling'])) for r in rows], f, indent=1)
  if args.write_table:
    resources.write_table(resources.table_entries(rows, archs[0]))
  if args.require == 'table':
    import importlib  # pylint: disable=g-import-not-at-top
    fa = importlib.import_module('kernelformer.pallas.feature_attention')
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    broken = [r for r in bad_rows if fa.fits(r['case'].feature, r['case'].m, r['case'].d,
                                             jnp.dtype(r['case'].dtype))]
    for r in broken:
      print(f'LISTED AS FITTING IN resources.json BUT DOES NOT: {r["case"].label()} {r["kernel"]}')
    print(f'--require table: {len(broken)} kernel(s) of cases listed as fitting do not fit; '
          f'{len(bad_rows) - len(broken)} non-fitting kernel(s) belong to cases impl=auto sends to XLA')
    return 1 if broken else 0
  return 1 if bad_rows else 0
