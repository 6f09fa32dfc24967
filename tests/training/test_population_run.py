"""``train_population``: each member's workdir as its single run (``trainer.train_and_evaluate``) leaves it.

A population of one is the single run's program: its workdir is compared bitwise (results.json less
its clock fields, every checkpoint's state digest). Larger populations vmap the step, which changes the
order of float32 reductions, so parameters are compared at ``test_population.ATOL`` (measured: a few
float32 ulps; an update of one wrong step is ~lr = 1e-3) and the discrete outcomes -- best step, early
stop step, test accuracy over the whole test split -- exactly. Stops are frozen (the step's ``active``
mask), divergence is one member's, and resumes (a stop signal; a kill between members' checkpoint
writes) are compared bitwise with the uninterrupted population.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from kernelformer import run_config
from kernelformer.training import checkpoint as ckpt_lib
from kernelformer.training import population
from kernelformer.training import population_run
from kernelformer.training import signals as signals_lib
from kernelformer.training import steps as steps_lib
from kernelformer.training import trainer
from kernelformer.training import validate
from kernelformer.training import workdir as workdir_lib
from lra_tasks import fixtures
from tests.training import test_population

STEPS, EVERY = 12, 4
ONE = jax.devices()[:1]
CLOCKS = {'steps_per_sec', 'train_seconds', 'wall_time_s', 'started', 'finished', 'wall_seconds',
          'code_version', 'code_versions'}
# What a resume changes in a checkpoint's meta (a single run's too): the steps dispatched and timed in
# this process, and the events the first save after a resume holds until the record is written.
RESUMED = {'steps_trained', 'timed_steps', 'uncommitted'}
# Seed and one optimizer field varying (a member's own data order, keys and schedule).
MEMBERS = [{'seed': 0}, {'seed': 1, 'optim.learning_rate': 3e-3}, {'seed': 2}]


def _config(task, data, members, steps=STEPS, **overrides):
  c = test_population.CONFIGS[task].get_config('tiny')
  c.data.data_dir = str(data)
  if task == 'retrieval' and not os.path.isdir(data):
    fixtures.write_retrieval_fixture(str(data), n_per_split=8, seed=0)
  with c.unlocked():
    c.progress, c.num_train_steps, c.eval_every, c.checkpoint_every = False, steps, EVERY, EVERY
    c.log_every = 2
    c.population = tuple(members)
    for k, v in overrides.items():
      c[k] = v
  return c


def _single(c, i, workdir, devices=ONE):
  """Member ``i``'s single run."""
  return trainer.train_and_evaluate(population.members(c)[i], str(workdir), devices=devices)


def _results(workdir) -> dict:
  with open(os.path.join(workdir, 'results.json')) as f:
    return {k: v for k, v in json.load(f).items() if k not in CLOCKS}


def _metas(workdir, which='checkpoints') -> dict:
  """Each checkpoint's meta less its clocks (``state_sha256``: the state, bitwise)."""
  manager = ckpt_lib.Checkpoints(os.path.join(workdir, which), 2, read_only=True)
  out = {s: {k: v for k, v in manager.meta(s).items() if k not in CLOCKS} for s in manager.all_steps()}
  manager.close()
  for meta in out.values():   # the events held until the record is written: their rates are clocks
    for _, _, values in meta.get('uncommitted', {}).get('events', []):
      values.pop('steps_per_sec', None)
  return out


def _params(c, workdir, step=None):
  run = run_config.of(population.members(c)[0])
  task = __import__('lra_tasks').get(run.data.task)
  _, fresh = steps_lib.build_steps(run, task.info(run.data), ONE)
  manager = ckpt_lib.Checkpoints(os.path.join(workdir, 'checkpoints'), 2, read_only=True)
  state, _ = manager.restore(ckpt_lib.abstract_like(fresh), step)
  manager.close()
  return test_population._leaves(state.params)


def _close(got: dict, want: dict, what: str):
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=0, atol=test_population.ATOL,
                               err_msg=f'{what} {name}')


def _same_outcome(got: dict, want: dict):
  for key in ('best_step', 'final_step', 'stopped_early', 'test_accuracy', 'test_examples',
              'tested_checkpoint', 'config_fingerprint', 'config'):
    assert got[key] == want[key], key


