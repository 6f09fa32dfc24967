"""Sweeps: expansion, stable run names, skip/resume/failure bookkeeping, emitted commands, named sweeps."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from kernelformer import registry
from kernelformer.reproduce import sweeps
from tests import procs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LISTOPS = 'configs/listops.py'


def test_parse_value_like_config_overrides():
  assert sweeps.parse_value('true') is True and sweeps.parse_value('False') is False
  assert sweeps.parse_value('3') == 3 and isinstance(sweeps.parse_value('3'), int)
  assert sweeps.parse_value('1e-4') == 1e-4 and sweeps.parse_value('0.5') == 0.5
  assert sweeps.parse_value('None') is None
  assert sweeps.parse_value('posrf-orf') == 'posrf-orf'
  key, values = sweeps.parse_assignment('config.model.attention.num_features=64,128', multi=True)
  assert key == 'model.attention.num_features' and values == [64, 128]
  with pytest.raises(sweeps.SweepError, match='KEY=VALUE'):
    sweeps.parse_assignment('seed', multi=True)


def test_grid_names_are_readable_stable_and_canonical():
  sweep = sweeps.expand(sweeps.sweep_from_flags(
      [f'{LISTOPS}:quick'], ['model.attention.kind=softmax,performer', 'seed=0,1',
                             'optim.learning_rate=0.001']))
  names = sorted(sweeps.point_dirname(p) for p in sweep.points)
  # 'performer' is an alias: runs land under the canonical name, keys sorted, seed last.
  assert names == [
      'listops-quick/kind=posrf-orf__learning_rate=0.001__seed=0',
      'listops-quick/kind=posrf-orf__learning_rate=0.001__seed=1',
      'listops-quick/kind=softmax__learning_rate=0.001__seed=0',
      'listops-quick/kind=softmax__learning_rate=0.001__seed=1']
  # Report rows: kind plus the other swept keys, never the seed.
  assert {p.label for p in sweep.points} == {'posrf-orf, learning_rate=0.001',
                                             'softmax, learning_rate=0.001'}
  # The order of --grid flags does not change the names.
  swapped = sweeps.expand(sweeps.sweep_from_flags(
      [f'{LISTOPS}:quick'], ['optim.learning_rate=0.001', 'seed=0,1',
                             'model.attention.kind=performer,softmax']))
  assert sorted(sweeps.point_dirname(p) for p in swapped.points) == names


def test_unsafe_values_get_distinct_hashed_names():
  a = sweeps.Point(LISTOPS, 'quick', (('data.data_dir', '/tmp/a b'),))
  b = sweeps.Point(LISTOPS, 'quick', (('data.data_dir', '/tmp/a_b'),))
  na, nb = sweeps.point_dirname(a), sweeps.point_dirname(b)
  assert na != nb and na == sweeps.point_dirname(a)
  for n in (na, nb):
    leaf = n.split('/', 1)[1]
    assert '/' not in leaf and ' ' not in leaf and leaf.startswith('data_dir=_tmp_a_b')


def test_unknown_kind_is_an_error_listing_valid_names():
  sweep = sweeps.sweep_from_flags([f'{LISTOPS}:quick'],
                                  ['model.attention.kind=softmax,posrf-orff,favorplus'])
  with pytest.raises(sweeps.SweepError) as e:
    sweeps.expand(sweep)
  msg = str(e.value)
  assert "'favorplus' (nearest: favor+ (= posrf-orf), " in msg and "'posrf-orff' (nearest: posrf-orf, " in msg
  assert msg.endswith('see `kernelformer kernels` for every kind')


def test_misspelled_override_stops_before_training(tmp_path):
  sweep = sweeps.expand(sweeps.sweep_from_flags([f'{LISTOPS}:tiny'], ['model.num_layer=1,2']))
  with pytest.raises(sweeps.SweepError, match='Did you mean model.num_layers'):
    sweeps.plan(sweep, str(tmp_path))


@pytest.mark.parametrize('name,tasks,kinds,rows,seeds', [
    ('spectraformer', {'listops', 'text', 'retrieval'}, 22, 22, 3),
    # 10 rows; the Performer row runs performer-lra-listops on ListOps, performer-relu-det elsewhere.
    ('kernel_learning', {'listops', 'text', 'retrieval', 'image'}, 11, 10, 3),
    ('skyformer', {'text', 'listops', 'retrieval', 'pathfinder', 'image'}, 6, 6, 3),
    ('mini', {'listops'}, 3, 3, 2),
])
def test_named_sweeps_expand_against_registry_and_configs(tmp_path, name, tasks, kinds, rows, seeds):
  sweep = sweeps.load_sweep(name)  # validates kinds against the registry
  runs = sweeps.plan(sweep, str(tmp_path))  # loads every task config and applies every override
  assert not [r.error for r in runs if r.error]
  assert {r.task for r in runs} == tasks
  assert len({r.kind for r in runs}) == kinds
  assert len({r.point.label or r.kind for r in runs}) == rows
  assert len(runs) == len(tasks) * rows * seeds
  assert all(r.kind in registry.list_kernels() for r in runs)
  if name != 'mini':
    assert sweep.paper == name


def test_spectraformer_draws_w_once_as_its_code(tmp_path):
  """Spectraformer's code registers W once and never redraws it; Skyformer's landmarks, a reference
  row, keep their own schedule."""
  runs = sweeps.plan(sweeps.load_sweep('spectraformer'), str(tmp_path))
  redraw = {(r.task, r.kind): r.point.get('model.attention.redraw_every') for r in runs}
  assert all(redraw[(t, k)] == 0 for t, k in redraw if '-' in k and k != 'skyformer'), redraw
  assert redraw[('listops', 'fastfood-prf')] == 0          # posrf-fastfoodl
  assert all(redraw[(t, k)] is None for t in ('listops', 'text') for k in ('skyformer', 'softmax'))


def test_kernel_learning_uses_table5_samples(tmp_path):
  runs = sweeps.plan(sweeps.load_sweep('kernel_learning'), str(tmp_path))
  m = {(r.task, r.kind): r.point.get('model.attention.num_features') for r in runs}
  assert m[('listops', 'gmm-rks')] == 256 and m[('retrieval', 'gmm-rks')] == 64
  assert m[('image', 'fastfood-prf')] == 8 and m[('text', 'generative-rks')] == 256
  assert m[('text', 'softmax')] is None  # baselines keep the preset's options


def test_kernel_learning_dry_run_lists_lra_performers(tmp_path):
  """Where table 2 quotes LRA's Performer, the sweep runs LRA's: relu(x)+1e-3 and, on ListOps, LRA's FAVOR+."""
  proc = _cli('--sweep', 'kernel_learning', '--sweep_dir', str(tmp_path / 'kl'), '--dry_run', cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = proc.stdout
  for task in ('text', 'retrieval', 'image'):
    for seed in (0, 1, 2):
      assert f'{task}-kernel_learning/kind=performer-relu-det__seed={seed}' in out, task
    assert f'{task}-kernel_learning/kind=performer-lra-listops' not in out
  for seed in (0, 1, 2):
    assert f'listops-kernel_learning/kind=performer-lra-listops__seed={seed}' in out
  assert 'listops-kernel_learning/kind=performer-relu-det' not in out
  assert 'kind=posrf-orf' not in out                  # FAVOR+ is not LRA's Performer
  assert '120 runs' in out
  labels = {p.label for p in sweeps.load_sweep('kernel_learning').points
            if p.get(sweeps.KIND_KEY).startswith('performer')}
  assert labels == {'performer (LRA)'}


def _fake_trainer(fail_on=()):
  """Writes results.json as train_and_evaluate does; raises for kinds in ``fail_on``."""
  calls = []

  def train(config, workdir):
    calls.append((config.model.attention.kind, int(config.seed), int(config.num_train_steps)))
    if config.model.attention.kind in fail_on:
      raise RuntimeError('boom: NaN loss')
    results = {'task': config.data.task, 'attention': config.model.attention.kind,
               'test_accuracy': 0.25 + 0.01 * config.seed, 'steps_per_sec': 10.0,
               'compiled_memory_bytes': {'argument_size_in_bytes': 1000, 'temp_size_in_bytes': 24},
               'best_val_accuracy': 0.3, 'best_step': 4, 'config': config.to_dict()}
    with open(os.path.join(workdir, 'results.json'), 'w', encoding='utf-8') as f:
      json.dump(results, f)
    return results

  return train, calls


def test_finished_skipped_failed_recorded_and_retried(tmp_path):
  sweep = sweeps.expand(sweeps.sweep_from_flags(
      [f'{LISTOPS}:tiny'], ['model.attention.kind=softmax,posrf-orf,linear-elu', 'seed=0'],
      ['num_train_steps=5']))
  sweep_dir = str(tmp_path / 'sw')
  train, calls = _fake_trainer(fail_on=('posrf-orf',))
  counts = sweeps.run_sweep(sweep, sweep_dir, train_fn=train, log=lambda s: None)
  assert counts == {'done': 0, 'ran': 2, 'failed': 1}
  # The sweep went on after the failure, and --set reached every run.
  assert [c[0] for c in calls] == ['softmax', 'posrf-orf', 'linear-elu']
  assert all(c[2] == 5 for c in calls)
  failures = [json.loads(l) for l in (tmp_path / 'sw' / 'failures.jsonl').read_text().splitlines()]
  assert len(failures) == 1 and failures[0]['kind'] == 'posrf-orf'
  assert 'RuntimeError: boom' in failures[0]['error'] and 'Traceback' in failures[0]['details']
  point = json.loads((tmp_path / 'sw' / 'listops-tiny' / 'kind=softmax__seed=0' /
                      'sweep_point.json').read_text())
  assert point['identity']['common'] == {'num_train_steps': 5} and point['task'] == 'listops'

  # Second invocation: only the failed point runs; a checkpoint makes it a resume.
  os.makedirs(tmp_path / 'sw' / 'listops-tiny' / 'kind=posrf-orf__seed=0' / 'checkpoints' / '4')
  runs = {r.kind: r.status() for r in sweeps.plan(sweep, sweep_dir)}
  assert runs == {'softmax': 'done', 'posrf-orf': 'resume', 'linear-elu': 'done'}
  train2, calls2 = _fake_trainer()
  counts = sweeps.run_sweep(sweep, sweep_dir, train_fn=train2, log=lambda s: None)
  assert counts == {'done': 2, 'ran': 1, 'failed': 0}
  assert [c[0] for c in calls2] == ['posrf-orf']
  planned = json.loads((tmp_path / 'sw' / 'sweep.json').read_text())
  assert len(planned['runs']) == 3


def test_runs_linked_into_a_sweep_directory_count_as_its_points(tmp_path):
  """Runs trained elsewhere, linked under their points' names (docs/reproduce.md, Zoology's panel): the
  sweep counts them done and trains only the rest; the report reads each linked run once."""
  from kernelformer.reproduce import report  # pylint: disable=g-import-not-at-top
  sweep = sweeps.expand(sweeps.sweep_from_flags(
      [f'{LISTOPS}:tiny'], ['model.attention.kind=softmax,linear-elu', 'seed=0'], ['num_train_steps=5']))
  train, _ = _fake_trainer()
  sweeps.run_sweep(sweep, str(tmp_path / 'elsewhere'), train_fn=train, log=lambda s: None)
  linked = tmp_path / 'linked'
  os.makedirs(linked / 'listops-tiny')
  name = 'kind=softmax__seed=0'
  os.symlink(tmp_path / 'elsewhere' / 'listops-tiny' / name, linked / 'listops-tiny' / name)
  assert {r.kind: r.status() for r in sweeps.plan(sweep, str(linked))} == {'softmax': 'done',
                                                                           'linear-elu': 'new'}
  train2, calls = _fake_trainer()
  assert sweeps.run_sweep(sweep, str(linked), train_fn=train2, log=lambda s: None) == {
      'done': 1, 'ran': 1, 'failed': 0}
  assert [c[0] for c in calls] == ['linear-elu']
  _, runs = report.collect(str(linked))
  assert sorted((r.kind, r.results is not None) for r in runs) == [('linear-elu', True),
                                                                   ('softmax', True)]


def test_reusing_a_workdir_with_other_settings_is_refused(tmp_path):
  def make(steps):
    return sweeps.expand(sweeps.sweep_from_flags(
        [f'{LISTOPS}:tiny'], ['model.attention.kind=softmax'], [f'num_train_steps={steps}']))
  train, _ = _fake_trainer()
  sweeps.run_sweep(make(5), str(tmp_path), train_fn=train, log=lambda s: None)
  sweeps.plan(make(5), str(tmp_path))  # same settings: fine
  with pytest.raises(sweeps.SweepError, match='different settings'):
    sweeps.plan(make(6), str(tmp_path))


def test_emitted_commands_parse_as_train_py_flags(tmp_path):
  sweep = sweeps.expand(sweeps.sweep_from_flags(
      [f'{LISTOPS}:tiny'], ['model.attention.kind=posrf-orf', 'seed=3',
                            'model.attention.num_features=8', 'optim.learning_rate=0.0005',
                            'model.attention.normalize_qk=false'], ['data.data_dir=/tmp/x,y']))
  (run,) = sweeps.plan(sweep, str(tmp_path))
  (line,) = sweeps.emit([run])
  argv = shlex.split(line)
  assert argv[:3] == ['python', 'scripts/train.py', '--config']
  # Parse exactly as scripts/train.py does (its config flag), into a private FlagValues.
  argv = [a.replace(LISTOPS, os.path.join(ROOT, LISTOPS)) for a in argv[1:]]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file('config', None, 'x', flag_values=fv, lock_config=True,
                                  sys_argv=argv)
  flags.DEFINE_string('workdir', None, 'x', flag_values=fv)
  fv(argv)
  parsed = fv.config
  expected = sweeps.point_config(run.point, run.common)
  assert parsed.to_dict() == expected.to_dict()
  assert parsed.model.attention.normalize_qk is False and parsed.data.data_dir == '/tmp/x,y'
  assert fv.workdir == run.workdir


def _cli(*args, cwd):
  env = procs.env(1)   # one CPU device (the tiny batch splits over any count)
  return subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'sweep.py'), *args],
                        capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def test_cli_dry_run_emit_and_parallel_failures(tmp_path):
  common = ['--config', f'{os.path.join(ROOT, LISTOPS)}:tiny',
            '--grid', 'model.attention.kind=softmax,posrf-orf',
            '--set', f'data.data_dir={tmp_path}/nodata', '--set', 'data.generate=False',
            '--sweep_dir', str(tmp_path / 'sw')]
  proc = _cli(*common, '--dry_run', '--emit', str(tmp_path / 'jobs.txt'), cwd=str(tmp_path))
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert 'new    listops-tiny/kind=softmax' in proc.stdout and '2 runs: 0 done' in proc.stdout
  jobs = [l for l in (tmp_path / 'jobs.txt').read_text().splitlines() if not l.startswith('#')]
  assert len(jobs) == 2 and all('scripts/train.py' in j for j in jobs)
  proc = _cli(*common, '--emit', str(tmp_path / 'missing' / 'jobs.txt'), cwd=str(tmp_path))
  assert proc.returncode == 2 and 'Traceback' not in proc.stderr, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].endswith('missing/jobs.txt: No such file or directory')
  # Parallel subprocesses: both runs stop at the data check (so their flags parsed), are recorded
  # as failures, and the sweep exits non-zero after running both.
  proc = _cli(*common, '--parallel', '2', cwd=str(tmp_path))
  assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
  failures = [json.loads(l) for l in (tmp_path / 'sw' / 'failures.jsonl').read_text().splitlines()]
  assert sorted(f['kind'] for f in failures) == ['posrf-orf', 'softmax']
  assert all('basic_train.tsv' in f['error'] for f in failures), failures
  # An unknown kind stops the CLI with one line listing the valid ones.
  proc = _cli('--config', f'{LISTOPS}:tiny', '--grid', 'model.attention.kind=favorplus',
              '--sweep_dir', str(tmp_path / 'bad'), '--dry_run', cwd=ROOT)
  assert proc.returncode == 2 and 'Traceback' not in proc.stderr
  assert 'see `kernelformer kernels`' in proc.stderr.strip().splitlines()[-1]


