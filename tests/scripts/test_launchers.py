"""Cluster launchers: SLURM through submitit against a real scheduler, TPU-pod commands.

The SLURM test needs a running cluster: ``.ci/slurm-up`` starts a single-node one (munge, slurmctld,
slurmd) before the suite in CI, which also sets ``KERNELFORMER_REQUIRE_SLURM=1`` so the test fails
there instead of skipping. Everywhere else it skips with the reason.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from kernelformer.reproduce import launchers, report, sweeps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = 'configs/listops.py:tiny'


def _cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-m', 'kernelformer', 'sweep', *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=timeout,
                        env={**os.environ, 'PYTHONPATH': ROOT, **(env or {})})


def _sweep(kinds=('softmax',), seeds=(0,), sets=()) -> sweeps.Sweep:
  return sweeps.expand(sweeps.sweep_from_flags(
      [TINY], [f'model.attention.kind={",".join(kinds)}', f'seed={",".join(map(str, seeds))}'],
      list(sets), name='t'))


# ----------------------------------------------------------------------------------------------------
# Without a scheduler.


def test_slurm_options_become_submitit_parameters():
  extra = launchers.SlurmOptions.parse_extra(['account=abc,qos=high', '--constraint=a100'])
  assert extra == (('account', 'abc'), ('qos', 'high'), ('constraint', 'a100'))
  o = launchers.SlurmOptions(partition='gpu', nodes=2, gpus_per_node=8, time_min=90, extra=extra)
  p = o.executor_parameters()
  assert p['slurm_partition'] == 'gpu' and p['nodes'] == 2 and p['tasks_per_node'] == 1
  assert p['gpus_per_node'] == 8 and p['timeout_min'] == 90
  assert p['slurm_additional_parameters'] == {'account': 'abc', 'qos': 'high', 'constraint': 'a100'}
  with pytest.raises(launchers.LauncherError, match='KEY=VALUE'):
    launchers.SlurmOptions.parse_extra(['account'])
  with pytest.raises(launchers.LauncherError, match='--nodes'):
    launchers.SlurmOptions(nodes=0).validate()


def _fake_run_dir(run: sweeps.Run, *, results=None, checkpoint=None, log=None):
  os.makedirs(run.workdir, exist_ok=True)
  if results is not None:
    with open(os.path.join(run.workdir, 'results.json'), 'w') as f:
      json.dump(results, f)
  if checkpoint is not None:
    os.makedirs(os.path.join(run.workdir, 'checkpoints', str(checkpoint)))
  if log is not None:
    with open(os.path.join(run.workdir, launchers.TRAIN_LOG), 'w') as f:
      f.write(log)


class _FakeJob:
  def __init__(self, job_id):
    self.job_id = job_id


class _FakeExecutor:
  """Records what submit_slurm asks of submitit."""

  def __init__(self, folder):
    self.folder, self.params, self.calls = folder, {}, []

  def update_parameters(self, **kw):
    self.params.update(kw)

  def submit(self, fn):
    self.calls.append(fn)
    return _FakeJob(str(100 + len(self.calls)))


def test_status_and_resubmission_follow_run_dirs_and_queue(tmp_path):
  sweep = _sweep(kinds=('softmax', 'linear-elu', 'relu'), seeds=(0, 1))
  d = str(tmp_path)
  runs = {r.name: r for r in sweeps.plan(sweep, d)}
  names = sorted(runs)
  # finished / running / stopped (checkpoint, job gone) / failed (job gone, nothing saved) / queued /
  # never submitted.
  _fake_run_dir(runs[names[0]], results={'test_accuracy': 0.25})
  _fake_run_dir(runs[names[2]], checkpoint=8)
  _fake_run_dir(runs[names[3]], log='boom\nValueError: bad thing\n')
  launchers._write_jobs(d, {names[0]: {'job_id': '1'}, names[1]: {'job_id': '2'},  # pylint: disable=protected-access
                            names[2]: {'job_id': '3'}, names[3]: {'job_id': '4'},
                            names[4]: {'job_id': '5'}})
  states = {'2': 'running', '5': 'queued'}
  got = {s.run.name: s for s in launchers.slurm_status(list(runs.values()), d, states=states)}
  assert [got[n].state for n in names] == ['finished', 'running', 'stopped', 'failed', 'queued',
                                           'not submitted']
  assert got[names[0]].detail == 'test accuracy 0.2500'
  assert 'step 8' in got[names[2]].detail and 'ValueError: bad thing' in got[names[3]].detail
  table = '\n'.join(launchers.format_status(list(got.values())))
  assert '6 points: 1 failed, 1 finished, 1 not submitted, 1 queued, 1 running, 1 stopped' in table

  # Submission: only stopped, failed and never-submitted points; the queue is asked (monkeypatched).
  orig_states, orig_avail = launchers.queue_states, launchers.slurm_available
  launchers.queue_states = lambda ids: states
  launchers.slurm_available = lambda: None
  try:
    made = []
    counts = launchers.submit_slurm(sweep, d, launchers.SlurmOptions(gpus_per_node=1), log=lambda s: None,
                                    executor_factory=lambda folder: made.append(_FakeExecutor(folder))
                                    or made[-1])
  finally:
    launchers.queue_states, launchers.slurm_available = orig_states, orig_avail
  ex = made[0]
  assert counts['submitted'] == 3 and counts['finished'] == 1 and counts['active'] == 2
  assert sorted(c.workdir for c in ex.calls) == sorted(runs[n].workdir for n in names[2:4] + [names[5]])
  assert ex.params['gpus_per_node'] == 1 and ex.folder.endswith(os.path.join('.slurm', '%j'))
  assert any('PYTHONPATH' in line for line in ex.params['slurm_setup'])
  jobs = launchers.read_jobs(d)
  assert sorted(jobs[n]['job_id'] for n in names[2:4] + [names[5]]) == ['101', '102', '103']
  assert [jobs[n]['job_id'] for n in (names[0], names[1], names[4])] == ['1', '2', '5']
  # Every submitted call is the point's own train command, resumable in its workdir.
  call = ex.calls[0]
  assert call.command[1:4] == ['-m', 'kernelformer', 'train'] and call.workdir in call.command


def test_dry_run_lists_jobs_without_a_scheduler(tmp_path):
  r = _cli('--config', TINY, '--grid', 'model.attention.kind=softmax,linear-elu', '--sweep_dir',
           str(tmp_path / 's'), '--launcher', 'slurm', '--dry_run', '--gpus_per_node', '2',
           '--slurm_args', 'account=abc')
  assert r.returncode == 0, r.stderr
  assert 'would submit' in r.stdout and r.stdout.count('would submit') == 2
  assert 'gpus_per_node=2' in r.stdout and "'account': 'abc'" in r.stdout
  assert not os.path.exists(tmp_path / 's' / '.slurm')


def test_tpu_pod_commands_equal_the_documented_ones(tmp_path):
  """docs/reproduce.md's TPU-pod block is exactly what the generator prints for its sweep."""
  with open(os.path.join(ROOT, 'docs', 'reproduce.md'), encoding='utf-8') as f:
    doc = f.read()
  block = re.search(r'<!-- tpu-pod-example -->\s*```bash\n(.*?)```\s*\n```text\n(.*?)```', doc, re.S)
  assert block, 'docs/reproduce.md lost its tpu-pod example'
  command, expected = block.group(1), block.group(2)
  args = [a for a in re.sub(r'\\\n\s*', ' ', command).split() if a]
  assert args[:2] == ['kernelformer', 'sweep']
  r = _cli(*args[2:], timeout=120)
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == expected.strip()
  # --submit runs them in order, stopping at the first failure, with one line.
  fake = tmp_path / 'bin'
  fake.mkdir()
  (fake / 'gcloud').write_text('#!/bin/sh\necho "$@" >> "$GCLOUD_LOG"\n'
                               'case "$*" in *linear-elu*) exit 7;; esac\n')
  (fake / 'gcloud').chmod(0o755)
  log = tmp_path / 'gcloud.log'
  r = _cli(*args[2:], '--submit', timeout=120,
           env={'PATH': f'{fake}{os.pathsep}{os.environ["PATH"]}', 'GCLOUD_LOG': str(log)})
  calls = log.read_text().splitlines()
  assert r.returncode == 7 and 'exited with code 7' in r.stdout
  assert len(calls) == 3 and 'pip install' in calls[0] and 'kind=softmax' in calls[1]
  r = _cli('--config', TINY, '--sweep_dir', str(tmp_path / 'x'), '--launcher', 'tpu-pod', timeout=120)
  assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith('error: --launcher tpu-pod needs')