def test_a_population_of_one_is_its_single_run_bitwise(tmp_path):
  c = _config('listops', tmp_path / 'data', [{'seed': 3}])
  [got] = population_run.train_population(c, [str(tmp_path / 'member')], devices=ONE)
  want = _single(c, 0, tmp_path / 'single')
  assert got.status == want.status == 'trained'
  assert _results(tmp_path / 'member') == _results(tmp_path / 'single')
  for which in ('checkpoints', 'best'):
    assert _metas(tmp_path / 'member', which) == _metas(tmp_path / 'single', which) != {}
  with open(tmp_path / 'member' / 'run.json') as a, open(tmp_path / 'single' / 'run.json') as b:
    assert json.load(a)['fingerprint'] == json.load(b)['fingerprint']


@pytest.fixture(scope='module')
def listops_three(tmp_path_factory):
  """The uninterrupted population of ``MEMBERS`` (the resume tests compare with it)."""
  root = tmp_path_factory.mktemp('three')
  c = _config('listops', root / 'data', MEMBERS)
  workdirs = [str(root / population.member_name(m)) for m in MEMBERS]
  results = population_run.train_population(c, workdirs, devices=ONE)
  return c, root, workdirs, results


def _compare_members(c, workdirs, root, devices=ONE):
  for i, w in enumerate(workdirs):
    _single(c, i, root / f'single{i}', devices)
    _same_outcome(_results(w), _results(root / f'single{i}'))
    _close(_params(c, w), _params(c, root / f'single{i}'), f'member {i}')


def test_three_listops_members_equal_their_single_runs(listops_three):
  c, root, workdirs, results = listops_three
  assert [r.status for r in results] == ['trained'] * 3
  assert sorted(os.listdir(workdirs[1])) == ['best', 'checkpoints', 'config.json', 'metrics.jsonl',
                                             'results.json', 'run.json', 'tensorboard']
  _compare_members(c, workdirs, root)
  again = population_run.train_population(c, workdirs, devices=ONE)   # finished: not retrained
  assert [r.status for r in again] == ['finished'] * 3


@pytest.mark.parametrize('devices,single_devices', [(2, 1), (4, 2)])
def test_members_across_devices_equal_their_single_runs(tmp_path, devices, single_devices):
  """The conftest forces 8 CPU devices. Two members on two devices train one each (a pod's slices);
  on four, each member's batch is split two ways, as its single run's on two devices."""
  c = _config('listops', tmp_path / 'data', MEMBERS[:2])
  workdirs = [str(tmp_path / f'm{i}') for i in range(2)]
  results = population_run.train_population(c, workdirs, devices=jax.devices()[:devices])
  assert [r.status for r in results] == ['trained'] * 2
  _compare_members(c, workdirs, tmp_path, jax.devices()[:single_devices])


@pytest.mark.slow
@pytest.mark.parametrize('task', ['retrieval', 'mqar'])
def test_three_members_equal_their_single_runs(tmp_path, task):
  c = _config(task, tmp_path / 'data', MEMBERS)
  workdirs = [str(tmp_path / f'm{i}') for i in range(3)]
  population_run.train_population(c, workdirs, devices=ONE)
  _compare_members(c, workdirs, tmp_path)


def test_a_member_that_stops_early_is_frozen_and_the_other_goes_on(tmp_path):
  """lr 3e-3 crosses 0.21 at step 8 (validation 0.219); lr 1e-3 stays below it to step 16."""
  members = [{'optim.learning_rate': 3e-3}, {'optim.learning_rate': 1e-3}]
  c = _config('listops', tmp_path / 'data', members, steps=16, early_stop_accuracy=0.21)
  last = {}
  workdirs = [str(tmp_path / 'a'), str(tmp_path / 'b')]
  got = population_run.train_population(
      c, workdirs, devices=ONE, hooks=[lambda s, state: last.update(step=s, state=jax.device_get(state))])
  assert last['step'] == 16 and got[0]['stopped_early']['step'] == 8 and got[1]['final_step'] == 16
  assert sorted(_metas(workdirs[0])) == [4, 8]          # nothing written past its stop
  frozen = test_population._leaves(jax.tree.map(lambda x: x[0], last["state"].params))
  for name, value in _params(c, workdirs[0]).items():   # the population's state at the end: step 8's
    np.testing.assert_array_equal(frozen[name], value, err_msg=name)
  _compare_members(c, workdirs, tmp_path)


def _interrupted(c, workdirs, hook):
  with pytest.raises(workdir_lib.RunError) as e:
    population_run.train_population(c, workdirs, devices=ONE, hooks=[hook])
  return e.value


def _same_as_uninterrupted(workdirs, reference):
  for w, ref in zip(workdirs, reference):
    assert _results(w) == _results(ref)
    for which in ('checkpoints', 'best'):
      got, want = _metas(w, which), _metas(ref, which)
      assert sorted(got) == sorted(want), which
      for step in want:
        diff = {k for k in {*got[step], *want[step]} if got[step].get(k) != want[step].get(k)}
        assert diff <= RESUMED, (which, step, diff)