def test_in_process_sweep_trains_for_real_and_skips_on_rerun(tmp_path):
  sweep = sweeps.expand(sweeps.sweep_from_flags(
      [f'{LISTOPS}:tiny'], ['model.attention.kind=softmax', 'seed=1'],
      [f'data.data_dir={tmp_path}/data', 'num_train_steps=2', 'eval_every=2', 'checkpoint_every=2',
       'progress=False']))
  counts = sweeps.run_sweep(sweep, str(tmp_path / 'sw'), log=lambda s: None)
  assert counts == {'done': 0, 'ran': 1, 'failed': 0}
  results = json.loads((tmp_path / 'sw' / 'listops-tiny' / 'kind=softmax__seed=1' /
                        'results.json').read_text())
  assert results['final_step'] == 2 and results['config']['seed'] == 1
  assert sweeps.run_sweep(sweep, str(tmp_path / 'sw'), log=lambda s: None) == \
      {'done': 1, 'ran': 0, 'failed': 0}


def test_a_preempted_point_stops_the_sweep_and_is_not_a_failure(tmp_path):
  """SIGTERM/SIGINT inside a point (the trainer saved its checkpoint and raised exit code 143/130)
  stops the sweep: no failure is recorded and the next point does not start."""
  from kernelformer.training.workdir import RunError
  sweep = sweeps.expand(sweeps.sweep_from_flags(
      [f'{LISTOPS}:tiny'], ['model.attention.kind=softmax,posrf-orf,linear-elu', 'seed=0'],
      ['num_train_steps=5']))
  sweep_dir = str(tmp_path / 'sw')
  calls = []

  def train(config, workdir):
    calls.append(config.model.attention.kind)
    if config.model.attention.kind == 'posrf-orf':
      raise RunError('preempted (SIGTERM) at step 3: checkpoint saved', 143)
    return _fake_trainer()[0](config, workdir)

  with pytest.raises(sweeps.SweepInterrupted) as e:
    sweeps.run_sweep(sweep, sweep_dir, train_fn=train, log=lambda s: None)
  assert e.value.exit_code == 143
  assert calls == ['softmax', 'posrf-orf']
  assert not (tmp_path / 'sw' / 'failures.jsonl').exists()


