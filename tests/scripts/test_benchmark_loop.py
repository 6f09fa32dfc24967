"""`kernelformer benchmark loop` times the trainer's loop and the bare loop and reports both."""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading

import pytest

from kernelformer.bench import loop
from kernelformer.commands import benchmark


def test_loop_benchmark_reports_trainer_and_bare_rates(tmp_path, capsys):
  rc = benchmark.run(['loop', '--settings', 'tiny', '--steps', '4', '--rounds', '2',
                      '--out_dir', str(tmp_path)])
  assert rc == 0
  table = (tmp_path / 'loop.md').read_text()
  assert table.startswith('`kernelformer benchmark loop --settings tiny') and 'load average' in table
  (row,) = [line for line in table.splitlines() if line.startswith('| tiny')]
  cells = [c.strip() for c in row.strip('|').split('|')]
  batch, steps, rounds, trainer_rate, bare_rate, ratio = (float(cells[i]) for i in (2, 3, 5, 6, 7, 8))
  low, high = (float(x) for x in cells[9].split('-'))
  assert (batch, steps, rounds) == (8, 4, 2) and trainer_rate > 0 and bare_rate > 0
  assert low <= ratio <= high and 'batch' not in cells[1]   # the preset's batch: not flagged
  assert 'Peak resident memory' in table
  assert table in capsys.readouterr().out


def test_ratio_is_the_median_of_per_round_ratios():
  t = loop.LoopTiming('tiny', 'x', 32, 4, 3, trainer_rates=[10.0, 1.0, 4.0],
                      bare_rates=[20.0, 1.0, 4.0], pipeline_rates=[])
  assert t.round_ratios == [0.5, 1.0, 1.0] and t.ratio == 1.0
  assert t.trainer_steps_per_s == 4.0 and t.bare_steps_per_s == 4.0 and t.rounds == 3


class _Counting:
  """The compiled step, counting its calls."""

  def __init__(self, compiled):
    self.compiled, self.calls = compiled, 0

  def __call__(self, *args):
    self.calls += 1
    return self.compiled(*args)


def test_both_sides_run_the_same_steps_of_the_same_executable():
  bench = loop._Bench('tiny', 3, None)  # pylint: disable=protected-access
  try:
    counting = bench.loop.compiled = bench.executable = _Counting(bench.executable)
    for side in (bench.trainer_round, bench.bare_round, bench.bare_round, bench.trainer_round):
      before = counting.calls
      side()
      assert counting.calls - before == 3      # each round: `steps` calls of the one executable
    assert bench.start == 2 + 4 * 3
    assert len(bench.trainer_rates) == len(bench.bare_rates) == 2
  finally:
    bench.close()


def test_a_round_of_unequal_work_is_refused():
  bench = loop._Bench('tiny', 3, None)  # pylint: disable=protected-access
  try:
    bench.trainer_round()
    rounds_batches = bench._round_batches  # pylint: disable=protected-access

    def one_more():   # a bare side that runs 4 steps where the trainer ran 3
      start, batches = rounds_batches()
      return start, {**batches, start + 3: bench.pipeline.batch(start + 3)}

    bench._round_batches = one_more  # pylint: disable=protected-access
    with pytest.raises(loop.RoundMismatch, match='bare round ran 4 steps'):
      bench.bare_round()
    bench._round_batches = rounds_batches  # pylint: disable=protected-access
    bench.start += 4
    bench.loop.compiled = bench.loop.setup.loop_step.lower(   # a trainer that compiled its own step
        bench.state, bench.loop.window, bench.pipeline.batch(0)).compile()
    with pytest.raises(loop.RoundMismatch, match='other than the one compiled'):
      bench.trainer_round()
    assert bench.bare_rates == [] and len(bench.trainer_rates) == 1   # refused rounds not counted
  finally:
    bench.close()