def test_a_stopped_population_resumes_bitwise(tmp_path, listops_three):
  c, _, reference, _ = listops_three
  workdirs = [str(tmp_path / population.member_name(m)) for m in MEMBERS]

  def sigint_at_6(step, state):
    if step == 6:
      os.kill(os.getpid(), signal.SIGINT)
      deadline = time.monotonic() + 10
      while not signals_lib._READER.stack[-1].requested and time.monotonic() < deadline:
        time.sleep(0.01)
  error = _interrupted(c, workdirs, sigint_at_6)
  assert error.exit_code == workdir_lib.EXIT_SIGINT and 'step 6' in str(error)
  assert all(max(_metas(w)) == 6 for w in workdirs)
  population_run.train_population(c, workdirs, devices=ONE)
  _same_as_uninterrupted(workdirs, reference)


def test_a_kill_between_member_checkpoints_resumes_bitwise(tmp_path, listops_three):
  """Killed after step 8's checkpoints of members 0 and 1: member 2's is removed; all resume at 4."""
  c, _, reference, _ = listops_three
  workdirs = [str(tmp_path / population.member_name(m)) for m in MEMBERS]

  class Kill(Exception):
    pass

  def kill_at_9(step, state):
    if step == 9:
      raise Kill()
  with pytest.raises(Kill):
    population_run.train_population(c, workdirs, devices=ONE, hooks=[kill_at_9])
  shutil.rmtree(os.path.join(workdirs[2], 'checkpoints', '8'))
  seen = []
  population_run.train_population(c, workdirs, devices=ONE, hooks=[lambda s, _: seen.append(s)])
  assert seen[0] == 5
  _same_as_uninterrupted(workdirs, reference)


def test_cli_a_diverged_member_says_its_line_the_others_finish_and_report_reads_them(tmp_path):
  """``kernelformer train --config.population=...``: members in --workdir/<member name>; a member with
  a huge learning rate diverges (its line, its record), the other finishes; exit 3; a re-run says the
  diverged member's line again and trains nothing; ``kernelformer report`` reads the finished member."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = {**os.environ, 'PYTHONPATH': root}
  cmd = [sys.executable, '-m', 'kernelformer', 'train', '--config', 'listops:tiny',
         '--workdir', str(tmp_path / 'pop'), f'--config.data.data_dir={tmp_path / "data"}',
         '--config.num_train_steps=8', '--config.eval_every=4', '--config.checkpoint_every=4',
         '--config.progress=False',
         "--config.population=({'seed': 1}, {'seed': 1, 'optim.learning_rate': 1e6})"]
  for attempt in range(2):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == workdir_lib.EXIT_DIVERGED, proc.stderr[-2000:]
    bad = tmp_path / 'pop' / 'seed=1,optim.learning_rate=1000000.0'
    assert f'{bad}: step ' in proc.stderr and 'diverged' in proc.stderr
    assert 'error: 1 of 2 members diverged' in proc.stderr.splitlines()[-1]
    assert proc.stdout.splitlines()[-1].startswith(
        'seed=1: this run is finished' if attempt else 'seed=1: test accuracy')
    assert (bad / population_run.DIVERGED).exists() and not (bad / 'results.json').exists()
    assert (tmp_path / 'pop' / 'seed=1' / 'results.json').exists()
  report = subprocess.run([sys.executable, '-m', 'kernelformer', 'report', str(tmp_path / 'pop')],
                          capture_output=True, text=True, env=env, timeout=300)
  assert report.returncode == 0, report.stderr[-2000:]
  assert '| `seed=1` | listops | `softmax` | 1 |' in report.stdout, report.stdout


def test_bad_members_are_one_line(tmp_path):
  c = _config('listops', tmp_path / 'data', [{'seed': 0}, {'model.num_layers': 2}])
  with pytest.raises(population.PopulationError, match="'model.num_layers' cannot differ"):
    population_run.train_population(c, [str(tmp_path / 'a'), str(tmp_path / 'b')])
  c = _config('listops', tmp_path / 'data', [{'seed': 0}, {'seed': 1}])
  with pytest.raises(validate.ConfigError, match='distinct workdirs'):
    population_run.train_population(c, [str(tmp_path / 'a'), str(tmp_path / 'a')])
  with pytest.raises(Exception, match='config.population lists members'):
    trainer.train_and_evaluate(c, str(tmp_path / 'single'))
  assert not os.path.exists(tmp_path / 'a')
