"""The offline resource check (kernelformer/pallas/resource_check.py), the verdict table it writes
(resources.py reads it) and the fit gate of impl='auto'.

No triton needed: ptxas output is parsed from a recorded sample, limits are checked on made-up
results, the exporter's Triton IR is checked for the launch configuration ``tiling()`` chooses, and
``feature_attention.fits`` is checked against temporary tables.
"""
from __future__ import annotations

import importlib
import json

import jax.numpy as jnp
import pytest

from kernelformer.pallas import resource_check, resources

fa = importlib.import_module('kernelformer.pallas.feature_attention')

# ptxas -v of the bidirectional fwd_q kernel at today's old defaults (shared/reference numbers).
SAMPLE = """ptxas-blackwell info    : 0 bytes gmem
ptxas-blackwell info    : Compiling entry function 'feature_attention_fwd_q' for 'sm_90a'
ptxas-blackwell info    : Function properties for feature_attention_fwd_q
    26608 bytes stack frame, 50064 bytes spill stores, 58916 bytes spill loads
ptxas-blackwell info    : Used 255 registers, used 1 barriers, 26608 bytes cumulative stack size
"""


def test_parse_ptxas():
  r = resource_check.parse_ptxas(SAMPLE) if hasattr(resources, 'parse_ptxas') else None
  if r is None:
    worker = importlib.import_module('kernelformer.pallas.ptxas_worker')
    r = worker.parse_ptxas(SAMPLE)
  assert r == {'registers': 255, 'spill_stores': 50064, 'spill_loads': 58916, 'stack': 26608,
               'static_shared': 0}


def _res(regs=128, stores=0, loads=0, shared=1000):
  return {'registers': regs, 'spill_stores': stores, 'spill_loads': loads, 'shared': shared}


def test_limits():
  assert resource_check.fits(_res(), '90a', 4)
  assert resource_check.fits(_res(regs=255), '90a', 8)           # 255 x 256 threads <= 65536
  assert not resource_check.fits(_res(regs=255), '90a', 16)      # the block's register file
  assert not resource_check.fits(_res(stores=4), '90a', 4)
  assert not resource_check.fits(_res(loads=4), '90a', 4)
  assert resource_check.fits(_res(shared=232448), '90a', 4)
  assert not resource_check.fits(_res(shared=232449), '90a', 4)
  assert not resource_check.fits(_res(shared=200000), '80', 4)   # A100: 166,912 B
  assert not resource_check.fits({'error': 'x'}, '90a', 4)


def test_matrix_covers_every_kernel_family():
  full = resource_check.cases()
  # bidirectional: (exp, trig: 3 M) + (elu, relu) x 3 d x 2 dtypes (the kernels have no causal form)
  assert len(full) == (2 * 3 + 2) * 3 * 2 and {c.mode for c in full} == {'bidirectional'}
  assert {c.feature for c in full} == set(fa.FEATURES)
  quick = resource_check.cases(quick=True)
  assert {(c.m, c.d) for c in quick} <= {(256, 128), (None, 128)}


def test_export_uses_the_chosen_tiling():
  case = resource_check.Case('bidirectional', 'exp', 64, 32, 'bfloat16')
  tl = resource_check.launch(case)
  kernels = resource_check.export_kernels(case)
  names = [k['name'] for k in kernels]
  assert names == ['fwd_kv', 'fwd_q', 'bwd_q', 'bwd_k'], names
  for k in kernels:
    assert 'tt.func' in k['ttir'] and k['num_warps'] == tl.num_warps
    assert k['num_stages'] == tl.num_stages
  # The feature tile is the block_m of the table: W's tile is [block_m, d] in the IR.
  assert f'tensor<{tl.block_m}x32xf32>' in kernels[0]['ttir']


def _table(tmp_path, monkeypatch, entries):
  path = tmp_path / 'resources.json'
  path.write_text(json.dumps({'entries': entries}))
  monkeypatch.setattr(resources, 'TABLE_PATH', str(path))


def test_fit_gate_follows_the_table_and_the_tiling(tmp_path, monkeypatch):
  tl = fa.tiling('exp', 128, 64, 64, jnp.dtype('bfloat16'))
  entry = {'mode': 'bidirectional', 'feature': 'exp', 'num_features': 128, 'head_dim': 64,
           'dtype': 'bfloat16', 'tiling': list(tl), 'fits': True,
           'kernel_source': resources.kernel_source_hash()}
  _table(tmp_path, monkeypatch, [entry])
  assert fa.fits('exp', 128, 64, jnp.bfloat16)
  assert fa.fits('exp', 100, 64, jnp.bfloat16)       # M = 100 pads to 128
  assert not fa.fits('exp', 128, 64, jnp.float32)
  assert not fa.fits('exp', None, 64, jnp.bfloat16)  # M unknown
  assert fa.supported('exp', (2, 1024, 8, 64), jnp.bfloat16, 'gpu', num_features=128)
  assert not fa.supported('exp', (2, 1024, 8, 64), jnp.bfloat16, 'gpu', num_features=256)
  _table(tmp_path, monkeypatch, [dict(entry, fits=False)])
  assert not fa.fits('exp', 128, 64, jnp.bfloat16)
  other = list(tl)
  other[0] *= 2
  _table(tmp_path, monkeypatch, [dict(entry, tiling=other)])  # measured at another block table
  assert not fa.fits('exp', 128, 64, jnp.bfloat16)
  for stale in ({'kernel_source': '0' * 16}, {}):               # measured for other kernel code
    _table(tmp_path, monkeypatch, [{**{k: v for k, v in entry.items() if k != 'kernel_source'},
                                    **stale}])
    assert not fa.fits('exp', 128, 64, jnp.bfloat16)


