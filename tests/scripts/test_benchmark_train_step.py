"""`kernelformer benchmark train_step` runs the trainer's step for each kind and reports both step kinds."""
from __future__ import annotations

from kernelformer.commands import benchmark


def test_train_step_benchmark_reports_reuse_and_redraw_steps(tmp_path, capsys):
  rc = benchmark.run(['train_step', '--config', 'configs/listops.py:tiny', '--kinds',
                      'posrf-orf,softmax', '--batch_size', '2', '--repeats', '1',
                      '--out_dir', str(tmp_path)])
  assert rc == 0
  table = (tmp_path / 'train_step.md').read_text()
  rows = [line for line in table.splitlines() if line.startswith('| posrf-orf') or
          line.startswith('| softmax')]
  assert len(rows) == 2
  for row in rows:
    cells = [c.strip() for c in row.strip('|').split('|')]
    assert all(float(x) > 0 for x in cells[1:])
  assert 'redraw_every' in capsys.readouterr().out


def test_unknown_kind_is_one_line(capsys):
  assert benchmark.run(['train_step', '--kinds', 'posrf-nope']) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and 'posrf-nope' in err[0]
