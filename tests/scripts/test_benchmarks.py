"""The benchmark and approximation scripts (``--quick``), the measurement helpers and the claim checks.

The scripts run in-process (``main(argv)``) so the test shares one JAX start-up; their outputs are read
back from disk as a user would read them.
"""
from __future__ import annotations

import importlib.util
import math
import os
import time

import jax.numpy as jnp
import pytest

from kernelformer.bench import attention_cost, measure, output

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def load_script(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, 'scripts', f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def assert_png(path):
  assert os.path.getsize(path) > 1000, path
  with open(path, 'rb') as f:
    assert f.read(8) == PNG_MAGIC, path


def as_float(x):
  return float(x) if x not in ('', None) else math.nan


# ---------------------------------------------------------------------------------------------------
# measure.py
# ---------------------------------------------------------------------------------------------------


def test_compile_with_stats_reports_xla_flops_and_buffer_sizes():
  a = jnp.ones((64, 32), jnp.float32)
  b = jnp.ones((32, 16), jnp.float32)
  compiled, stats = measure.compile_with_stats(jnp.matmul, a, b)
  assert stats.flops == 2 * 64 * 32 * 16                 # one multiply-add = 2 FLOPs
  assert stats.argument_bytes == (64 * 32 + 32 * 16) * 4
  assert stats.output_bytes == 64 * 16 * 4
  assert stats.total_bytes == stats.temp_bytes + stats.argument_bytes + stats.output_bytes
  assert float(compiled(a, b)[0, 0]) == 32.0


def test_unknown_xla_flops_give_none_and_a_positive_matmul_peak(monkeypatch):
  # On GPU XLA's cost analysis says flops = -1 ("unknown") for a matmul that is one cuBLAS call; the
  # peak once came out as -1 / time = -0.0 TFLOP/s (docs/benchmarks/gpu-h100-2026-11-26-check.md).
  # CPU XLA counts the matmul, so the GPU answer is put in its place here.
  real = measure._cost_dict
  monkeypatch.setattr(measure, '_cost_dict', lambda compiled: {**real(compiled), 'flops': -1.0})
  a = jnp.ones((32, 32), jnp.float32)
  _, stats = measure.compile_with_stats(jnp.matmul, a, a)
  assert stats.flops is None
  calls = []
  real_time = measure.time_compiled

  def timed(*args, **kwargs):
    calls.append(real_time(*args, **kwargs))
    return calls[-1]
  monkeypatch.setattr(measure, 'time_compiled', timed)
  peak, flops = measure.matmul_flops_per_second(size=32, repeats=1)
  assert flops == 2 * 32 ** 3
  assert peak == pytest.approx(flops / calls[0].median_s) and peak > 0


def test_time_compiled_median_and_budget_cut():
  calls = []

  def slow():
    calls.append(1)
    time.sleep(0.05)
    return jnp.zeros(())

  timing = measure.time_compiled(slow, (), repeats=50, budget_s=0.2)
  # warm-up ~0.05 s, budget 0.2 s: (0.2 - 0.05) // 0.05 = 3 timed calls at most, never 50.
  assert 1 <= len(timing.times_s) <= 3
  assert len(calls) == len(timing.times_s) + 1
  assert 0.045 <= timing.median_s < 1.0
  assert len(measure.time_compiled(slow, (), repeats=4).times_s) == 4
  calls.clear()
  cold = measure.time_compiled(slow, (), repeats=50, budget_s=0.2, warmup=False)
  assert cold.warmup_s == 0.0 and 1 <= len(cold.times_s) <= 4 and len(calls) == len(cold.times_s)


# ---------------------------------------------------------------------------------------------------
# Claims logic on synthetic rows (no timing noise).
# ---------------------------------------------------------------------------------------------------


def _rows(t_soft, t_lin, m_soft, m_lin, m_lin_4k, t_rpe_ratio, t_ff):
  rows = []

  def add(kind, fam, length, t, m, mode='fwd+bwd'):
    rows.append({'kind': kind, 'family': fam, 'mode': mode, 'length': length, 'time_ms': t,
                 'total_mib': m})

  add('softmax', 'quadratic', 16384, t_soft, m_soft)
  add('softmax', 'quadratic', 1024, t_soft / 256, m_soft / 256)
  add('posrf-orf', 'feature-map', 16384, t_lin, m_lin)
  add('posrf-orf', 'feature-map', 4096, None, m_lin_4k)
  add('posrf-orf', 'feature-map', 1024, t_lin / 16, m_lin / 16)
  add('posrf-fastfood', 'feature-map', 16384, t_ff, m_lin)
  add('posrf-fastfood', 'feature-map', 1024, t_ff / 16, m_lin / 16)
  add('nprf-rpe', 'rpe-fft', 16384, 10.0 * t_rpe_ratio, 900.0)
  add('nprf-rpe', 'rpe-fft', 1024, 10.0, 60.0)
  return rows


def _by_status(claims):
  return [c.status for c in claims]


def test_check_claims_met():
  rows = _rows(t_soft=1000.0, t_lin=40.0, m_soft=6000.0, m_lin=100.0, m_lin_4k=25.0,
               t_rpe_ratio=18.0, t_ff=40.0)
  claims = attention_cost.check_claims(rows, head_dim=64)
  assert _by_status(claims) == ['met'] * len(claims)
  assert '25.0x' in claims[0].detail and '60.0x' in claims[1].detail


def test_check_claims_not_met_and_not_measured():
  rows = _rows(t_soft=1000.0, t_lin=100.0, m_soft=1000.0, m_lin=100.0, m_lin_4k=20.0,
               t_rpe_ratio=40.0, t_ff=150.0)
  claims = attention_cost.check_claims(rows, head_dim=64)
  # 10x faster, 10x less memory, memory 5x from 4K to 16K, RPE 40x vs 16x, FastFood 1.5x slower.
  assert _by_status(claims)[:4] == ['not met'] * 4
  assert 'not met' in _by_status(claims)[4:]
  no_softmax = [r for r in rows if r['kind'] != 'softmax']
  assert attention_cost.check_claims(no_softmax, head_dim=64)[0].status == 'not measured'
  assert attention_cost.check_claims(rows, head_dim=32)[-1].status == 'not measured'


# ---------------------------------------------------------------------------------------------------
# The scripts' --quick modes.
# ---------------------------------------------------------------------------------------------------


def test_benchmark_quick(tmp_path, capsys):
  script = load_script('benchmark_attention')
  assert script.main(['--quick', '--out_dir', str(tmp_path)]) == 0
  printed = capsys.readouterr().out
  assert 'Claims (measured in this run)' in printed
  rows = output.read_csv(str(tmp_path / 'attention_cost_quick.csv'))
  assert {(r['kind'], r['mode'], r['length']) for r in rows} == {
      (k, m, str(n)) for k in script.QUICK_KINDS for m in attention_cost.MODES
      for n in script.QUICK_LENGTHS}
  for r in rows:
    assert r['status'] == 'ok', r
    assert as_float(r['time_ms']) > 0 and as_float(r['gflop']) > 0 and as_float(r['temp_mib']) >= 0
    assert int(r['repeats']) == 1
    assert as_float(r['peak_rss_mib']) > 10.0        # the process itself: JAX alone is ~100 MB
  get = lambda kind, mode, length, key: as_float(next(
      r[key] for r in rows if r['kind'] == kind and r['mode'] == mode and r['length'] == str(length)))
  for mode in attention_cost.MODES:
    assert get('softmax', mode, 256, 'time_vs_softmax') == 1.0
    assert get('softmax', mode, 256, 'memory_vs_softmax') == 1.0
  # Softmax materializes B x H x L x L: its FLOPs are 4 B H L^2 d (QK^T and AV) plus O(L^2) softmax.
  expected = 4 * 1 * 2 * 256 ** 2 * 64
  assert expected <= get('softmax', 'fwd', 256, 'gflop') * 1e9 <= 1.1 * expected
  # Doubling L: softmax's scratch grows ~4x (quadratic), the feature map's ~2x or less (linear).
  assert get('softmax', 'fwd+bwd', 256, 'temp_mib') / get('softmax', 'fwd+bwd', 128, 'temp_mib') > 3.0
  assert get('posrf-orf', 'fwd+bwd', 256, 'temp_mib') / get('posrf-orf', 'fwd+bwd', 128, 'temp_mib') < 2.2
  md = (tmp_path / 'attention_cost_quick.md').read_text()
  assert '## Claims' in md and '| posrf-orf | fwd+bwd | 256 |' in md and 'load average' in md
  for suffix in ('time', 'memory'):
    assert_png(str(tmp_path / f'attention_cost_quick_{suffix}.png'))


def test_benchmark_compare_official_quick(tmp_path, capsys):
  """``--compare official``: one row per (causal, length, mode), both sides timed, same estimate."""
  script = load_script('benchmark_attention')
  assert script.main(['--compare', 'official', '--quick', '--out_dir', str(tmp_path)]) == 0
  rows = output.read_csv(str(tmp_path / 'compare_official_quick.csv'))
  assert {(r['causal'], r['mode'], r['length']) for r in rows} == {
      (c, m, str(n)) for c in ('True', 'False') for m in attention_cost.MODES
      for n in script.QUICK_LENGTHS}
  for r in rows:
    assert as_float(r['ours_ms']) > 0 and as_float(r['official_ms']) > 0
    assert math.isclose(as_float(r['speedup']), as_float(r['official_ms']) / as_float(r['ours_ms']),
                        rel_tol=1e-6)
    assert as_float(r['max_abs_diff']) < 1e-4        # same W and mask: the same estimate (eps 0)
    assert int(r['masked_keys']) == int(r['length']) // 8
  md = (tmp_path / 'compare_official_quick.md').read_text()
  assert '| causal | fwd+bwd | 256 |' in md and 'load average' in md
  assert 'official / ours' in capsys.readouterr().out


def test_benchmark_compare_maps_quick(tmp_path, capsys):
  """``--compare maps``: per (causal, length) every kind, row-wise maps lean and stored, all timed,
  their M', memory from XLA."""
  script = load_script('benchmark_attention')
  assert script.main(['--compare', 'maps', '--quick', '--causal', '--out_dir', str(tmp_path)]) == 0
  rows = output.read_csv(str(tmp_path / 'compare_maps_quick.csv'))
  assert {(r['kind'], r['path'], r['causal']) for r in rows} == {
      ('softmax', '-', 'True'), ('taylor:map_dim=4', 'lean', 'True'), ('taylor:map_dim=4', 'stored', 'True')}
  for r in rows:
    assert as_float(r['time_ms']) > 0 and as_float(r['total_mib']) > 0 and int(r['repeats']) == 1, r
    assert as_float(r['load_1min']) >= 0
    if r['path'] == 'stored':
      assert as_float(r['time_vs_lean']) > 0
  width = {r['kind']: r['features'] for r in rows}
  assert width['taylor:map_dim=4'] == '21' and width['softmax'] == ''
  md = (tmp_path / 'compare_maps_quick.md').read_text()
  assert 'load average' in md and '| causal | 128 | taylor:map_dim=4 | stored | 21 |' in md


def test_benchmark_compare_maps_rejects_a_malformed_variant(tmp_path, capsys):
  script = load_script('benchmark_attention')
  assert script.main(['--compare', 'maps', '--kinds', 'taylor:map_dim', '--out_dir', str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and 'taylor:map_dim=16' in err, err
  assert not list(tmp_path.iterdir())


def test_compare_official_skips_cells_over_the_memory_limit():
  """A cell whose compiled programs exceed ``max_memory_gb`` is compiled, not run, and says why."""
  setup = attention_cost.Setup(batch=1, heads=1, head_dim=8, num_features=8, repeats=1,
                               max_memory_gb=1e-6)
  rows = attention_cost.compare_official([64], setup, causal_modes=(True,), log=lambda s: None)
  assert [r['mode'] for r in rows] == list(attention_cost.MODES)
  for r in rows:
    assert r['ours_ms'] is None and r['official_ms'] is None and r['repeats'] == 0
    assert r['note'].startswith('not run: compiled memory') and r['ours_temp_mib'] >= 0
  md = attention_cost.compare_markdown(rows)
  assert md.count('not run: compiled memory') == 2 and '| causal | fwd+bwd | 64 | 1 | 1 |' in md


def test_compare_official_runs_only_the_modes_asked_and_reports_memory_per_side():
  """``modes``: only those rows; each carries both sides' compiled totals (>= temp) and per-side peak RSS."""
  setup = attention_cost.Setup(batch=1, heads=1, head_dim=8, num_features=8, repeats=1)
  rows = attention_cost.compare_official([64], setup, causal_modes=(True,), modes=('fwd+bwd',),
                                         log=lambda s: None)
  assert [r['mode'] for r in rows] == ['fwd+bwd']
  (r,) = rows
  assert r['ours_ms'] > 0 and r['official_ms'] > 0 and r['max_abs_diff'] is None   # no fwd: no check
  for side in ('ours', 'official'):
    assert r[f'{side}_total_mib'] >= r[f'{side}_temp_mib'] > 0
    if os.path.exists('/proc/self/clear_refs'):
      assert r[f'{side}_peak_rss_mib'] > 0
  assert '| causal | fwd+bwd | 64 | 1 | 1 |' in attention_cost.compare_markdown(rows)


def test_compare_official_records_a_cell_that_fails_at_run_time_and_goes_on(monkeypatch):
  """A runtime failure (out of device memory) of one cell: its row says ``failed:``, the next cell runs."""
  import jax  # pylint: disable=g-import-not-at-top
  real = measure.compile_with_stats

  def compile_failing_at_64(fn, q, *args):
    compiled, stats = real(fn, q, *args)
    if q.shape[1] != 64:
      return compiled, stats

    def call(*a):
      raise jax.errors.JaxRuntimeError('RESOURCE_EXHAUSTED: Out of memory while trying to allocate')
    return call, stats

  monkeypatch.setattr(attention_cost.measure, 'compile_with_stats', compile_failing_at_64)
  setup = attention_cost.Setup(batch=1, heads=1, head_dim=8, num_features=8, repeats=1)
  rows = attention_cost.compare_official([64, 128], setup, causal_modes=(True,), modes=('fwd+bwd',),
                                         log=lambda s: None)
  assert [(r['length'], r['repeats']) for r in rows] == [(64, 0), (128, 1)]
  assert rows[0]['note'].startswith('failed: RESOURCE_EXHAUSTED') and rows[0]['ours_ms'] is None
  assert rows[0]['official_total_mib'] > 0 and rows[1]['official_ms'] > 0
  assert 'failed: RESOURCE_EXHAUSTED' in attention_cost.compare_markdown(rows)


def test_benchmark_compare_official_rejects_unknown_modes(tmp_path, capsys):
  script = load_script('benchmark_attention')
  assert script.main(['--compare', 'official', '--modes', 'fwd,bwd', '--out_dir', str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and 'fwd,fwd+bwd' in err and 'bwd' in err, err
  assert not list(tmp_path.iterdir())


def test_benchmark_compare_projections_quick(tmp_path):
  """``--compare projections``: projection rows per d, attention rows per mode, transform rows per n."""
  script = load_script('benchmark_attention')
  assert script.main(['--compare', 'projections', '--quick', '--dims', '16,64', '--out_dir',
                      str(tmp_path)]) == 0
  rows = output.read_csv(str(tmp_path / 'compare_projections_quick.csv'))
  assert [(r['what'], r['size']) for r in rows] == [
      ('projection', '16'), ('projection', '64'), ('attention fwd', '64'), ('attention fwd+bwd', '64'),
      ('fwht', '16'), ('fwht', '64')]
  for r in rows:
    times = [as_float(r[k]) for k in ('dense_ms', 'sorf_ms', 'fastfood_ms', 'butterfly_ms', 'matmul_ms')]
    assert all(t > 0 for t in times if not math.isnan(t)) and sum(not math.isnan(t) for t in times) >= 2
  md = (tmp_path / 'compare_projections_quick.md').read_text()
  assert '| 64 | 32 | 512 |' in md and 'butterfly / matmul' in md and 'fastfood / orf' in md


def test_approximation_quick(tmp_path, capsys):
  script = load_script('approximation')
  assert script.main(['--quick', '--out_dir', str(tmp_path)]) == 0
  printed = capsys.readouterr().out
  assert 'Performer note orderings' in printed
  for name in script.EXPERIMENTS:
    assert_png(str(tmp_path / f'approx_{name}_quick.png'))

  perf = output.read_csv(str(tmp_path / 'approx_performer_quick.csv'))
  assert len(perf) == 4
  for r in perf:
    assert 0.0 < as_float(r['mse_mean']) < 1.0 and as_float(r['mse_std']) >= 0.0

  # Luo et al. Theorem 3: the PRF error grows with the query/key norm R (and ||A - A_hat||_1 <= 2).
  luo = {float(r['radius']): as_float(r['l1_mean'])
         for r in output.read_csv(str(tmp_path / 'approx_luo_quick.csv'))}
  assert 0.0 < luo[1.0] < luo[3.0] <= 2.0

  grid = output.read_csv(str(tmp_path / 'approx_grid_quick.csv'))
  assert len(grid) == 4
  for r in grid:
    assert 0.0 < as_float(r['rel_error_mean']) < 2.0, r
  assert '| trigrf (softmax) |' in (tmp_path / 'approx_grid_quick.md').read_text()

  sky = output.read_csv(str(tmp_path / 'approx_skyformer_quick.csv'))
  assert {r['method'] for r in sky} == {'skyformer', 'performer (posrf-orf)'}
  for r in sky:
    assert 0.0 < as_float(r['rel_mean']) < 2.0 and as_float(r['spectral_mean']) > 0.0


@pytest.mark.parametrize('bad', [['--only', 'nonsense']])
def test_approximation_rejects_unknown_experiment(bad):
  script = load_script('approximation')
  with pytest.raises(SystemExit):
    script.parse_args(bad)