def test_kernel_source_hash_ignores_docstrings_and_comments_not_code(tmp_path):
  src = open(resources.KERNEL_SOURCE).read()
  base = resources.kernel_source_hash()
  variants = {'docstring': src.replace('"""Whether every kernel', '"""Whether each kernel', 1),
              'comment': src + '\n# a comment\n',
              'code': src + '\nEXTRA = 1\n'}
  got = {}
  for name, text in variants.items():
    path = tmp_path / f'{name}.py'
    path.write_text(text)
    got[name] = resources.kernel_source_hash(str(path))
  assert variants['docstring'] != src
  assert got['docstring'] == base and got['comment'] == base and got['code'] != base


def test_shipped_table_was_measured_for_todays_kernels():
  """Every entry of resources.json carries the hash of the kernel code it was compiled from; where
  it is not today's, impl='auto' takes XLA for that case (re-run pallas-resources --write_table)."""
  entries = resources.load_table()
  assert entries and all('kernel_source' in e for e in entries)
  stale = [e for e in entries if e['kernel_source'] != resources.kernel_source_hash()]
  assert not stale, (f'{len(stale)} resources.json entries were measured for other kernel code: '
                     'run kernelformer benchmark pallas-resources --write_table')


def test_write_table_merges_by_case(tmp_path):
  path = str(tmp_path / 'r.json')
  e = {'mode': 'bidirectional', 'feature': 'elu', 'num_features': 32, 'head_dim': 32, 'dtype': 'float32',
       'tiling': [64, 32, 4, 2], 'fits': False}
  resource_check.write_table([e], path)
  resource_check.write_table([dict(e, fits=True), dict(e, dtype='bfloat16')], path)
  got = resources.load_table(path)
  assert len(got) == 2 and all(x['fits'] for x in got if x['dtype'] == 'float32')


def test_cli_without_triton_is_one_line(capsys):
  from kernelformer.commands import benchmark
  code = benchmark.run(['pallas-resources', '--triton_python', '/nonexistent/python'])
  err = capsys.readouterr().err
  assert code == 2 and err.count('\n') == 1 and 'triton' in err
  assert benchmark.run(['pallas-resources', '--arch', '75']) == 2


def test_cli_exit_codes_and_require_table(tmp_path, monkeypatch, capsys):
  """Exit 1 on any non-fitting kernel; with --require table only for cases resources.json lists."""
  from kernelformer.commands import benchmark
  listed = resource_check.Case('bidirectional', 'exp', 128, 64, 'bfloat16')
  other = resource_check.Case('bidirectional', 'trig', 256, 128, 'float32')
  tl = resource_check.launch(listed)
  _table(tmp_path, monkeypatch, [
      {'mode': 'bidirectional', 'feature': 'exp', 'num_features': 128, 'head_dim': 64,
       'dtype': 'bfloat16', 'tiling': list(tl), 'fits': True,
       'kernel_source': resources.kernel_source_hash()}])
  good = dict(_res(), fits=True)
  bad = dict(_res(stores=8), fits=False)
  verdict = {}

  def fake_run(quick, archs, py, jobs, only=None):
    rows = [{'case': c, 'tiling': resource_check.launch(c), 'kernel': 'fwd', 'num_warps': 8,
             'num_stages': 1, '90a': verdict[c]} for c in (listed, other)]
    return rows, {'export_s': 0.0, 'compile_s': 0.0, 'distinct': 2}

  monkeypatch.setattr(resource_check, 'run', fake_run)
  monkeypatch.setattr(resource_check, 'find_triton_python', lambda explicit=None: 'python')
  args = ['pallas-resources', '--arch', '90a']
  verdict.update({listed: good, other: good})
  assert benchmark.run(args) == 0
  verdict.update({listed: good, other: bad})
  assert benchmark.run(args) == 1                              # strict: any kernel
  assert benchmark.run(args + ['--require', 'table']) == 0     # 'other' is left to XLA
  assert 'DOES NOT FIT: bidirectional trig M=256 d=128 float32 fwd' in capsys.readouterr().out
  verdict.update({listed: bad, other: good})
  assert benchmark.run(args + ['--require', 'table']) == 1     # a listed case broke


def test_the_tools_padding_is_the_kernels():
  """resource_check keys the table by the widths the kernels pad to (feature_attention's own rule)."""
  for n in range(1, 600):
    assert resource_check.pow2_at_least(n) == fa._pow2_at_least(n), n  # pylint: disable=protected-access
