"""Time, compiled memory and FLOPs of attention mechanisms versus sequence length.

  python scripts/benchmark_attention.py                          # default set, L = 1K..16K, runs/benchmarks/
  python scripts/benchmark_attention.py --out_dir docs/benchmarks   # the committed results
  python scripts/benchmark_attention.py --kinds softmax,posrf-orf --lengths 1024,4096 --mode fwd+bwd
  python scripts/benchmark_attention.py --quick --out_dir /tmp/bench   # tiny, for tests
  python scripts/benchmark_attention.py --compare official --num_features 256 --repeats 7
      # posrf-orf vs a re-implementation of the official Performer FAVOR+, same W and mask, interleaved
  python scripts/benchmark_attention.py --compare official --causal --num_features 256 --lengths 65536 \
      --batch 8 --heads 8 --modes fwd --max_memory_gb 19   # one mode, memory limit lifted (default 8)

Writes ``<out_dir>/<name>.csv``, ``<name>.md`` (markdown tables) and ``<name>_time.png`` /
``<name>_memory.png`` (log-log vs length, softmax in black), then prints the issue's claims with the
measured numbers. The work is done by ``kernelformer.bench.attention_cost``; see docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time


PROG = 'kernelformer benchmark attention'
QUICK_KINDS = ('softmax', 'posrf-orf')
QUICK_MAP_KINDS = ('softmax', 'taylor:map_dim=4')   # --compare maps --quick
QUICK_LENGTHS = (128, 256)
MODES = ('fwd', 'fwd+bwd')    # attention_cost.MODES (not imported here: --help stays fast)


def parse_args(argv):
  from kernelformer.bench import attention_cost  # pylint: disable=g-import-not-at-top
  d = attention_cost.Setup()
  p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--kinds', default=None,
                 help='comma-separated registry names, or "all" for every registered name (default: '
                      f'{",".join(attention_cost.DEFAULT_KINDS)}; with --compare maps: '
                      f'{",".join(attention_cost.DEFAULT_MAP_KINDS)}; there a name may carry attention '
                      'options, e.g. taylor:map_dim=16)')
  p.add_argument('--lengths', default=','.join(map(str, attention_cost.DEFAULT_LENGTHS)))
  p.add_argument('--batch', type=int, default=d.batch)
  p.add_argument('--heads', type=int, default=d.heads)
  p.add_argument('--head_dim', type=int, default=d.head_dim)
  p.add_argument('--num_features', type=int, default=64,
                 help='M: random features, landmarks (skyformer, nystromformer), linformer_k')
  p.add_argument('--repeats', type=int, default=5,
                 help='timed calls per cell after one warm-up (fewer for slow cells, see --cell_budget_s)')
  p.add_argument('--dtype', default=d.dtype, choices=('float32', 'bfloat16', 'float16'))
  p.add_argument('--causal', action='store_true')
  p.add_argument('--modes', default=','.join(MODES),
                 help='--compare official: comma-separated subset of fwd,fwd+bwd to run (default both)')
  p.add_argument('--max_memory_gb', type=float, default=d.max_memory_gb,
                 help='compile but do not run cells whose compiled memory is larger')
  p.add_argument('--max_call_s', type=float, default=d.max_call_s,
                 help='skip cells whose time per call, extrapolated from the previous length, is larger')
  p.add_argument('--cell_budget_s', type=float, default=20.0,
                 help='seconds per cell (warm-up + repeats); slow cells get fewer repeats')
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--out_dir', default='runs/benchmarks',
                 help='output folder (default runs/benchmarks; --out_dir docs/benchmarks regenerates the '
                      'committed results of docs/benchmarks.md)')
  p.add_argument('--name', default=None, help='output file stem (default: attention_cost[_quick])')
  p.add_argument('--dims', default='16,32,64,128,256,512,1024',
                 help='--compare projections: head dims d to time')
  p.add_argument('--compare', default=None, choices=('official', 'projections', 'maps'),
                 help='official: posrf-orf against the official Performer FAVOR+ (bench/official_favor.py) '
                      'at equal B, H, d, M, W and key mask, bidirectional and causal (or only --causal), '
                      'fwd and fwd+bwd, timed interleaved; writes <name>.csv/.md (default compare_official). '
                      'projections: x W^T by dense W, SORF and FastFood for each of --dims (M = '
                      '--num_features), and the Hadamard transform by butterfly vs dense matmul. '
                      'maps: fwd+bwd time and XLA memory of each of --kinds, row-wise feature maps '
                      'both lean and stored, timed interleaved, bidirectional and causal (or only '
                      '--causal); writes <name>.csv/.md (default compare_maps)')
  p.add_argument('--quick', action='store_true',
                 help=f'{",".join(QUICK_KINDS)} at L={",".join(map(str, QUICK_LENGTHS))}, 1 repeat '
                      f'(--compare maps: {",".join(QUICK_MAP_KINDS)} at L={QUICK_LENGTHS[0]})')
  args = p.parse_args(argv)
  args.modes = tuple(m.strip() for m in args.modes.split(',') if m.strip())
  if args.quick:
    maps = args.compare == 'maps'
    args.kinds = ','.join(QUICK_MAP_KINDS if maps else QUICK_KINDS)
    args.lengths, args.repeats = ','.join(map(str, QUICK_LENGTHS[:1] if maps else QUICK_LENGTHS)), 1
    args.num_features = min(args.num_features, 32)
  return args


def hardware() -> str:
  """One line: cores, CPU model, load, jax backend and version."""
  import jax  # pylint: disable=g-import-not-at-top
  model = platform.processor() or 'unknown'
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          model = line.split(':', 1)[1].strip()
          break
  except OSError:
    pass
  load = os.getloadavg() if hasattr(os, 'getloadavg') else ('?',) * 3
  devices = ', '.join(sorted({d.device_kind for d in jax.devices()}))
  return (f'{os.cpu_count()} cores ({model}); load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; '
          f'jax {jax.__version__} on {jax.default_backend()} ({devices})')


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  bad = [m for m in args.modes if m not in MODES]
  if bad or not args.modes:
    print(f'{PROG}: error: --modes takes a comma-separated subset of {",".join(MODES)}; got '
          f'{",".join(bad) or "nothing"}', file=sys.stderr)
    return 2
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  from kernelformer.bench import attention_cost  # pylint: disable=g-import-not-at-top
  if args.kinds is None:
    args.kinds = ','.join(attention_cost.DEFAULT_MAP_KINDS if args.compare == 'maps'
                          else attention_cost.DEFAULT_KINDS)
  kinds = registry.list_kernels() if args.kinds == 'all' else [k.strip() for k in args.kinds.split(',')]
  lengths = [int(x) for x in args.lengths.split(',')]
  setup = attention_cost.Setup(batch=args.batch, heads=args.heads, head_dim=args.head_dim,
                               num_features=args.num_features, dtype=args.dtype, causal=args.causal,
                               repeats=args.repeats, max_memory_gb=args.max_memory_gb,
                               max_call_s=args.max_call_s, cell_budget_s=args.cell_budget_s,
                               matmul_size=512 if args.quick else 2048, seed=args.seed)
  hw_before = hardware()
  print(hw_before, flush=True)
  if args.compare == 'official':
    return _compare_official(args, setup, lengths, hw_before, argv)
  if args.compare == 'projections':
    return _compare_projections(args, setup, hw_before, argv)
  if args.compare == 'maps':
    return _compare_maps(args, setup, kinds, lengths, hw_before, argv)
  start = time.time()
  rows, info = attention_cost.run(kinds, lengths, setup, log=lambda s: print(s, flush=True))
  elapsed = time.time() - start
  hw_after = hardware()
  claims = attention_cost.check_claims(rows, head_dim=args.head_dim)

  name = args.name or ('attention_cost_quick' if args.quick else 'attention_cost')
  prefix = os.path.join(args.out_dir, name)
  os.makedirs(args.out_dir, exist_ok=True)
  from kernelformer.bench import output  # pylint: disable=g-import-not-at-top
  output.write_csv(rows, prefix + '.csv', attention_cost.FIELDS)
  command = 'python scripts/benchmark_attention.py ' + ' '.join(sys.argv[1:] if argv is None else argv)
  lines = [f'# Attention cost ({name})', '', f'Command: `{command.strip()}`', '',
           f'Hardware at start: {hw_before}', '', f'Hardware at end: {hw_after}', '',
           f'Dense matmul reference: {info["matmul_gflop_per_s"]:.1f} GFLOP/s; run took {elapsed:.0f} s.',
           '', f'Setup: batch {args.batch}, heads {args.heads}, head_dim {args.head_dim}, '
           f'M {args.num_features}, {args.dtype}, causal {args.causal}; median of up to {args.repeats} '
           f'timed calls after one warm-up call, within {args.cell_budget_s:g} s per cell (column n: '
           'calls timed; note "no warm-up": calls predicted to take over a quarter of that budget).', '',
           'Compiled memory is XLA\'s buffer assignment; peak RSS is the process\'s resident high-water '
           'mark after the cell (monotone over the run).', '']
  if info['skipped']:
    lines += ['Skipped (failed to build): ' + '; '.join(f'`{k}`: {v}' for k, v in info['skipped'].items()),
              '']
  for title, key, spec in (('median time (ms)', 'time_ms', output.num),
                           ('compiled memory: temp + arguments + outputs (MiB)', 'total_mib', output.num),
                           ('time / softmax', 'time_vs_softmax', '.3g')):
    lines += [f'## fwd+bwd: {title}', '', attention_cost.pivot_markdown(rows, 'fwd+bwd', key, spec), '']
  for mode in attention_cost.MODES:
    lines += [f'## All measurements: {mode}', '', attention_cost.markdown(rows, mode), '']
  lines += ['## Claims', '', '```', attention_cost.format_claims(claims), '```', '']
  with open(prefix + '.md', 'w') as f:
    f.write('\n'.join(lines))
  pngs = attention_cost.plot(rows, prefix, title=f'(B={args.batch}, H={args.heads}, '
                             f'd={args.head_dim}, M={args.num_features}, {args.dtype})')
  print()
  print(attention_cost.markdown(rows))
  if info['skipped']:
    print('skipped: ' + '; '.join(f'{k}: {v}' for k, v in info['skipped'].items()))
  print('\nClaims (measured in this run):')
  print(attention_cost.format_claims(claims))
  print('wrote ' + ', '.join([prefix + '.csv', prefix + '.md', *pngs]))
  return 0


def _compare_official(args, setup, lengths, hw_before, argv) -> int:
  """``--compare official``: runs ``attention_cost.compare_official`` and writes its table."""
  from kernelformer.bench import attention_cost  # pylint: disable=g-import-not-at-top
  causal_modes = (True,) if args.causal else (False, True)
  start = time.time()
  rows = attention_cost.compare_official(lengths, setup, causal_modes=causal_modes, modes=args.modes,
                                         log=lambda s: print(s, flush=True))
  elapsed = time.time() - start
  name = args.name or ('compare_official_quick' if args.quick else 'compare_official')
  setup_line = (f'Setup: batch {args.batch}, heads {args.heads}, head_dim {args.head_dim}, '
                f'M {args.num_features}, {args.dtype}, last L/8 keys padded; medians of {args.repeats} '
                f'interleaved rounds after one warm-up call each; modes {",".join(args.modes)}; cells '
                f'whose compiled memory (either side) exceeds --max_memory_gb {args.max_memory_gb:g} '
                f'are compiled, not run; run took {elapsed:.0f} s.')
  return _write_comparison(args, name, f'posrf-orf vs official Performer FAVOR+ ({name})', rows,
                           attention_cost.COMPARE_FIELDS, attention_cost.compare_markdown(rows),
                           [setup_line], hw_before, argv)


def _write_comparison(args, name, title, rows, fields, table, setup_lines, hw_before, argv) -> int:
  """Writes ``<out_dir>/<name>.csv`` and ``.md`` (title, command, hardware before/after, setup, table)."""
  from kernelformer.bench import output  # pylint: disable=g-import-not-at-top
  prefix = os.path.join(args.out_dir, name)
  os.makedirs(args.out_dir, exist_ok=True)
  output.write_csv(rows, prefix + '.csv', fields)
  command = 'python scripts/benchmark_attention.py ' + ' '.join(sys.argv[1:] if argv is None else argv)
  lines = [f'# {title}', '', f'Command: `{command.strip()}`', '',
           f'Hardware at start: {hw_before}', '', f'Hardware at end: {hardware()}', '']
  for line in setup_lines:
    lines += [line, '']
  lines += [table, '']
  with open(prefix + '.md', 'w') as f:
    f.write('\n'.join(lines))
  print()
  print(table)
  print('wrote ' + ', '.join([prefix + '.csv', prefix + '.md']))
  return 0


def _compare_maps(args, setup, kinds, lengths, hw_before, argv) -> int:
  """``--compare maps``: runs ``attention_cost.compare_maps`` and writes its table."""
  from kernelformer.bench import attention_cost  # pylint: disable=g-import-not-at-top
  for text in kinds:
    try:
      attention_cost.parse_kind_variant(text)
    except ValueError as e:
      print(f'{PROG}: error: {e}', file=sys.stderr)
      return 2
  causal_modes = (True,) if args.causal else (False, True)
  start = time.time()
  rows, skipped = attention_cost.compare_maps(kinds, lengths, setup, causal_modes=causal_modes,
                                              log=lambda s: print(s, flush=True))
  elapsed = time.time() - start
  name = args.name or ('compare_maps_quick' if args.quick else 'compare_maps')
  setup_lines = [f'Setup: batch {args.batch}, heads {args.heads}, head_dim {args.head_dim}, M '
                 f'{args.num_features} (posrf-orf, t2r), {args.dtype}, every key real; fwd+bwd (jax.vjp of '
                 f'the module); medians of {args.repeats} interleaved rounds after one warm-up call each; '
                 f'compiled memory from XLA (temp + arguments + outputs); run took {elapsed:.0f} s.']
  if skipped:
    setup_lines.append('Skipped: ' + '; '.join(f'`{k}`: {v}' for k, v in skipped.items()))
  return _write_comparison(args, name, f'Feature maps, lean and stored paths ({name})', rows,
                           attention_cost.MAPS_FIELDS, attention_cost.maps_markdown(rows), setup_lines,
                           hw_before, argv)


def _compare_projections(args, setup, hw_before, argv) -> int:
  """``--compare projections``: runs ``attention_cost.compare_projections`` and writes its tables."""
  from kernelformer.bench import attention_cost  # pylint: disable=g-import-not-at-top
  dims = [int(x) for x in args.dims.split(',')]
  if args.quick:
    dims = dims[:2]
  rows_per_call = args.batch * args.heads * (256 if args.quick else 16384)
  rows = attention_cost.compare_projections(dims, setup, rows=rows_per_call,
                                            log=lambda s: print(s, flush=True))
  name = args.name or ('compare_projections_quick' if args.quick else 'compare_projections')
  return _write_comparison(args, name, f'Structured projections ({name})', rows,
                           attention_cost.PROJECTION_FIELDS, attention_cost.projections_markdown(rows), [],
                           hw_before, argv)


if __name__ == '__main__':
  sys.exit(main())
