"""``kernelformer sweep --pack``: points that differ only in population fields train as populations.

A packed sweep must leave every point's work directory as its unpacked sweep does (the population
contract: each member's workdir is its single run's), so ``report`` reads the same numbers. Tolerance
(tests/training/test_population.py): a member's parameters equal its single run's within 2e-5 absolute,
its loss within rtol 1e-5; the test accuracy and the selected step are compared exactly (a 2e-5 change of
the parameters flips no prediction of these tiny runs).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from kernelformer.reproduce import launchers, report, sweeps
from kernelformer.training import population
from tests import procs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = 'configs/listops.py:tiny'
LOSS_RTOL = 1e-5     # test_population.py's loss tolerance


def _sweep(grids, sets=(), configs=(TINY,)) -> sweeps.Sweep:
  return sweeps.expand(sweeps.sweep_from_flags(list(configs), list(grids), list(sets), name='p'))


def _cli(*args, cwd=ROOT, timeout=600):
  return subprocess.run([sys.executable, '-m', 'kernelformer', 'sweep', *args], capture_output=True,
                        text=True, cwd=cwd, timeout=timeout, env=procs.env(1, PYTHONPATH=ROOT))


def _finish(run: sweeps.Run):
  os.makedirs(run.workdir, exist_ok=True)
  with open(os.path.join(run.workdir, 'results.json'), 'w') as f:
    json.dump({'test_accuracy': 0.5}, f)


def test_only_population_fields_differ_within_a_pack(tmp_path):
  sweep = _sweep(['model.attention.kind=softmax,linear-elu', 'seed=0,1,2',
                  'optim.learning_rate=0.001,0.002', 'model.attention.num_features=8,16'],
                 configs=(TINY, 'configs/mqar.py:tiny'))
  runs = sweeps.plan(sweep, str(tmp_path))
  finished = next(r for r in runs if r.name == 'listops-tiny/kind=softmax__num_features=8__'
                                                'learning_rate=0.001__seed=1')
  _finish(finished)
  packs = sweeps.packed(runs, 4, sweep, str(tmp_path))
  # Every point exactly once; the finished one alone, as it was (not repacked).
  assert sorted(m.name for p in packs for m in p.members) == sorted(r.name for r in runs)
  assert finished in packs
  for p in packs:
    assert len(p.members) <= 4
    if len(p.members) == 1:
      continue
    assert isinstance(p, sweeps.Pack) and all(m.status() != 'done' for m in p.members)
    shared = {(m.point.config, m.point.preset,
               tuple(kv for kv in m.point.overrides if kv[0] not in population.FIELDS)) for m in p.members}
    assert len(shared) == 1, p.name   # config file, preset, kind and num_features: one of each
    # Each member of the population config is exactly its point's config (less ``population``).
    members = population.members(p.config())
    for m, c in zip(p.members, members):
      want = sweeps.point_config(m.point, m.common).to_dict()
      assert c.to_dict() == {k: v for k, v in want.items() if k != 'population'}, m.name
  # 2 configs x 2 kinds x 2 feature counts = 8 groups of 6 points (3 seeds x 2 learning rates), one of
  # them with a finished point: 4 + 2 members each, 4 + 1 for that one.
  sizes = sorted(len(p.members) for p in packs)
  assert sizes == sorted([1, 4, 1] + [4, 2] * 7), sizes
  # --pack N caps at N.
  assert max(len(p.members) for p in sweeps.packed(runs, 2, sweep, str(tmp_path))) == 2


def test_pack_alone_takes_the_most_members_that_fit(tmp_path, monkeypatch):
  sweep = _sweep(['seed=0,1,2,3,4'])
  runs = sweeps.plan(sweep, str(tmp_path))
  (whole,) = sweeps.packed(runs, 5, sweep, str(tmp_path))
  need = {}
  for n in range(2, 6):
    config = whole.config()
    with config.unlocked():
      config.population = config.population[:n]
    need[n] = sweeps.step_bytes(config)
  # On this process's 8 CPU devices, 4 members train one per device pair: less per device than 3.
  assert need[2] < need[3] and need[4] < need[3], need
  for budget, sizes in [(need[3], [4, 1]), (need[4] - 1, [2, 2, 1]), (need[2] - 1, [1] * 5),
                        (need[5], [5])]:
    monkeypatch.setattr(sweeps, 'device_memory', lambda b=budget: b / 0.9)
    assert [len(p.members) for p in sweeps.packed(runs, -1, sweep, str(tmp_path))] == sizes, (budget, need)


def test_cli_shows_one_job_per_population(tmp_path):
  sweep_dir = str(tmp_path / 'sw')
  args = ['--config', TINY, '--grid', 'model.attention.kind=softmax,linear-elu', '--grid', 'seed=0,1,2',
          '--sweep_dir', sweep_dir]
  # A point finished by a single run is dropped from its group.
  _finish(next(r for r in sweeps.plan(_sweep(args[3:6:2]), sweep_dir) if r.name.endswith('softmax__seed=0')))
  r = _cli(*args, '--pack', '--dry_run', '--emit', str(tmp_path / 'jobs.txt'))
  assert r.returncode == 0, r.stderr
  lines = r.stdout.splitlines()
  assert 'done   listops-tiny/kind=softmax__seed=0' in lines
  assert 'new    listops-tiny/kind=softmax__seed=1 + listops-tiny/kind=softmax__seed=2' in lines
  assert ('new    listops-tiny/kind=linear-elu__seed=0 + listops-tiny/kind=linear-elu__seed=1 + '
          'listops-tiny/kind=linear-elu__seed=2') in lines
  jobs = [l for l in (tmp_path / 'jobs.txt').read_text().splitlines() if not l.startswith('#')]
  assert len(jobs) == 2 and all(j.startswith('python scripts/sweep.py --config configs/listops.py:tiny '
                                             '--grid ') for j in jobs)
  assert jobs[0].endswith('--pack 2 --points listops-tiny/kind=softmax__seed=1,listops-tiny/kind=softmax__seed=2')
  r = _cli(*args, '--pack', '2', '--launcher', 'slurm', '--dry_run')
  assert r.returncode == 0, r.stderr
  submits = [l for l in r.stdout.splitlines() if l.startswith('would submit')]
  assert len(submits) == 3 and sum('kernelformer sweep' in s for s in submits) == 2, submits
  # The cap's remainder: a single run.
  assert 'kernelformer train' in submits[2] and 'kind=linear-elu__seed=2' in submits[2], submits
  r = _cli(*args, '--pack', '3', '--launcher', 'tpu-pod', '--tpu_name', 'pod', '--zone', 'z')
  assert r.returncode == 0, r.stderr
  cmds = [l for l in r.stdout.splitlines() if l.startswith('gcloud') and 'pip install' not in l]
  assert len(cmds) == 2 and all('kernelformer sweep' in c and '--distributed' in c for c in cmds), cmds
  for bad, why in [(['--pack', '-2'], '--pack -2: give a population size'),
                   (['--pack', '--launcher', 'slurm'], "this machine's device: --launcher local only"),
                   (['--points', 'listops-tiny/kind=nope'], "has no point listops-tiny/kind=nope")]:
    r = _cli(*args, *bad, '--dry_run')
    assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith('error: ') and why in r.stderr, r.stderr


def _results(sweep_dir):
  out = {}
  for run in report.collect(sweep_dir)[1]:
    out[run.workdir] = run.results
  return out


@pytest.mark.slow
def test_packed_sweep_reports_the_unpacked_numbers(tmp_path):
  """The same sweep unpacked (in this process) and packed (--parallel: each population a `kernelformer
  sweep --points` job, as --emit and the launchers write it): the same results and report."""
  data = str(tmp_path / 'data')
  args = ['--config', TINY, '--grid', 'model.attention.kind=softmax,linear-elu', '--grid', 'seed=0,1,2',
          '--set', f'data.data_dir={data}', '--set', 'num_train_steps=6', '--set', 'eval_every=3',
          '--set', 'checkpoint_every=3', '--set', 'progress=False']
  single, packed = str(tmp_path / 'single'), str(tmp_path / 'packed')
  counts = sweeps.run_sweep(_sweep([args[3], args[5]], sets=args[7::2]), single,
                            log=lambda s: None)
  assert counts == {'done': 0, 'ran': 6, 'failed': 0}
  # One point of the packed sweep finished by a single run beforehand: dropped from its population.
  shutil.copytree(os.path.join(single, 'listops-tiny', 'kind=softmax__seed=0'),
                  os.path.join(packed, 'listops-tiny', 'kind=softmax__seed=0'))
  r = _cli(*args, '--sweep_dir', packed, '--pack', '--parallel', '2')
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  assert '5 trained, 1 already finished, 0 failed' in r.stdout, r.stdout
  assert r.stdout.count('start listops-tiny/') == 2, r.stdout       # two populations, one job each
  with open(os.path.join(packed, 'listops-tiny', 'kind=linear-elu__seed=0', 'train.log')) as f:
    log = f.read()   # the population's job: a sweep of its three points
  assert '3 trained, 0 already finished, 0 failed' in log, log[-2000:]
  _same_results(single, packed, 6)
  ra, rb = report.build(single), report.build(packed)
  assert {k: c.text() for k, c in ra.cells.items()} == {k: c.text() for k, c in rb.cells.items()}
  # Re-running the packed command trains nothing.
  r = _cli(*args, '--sweep_dir', packed, '--pack', '2')
  assert r.returncode == 0 and '0 trained, 6 already finished' in r.stdout, r.stdout + r.stderr


def _same_results(a_dir, b_dir, n):
  a, b = _results(a_dir), _results(b_dir)
  assert sorted(a) == sorted(b) and len(a) == n and all(r is not None for r in b.values()), b
  for name in a:
    for key in ('test_accuracy', 'best_step', 'best_val_accuracy', 'final_step'):
      assert a[name][key] == b[name][key], (name, key)
    np.testing.assert_allclose(b[name]['test_loss'], a[name]['test_loss'], rtol=LOSS_RTOL, err_msg=name)


@pytest.mark.slow
def test_slurm_packed_sweep_is_one_job_with_the_local_results(tmp_path):
  from tests.scripts.test_launchers import _require_slurm, _wait  # pylint: disable=g-import-not-at-top
  _require_slurm()
  args = ['--config', TINY, '--grid', 'seed=0,1', '--set', f'data.data_dir={tmp_path / "data"}',
          '--set', 'num_train_steps=4', '--set', 'eval_every=2', '--set', 'progress=False']
  slurm_dir, local_dir = str(tmp_path / 'slurm'), str(tmp_path / 'local')
  r = _cli(*args, '--sweep_dir', slurm_dir, '--launcher', 'slurm', '--pack', '2')
  assert r.returncode == 0 and '1 submitted' in r.stdout, r.stdout + r.stderr
  jobs = launchers.read_jobs(slurm_dir)
  assert sorted(jobs) == ['listops-tiny/seed=0', 'listops-tiny/seed=1']
  assert len({j['job_id'] for j in jobs.values()}) == 1 and '--points' in jobs['listops-tiny/seed=0']['command']
  _wait(lambda: not launchers.queue_states([j['job_id'] for j in jobs.values()]), 300, 'the packed job')
  r = _cli(*args, '--sweep_dir', slurm_dir, '--launcher', 'slurm', '--status')
  assert r.returncode == 0 and '2 points: 2 finished' in r.stdout, r.stdout + r.stderr
  r = _cli(*args, '--sweep_dir', slurm_dir, '--launcher', 'slurm', '--pack', '2')
  assert r.returncode == 0 and '0 submitted' in r.stdout, r.stdout + r.stderr
  assert sweeps.run_sweep(_sweep([args[3]], sets=args[5::2]), local_dir, log=lambda s: None)['ran'] == 2
  _same_results(local_dir, slurm_dir, 2)