def test_train_until_a_log_step_returns_with_every_step_done():
  """``Loop.run(..., until=k)`` waits for step k even when k is a log step (tiny logs every 3 steps):
  a benchmark round that ends there times every step, and the log of step k is written."""
  bench = loop._Bench('tiny', 4, None)  # pylint: disable=protected-access
  try:
    run, logged = bench.loop, []
    run.log = lambda done, window: logged.append(done)
    run.run(bench.state, 2, 6, bench.pipeline)
    assert not run.in_flight and not run.pending_logs and logged == [3, 6]
    assert run.meta.timed_steps == 1 + 3     # the warm-up segment's step 2, this one's 4-6
  finally:
    bench.close()


def test_text_setting_is_the_lra_text_model_and_a_smaller_batch_is_named():
  c = loop.get_config('text')
  assert (c.model.num_layers, c.model.emb_dim, c.model.num_heads, c.model.mlp_dim,
          c.data.max_length, c.batch_size) == (4, 256, 4, 1024, 1000, 32)
  assert (c.model.attention.kind, c.model.attention.num_features) == ('gmm-rks', 128)
  assert loop.get_config('text', 'softmax').model.attention.kind == 'softmax'
  assert loop.get_config('text', batch=8).batch_size == 8
  assert 'batch' not in loop.source('text', None, 32).split(')', 1)[1]
  assert '**batch 8**' in loop.source('text', None, 8)


@pytest.mark.parametrize('argv, words', [
    (['--settings', 'tiny,huge'], 'huge'),
    (['--steps', 'tiny=0'], 'steps'),
    (['--batch', 'tiny=x'], 'batch'),
    (['--batch', 'text=0'], 'batch'),
    (['--kind', 'posrf-nope'], 'posrf-nope'),
])
def test_bad_flags_are_one_line(argv, words, capsys, tmp_path):
  assert benchmark.run(['loop', *argv, '--out_dir', str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and words in err[0]
  assert not (tmp_path / 'loop.md').exists()


def _run_threads():
  return {t for t in threading.enumerate() if t.name in ('kernelformer-watchdog', 'kernelformer-input')}


def test_with_pipeline_reports_its_ratio_and_the_pipeline_alone(tmp_path):
  before = _run_threads()
  rc = benchmark.run(['loop', '--settings', 'tiny', '--steps', '4', '--rounds', '2', '--with_pipeline',
                      '--out_dir', str(tmp_path)])
  assert rc == 0
  # The benchmark leaves no thread of the loops it ran (their watchdog, the input pipeline's reader).
  assert not _run_threads() - before, _run_threads() - before
  table = (tmp_path / 'loop.md').read_text()
  (row,) = [line for line in table.splitlines() if line.startswith('| tiny')]
  cells = [c.strip() for c in row.strip('|').split('|')]
  pipeline_rate = float(cells[10])
  ratio, spread = cells[11].split(' ', 1)
  low, high = (float(x) for x in spread.strip('()').split('-'))
  assert pipeline_rate > 0 and low <= float(ratio) <= high
  rate, per_batch = cells[12].split(' (')
  assert float(rate.replace(',', '')) > 0                          # examples/s of the pipeline alone
  assert per_batch.endswith('ms a batch)')
  assert 'tiny, each round trainer with pipeline / bare' in table


def test_mqar_setting_is_zoology_at_batch_512_on_its_generated_data():
  c = loop.get_config('mqar')
  assert (c.data.task, c.data.max_length, c.data.num_pairs, c.data.vocab_size, c.batch_size) == (
      'mqar', 64, 4, 8192, 512)
  assert loop.SETTINGS['mqar'].task_data and not loop.SETTINGS['quick'].task_data


def test_settings_load_outside_the_repository(tmp_path):
  """The command as installed: from any folder, the settings' configs come from the package (not from
  a ``configs`` folder that only the repository root has on the path)."""
  code = ('from kernelformer.bench import loop\n'
          'print(*(loop.get_config(s).batch_size for s in ("tiny", "quick", "mqar")))')
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  p = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, env=env, capture_output=True,
                     text=True, timeout=120)
  assert p.returncode == 0, p.stderr[-2000:]
  assert p.stdout.split() == ['8', '64', '512']