def test_an_unreadable_results_json_is_not_finished_and_is_named(tmp_path):
  sweep = sweeps.expand(sweeps.sweep_from_flags(
      [f'{LISTOPS}:tiny'], ['model.attention.kind=softmax,posrf-orf', 'seed=0'], ['num_train_steps=5']))
  sweep_dir = str(tmp_path / 'sw')
  train, _ = _fake_trainer()
  sweeps.run_sweep(sweep, sweep_dir, train_fn=train, log=lambda s: None)
  torn = tmp_path / 'sw' / 'listops-tiny' / 'kind=softmax__seed=0' / 'results.json'
  torn.write_text(torn.read_text()[:40])
  assert {r.kind: r.status() for r in sweeps.plan(sweep, sweep_dir)} == \
      {'softmax': 'new', 'posrf-orf': 'done'}
  train2, calls = _fake_trainer()
  logged = []
  counts = sweeps.run_sweep(sweep, sweep_dir, train_fn=train2, log=logged.append)
  assert counts == {'done': 1, 'ran': 1, 'failed': 0} and [c[0] for c in calls] == ['softmax']
  assert any(str(torn) in l and 'is damaged' in l for l in logged), logged
  torn.unlink()
  torn.mkdir()   # a directory: named the same way (sweep --dry_run prints the same line)
  plan = {r.kind: r for r in sweeps.plan(sweep, sweep_dir)}
  assert plan['softmax'].status() == 'new' and not plan['posrf-orf'].unreadable()
  assert plan['softmax'].unreadable() == f'{torn} is a directory, not a regular file: not finished'


def test_a_sweep_with_an_empty_grid_is_an_error():
  with pytest.raises(sweeps.SweepError, match='no points'):
    sweeps.expand(sweeps.Sweep(name='empty', points=()))
