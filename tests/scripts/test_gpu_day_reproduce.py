"""``scripts/gpu_day.sh reproduce`` dry-run on the CPU at tiny sizes, and its table builder.

The dry run (``KF_REPRODUCE_DRY=1``) runs the script's real commands -- data preparation, the Zoology
runs side by side, the ListOps kinds side by side, the table -- with a handful of steps, and must
leave results.json and results.md in OUT with every run's row, the device, the versions and the
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
from kernelformer.reproduce import gpu_table
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
  out = tmp_path / 'out'
  env = {**os.environ, 'KF_REPRODUCE_DRY': '1', 'KF_NO_WHL': '1', 'KF_PYTHON': sys.executable,
         'KF_GPU_DATA': str(tmp_path / 'data'), 'KF_REPRODUCE_RUNS': str(tmp_path / 'runs'),
         'KF_REPRODUCE_ZOOLOGY_LRS': '0.01', 'KF_REPRODUCE_KINDS': 'performer-skyformer skyformer',
         'KF_REPRODUCE_INSTABILITY': '1', 'KF_REPRODUCE_INSTABILITY_SEEDS': '1',
         'KF_REPRODUCE_LISTOPS_SECONDS': '1200', 'XLA_FLAGS': procs.xla_flags(1),
         'JAX_PLATFORMS': 'cpu'}   # one CPU device per process, as on the GPU machine
  proc = subprocess.run(['bash', 'scripts/gpu_day.sh', 'reproduce', str(out)], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=1800)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  res = json.loads((out / 'results.json').read_text())
  rows = {(r['group'], r['label']): r for r in res['runs']}
  sky = rows[('skyformer-table1-listops', 'skyformer')]
  assert sky['status'] == 'finished' and sky['final_step'] == sky['planned_steps'] == 4
  assert sky['published'] == pytest.approx(0.3869)     # Skyformer table 1, ListOps, Skyformer
  zoo = rows[('zoology-fig2-L64-d64', 'softmax lr 0.01')]
  assert zoo['status'] == 'finished' and zoo['kind'] == 'softmax' and zoo['learning_rate'] == 0.01
  assert zoo['published'] == gpu_table.ZOOLOGY_FIG2_ATTENTION[64]
  assert 0.0 <= zoo['test_accuracy'] <= 1.0
  environment = res['environment']
  assert environment['device'] and 'jax ' in environment['versions']
  assert any('--config.model.attention.kind=skyformer' in c for c in environment['commands'])
  md = (out / 'results.md').read_text()
  assert '| skyformer-table1-listops | skyformer | skyformer |' in md and 'Commands:' in md
  assert (out / 'results-listops-skyformer.json').exists()
  inst = json.loads((out / 'instability-listops.json').read_text())
  assert inst['seeds'] == [0] and inst['steps'] == 3
  assert set(inst['summary']) == {'nystromformer', 'gaussian', 'skyformer'}
  assert '| Skyformer | `skyformer` | 0.79 |' in md
  perf = ('skyformer-table1-listops', 'performer-skyformer')
  if _registered('performer-skyformer'):
    assert rows[perf]['status'] == 'finished' and rows[perf]['published'] == pytest.approx(0.3802)
  else:
    assert perf not in rows
    assert 'performer-skyformer is not registered' in proc.stdout
    assert 'Not run: performer-skyformer: not registered' in md


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
def test_continue_takes_a_stopped_run_to_its_schedule(tmp_path):
  """``reproduce-continue`` (the next call on the warm machine): a run the first call's time limit
  stopped and tested where it stood goes on to its planned steps and its row becomes "finished".
  The first call's state is made here as that call makes it: SIGINT once a checkpoint exists, then the
  test re-run at the step reached."""
  runs, out, data = tmp_path / 'runs', tmp_path / 'out', tmp_path / 'data'
  runs.mkdir()
  wd = runs / 'listops-skyformer'
  cmd = ['-m', 'kernelformer', 'train', '--config', 'configs/listops.py:tiny', f'--workdir={wd}',
         f'--config.data.data_dir={data}', '--config.num_train_steps=200', '--config.checkpoint_every=2',
         '--config.eval_every=50', '--config.progress=False']
  (runs / 'listops-skyformer.cmd').write_text('\n'.join(cmd) + '\n')
  env = procs.env(1)
  first = subprocess.Popen([sys.executable, *cmd], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 300
  while not _numbered(wd / 'checkpoints') and first.poll() is None and time.monotonic() < deadline:
    time.sleep(0.01)
  first.send_signal(signal.SIGINT)
  _, err = first.communicate(timeout=120)
  assert first.returncode == 130, err[-2000:]
  step = _numbered(wd / 'checkpoints')[-1]
  assert step < 200
  subprocess.run([sys.executable, *cmd, f'--config.num_train_steps={step}',
                  '--config.allow_config_change=True'], cwd=REPO, env=env, check=True,
                 capture_output=True, timeout=300)
  assert gpu_table.row('g', 'skyformer', str(wd))['status'] == 'truncated'
  (runs / 'table.args').write_text(f'--run\nskyformer-table1-listops:skyformer={wd}\n')
  (runs / 'commands.txt').write_text('the first call\n')

  script_env = {**env, 'KF_NO_WHL': '1', 'KF_PYTHON': sys.executable, 'KF_REPRODUCE_RUNS': str(runs)}
  # The first call's record, as its write_record leaves it: the table and the truncated run packed for
  # another machine.
  first_out = tmp_path / 'first_out'
  proc = subprocess.run(['bash', 'scripts/gpu_day.sh', 'record', str(first_out)], cwd=REPO,
                        env=script_env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  (first_row,) = json.loads((first_out / 'results.json').read_text())['runs']
  assert first_row['status'] == 'truncated' and first_row['final_step'] == step
  assert 'KF_REPRODUCE_FROM' in proc.stdout
  archive = first_out / 'continue-listops-skyformer.tar.gz'      # one file a truncated run
  assert archive.exists()
  carried = tmp_path / 'carried'                # what a next session carries to the fresh machine
  carried.mkdir()
  shutil.copy(archive, carried)
  proc = subprocess.run(['bash', 'scripts/gpu_day.sh', 'reproduce-continue', str(out)], cwd=REPO,
                        env=script_env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  res = json.loads((out / 'results.json').read_text())
  (row,) = res['runs']
  assert row['status'] == 'finished' and row['final_step'] == row['planned_steps'] == 200, row
  commands = res['environment']['commands']
  assert commands[0] == 'the first call'
  # The run's own command (its schedule: num_train_steps=200), continued: no test re-run was needed.
  (more,) = commands[1:]
  assert re.fullmatch(r'timeout -k 60 -s INT \d+ python3 ' + re.escape(' '.join(cmd))
                      + ' --config.allow_config_change=True', more), commands
  md = (out / 'results.md').read_text()
  assert '| skyformer-table1-listops | skyformer |' in md and '| 200 of 200 |' in md, md
  assert not [n for n in os.listdir(out) if n.startswith('continue-')]   # nothing is left truncated

  # A fresh machine (the warm one given back): no runs, no data, another runs directory. From the first
  # call's archive the run continues to the same end as on the warm machine, bit for bit.
  shutil.rmtree(data)
  runs2 = tmp_path / 'runs_fresh'
  fresh_out = tmp_path / 'fresh_out'
  proc = subprocess.run(['bash', 'scripts/gpu_day.sh', 'reproduce-continue', str(fresh_out)], cwd=REPO,
                        env={**script_env, 'KF_REPRODUCE_RUNS': str(runs2),
                             'KF_REPRODUCE_FROM': str(carried)},
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  (fresh,) = json.loads((fresh_out / 'results.json').read_text())['runs']
  assert fresh['workdir'] == str(runs2 / 'listops-skyformer')
  assert fresh['status'] == 'finished' and fresh['final_step'] == 200, fresh
  assert fresh['test_accuracy'] == row['test_accuracy']
  assert fresh['results']['test_loss'] == row['results']['test_loss']
  fresh_commands = json.loads((fresh_out / 'results.json').read_text())['environment']['commands']
  assert any('prepare-data' in c and str(data) in c for c in fresh_commands), fresh_commands
  assert not (runs2 / 'listops-skyformer' / 'lock').exists()
  # It continued from the packed checkpoint, not from step 0 (which would end the same, deterministically).
  log = (runs2 / 'listops-skyformer.log').read_text()
  assert re.search(rf'resumed from {re.escape(str(runs2))}/listops-skyformer/checkpoints at step {step}\b',
                   log), log[-3000:]

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
