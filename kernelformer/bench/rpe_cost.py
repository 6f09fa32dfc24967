"""RPE by FFT against its inherent cost.

``python -m kernelformer.bench.rpe_cost --lengths 1024,4096,16384 --rounds 3``

Luo et al.'s Algorithm 1 (eqs. 10-13) must transform M (Dv + 1) channels of length 2L; the question is
how close ``rpe.rpe_linear_attention`` gets to exactly that. Per length, in one process, fwd and fwd+bwd
of ``rpe_path`` (``rpe_linear_attention`` on given features), ``fft_pair`` (a bare rfft/irfft pair of the
same total FFT size, nothing else) and the registry's ``nprf-rpe`` and ``posrf-iid`` (as
``attention_cost.build_programs`` builds them; docs/benchmarks.md, "RPE by FFT: time against a bare
FFT, memory"). Programs are timed interleaved (round r times every program once), median over rounds;
memory is XLA's ``memory_analysis`` temp bytes of the same executables.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

from kernelformer.attention import rpe
from kernelformer.bench import attention_cost, measure


def programs(length: int, *, batch: int = 1, heads: int = 2, head_dim: int = 64,
             num_features: int = 64, seed: int = 0) -> dict[str, tuple[Callable, tuple]]:
  """name -> (function, arguments) for one length (see the module docstring)."""
  ks = jax.random.split(jax.random.PRNGKey(seed), 6)
  shape_f = (batch, length, heads, num_features)
  phi_q = jnp.exp(0.3 * jax.random.normal(ks[0], shape_f))
  phi_k = jnp.exp(0.3 * jax.random.normal(ks[1], shape_f))
  v = jax.random.normal(ks[2], (batch, length, heads, head_dim))
  cot = jax.random.normal(ks[3], (batch, length, heads, head_dim))
  bias = 0.1 * jax.random.normal(ks[4], (heads, 2 * length - 1))
  size = 2 * length
  x = jax.random.normal(ks[5], (batch, heads, num_features, head_dim + 1, length))

  def path(pq, pk, vv, b):
    return rpe.rpe_linear_attention(pq, pk, vv, b)

  def path_fb(pq, pk, vv, b, ct):
    _, vjp = jax.vjp(path, pq, pk, vv, b)
    return vjp(ct)

  def pair(xx):
    return jnp.fft.irfft(jnp.fft.rfft(xx, n=size, axis=-1), n=size, axis=-1)[..., :length]

  def pair_fb(xx):
    y, vjp = jax.vjp(pair, xx)
    return vjp(y)

  out = {'rpe_path fwd': (path, (phi_q, phi_k, v, bias)),
         'rpe_path fwd+bwd': (path_fb, (phi_q, phi_k, v, bias, cot)),
         'fft_pair fwd': (pair, (x,)),
         'fft_pair fwd+bwd': (pair_fb, (x,))}
  setup = attention_cost.Setup(batch=batch, heads=heads, head_dim=head_dim, num_features=num_features)
  inputs = attention_cost.make_inputs(setup, length, seed)
  for kind in ('nprf-rpe', 'posrf-iid'):
    _, _, fb, fb_args = attention_cost.build_programs(kind, setup, inputs)
    out[f'{kind} fwd+bwd'] = (fb, fb_args)
  return out


def run(lengths, rounds: int, **shape) -> list[dict[str, Any]]:
  rows = []
  for length in lengths:
    compiled = {}
    for name, (fn, args) in programs(length, **shape).items():
      exe, stats = measure.compile_with_stats(fn, *args)
      jax.block_until_ready(exe(*args))                    # warm-up
      compiled[name] = (exe, args, stats, [])
    for _ in range(rounds):
      for name, (exe, args, _, times) in compiled.items():
        start = time.perf_counter()
        jax.block_until_ready(exe(*args))
        times.append(time.perf_counter() - start)
    for name, (_, _, stats, times) in compiled.items():
      rows.append({'length': length, 'program': name, 'median_ms': 1e3 * statistics.median(times),
                   'times_ms': [round(1e3 * t, 1) for t in times],
                   'temp_mib': stats.temp_bytes / 2 ** 20})
      print(f"L={length:6d} {name:20s} {rows[-1]['median_ms']:10.1f} ms  temp "
            f"{rows[-1]['temp_mib']:8.1f} MiB  {rows[-1]['times_ms']}", flush=True)
  return rows


def markdown(rows) -> str:
  lengths = sorted({r['length'] for r in rows})
  get = {(r['length'], r['program']): r for r in rows}
  lines = ['| L | rpe_path fwd / fft_pair fwd | rpe_path fwd+bwd / fft_pair fwd+bwd | '
           'rpe_path fwd+bwd temp MiB | nprf-rpe fwd+bwd ms | posrf-iid fwd+bwd ms | ratio |',
           '|---|---|---|---|---|---|---|']
  for n in lengths:
    t = lambda p: get[(n, p)]['median_ms']
    lines.append(
        f"| {n} | {t('rpe_path fwd'):.0f} / {t('fft_pair fwd'):.0f} ms = "
        f"{t('rpe_path fwd') / t('fft_pair fwd'):.2f}x | {t('rpe_path fwd+bwd'):.0f} / "
        f"{t('fft_pair fwd+bwd'):.0f} ms = {t('rpe_path fwd+bwd') / t('fft_pair fwd+bwd'):.2f}x | "
        f"{get[(n, 'rpe_path fwd+bwd')]['temp_mib']:.0f} | {t('nprf-rpe fwd+bwd'):.0f} | "
        f"{t('posrf-iid fwd+bwd'):.1f} | {t('nprf-rpe fwd+bwd') / t('posrf-iid fwd+bwd'):.0f}x |")
  return '\n'.join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--lengths', default='1024,4096,16384')
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--num_features', type=int, default=64)
  parser.add_argument('--heads', type=int, default=2)
  parser.add_argument('--batch', type=int, default=1)
  args = parser.parse_args(argv)
  try:
    lengths = [int(s) for s in args.lengths.split(',')]
  except ValueError:
    print(f'--lengths must be comma-separated integers, got {args.lengths!r}', file=sys.stderr)
    return 2
  rows = run(lengths, args.rounds, batch=args.batch, heads=args.heads,
             num_features=args.num_features)
  print(markdown(rows))
  return 0


if __name__ == '__main__':
  sys.exit(main())
