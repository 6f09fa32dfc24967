"""`kernelformer benchmark loop` times the trainer's loop and the bare loop and reports both."""
from __future__ import annotations

import pytest

from kernelformer.commands import benchmark


def test_loop_benchmark_reports_trainer_and_bare_rates(tmp_path, capsys):
  rc = benchmark.run(['loop', '--settings', 'tiny', '--steps', '4', '--rounds', '1',
                      '--out_dir', str(tmp_path)])
  assert rc == 0
  table = (tmp_path / 'loop.md').read_text()
  assert table.startswith('`kernelformer benchmark loop --settings tiny') and 'load average' in table
  (row,) = [line for line in table.splitlines() if line.startswith('| tiny')]
  cells = [c.strip() for c in row.strip('|').split('|')]
  steps, rounds, trainer_rate, bare_rate, ratio = (float(cells[i]) for i in (2, 4, 5, 6, 7))
  assert (steps, rounds) == (4, 1) and trainer_rate > 0 and bare_rate > 0
  assert ratio == pytest.approx(trainer_rate / bare_rate, rel=0.01)
  assert table in capsys.readouterr().out


@pytest.mark.parametrize('argv, words', [
    (['--settings', 'tiny,huge'], 'huge'),
    (['--steps', 'tiny=0'], 'steps'),
    (['--kind', 'posrf-nope'], 'posrf-nope'),
])
def test_bad_flags_are_one_line(argv, words, capsys, tmp_path):
  assert benchmark.run(['loop', *argv, '--out_dir', str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and words in err[0]
  assert not (tmp_path / 'loop.md').exists()
