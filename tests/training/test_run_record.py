"""Issue 23 items 1-3, run as a user would (train_and_evaluate on the tiny preset): the test measures
the checkpoint it names, a workdir whose checkpoints are all damaged never restarts from zero
silently, and a run that stops after a resume leaves the workdir's record as it was."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from kernelformer.training import trainer
from kernelformer.training import workdir as workdir_lib
from tests.training import helpers
from tests.training.test_run_safety import _damage, snapshot


def numbered(directory):
  return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


def record(workdir):
  """Every file but the TensorBoard event files (a run may add one) and the lock."""
  return {k: v for k, v in snapshot(workdir).items() if not k.startswith('tensorboard')}


class Crash(Exception):
  pass


def crash_at(step):
  def hook(s, _):
    if s == step:
      raise Crash()
  return hook


def test_test_measures_the_best_checkpoint_or_stops(tmp_path, capfd):
  workdir = tmp_path / 'run'
  c = helpers.tiny_config(tmp_path / 'data', eval_every=2)
  first = trainer.train_and_evaluate(c, str(workdir))
  bests = numbered(workdir / 'best')
  assert len(bests) == 2, bests                          # the newest best and the one before
  assert first['tested_checkpoint'] == {'which': 'best', 'step': bests[-1], 'rule': 'best'}
  assert first['best_step'] == bests[-1]
  again = helpers.tiny_config(tmp_path / 'data', eval_every=2, reevaluate=True)

  # Reference: the earlier best, tested in a copy of the workdir without the newest.
  shutil.copytree(workdir, tmp_path / 'ref')
  shutil.rmtree(tmp_path / 'ref' / 'best' / str(bests[-1]))
  ref = trainer.train_and_evaluate(again, str(tmp_path / 'ref'))
  assert ref['tested_checkpoint'] == {'which': 'best', 'step': bests[0], 'rule': 'best'}

  # The newest best damaged: the earlier one is tested and named, quietly (no orbax tracebacks).
  _damage(str(workdir / 'best' / str(bests[-1])), 'truncated file')
  capfd.readouterr()
  out = trainer.train_and_evaluate(again, str(workdir))
  err = capfd.readouterr().err
  assert 'Traceback' not in err and len(err.strip().splitlines()) <= 3, err[-3000:]
  assert f'best/{bests[0]}' in err
  assert out['tested_checkpoint'] == {'which': 'best', 'step': bests[0], 'rule': 'best'}
  for k in ('test_loss', 'test_accuracy', 'best_step', 'best_val_accuracy'):
    assert out[k] == ref[k], k
  on_disk = json.loads((workdir / 'results.json').read_text())
  assert on_disk['tested_checkpoint'] == out['tested_checkpoint']
  tests = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()
           if json.loads(l)['split'] == 'test']
  assert [t['step'] for t in tests] == [bests[0]]

  # No best restores: one line naming the damage; results.json and metrics unchanged.
  _damage(str(workdir / 'best' / str(bests[0])), 'missing state')
  before = record(workdir)
  with pytest.raises(workdir_lib.RunError) as e:
    trainer.train_and_evaluate(again, str(workdir))
  msg = str(e.value)
  assert 'holds no checkpoint that restores' in msg and f'{bests[0]}.damaged-1' in msg
  assert '\n' not in msg
  after = record(workdir)
  assert {k: v for k, v in after.items() if not k.startswith('best')} == \
      {k: v for k, v in before.items() if not k.startswith('best')}


def test_no_silent_restart_when_no_checkpoint_restores(tmp_path):
  workdir = tmp_path / 'run'
  c = helpers.tiny_config(tmp_path / 'data', checkpoint_every=3, eval_every=3, keep_checkpoints=2)
  with pytest.raises(Crash):
    trainer.train_and_evaluate(c, str(workdir), hooks=[crash_at(10)])
  assert numbered(workdir / 'checkpoints') == [6, 9]
  best_before = snapshot(workdir / 'best')
  _damage(str(workdir / 'checkpoints' / '6'), 'missing state')
  _damage(str(workdir / 'checkpoints' / '9'), 'truncated file')
  before = {k: v for k, v in record(workdir).items() if not k.startswith('checkpoints')}

  for _ in range(2):   # and again, once they are set aside
    seen = []
    with pytest.raises(workdir_lib.RunError) as e:
      trainer.train_and_evaluate(c, str(workdir), hooks=[lambda s, _: seen.append(s)])
    msg = str(e.value)
    assert '6.damaged-1' in msg and '9.damaged-1' in msg and 'start_over=True' in msg, msg
    assert '\n' not in msg and seen == []
    assert {k: v for k, v in record(workdir).items() if not k.startswith('checkpoints')} == before
  assert snapshot(workdir / 'best') == best_before

  # Starting over is explicit: from step 0, the earlier best/ kept aside, not overwritten.
  over = helpers.tiny_config(tmp_path / 'data', checkpoint_every=3, eval_every=3,
                             keep_checkpoints=2, start_over=True)
  seen = []
  results = trainer.train_and_evaluate(over, str(workdir), hooks=[lambda s, _: seen.append(s)])
  assert seen[0] == 1 and results['final_step'] == 12
  assert snapshot(workdir / 'best.before-start-over-1') == best_before


def test_error_after_a_resume_leaves_the_record(tmp_path):
  """A continued run (allowed config change) that fails before its first checkpoint changes nothing:
  the original command still finds its finished run."""
  workdir = tmp_path / 'run'
  c = helpers.tiny_config(tmp_path / 'data')
  trainer.train_and_evaluate(c, str(workdir))
  before = record(workdir)
  longer = helpers.tiny_config(tmp_path / 'data', num_train_steps=24, allow_config_change=True)
  with pytest.raises(Crash):
    trainer.train_and_evaluate(longer, str(workdir), hooks=[crash_at(16)])
  assert record(workdir) == before
  assert trainer.train_and_evaluate(c, str(workdir)).status == 'finished'


def test_a_checkpoint_is_written_only_from_finite_parameters_and_validation_loss(tmp_path):
  """Issue 23 item 4: with checkpoints every 2 steps, a learning rate that makes the parameters
  explode leaves no checkpoint (nor best/) whose validation loss is NaN; the message names the last
  checkpoint that passed."""
  workdir = tmp_path / 'run'
  c = helpers.tiny_config(tmp_path / 'data', checkpoint_every=2, eval_every=2, log_every=1,
                          **{'optim.learning_rate': 1e30})
  with pytest.raises(workdir_lib.RunError) as e:
    trainer.train_and_evaluate(c, str(workdir))
  assert e.value.exit_code == workdir_lib.EXIT_DIVERGED
  msg = str(e.value)
  assert 'no checkpoint had been written' in msg and '\n' not in msg, msg
  for d in ('checkpoints', 'best'):
    assert not (workdir / d).is_dir() or numbered(workdir / d) == [], d
