"""Run safety in-process: one config per workdir, finished runs, divergence, damaged checkpoints, the lock,
metrics without duplicates, full test split. (Signals and the watchdog: test_signals.py.)"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
import tensorflow_datasets as tfds

from configs import image as image_config
from kernelformer.training import checkpoint as ckpt_lib
from kernelformer.training import fingerprint as fp
from kernelformer.training import steps as steps_lib
from kernelformer.training import trainer
from kernelformer.training import workdir as workdir_lib
from tests.training import helpers


def snapshot(directory):
  """{relative path: sha256} of every file under ``directory``."""
  out = {}
  for root, _, files in os.walk(directory):
    for f in files:
      p = os.path.join(root, f)
      with open(p, 'rb') as fh:
        out[os.path.relpath(p, directory)] = hashlib.sha256(fh.read()).hexdigest()
  return out


def events(workdir):
  return [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]


def test_workdir_belongs_to_one_config_and_finished_runs_are_finished(tmp_path):
  workdir = tmp_path / 'run'
  c = helpers.tiny_config(tmp_path / 'data', **{'model.attention.kind': 'posrf-orf'})
  first = trainer.train_and_evaluate(c, str(workdir))
  assert first.status == 'trained'
  results_bytes = (workdir / 'results.json').read_bytes()
  r = json.loads(results_bytes)
  for key in ('wall_time_s', 'started', 'finished', 'code_version', 'config_fingerprint',
              'steps_per_sec', 'selected_on', 'test_examples'):
    assert key in r, key
  assert r['steps_per_sec'] > 0 and r['steps_trained'] == c.num_train_steps
  assert 'git_commit' in r['code_version'] or 'package_version' in r['code_version']
  before = snapshot(workdir)

  # Re-running the finished run: one status, nothing written.
  again = trainer.train_and_evaluate(c, str(workdir))
  assert again.status == 'finished'
  assert (workdir / 'results.json').read_bytes() == results_bytes
  assert snapshot(workdir) == before

  # Another config: refused before compiling, naming every differing field; nothing written.
  other = helpers.tiny_config(tmp_path / 'data', **{'model.attention.kind': 'softmax',
                                                    'optim.learning_rate': 0.01})
  with pytest.raises(workdir_lib.RunError) as e:
    trainer.train_and_evaluate(other, str(workdir))
  msg = str(e.value)
  assert 'model.attention.kind: posrf-orf -> softmax' in msg
  assert 'optim.learning_rate: 0.002 -> 0.01' in msg
  assert 'allow_config_change' in msg and '\n' not in msg
  assert snapshot(workdir) == before
  # Fields that change nothing (progress, logging, checkpoint frequency) are not differences.
  same = helpers.tiny_config(tmp_path / 'data', **{'model.attention.kind': 'posrf-orf', 'log_every': 1,
                                                   'checkpoint_every': 3, 'keep_checkpoints': 5})
  assert trainer.train_and_evaluate(same, str(workdir)).status == 'finished'

  # Extending the run is an explicit choice, recorded; the continued run trains the new steps only.
  longer = helpers.tiny_config(tmp_path / 'data', **{'model.attention.kind': 'posrf-orf',
                                                     'num_train_steps': 15})
  with pytest.raises(workdir_lib.RunError, match='num_train_steps: 12 -> 15'):
    trainer.train_and_evaluate(longer, str(workdir))
  longer.unlock()
  longer.allow_config_change = True
  seen = []
  extended = trainer.train_and_evaluate(longer, str(workdir), hooks=[lambda s, _: seen.append(s)])
  assert seen == [13, 14, 15]
  assert extended['final_step'] == 15
  assert extended['config_changes'][0]['fields'] == ['num_train_steps: 12 -> 15']
  assert extended['config_changes'][0]['at_step'] == 12
  assert extended['steps_trained'] == 15
  keys = [(e['split'], e['step']) for e in events(workdir)]
  assert len(keys) == len(set(keys)) and [k for k in keys if k[0] == 'test'] == [
      ('test', extended['best_step'])]

  # Re-evaluation is asked for explicitly: results rewritten, one test event, no training.
  longer.reevaluate = True
  seen.clear()
  redone = trainer.train_and_evaluate(longer, str(workdir), hooks=[lambda s, _: seen.append(s)])
  assert redone.status == 'reevaluated' and seen == []
  assert redone['test_accuracy'] == extended['test_accuracy']
  assert [e for e in events(workdir) if e['split'] == 'test'].__len__() == 1


def test_nonfinite_loss_stops_at_the_exact_step_and_leaves_the_workdir_as_it_was(tmp_path):
  """The first non-finite step is found on the device and named
  exactly whatever the logging boundaries; its update is not applied; the run that diverged after a
  resume (with a config change) leaves every file of the workdir as it was."""
  workdir = tmp_path / 'run'
  c = helpers.tiny_config(tmp_path / 'data', log_every=1)
  trainer.train_and_evaluate(c, str(workdir))
  before = {k: v for k, v in snapshot(workdir).items() if not k.startswith('tensorboard')}

  stopped = {}
  for log_every in (1, 12):
    # The same workdir continued with a learning rate that diverges.
    bad = helpers.tiny_config(tmp_path / 'data', log_every=log_every, num_train_steps=24,
                              allow_config_change=True, **{'optim.learning_rate': 1e30})
    seen, digests = [], {}

    def record(step, state):
      seen.append(step)
      digests[step] = fp.tree_digest(state.params)

    with pytest.raises(workdir_lib.RunError) as e:
      trainer.train_and_evaluate(bad, str(workdir), hooks=[record])
    assert e.value.exit_code == workdir_lib.EXIT_DIVERGED
    stopped[log_every] = n = int(str(e.value).split()[1].rstrip(':'))
    # The non-finite step's update (and every later one) was not applied on the device.
    later = [s for s in digests if s >= n]
    assert n - 1 in digests and all(digests[s] == digests[n - 1] for s in later)
    if log_every == 12:
      assert later       # hooks ran past the bad step before the boundary read it: the check is real
    assert str(e.value).startswith(f'step {stopped[log_every]}: non-finite')
    assert 'last good checkpoint (step 12)' in str(e.value) and '\n' not in str(e.value)
    assert seen[:stopped[log_every] - 13] == list(range(13, stopped[log_every]))
    after = {k: v for k, v in snapshot(workdir).items() if not k.startswith('tensorboard')}
    assert after == before     # run.json, config.json, results.json, metrics.jsonl, checkpoints, best
  assert stopped[1] == stopped[12] > 12
  # The original command still runs: the finished run is reported, nothing is refused.
  assert trainer.train_and_evaluate(c, str(workdir)).status == 'finished'


def test_nonfinite_skip_policy_skips_updates_then_stops(tmp_path):
  # No validation or checkpoint before the skips run out (a checkpoint needs finite parameters).
  c = helpers.tiny_config(tmp_path / 'data', on_nonfinite='skip', num_train_steps=30, eval_every=30,
                          checkpoint_every=30, **{'optim.learning_rate': 1e30})
  params, counts = {}, {}
  sched = lambda x: isinstance(x, optax.ScaleByScheduleState)

  def record(step, state):
    params[step] = [np.asarray(x) for x in jax.tree.leaves(state.params)]
    [counts[step]] = [(int(x.count), int(state.step))
                      for x in jax.tree.leaves(state.opt_state, is_leaf=sched) if sched(x)]

  with pytest.raises(workdir_lib.RunError, match='non-finite steps .loss or gradient norm. in a row') as e:
    trainer.train_and_evaluate(c, str(tmp_path / 'run'), hooks=[record])
  assert e.value.exit_code == workdir_lib.EXIT_DIVERGED
  skipped = [s for s in params if s > 1 and all(
      np.array_equal(a, b) for a, b in zip(params[s], params[s - 1]))]
  assert len(skipped) >= steps_lib.MAX_CONSECUTIVE_SKIPS - 1      # those updates were not applied
  assert all(counts[s][0] == counts[s][1] for s in skipped)   # but the schedule counted them
  assert all(np.all(np.isfinite(a)) for a in params[max(params)])


def _small_state():
  return {'w': jnp.arange(4096, dtype=jnp.float32).reshape(64, 64), 'b': jnp.ones((64,))}


def _damage(path, how):
  state = os.path.join(path, 'state')
  # Every array-data file (OCDBT's d/ folders), not just the largest file: how orbax's asynchronous
  # writes split the data varies from run to run, and some files are left unreferenced once the
  # per-process store is merged, so damage to one file could miss the bytes a restore reads.
  data_files = [os.path.join(r, f) for r, _, fs in os.walk(state) for f in fs
                if os.path.basename(r) == 'd'] or \
      [max((os.path.join(r, f) for r, _, fs in os.walk(state) for f in fs), key=os.path.getsize)]
  if how == 'missing state':
    shutil.rmtree(state)
  elif how == 'truncated file':
    for name in data_files:
      with open(name, 'r+b') as f:
        f.truncate(os.path.getsize(name) // 2)
  elif how == 'bit flip':
    for name in data_files:
      data = bytearray(open(name, 'rb').read())
      data[len(data) // 2] ^= 0x10   # inside the array bytes: decodes, but to other values
      open(name, 'wb').write(bytes(data))
  elif how == 'corrupt meta':
    with open(os.path.join(path, 'meta', 'metadata'), 'w') as f:
      f.write('{"best_step": 3,')


@pytest.mark.parametrize('how', ['missing state', 'truncated file', 'bit flip', 'corrupt meta'])
def test_damaged_latest_checkpoint_is_set_aside(tmp_path, how, capsys):
  d = str(tmp_path / 'checkpoints')
  ckpts = ckpt_lib.Checkpoints(d, 5)
  states = {s: jax.tree.map(lambda x, s=s: x + s, _small_state()) for s in (2, 4)}
  for s, st in states.items():
    ckpts.save(s, st, {'best_step': s})
  _damage(os.path.join(d, '4'), how)
  ckpts.close()
  ckpts = ckpt_lib.Checkpoints(d, 5)
  state, meta = ckpts.restore_latest(ckpt_lib.abstract_like(_small_state()))
  assert meta['best_step'] == 2
  np.testing.assert_array_equal(state['w'], states[2]['w'])
  assert sorted(os.listdir(d)) == ['2', '4.damaged-1']
  line = capsys.readouterr().err.strip().splitlines()[-1]
  assert 'set aside as 4.damaged-1' in line
  assert ckpts.latest_step() == 2


def test_checkpoint_of_another_model_is_refused_not_set_aside(tmp_path):
  d = str(tmp_path / 'checkpoints')
  ckpts = ckpt_lib.Checkpoints(d, 5)
  ckpts.save(2, _small_state(), {'code_versions': [
      {'from_step': 0, 'code_version': {'git_commit': 'abcdef0123456789'}}]})
  with pytest.raises(workdir_lib.RunError, match=r'other shapes.*written by commit abcdef012345'):
    ckpts.restore_latest(ckpt_lib.abstract_like({'w': jnp.zeros((8, 8)), 'b': jnp.ones((64,))}))
  assert os.listdir(d) == ['2']


def test_failed_save_keeps_previous_checkpoints(tmp_path, monkeypatch):
  d = str(tmp_path / 'checkpoints')
  ckpts = ckpt_lib.Checkpoints(d, 1)
  ckpts.save(2, _small_state(), {'best_step': 2})
  before = snapshot(d)

  def full_disk(*a, **k):
    raise OSError(28, 'No space left on device')

  monkeypatch.setattr(ocp.CheckpointManager, 'save', full_disk)
  with pytest.raises(workdir_lib.RunError, match=r'could not write checkpoint .*No space left.*kept: 2'):
    ckpts.save(4, _small_state(), {})
  # Replacing a same-step checkpoint that then fails to write puts the old one back.
  with pytest.raises(workdir_lib.RunError, match='kept: 2'):
    ckpts.save(2, jax.tree.map(lambda x: x + 1, _small_state()), {})
  assert snapshot(d) == before
  monkeypatch.undo()
  state, _ = ckpt_lib.Checkpoints(d, 1).restore_latest(ckpt_lib.abstract_like(_small_state()))
  np.testing.assert_array_equal(state['w'], _small_state()['w'])


def test_killed_write_leaves_temp_dir_that_next_run_removes(tmp_path):
  d = tmp_path / 'checkpoints'
  ckpt_lib.Checkpoints(str(d), 2).save(2, _small_state(), {})
  (d / '4.orbax-checkpoint-tmp-1234' / 'state').mkdir(parents=True)
  ckpts = ckpt_lib.Checkpoints(str(d), 2)
  assert sorted(os.listdir(d)) == ['2'] and ckpts.latest_step() == 2


def test_resume_after_damage_and_crash_has_no_duplicate_events(tmp_path, capsys):
  workdir = tmp_path / 'run'
  c = helpers.tiny_config(tmp_path / 'data', checkpoint_every=3, keep_checkpoints=5, log_every=1,
                          eval_every=3)

  class Crash(Exception):
    pass

  def crash_at_11(step, state):
    if step == 11:
      raise Crash()

  with pytest.raises(Crash):
    trainer.train_and_evaluate(c, str(workdir), hooks=[crash_at_11])
  assert sorted(os.listdir(workdir / 'checkpoints')) == ['3', '6', '9']
  shutil.rmtree(workdir / 'checkpoints' / '9' / 'state')
  # A lock left by a process that is gone (same host) is taken over.
  dead = subprocess.Popen([sys.executable, '-c', 'pass'])
  dead.wait()
  (workdir / 'lock').write_text(json.dumps({'pid': dead.pid, 'host': socket.gethostname()}))
  seen = []
  trainer.train_and_evaluate(c, str(workdir), hooks=[lambda s, _: seen.append(s)])
  err = capsys.readouterr().err
  assert 'set aside as 9.damaged-1' in err and 'stale lock' in err
  assert seen[0] == 7
  keys = [(e['split'], e['step']) for e in events(workdir)]
  assert len(keys) == len(set(keys))
  assert sorted(s for split, s in keys if split == 'train') == list(range(1, 13))
  assert not (workdir / 'lock').exists()


def test_second_run_in_a_locked_workdir_is_refused(tmp_path):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  holder = {'pid': os.getpid(), 'host': socket.gethostname(), 'started': 'now'}
  (workdir / 'lock').write_text(json.dumps(holder))
  before = snapshot(workdir)
  c = helpers.tiny_config(tmp_path / 'data')
  with pytest.raises(workdir_lib.RunError, match=f'in use by pid {os.getpid()} on host'):
    trainer.train_and_evaluate(c, str(workdir))
  assert snapshot(workdir) == before


def test_final_test_covers_whole_split_on_a_quick_image_run(tmp_path):
  """The ``quick`` Image preset caps periodic validation, never the test split."""
  c = image_config.get_config('quick')
  c.data.data_dir = str(tmp_path / 'data')
  c.data.tfds_check = False
  c.progress = False
  c.batch_size = 8
  c.max_eval_batches = 1            # the quick preset's cap, shrunk so that 16 mock images exceed it
  c.num_train_steps = c.eval_every = c.checkpoint_every = c.log_every = 1
  with tfds.testing.mock_data(num_examples=16):
    results = trainer.train_and_evaluate(c, str(tmp_path / 'run'), devices=jax.devices()[:1])
  assert results['test_examples'] == 16
  val = [e for e in events(tmp_path / 'run') if e['split'] == 'val']
  assert f"over {val[0]['examples']} examples" in results['selected_on']
  assert 'max_eval_batches=1' in results['selected_on']


def test_a_damaged_checkpoint_line_has_words_not_object_reprs():
  e = ValueError('DATA_LOSS: Error opening "cast" driver: Error opening "zarr" driver: Error reading '
                 '"b/.zarray" <bound method pybind11_detail_function_record_v1_system_libstdcpp_gxx_'
                 'abi_1xxx.result of <tensorstore.Future object at 0x7f2a1c0b3e30>> in OCDBT database '
                 + 'x' * 300)
  reason = ckpt_lib.error_reason(e)
  assert 'bound method' not in reason and '0x7f' not in reason and 'driver' not in reason, reason
  assert reason.startswith('DATA_LOSS: Error reading "b/.zarray" in OCDBT database') and \
      len(reason) <= 165, reason
