"""Run as a user would (train_and_evaluate on the tiny preset): the test measures
the checkpoint it names, a workdir whose checkpoints are all damaged never restarts from zero
silently, and a run that stops after a resume leaves the workdir's record as it was."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from kernelformer.training import loop as loop_lib
from kernelformer.training import record as record_lib
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
  """With checkpoints every 2 steps, a learning rate that makes the parameters
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


@pytest.mark.parametrize('gone', ['removed', 'emptied'])
def test_a_started_run_whose_checkpoints_are_gone_is_refused(tmp_path, gone):
  """run.json says a run started (it is written with the first checkpoint); with checkpoints/ removed
  or emptied the run stops with one line instead of training from step 0 over its record."""
  workdir = tmp_path / 'run'
  c = helpers.tiny_config(tmp_path / 'data', checkpoint_every=3, eval_every=3)
  with pytest.raises(Crash):
    trainer.train_and_evaluate(c, str(workdir), hooks=[crash_at(10)])
  assert (workdir / 'run.json').is_file() and not (workdir / 'results.json').exists()
  shutil.rmtree(workdir / 'checkpoints')
  if gone == 'emptied':
    (workdir / 'checkpoints').mkdir()
  before = record(workdir)
  seen = []
  with pytest.raises(workdir_lib.RunError) as e:
    trainer.train_and_evaluate(c, str(workdir), hooks=[lambda s, _: seen.append(s)])
  msg = str(e.value)
  assert 'run.json records a run started here' in msg and 'start_over=True' in msg, msg
  assert '\n' not in msg and seen == []
  assert record(workdir) == before
  over = helpers.tiny_config(tmp_path / 'data', checkpoint_every=3, eval_every=3, start_over=True)
  results = trainer.train_and_evaluate(over, str(workdir))
  assert results['final_step'] == 12
  assert snapshot(workdir / 'best.before-start-over-1') == \
      {k[len('best/'):]: v for k, v in before.items() if k.startswith('best/')}


def test_a_stretch_that_diverges_leaves_the_finished_run_as_it_was(tmp_path):
  """A finished run continued under another config (here a learning rate that blows the model up,
  checkpointing every step) changes no byte of the finished run's record, checkpoints or best/ when
  it diverges; the last good checkpoint it names is a finished-run checkpoint, and the original
  command still finds its run finished."""
  workdir = tmp_path / 'run'
  c = helpers.tiny_config(tmp_path / 'data', eval_every=3, checkpoint_every=3, keep_checkpoints=1)
  trainer.train_and_evaluate(c, str(workdir))
  before = record(workdir)
  blowup = helpers.tiny_config(tmp_path / 'data', num_train_steps=24, checkpoint_every=1,
                               eval_every=3, keep_checkpoints=1, allow_config_change=True,
                               **{'optim.learning_rate': 1e4})
  with pytest.raises(workdir_lib.RunError) as e:
    trainer.train_and_evaluate(blowup, str(workdir))
  assert e.value.exit_code == workdir_lib.EXIT_DIVERGED
  msg = str(e.value)
  assert 'last good checkpoint (step 12)' in msg and 'finished run' in msg, msg
  after = record(workdir)
  assert {k: v for k, v in after.items() if k in before} == before    # every earlier byte kept
  added = {k.split('/')[0] + '/' + k.split('/')[1] for k in set(after) - set(before)}
  assert all(a.split('/')[0] in ('checkpoints', 'best') and int(a.split('/')[1]) > 12
             for a in added), added                                 # only new steps, beside
  assert trainer.train_and_evaluate(c, str(workdir)).status == 'finished'


def test_a_write_failure_at_the_end_of_a_stretch_leaves_the_finished_run(tmp_path, monkeypatch):
  """A continued run that trains and checkpoints, then cannot write results.json (a full disk),
  leaves run.json, config.json, metrics.jsonl and results.json of the finished run byte-identical,
  and its checkpoints and bests beside the new ones; the same command then completes it."""
  workdir = tmp_path / 'run'
  c = helpers.tiny_config(tmp_path / 'data', eval_every=3, checkpoint_every=3, keep_checkpoints=1)
  trainer.train_and_evaluate(c, str(workdir))
  before, events_before = record(workdir), snapshot(workdir / 'tensorboard')
  longer = helpers.tiny_config(tmp_path / 'data', num_train_steps=18, eval_every=3,
                               checkpoint_every=3, keep_checkpoints=1, allow_config_change=True)
  real = record_lib.atomic_write_json

  def full_disk(path, obj):
    if path.endswith('results.json'):
      raise workdir_lib.write_error(path, OSError(28, 'No space left on device'))
    real(path, obj)

  monkeypatch.setattr(record_lib, 'atomic_write_json', full_disk)
  with pytest.raises(workdir_lib.RunError, match='No space left'):
    trainer.train_and_evaluate(longer, str(workdir))
  after = record(workdir)
  assert {k: v for k, v in after.items() if k in before} == before
  assert snapshot(workdir / 'tensorboard') == events_before   # no partial event file to duplicate
  assert not [n for n in os.listdir(workdir) if n.startswith(('record.', 'run.json.'))]
  assert numbered(workdir / 'checkpoints') == [12, 18]
  monkeypatch.setattr(record_lib, 'atomic_write_json', real)
  assert trainer.train_and_evaluate(c, str(workdir)).status == 'finished'
  done = trainer.train_and_evaluate(longer, str(workdir))
  assert done['final_step'] == 18 and done['config_changes']
  events = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  steps = [(e['split'], e['step']) for e in events]
  assert len(steps) == len(set(steps)), steps                    # no event twice
  assert [s for s in steps if s[0] == 'test'] == [('test', done['tested_checkpoint']['step'])]
  assert [e['step'] for e in events if e['split'] == 'train'] == list(range(3, 19, 3)), steps


def test_divergence_lines_name_what_is_non_finite_and_advise_only_what_is_not_set():
  """A finite loss of 1.2e17 beside an infinite gradient norm: only the gradient norm is called
  non-finite; with on_nonfinite='skip' already set, no line advises it."""
  window = {'bad_step': 7, 'bad_loss': 1.2e17, 'bad_grad_norm': float('inf'), 'consecutive': 10}
  for policy in ('stop', 'skip'):
    with pytest.raises(workdir_lib.RunError) as e:
      raise loop_lib.divergence_error(window, policy, 'no checkpoint had been written')
    msg = str(e.value)
    assert e.value.exit_code == workdir_lib.EXIT_DIVERGED and 'step 7' in msg, msg
    assert ("on_nonfinite='skip'" in msg) == (policy == 'stop'), msg
    if policy == 'stop':
      assert 'non-finite gradient norm (loss 1.2e+17, gradient norm inf)' in msg, msg


def test_a_diverging_skip_run_is_not_advised_to_skip(tmp_path):
  c = helpers.tiny_config(tmp_path / 'data', checkpoint_every=2, eval_every=2, log_every=1,
                          on_nonfinite='skip', **{'optim.learning_rate': 1e30})
  with pytest.raises(workdir_lib.RunError) as e:
    trainer.train_and_evaluate(c, str(tmp_path / 'run'))
  assert e.value.exit_code == workdir_lib.EXIT_DIVERGED
  assert 'on_nonfinite' not in str(e.value) and 'learning_rate' in str(e.value), str(e.value)
