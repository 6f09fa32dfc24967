"""``scripts/gpu_day.sh reproduce`` dry-run on the CPU at tiny sizes, its plan and its table builder.

The dry run (``KF_REPRODUCE_DRY=1``) runs the script's real commands -- data preparation, the
measurement and plan (kernelformer/reproduce/gpu_plan.py), the ListOps and Zoology populations one
after another, the instability seeds, the table -- with a handful of steps, and must leave
results.json and results.md in OUT with every member's row, the device, the versions and the
commands; a kind the registry lacks is skipped with one line and named in the table.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from kernelformer import registry
from kernelformer.reproduce import gpu_plan, gpu_table
from tests import procs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _registered(kind):
  try:
    registry.get(kind)
  except registry.UnknownKernelError:
    return False
  return True


@pytest.mark.slow
def test_reproduce_dry_run_writes_results_and_table(tmp_path):
  out, runs = tmp_path / 'out', tmp_path / 'runs'
  env = {**os.environ, 'KF_REPRODUCE_DRY': '1', 'KF_NO_WHL': '1', 'KF_PYTHON': sys.executable,
         'KF_GPU_DATA': str(tmp_path / 'data'), 'KF_REPRODUCE_RUNS': str(runs),
         'KF_REPRODUCE_KINDS': 'performer-skyformer skyformer', 'KF_REPRODUCE_SEEDS': '2',
         'KF_REPRODUCE_ZOOLOGY': 'softmax:64', 'KF_REPRODUCE_ZOOLOGY_LRS': '0.01 0.001',
         'KF_REPRODUCE_INSTABILITY_SEEDS': '1', 'XLA_FLAGS': procs.xla_flags(1),
         'JAX_PLATFORMS': 'cpu'}   # one CPU device per process, as on the GPU machine
  proc = subprocess.run(['bash', 'scripts/gpu_day.sh', 'reproduce', str(out)], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=1800)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  perf_ok = _registered('performer-skyformer')
  planned = (['listops-performer-skyformer'] if perf_ok else []) + ['listops-skyformer',
                                                                    'zoology-softmax-d64']
  # The plan: each job measured, then listed in order with its estimate, every one complete.
  rates = json.loads((runs / 'rates.json').read_text())
  assert list(rates) == planned and all(r['member_steps_per_s'] > 0 and r['size'] == 2
                                        for r in rates.values()), rates
  plan = re.search(r'plan: (\d) of (\d) populations, estimated (\d+) s:\n((?:  .*\n)+)', proc.stdout)
  assert plan and plan.group(1) == plan.group(2) == str(len(planned)), proc.stdout
  lines = plan.group(4).splitlines()
  assert [l.split(':')[0].strip() for l in lines] == planned + ['instability-listops'], lines
  estimates = [int(re.fullmatch(r'  \S+: 2 members x 4 steps, (\d+) s', l).group(1)) for l in lines[:-1]]
  assert sum(estimates) == pytest.approx(int(plan.group(3)), abs=len(estimates))
  assert 'up to 1 seeds' in lines[-1]
  res = json.loads((out / 'results.json').read_text())
  rows = {(r['group'], r['label']): r for r in res['runs']}
  # Every population member is a row of the table, from its own single-run workdir.
  for seed in (0, 1):
    sky = rows[('skyformer-table1-listops', f'skyformer seed {seed}')]
    assert sky['workdir'] == str(runs / 'listops-skyformer' / f'seed={seed}')
    assert sky['status'] == 'finished' and sky['final_step'] == sky['planned_steps'] == 4
    assert sky['published'] == pytest.approx(0.3869)     # Skyformer table 1, ListOps, Skyformer
    assert sky['precision'] == 'float32' and sky['results']['config']['seed'] == seed
  for lr in (0.01, 0.001):
    zoo = rows[('zoology-fig2-L64-d64', f'softmax lr {lr}')]
    assert zoo['status'] == 'finished' and zoo['kind'] == 'softmax' and zoo['learning_rate'] == lr
    assert zoo['published'] == gpu_table.ZOOLOGY_FIG2_ATTENTION[64]
    assert 0.0 <= zoo['test_accuracy'] <= 1.0
  environment = res['environment']
  assert environment['device'] and 'jax ' in environment['versions']
  assert any('--config.model.attention.kind=skyformer' in c and '--config.population=' in c
             for c in environment['commands'])
  md = (out / 'results.md').read_text()
  assert '| skyformer-table1-listops | skyformer seed 1 | skyformer | 0.002 | float32 |' in md
  assert 'Commands:' in md
  inst = json.loads((out / 'instability-listops.json').read_text())
  assert inst['seeds'] == [0] and inst['steps'] == 3 and inst['precision'] == 'skyformer-amp'
  assert set(inst['summary']) == {'nystromformer', 'gaussian', 'skyformer'}
  assert '| Skyformer | `skyformer` | 0.79 |' in md
  assert not [n for n in os.listdir(out) if n.startswith('continue-')]   # everything finished
  perf = ('skyformer-table1-listops', 'performer-skyformer seed 0')
  if perf_ok:
    assert rows[perf]['status'] == 'finished' and rows[perf]['published'] == pytest.approx(0.3802)
  else:
    assert perf not in rows
    assert 'performer-skyformer is not registered' in proc.stdout
    assert 'Not run: performer-skyformer: not registered' in md


def _job(name, members=2, steps=1000, eval_batches=300):
  return gpu_plan.Job(name, 'g', 'listops:tiny', (('model.attention.kind', 'softmax'),),
                      tuple({'seed': s} for s in range(members)), steps, eval_batches)


def test_the_plan_is_the_longest_prefix_that_fits_then_the_time_left():
  rate = {'member_steps_per_s': 100.0, 'compile_s': 5.0}
  # 2 members at 100 member-steps/s: 0.02 s a step; 1000 steps and 300 evaluation batches (a forward
  # pass: a third of a step) 22 s, the compilation 5 s, the process start 15 s.
  assert gpu_plan.estimate(_job('a'), rate) == pytest.approx(
      gpu_plan.STARTUP_S + 5.0 + 0.02 * (1000 + 300 / 3))
  jobs = [_job('a'), _job('b', members=4), _job('c', steps=5000), _job('d')]
  rates = {j: rate for j in 'abcd'}
  ea, eb = (gpu_plan.estimate(j, rate) for j in jobs[:2])
  p = gpu_plan.plan(rates, ea + eb + 70, jobs)
  assert [(j.name, round(s, 6), full) for j, s, full in p['jobs']] == [
      ('a', round(ea, 6), True), ('b', round(eb, 6), True), ('c', 70.0, False)]
  assert p['seconds'] == pytest.approx(ea + eb + 70) and p['left'] == 0
  # Less than min_partial_s left: the next job is not started, the rest goes to (c), the instability
  # seeds; a later job that would fit is not taken out of order.
  p = gpu_plan.plan({**rates, 'big': rate, 'small': rate}, ea + eb + 30,
                    [*jobs[:2], _job('big', steps=10**6), _job('small', steps=1)])
  assert [j.name for j, _, _ in p['jobs']] == ['a', 'b'] and p['left'] == pytest.approx(30)
  # A job not measured (measuring stopped once the jobs before it filled the time) ends the plan.
  p = gpu_plan.plan({'a': rate}, 10**6, jobs)
  assert [j.name for j, _, _ in p['jobs']] == ['a'] and p['left'] == pytest.approx(10**6 - ea)


@pytest.mark.parametrize('name, value, message', [
    ('KF_REPRODUCE_ZOOLOGY', 'softmax', "'softmax' is not KIND:D_MODEL"),
    ('KF_REPRODUCE_SEEDS', 'three', "KF_REPRODUCE_SEEDS='three': a count >= 1"),
    ('KF_REPRODUCE_INSTABILITY_SEEDS', '0', 'a count >= 1')])
def test_a_bad_selection_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, name, value, message):
  monkeypatch.setenv(name, value)
  assert gpu_plan.main(['--runs', str(tmp_path), '--data', str(tmp_path), '--out', str(tmp_path),
                        'plan', '--seconds', '100']) == 2
  printed = capsys.readouterr().out.strip()
  assert message in printed and '\n' not in printed, printed
  assert not os.listdir(tmp_path)


def test_a_run_stopped_by_its_limit_is_truncated_not_finished(tmp_path):
  wd = tmp_path / 'run'
  wd.mkdir()
  (wd / 'results.json').write_text(json.dumps({
      'attention': 'skyformer', 'test_accuracy': 0.3, 'final_step': 1200,
      'config': {'num_train_steps': 1200, 'optim': {'learning_rate': 1e-4}},
      'config_changes': [{'at_step': 1200, 'fields': ['num_train_steps: 50000 -> 1200']}]}))
  row = gpu_table.row('skyformer-table1-listops', 'skyformer', str(wd))
  assert row['status'] == 'truncated' and row['planned_steps'] == 50000
  assert '1,200 of 50,000' in gpu_table.markdown([row], {})
  assert gpu_table.published('zoology-fig2-L64-d128', 'softmax')[0] == 1.0        # figure 2, d_model 128
  assert gpu_table.published('zoology-fig2-L64-d64', 'softmax')[0] == 1.0
  assert gpu_table.published('zoology-fig2-L64-d256', 'softmax')[0] is None       # not read off the plot
  missing = gpu_table.row('zoology-fig2-L64-d64', 'x', str(tmp_path / 'absent'))
  assert missing['status'].startswith('no results.json')
  assert gpu_table.main(['--out', str(tmp_path / 'o'), '--run', 'no-separator']) == 2


def _numbered(directory):
  return sorted(int(n) for n in os.listdir(directory) if n.isdigit()) if os.path.isdir(directory) else []


@pytest.mark.slow
def test_continue_takes_stopped_population_members_to_their_schedule(tmp_path):
  """``reproduce-continue`` (the next call on the warm machine): the members of a population the first
  call's time limit stopped go on alone (a member's workdir is its single run's) to their planned
  steps, a member that had not started starts, and every row becomes "finished". The first call's
  state is made here as that call makes it: SIGINT once a member has a checkpoint, then the test
  re-run of each stopped member at the step it reached."""
  runs, out, data = tmp_path / 'runs', tmp_path / 'out', tmp_path / 'data'
  job = runs / 'listops-skyformer'
  job.mkdir(parents=True)
  common = ['-m', 'kernelformer', 'train', '--config', 'configs/listops.py:tiny',
            f'--config.data.data_dir={data}', '--config.num_train_steps=200', '--config.checkpoint_every=2',
            '--config.eval_every=50', '--config.progress=False']
  members = {s: job / f'seed={s}' for s in (0, 1)}
  cmds = {s: [*common, f'--workdir={wd}', f'--config.seed={s}'] for s, wd in members.items()}
  for s, wd in members.items():
    (job / f'seed={s}.cmd').write_text('\n'.join(cmds[s]) + '\n')
  env = procs.env(1)
  first = subprocess.Popen([sys.executable, *common, f'--workdir={job}',
                            '--config.population=[{"seed": 0}, {"seed": 1}]'], cwd=REPO, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 300
  while not _numbered(members[0] / 'checkpoints') and first.poll() is None and time.monotonic() < deadline:
    time.sleep(0.01)
  first.send_signal(signal.SIGINT)
  _, err = first.communicate(timeout=120)
  assert first.returncode == 130, err[-2000:]
  steps = {s: _numbered(wd / 'checkpoints')[-1] for s, wd in members.items() if _numbered(wd / 'checkpoints')}
  assert 0 in steps and all(step < 200 for step in steps.values())
  for s, step in steps.items():
    subprocess.run([sys.executable, *cmds[s], f'--config.num_train_steps={step}',
                    '--config.allow_config_change=True'], cwd=REPO, env=env, check=True,
                   capture_output=True, timeout=300)
  assert gpu_table.row('g', 'skyformer', str(members[0]))['status'] == 'truncated'
  (runs / 'table.args').write_text(''.join(f'--run\nskyformer-table1-listops:skyformer seed {s}={wd}\n'
                                           for s, wd in members.items()))
  (runs / 'commands.txt').write_text('the first call\n')

  script_env = {**env, 'KF_NO_WHL': '1', 'KF_PYTHON': sys.executable, 'KF_REPRODUCE_RUNS': str(runs)}
  # The first call's record, as its write_record leaves it: the table and each unfinished member
  # packed for another machine.
  first_out = tmp_path / 'first_out'
  proc = subprocess.run(['bash', 'scripts/gpu_day.sh', 'record', str(first_out)], cwd=REPO,
                        env=script_env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  first_rows = json.loads((first_out / 'results.json').read_text())['runs']
  assert first_rows[0]['status'] == 'truncated' and first_rows[0]['final_step'] == steps[0]
  assert 'KF_REPRODUCE_FROM' in proc.stdout
  archives = sorted(first_out.glob('continue-*.tar.gz'))     # one file a member
  assert [a.name for a in archives] == [f'continue-listops-skyformer_seed_{s}.tar.gz' for s in (0, 1)]
  carried = tmp_path / 'carried'                # what a next session carries to the fresh machine
  carried.mkdir()
  for a in archives:
    shutil.copy(a, carried)
  proc = subprocess.run(['bash', 'scripts/gpu_day.sh', 'reproduce-continue', str(out)], cwd=REPO,
                        env=script_env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  res = json.loads((out / 'results.json').read_text())
  rows = res['runs']
  for row in rows:
    assert row['status'] == 'finished' and row['final_step'] == row['planned_steps'] == 200, row
  commands = res['environment']['commands']
  assert commands[0] == 'the first call'
  # Each member's own command (its schedule: num_train_steps=200), continued: no test re-run was needed.
  assert len(commands) == 3, commands
  for s, more in zip((0, 1), commands[1:]):
    assert re.fullmatch(r'timeout -k 60 -s INT \d+ python3 ' + re.escape(' '.join(cmds[s]))
                        + ' --config.allow_config_change=True', more), commands
  md = (out / 'results.md').read_text()
  assert '| skyformer-table1-listops | skyformer seed 1 |' in md and '| 200 of 200 |' in md, md
  assert not [n for n in os.listdir(out) if n.startswith('continue-')]   # nothing is left unfinished

  # A fresh machine (the warm one given back): no runs, no data, another runs directory. From the first
  # call's archives the members continue to the same end as on the warm machine, bit for bit.
  shutil.rmtree(data)
  runs2 = tmp_path / 'runs_fresh'
  fresh_out = tmp_path / 'fresh_out'
  proc = subprocess.run(['bash', 'scripts/gpu_day.sh', 'reproduce-continue', str(fresh_out)], cwd=REPO,
                        env={**script_env, 'KF_REPRODUCE_RUNS': str(runs2),
                             'KF_REPRODUCE_FROM': str(carried)},
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  fresh_rows = json.loads((fresh_out / 'results.json').read_text())['runs']
  for s, fresh, row in zip((0, 1), fresh_rows, rows):
    assert fresh['workdir'] == str(runs2 / 'listops-skyformer' / f'seed={s}')
    assert fresh['status'] == 'finished' and fresh['final_step'] == 200, fresh
    assert fresh['test_accuracy'] == row['test_accuracy']
    assert fresh['results']['test_loss'] == row['results']['test_loss']
  fresh_commands = json.loads((fresh_out / 'results.json').read_text())['environment']['commands']
  assert [c for c in fresh_commands if 'prepare-data' in c and str(data) in c], fresh_commands
  assert not (runs2 / 'listops-skyformer' / 'seed=0' / 'lock').exists()
  # It continued from the packed checkpoint, not from step 0 (which would end the same, deterministically).
  log = (runs2 / 'listops-skyformer' / 'seed=0.log').read_text()
  assert re.search(rf'resumed from {re.escape(str(runs2))}/listops-skyformer/seed=0/checkpoints at step '
                   rf'{steps[0]}\b', log), log[-3000:]

  # An archive that is not one: one line, exit 2.
  bad = tmp_path / 'bad.tar.gz'
  bad.write_bytes(b'not an archive')
  proc = subprocess.run(['bash', 'scripts/gpu_day.sh', 'reproduce-continue', str(out)], cwd=REPO,
                        env={**script_env, 'KF_REPRODUCE_RUNS': str(tmp_path / 'none2'),
                             'KF_REPRODUCE_FROM': str(bad)},
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2 and 'is not a continue-*.tar.gz' in proc.stdout, proc.stdout + proc.stderr

  # No earlier call on this machine: one line, exit 2.
  proc = subprocess.run(['bash', 'scripts/gpu_day.sh', 'reproduce-continue', str(out)], cwd=REPO,
                        env={**script_env, 'KF_REPRODUCE_RUNS': str(tmp_path / 'none')},
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2 and 'run reproduce first' in proc.stdout, proc.stdout + proc.stderr
