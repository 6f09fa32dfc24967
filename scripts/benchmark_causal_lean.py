"""Time the lean causal exp-feature attention of this tree against another revision's, interleaved.

    python scripts/benchmark_causal_lean.py --baseline REV [--batch 4 --heads 2 --length 2048 ...]

Both sides run ``linear.causal_exp_feature_attention`` (``REV``'s ``kernelformer/attention/linear.py``
loaded from git, this tree's imported) -- or, for a map with a running key shift and no log-space form
(trigrf), the stored path ``linear.linear_attention(..., key_shift=)`` on this tree's features -- on the
same inputs: posrf (or ``--component``) with one
orthogonal W per head (vmapped over heads, as the attention module does), float32, every key real.
For the forward and for forward+backward (``jax.grad`` of the sum of squares) both programs are
compiled and called once, then timed ``--rounds`` times, one call of each per round in alternating
order. Prints the median wall and process CPU time (all threads) of each side and the load average
before and after; CPU time is the steadier of the two on a loaded machine.
"""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernelformer.attention import linear  # noqa: E402
from kernelformer.features import catalog  # noqa: E402
from kernelformer.features import weights  # noqa: E402


def _load_revision(rev: str):
  """``kernelformer/attention/linear.py`` at ``rev`` as a module (it imports only jax and numpy)."""
  try:
    text = subprocess.run(['git', 'show', f'{rev}:kernelformer/attention/linear.py'], cwd=ROOT,
                          check=True, capture_output=True, text=True).stdout
  except subprocess.CalledProcessError as e:
    raise SystemExit(f'benchmark_causal_lean: cannot read linear.py at {rev!r}: '
                     f'{e.stderr.strip().splitlines()[-1] if e.stderr.strip() else "git failed"}')
  path = Path(tempfile.mkdtemp()) / 'linear_baseline.py'
  path.write_text(text)
  spec = importlib.util.spec_from_file_location('linear_baseline', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _load() -> str:
  return ' '.join(Path('/proc/loadavg').read_text().split()[:3])


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--baseline', required=True, help='git revision to compare with (e.g. main, HEAD~1)')
  ap.add_argument('--batch', type=int, default=4)
  ap.add_argument('--heads', type=int, default=2)
  ap.add_argument('--length', type=int, default=2048)
  ap.add_argument('--head_dim', type=int, default=64)
  ap.add_argument('--features', type=int, default=128)
  ap.add_argument('--chunk', type=int, default=64)
  ap.add_argument('--key_scale', type=float, default=1.0, help='multiplies the keys (x10: larger rises)')
  ap.add_argument('--component', default='posrf', help='a catalog name with a running key shift')
  ap.add_argument('--rounds', type=int, default=7)
  args = ap.parse_args(argv)
  for name in ('batch', 'heads', 'length', 'head_dim', 'features', 'chunk', 'rounds'):
    if getattr(args, name) < 1:
      raise SystemExit(f'benchmark_causal_lean: --{name} must be >= 1, got {getattr(args, name)}')
  try:
    record = catalog.get(args.component)
  except (KeyError, ValueError) as e:
    raise SystemExit(f'benchmark_causal_lean: unknown component {args.component!r} ({e})')
  if not record.causal_shift:
    raise SystemExit(f'benchmark_causal_lean: {args.component!r} has no running key shift')
  form = record.log_space
  baseline = _load_revision(args.baseline)

  b, h, n, d, m = args.batch, args.heads, args.length, args.head_dim, args.features
  ks = jax.random.split(jax.random.PRNGKey(0), 4)
  s = d ** -0.25                                   # the attention module's input scale
  q = s * jax.random.normal(ks[0], (b, n, h, d))
  k = args.key_scale * s * jax.random.normal(ks[1], (b, n, h, d))
  v = jax.random.normal(ks[2], (b, n, h, d))
  proj = jax.vmap(lambda kk: weights.SAMPLERS['orf'](kk, m, d))(jax.random.split(ks[3], h))

  def programs(module):
    """As the attention module calls them: vmapped over heads, or (stored path) the features vmapped
    over heads and the core on ``[B, L, H, M']``."""
    heads = lambda fn, *a: jax.vmap(fn, in_axes=(2,) * (len(a) - 1) + (0,), out_axes=2)(*a)
    if form is not None:
      one = lambda qh, kh, vh, p: module.causal_exp_feature_attention(form, qh, kh, vh, p,
                                                                       chunk_size=args.chunk)
      f = lambda q, k, v, p: heads(one, q, k, v, p)
    else:
      def f(q, k, v, p):
        fq, fk, shift = heads(lambda qh, kh, ph: record.fn(qh, kh, ph, causal_chunk=args.chunk), q, k, p)
        return module.linear_attention(fq, fk, v, causal=True, chunk_size=args.chunk, key_shift=shift)
    grad = jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2))
    return jax.jit(f), jax.jit(grad)

  sides = {f'baseline ({args.baseline})': programs(baseline), 'this tree': programs(linear)}
  print(f'B={b} H={h} L={n} d={d} M={m} chunk={args.chunk} {args.component} keys x{args.key_scale:g}, '
        f'{args.rounds} rounds; load {_load()}')
  for mode, label in ((0, 'forward'), (1, 'forward+backward')):
    for fns in sides.values():
      jax.block_until_ready(fns[mode](q, k, v, proj))
    wall = {name: [] for name in sides}
    cpu = {name: [] for name in sides}
    order = list(sides)
    for r in range(args.rounds):
      for name in (order if r % 2 == 0 else order[::-1]):
        t0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(sides[name][mode](q, k, v, proj))
        wall[name].append(time.perf_counter() - t0)
        cpu[name].append(time.process_time() - c0)
    cells = ', '.join(f'{name} {1e3 * np.median(wall[name]):.1f} ms wall / '
                      f'{1e3 * np.median(cpu[name]):.1f} ms CPU' for name in sides)
    print(f'{label}: {cells}; load {_load()}')


if __name__ == '__main__':
  main()
