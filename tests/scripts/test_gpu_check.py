"""scripts/gpu_check.py: the --dry_run mode on CPU (the same code paths as on a GPU, interpret mode).

One dry run (~40 CPU-seconds: four interpret-mode correctness cases, one length of the attention
section with two block candidates, three tiny training steps) is shared by the assertions below.
"""
from __future__ import annotations

import importlib.util
import json
import os

import pytest

from kernelformer.bench import gpu_check
from kernelformer.pallas import validated

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_script(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, 'scripts', f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope='module')
def dry_run(tmp_path_factory):
  out = tmp_path_factory.mktemp('gpu_check')
  with open(validated.TABLE_PATH) as f:
    table_before = f.read()
  code = load_script('gpu_check').main(['--dry_run', '--out_dir', str(out)])
  with open(validated.TABLE_PATH) as f:
    assert f.read() == table_before        # a dry run never touches the package's table
  with open(out / 'gpu-cpu.json') as f:
    result = json.load(f)
  return code, out, result


def test_dry_run_passes_and_reports_every_section(dry_run):
  code, out, result = dry_run
  assert code == 0
  env = result['environment']
  assert env['device_kind'] == 'cpu' and env['jax'] and 'gpu_check.py --dry_run' in env['command']
  # Correctness: every feature, both dtypes, bidirectional (the kernels' only mode), all passed
  # (interpret mode on CPU).
  rows = result['correctness']
  assert {r['feature'] for r in rows} == {'exp', 'trig', 'elu', 'relu'}
  assert {r['mode'] for r in rows} == {'bidirectional'}
  assert {r['dtype'] for r in rows} == {'float32', 'bfloat16'}
  assert all(r['passed'] and r['interpret'] for r in rows), rows
  assert all(set(r['grad_err']) >= {'q', 'k', 'v'} for r in rows)
  # Attention: every impl x mode x causality timed (Pallas bidirectional only), with memory and the
  # matmul fraction; the Pallas cells tried two block settings and kept the faster; softmax is marked
  # as the cuDNN stand-in.
  att = result['attention']['rows']
  cells = {(r['impl'], r['mode'], r['causal']) for r in att if r['status'] == 'ok'}
  assert cells == {(i, m, c) for i in ('pallas', 'xla', 'softmax') for m in ('fwd', 'fwd+bwd')
                   for c in (False, True) if not (c and i == 'pallas')}
  for r in att:
    assert r['time_ms'] > 0 and r['temp_mib'] >= 0 and r['frac_matmul'] > 0
    if r['impl'] == 'pallas':
      assert len(r['tried']) == 2 and r['time_ms'] == min(t['time_ms'] for t in r['tried'])
    if r['impl'] == 'softmax':
      assert 'stands in for cuDNN' in r['note']
  assert result['attention']['info']['matmul_bf16_tflops'] > 0
  assert set(result['attention']['info']['crossover']) == {'bidirectional vs softmax',
                                                            'bidirectional vs xla'}
  # Training step: Pallas, XLA and the softmax stand-in.
  assert [(r['variant'], r['status']) for r in result['train']] == [
      ('pallas', 'ok'), ('xla', 'ok'), ('cudnn', 'ok')]
  assert [r['attention'] for r in result['train']] == ['posrf-orf', 'posrf-orf', 'softmax']
  # No validation entries from interpret mode; the report says so, and lists the targets.
  assert result['validated_entries'] == [] and not os.path.exists(out / 'validated.json')
  assert len(result['targets']) == 4
  md = (out / 'gpu-cpu.md').read_text()
  for heading in ('# GPU check: cpu', '**Dry run**', '## Correctness', '## Attention',
                  '## LRA-Text-shaped training step', '## Pallas targets'):
    assert heading in md


def test_failed_case_prints_it_and_exits_nonzero(monkeypatch, tmp_path, capsys):
  case = gpu_check.correctness_cases(True)[0]
  monkeypatch.setattr(gpu_check, 'correctness_cases', lambda dry_run: [case])
  # Outputs within tolerance, gradients not: the gradients alone must fail the case.
  monkeypatch.setattr(gpu_check, 'TOL', {'float32': (1.0, 0.0), 'bfloat16': (1.0, 0.0)})
  code = gpu_check.main(['--dry_run', '--sections', 'correctness', '--out_dir', str(tmp_path)])
  assert code == 1
  assert 'FAILED: feature=exp mode=bidirectional dtype=float32 L=37' in capsys.readouterr().out


def test_spent_budget_skips_the_remaining_lengths(tmp_path):
  opts = gpu_check.Options(dry_run=True, out_dir=str(tmp_path), lengths=(64, 128))
  rows, _ = gpu_check.run_attention(opts, gpu_check.Budget(0.0), log=lambda *_: None)
  assert len(rows) == 2 * (3 + 2) * 2      # lengths x (3 impls bidirectional, 2 causal) x modes
  assert all(r['status'] == 'skipped' and 'budget spent' in r['note'] for r in rows)


def test_without_dry_run_on_cpu_is_one_line_error(tmp_path):
  with pytest.raises(SystemExit, match='needs a GPU .* --dry_run'):
    gpu_check.main(['--out_dir', str(tmp_path)])



def test_text_step_has_no_attention_dropout():
  # On the H100 the softmax (cuDNN) Text step asked 74 GiB: configs/text.py's attention dropout (0.1)
  # sent the model down the explicit-weights path (tests/attention/test_softmax.py: only attention
  # dropout in training forms the weights). The check's step (the GPU config, not the dry run's tiny
  # one) must be the flash-able one, and the same model for all three variants.
  for variant in ('pallas', 'xla', 'cudnn'):
    config = gpu_check.text_config(variant, False)
    assert config.model.attention.attention_dropout == 0.0, variant
    assert config.data.max_length + 1 == 4096 and config.model.dtype == 'bfloat16'
