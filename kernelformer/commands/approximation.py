"""Approximation quality of the attention approximations: four paper experiments, fixed seeds.

  python scripts/approximation.py                                  # all four, runs/benchmarks/
  python scripts/approximation.py --out_dir docs/benchmarks         # the committed results
  python scripts/approximation.py --only performer,luo --draws_scale 0.5
  python scripts/approximation.py --quick --out_dir /tmp/approx    # tiny, for tests

Experiments (``kernelformer.bench.approximation``):
  performer   Performer note: attention MSE vs features, L=1024, d=16, iid vs orf, trig vs positive, 15 draws
  luo         Luo et al. fig. 1b: ||A - A_hat||_1 of PRF vs query/key norm R, m = 4..1024
  grid        Spectraformer component x weight-matrix grid: kernel-estimate error at M = 64, 128, 256
  skyformer   Skyformer fig. 1: spectral-norm error of the attention output vs number of features
Each writes ``<out_dir>/approx_<name>[_quick].csv`` and ``.png`` (the grid also ``.md``), and the
Performer orderings (ORF < iid, positive < trig) are printed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


PROG = 'kernelformer benchmark approximation'
EXPERIMENTS = ('performer', 'luo', 'grid', 'skyformer')

# Full-size and --quick sizes of each experiment.
FULL = {
    'performer': dict(length=1024, dim=16, num_features=(16, 32, 64, 128, 256, 512), draws=15),
    'luo': dict(dim=64, num_keys=1024, radii=(1, 2, 3, 4, 5), num_features=(4, 16, 64, 256, 1024),
                draws=20),
    'grid': dict(length=256, dim=16, num_features=(64, 128, 256), draws=32),
    'skyformer': dict(lengths=(512, 1024), model_dim=768, head_dim=64, init_std=0.02,
                      num_features=(16, 32, 64, 128, 256), draws=5),
}
QUICK = {
    'performer': dict(length=128, dim=16, num_features=(16,), draws=3, input_stds=(0.5,)),
    'luo': dict(dim=64, num_keys=256, radii=(1, 3), num_features=(16,), draws=8),
    'grid': dict(length=64, dim=16, component_names=('trigrf', 'posrf'),
                 sampler_names=('orf', 'fastfood'), num_features=(64,), draws=3),
    'skyformer': dict(lengths=(128,), model_dim=768, head_dim=32, num_features=(32,),
                      methods=('skyformer', 'performer (posrf-orf)'), draws=2),
}


def parse_args(argv):
  p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--only', default=','.join(EXPERIMENTS),
                 help=f'comma-separated subset of {",".join(EXPERIMENTS)}')
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--out_dir', default='runs/benchmarks',
                 help='output folder (default runs/benchmarks; --out_dir docs/benchmarks regenerates the '
                      'committed results of docs/benchmarks.md)')
  p.add_argument('--quick', action='store_true', help='tiny sizes (seconds), for tests')
  args = p.parse_args(argv)
  args.only = [x.strip() for x in args.only.split(',') if x.strip()]
  unknown = sorted(set(args.only) - set(EXPERIMENTS))
  if unknown:
    p.error(f'unknown experiment(s) {", ".join(unknown)}; valid: {", ".join(EXPERIMENTS)}')
  return args


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  from kernelformer.bench import approximation as ap  # pylint: disable=g-import-not-at-top
  from kernelformer.bench import output  # pylint: disable=g-import-not-at-top
  sizes = QUICK if args.quick else FULL
  suffix = '_quick' if args.quick else ''
  path = lambda name, ext: os.path.join(args.out_dir, f'approx_{name}{suffix}.{ext}')
  os.makedirs(args.out_dir, exist_ok=True)
  log = lambda s: print(s, flush=True)
  written = []
  for name in args.only:
    start = time.time()
    if name == 'performer':
      rows = ap.performer_mse(seed=args.seed, log=log, **sizes[name])
      written += [output.write_csv(rows, path(name, 'csv')), ap.plot_performer(rows, path(name, 'png'))]
      print('\nPerformer note orderings (mean MSE over the draws):')
      for std, ordering, m, holds, numbers in ap.performer_orderings(rows):
        print(f'  input std {std:<4g} R={m:<5d} {ordering:<22s} {"holds" if holds else "FAILS"}  '
              f'({numbers})')
    elif name == 'luo':
      rows = ap.luo_prf_error(seed=args.seed, log=log, **sizes[name])
      written += [output.write_csv(rows, path(name, 'csv')), ap.plot_luo(rows, path(name, 'png'))]
    elif name == 'grid':
      rows = ap.spectraformer_grid(seed=args.seed, log=log, **sizes[name])
      written += [output.write_csv(rows, path(name, 'csv')), ap.plot_grid(rows, path(name, 'png'))]
      table = grid_markdown(rows)
      with open(path(name, 'md'), 'w') as f:
        f.write(table + '\n')
      written.append(path(name, 'md'))
      print(table)
    elif name == 'skyformer':
      rows = ap.skyformer_spectral(seed=args.seed, log=log, **sizes[name])
      written += [output.write_csv(rows, path(name, 'csv')), ap.plot_skyformer(rows, path(name, 'png'))]
    print(f'{name}: {time.time() - start:.0f} s', flush=True)
  print('wrote ' + ', '.join(written))
  return 0


def grid_markdown(rows) -> str:
  """One markdown heat-map table per M: components x samplers, mean relative error (± std)."""
  from kernelformer.bench import output  # pylint: disable=g-import-not-at-top
  samplers = list(dict.fromkeys(r['sampler'] for r in rows))
  parts = []
  for m in sorted({r['num_features'] for r in rows}):
    table = []
    for comp in dict.fromkeys(r['component'] for r in rows):
      line = {'component': f'{comp} ({next(r["target"] for r in rows if r["component"] == comp)})'}
      for r in rows:
        if r['num_features'] == m and r['component'] == comp:
          mean = r.get('rel_error_mean')
          line[r['sampler']] = 'n/a' if mean is None else f'{mean:.3g} ± {r["rel_error_std"]:.2g}'
      table.append(line)
    columns = [('component (target)', 'component', str)] + [(s, s, str) for s in samplers]
    parts.append(f'M = {m} (rows of W; trigrf, rks and hyperbolic have 2M features)\n\n'
                 + output.markdown_table(table, columns))
  return '\n\n'.join(parts)


if __name__ == '__main__':
  sys.exit(main())