# ----------------------------------------------------------------------------------------------------
# A real scheduler.


def _require_slurm():
  why = launchers.slurm_available()
  if why:
    if os.environ.get('KERNELFORMER_REQUIRE_SLURM') == '1':
      pytest.fail(f'KERNELFORMER_REQUIRE_SLURM=1 but no SLURM cluster answers: {why}')
    pytest.skip(f'no SLURM cluster ({why}); .ci/slurm-up starts one')


def _wait(predicate, timeout, what):
  t0 = time.time()
  while time.time() - t0 < timeout:
    if predicate():
      return
    time.sleep(0.5)
  raise AssertionError(f'timed out after {timeout:.0f}s waiting for {what}')


def _results(sweep_dir, name):
  with open(os.path.join(sweep_dir, name, 'results.json')) as f:
    r = json.load(f)
  return {k: r[k] for k in ('test_accuracy', 'test_loss', 'best_step', 'best_val_accuracy', 'final_step')}


@pytest.mark.slow
def test_slurm_sweep_cancel_preempt_resubmit_equals_local(tmp_path):
  _require_slurm()
  data = str(tmp_path / 'data')
  subprocess.run([sys.executable, '-m', 'kernelformer', 'prepare-data', '--config', TINY, '--data_dir',
                  data], cwd=ROOT, check=True, capture_output=True, env={**os.environ, 'PYTHONPATH': ROOT})
  args = ['--config', TINY, '--grid', 'model.attention.kind=softmax,linear-elu', '--grid', 'seed=0,1',
          '--set', f'data.data_dir={data}', '--set', 'checkpoint_every=4']
  slurm_dir = str(tmp_path / 'slurm')
  # Each save sleeps 3 s, so a point is still running after its first checkpoint (step 4).
  env = {'KERNELFORMER_TEST_SLOW_SAVE_S': '3'}
  r = _cli(*args, '--sweep_dir', slurm_dir, '--launcher', 'slurm', env=env)
  assert r.returncode == 0, r.stdout + r.stderr
  assert '4 submitted' in r.stdout
  jobs = launchers.read_jobs(slurm_dir)
  names = sorted(jobs)
  # The node has 2 CPUs and each job takes one: the first two submitted run first.
  cancelled, preempted = sorted(names, key=lambda n: int(jobs[n]['job_id']))[:2]

  def has_ckpt(n):
    ckpt = os.path.join(slurm_dir, n, 'checkpoints')
    assert not os.path.exists(os.path.join(slurm_dir, n, 'results.json')), f'{n} finished too early'
    return os.path.isdir(ckpt) and any(s.isdigit() for s in os.listdir(ckpt))
  # scancel one job mid-run (after its first checkpoint), and preempt another (SIGUSR2, as SLURM sends
  # before a time limit or a preemption): submitit calls TrainPoint.checkpoint and requeues it.
  _wait(lambda: has_ckpt(cancelled), 240, f'{cancelled}\'s first checkpoint')
  subprocess.run(['scancel', jobs[cancelled]['job_id']], check=True)
  _wait(lambda: has_ckpt(preempted), 240, f'{preempted}\'s first checkpoint')
  subprocess.run(['scancel', '--signal=USR2', jobs[preempted]['job_id']], check=True)

  def requeued():
    out = subprocess.run(['squeue', '-h', '-o', '%i %t %r', '-j', jobs[preempted]['job_id']],
                         capture_output=True, text=True).stdout
    return ' PD ' in out
  _wait(requeued, 120, 'the preempted job to be requeued')
  # A requeued job starts again after SLURM's job-credential lifetime (AuthInfo=cred_expire: 30 s in
  # .ci/slurm-up, 120 s by default; forcing an earlier start makes slurmctld kill it, "credential revoked").
  ids = [j['job_id'] for j in jobs.values()]
  _wait(lambda: not launchers.queue_states(ids), 420, 'the jobs to leave the queue')

  r = _cli(*args, '--sweep_dir', slurm_dir, '--launcher', 'slurm', '--status')
  assert r.returncode == 0, r.stderr
  state = {line.split()[0]: line.split()[1] for line in r.stdout.splitlines()[1:-1]}
  assert state[cancelled] == 'stopped', r.stdout
  with open(os.path.join(slurm_dir, cancelled, 'train.log')) as f:
    assert 'SIGTERM' in f.read()   # scancel's SIGTERM reached the trainer (it saved and stopped)
  assert all(state[n] == 'finished' for n in names if n != cancelled), r.stdout
  # The preempted point resumed inside its requeued job.
  with open(os.path.join(slurm_dir, preempted, 'train.log')) as f:
    log = f.read()
  assert re.search(r'resumed from .* at step \d+', log), log[-2000:]
  # ... from the checkpoint its trainer saved on the SIGTERM that TrainPoint.checkpoint sent: the line
  # the trainer prints when it stops after saving (exit 143), and the requeued job resumed at that
  # step. A child killed instead (SIGKILL) prints no such line and resumes from an older periodic
  # checkpoint, whose results are the same (resuming is exact), so only this tells the two apart.
  saved = re.findall(r'SIGTERM: checkpoint saved at step (\d+)', log)
  assert len(saved) == 1, log[-2000:]
  assert re.findall(r'resumed from .* at step (\d+)', log)[0] == saved[0], log[-2000:]

  # Re-running the command submits only the cancelled point, which resumes from its checkpoint.
  r = _cli(*args, '--sweep_dir', slurm_dir, '--launcher', 'slurm')
  assert r.returncode == 0 and '1 submitted' in r.stdout, r.stdout + r.stderr
  new_id = launchers.read_jobs(slurm_dir)[cancelled]['job_id']
  assert new_id != jobs[cancelled]['job_id']
  _wait(lambda: not launchers.queue_states([new_id]), 300, 'the resubmitted job')
  with open(os.path.join(slurm_dir, cancelled, 'train.log')) as f:
    assert re.search(r'resumed from .* at step \d+', f.read())

  # The same sweep run locally gives the same results and the same report.
  local_dir = str(tmp_path / 'local')
  r = _cli(*args, '--sweep_dir', local_dir)
  assert r.returncode == 0, r.stdout + r.stderr
  for n in names:
    assert _results(slurm_dir, n) == _results(local_dir, n), n
  a, b = report.build(slurm_dir), report.build(local_dir)
  assert a.labels == b.labels and a.tasks == b.tasks
  assert {k: c.text() for k, c in a.cells.items()} == {k: c.text() for k, c in b.cells.items()}
