"""One rule for where data lives (kernelformer/data_location.py), the same from any directory, and the
package layout that goes with it: configs inside the package, the code version of a run."""
from __future__ import annotations

import os
import subprocess
import sys

from kernelformer import data_location
from kernelformer.training import workdir as workdir_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_default_data_dir_env_then_xdg_then_home(monkeypatch, tmp_path):
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  monkeypatch.delenv('XDG_CACHE_HOME', raising=False)
  monkeypatch.delenv('KERNELFORMER_DATA', raising=False)
  assert data_location.default_data_dir() == str(tmp_path / 'home' / '.cache' / 'kernelformer' / 'data')
  monkeypatch.setenv('XDG_CACHE_HOME', 'relative/cache')   # the XDG rule ignores a relative path
  assert data_location.default_data_dir() == str(tmp_path / 'home' / '.cache' / 'kernelformer' / 'data')
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
  assert data_location.default_data_dir() == str(tmp_path / 'xdg' / 'kernelformer' / 'data')
  monkeypatch.setenv('KERNELFORMER_DATA', '~/mydata')
  assert data_location.default_data_dir() == str(tmp_path / 'home' / 'mydata')
  assert 'KERNELFORMER_DATA' in data_location.describe(str(tmp_path / 'home' / 'mydata'))
  assert data_location.describe('elsewhere').endswith('(config.data.data_dir)')
  # Every packaged task config takes it as its default; an explicit value is just a field.
  from kernelformer.configs import listops, text
  assert listops.get_config('tiny').data.data_dir == str(tmp_path / 'home' / 'mydata')
  assert text.get_config().data.data_dir == str(tmp_path / 'home' / 'mydata')


def test_prepare_and_check_from_any_folder_use_the_per_user_cache(tmp_path):
  """From an unrelated folder, with no KERNELFORMER_DATA: the files go to ~/.cache/kernelformer/data
  (HOME is a temporary folder here) and nothing is written into the current directory."""
  home, cwd = tmp_path / 'home', tmp_path / 'cwd'
  home.mkdir()
  cwd.mkdir()
  env = {k: v for k, v in os.environ.items() if k not in ('KERNELFORMER_DATA', 'XDG_CACHE_HOME')}
  env.update(HOME=str(home), PYTHONPATH=ROOT, JAX_PLATFORMS='cpu')
  run = lambda *a: subprocess.run([sys.executable, '-m', 'kernelformer', 'prepare-data', *a],
                                  capture_output=True, text=True, env=env, cwd=str(cwd), timeout=300)
  proc = run('--config', 'listops:tiny')
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  expected = home / '.cache' / 'kernelformer' / 'data'
  written = {f for _, _, files in os.walk(expected / 'listops') for f in files}
  assert {'basic_train.tsv', 'basic_val.tsv', 'basic_test.tsv', 'MANIFEST.json'} <= written, written
  assert os.listdir(cwd) == []
  proc = run('--check', '--config', 'listops:tiny')
  assert proc.returncode == 0, proc.stdout[-2000:]
  assert proc.stdout.splitlines()[0] == f'data: {expected} (the per-user default; set $KERNELFORMER_DATA ' \
      'or --config.data.data_dir to move it)'
  assert os.listdir(cwd) == []


def test_code_version_has_the_package_version_and_a_checkout_commit(monkeypatch, tmp_path):
  v = workdir_lib.code_version()
  assert v['package_version'] and len(v.get('git_commit', '')) == 40   # this checkout
  # An installed copy records only the package version, even in a virtualenv inside some other git
  # repository (whose commit says nothing about the installed code).
  project = tmp_path / 'project'
  site = project / '.venv' / 'lib' / 'site-packages'
  (site / 'kernelformer' / 'training').mkdir(parents=True)
  git = {**os.environ, 'GIT_AUTHOR_NAME': 't', 'GIT_AUTHOR_EMAIL': 't@t', 'GIT_COMMITTER_NAME': 't',
         'GIT_COMMITTER_EMAIL': 't@t'}
  subprocess.run(['git', 'init', '-q', str(project)], check=True, env=git)
  subprocess.run(['git', '-C', str(project), 'commit', '-q', '--allow-empty', '-m', 'x'], check=True,
                 env=git)
  monkeypatch.setattr(workdir_lib, '__file__', str(site / 'kernelformer' / 'training' / 'workdir.py'))
  assert set(workdir_lib.code_version()) == {'package_version'}


def test_no_top_level_configs_package_is_installed():
  """pyproject ships the configs as kernelformer.configs (a link to configs/), not as ``configs``."""
  with open(os.path.join(ROOT, 'pyproject.toml'), encoding='utf-8') as f:
    text = f.read()
  include = [l for l in text.splitlines() if l.startswith('include = ')]
  assert include == ['include = ["kernelformer*", "lra_tasks*"]']
  assert os.path.realpath(os.path.join(ROOT, 'kernelformer', 'configs')) == \
      os.path.realpath(os.path.join(ROOT, 'configs'))
  from kernelformer.configs import common   # the configs import each other this way
  assert os.path.realpath(common.__file__) == os.path.realpath(os.path.join(ROOT, 'configs', 'common.py'))


def test_check_without_a_task_checks_every_task(tmp_path):
  """``prepare-data --check`` alone: every task, ListOps (generated from its seed) "will be generated on
  first use" rather than missing; the others missing, so it exits 1."""
  env = {**os.environ, 'KERNELFORMER_DATA': str(tmp_path), 'PYTHONPATH': ROOT, 'JAX_PLATFORMS': 'cpu'}
  proc = subprocess.run([sys.executable, '-m', 'kernelformer', 'prepare-data', '--check'],
                        capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
  heads = [l for l in proc.stdout.splitlines() if l.startswith(('[', 'data: '))]
  assert proc.returncode == 1 and heads == [
      f'data: {tmp_path} ($KERNELFORMER_DATA)',
      f'[listops] will be generated on first use (seeded generator) into {tmp_path}/listops',
      '[text max_length=1000] MISSING', '[retrieval max_length=4000] MISSING', '[image] MISSING',
      '[pathfinder 32x32 hard (pathfinder32/curv_contour_length_14)] MISSING', '[enwik8] MISSING',
  ], proc.stdout + proc.stderr
  assert proc.stdout.splitlines()[-1] == '5 of 6 not ready (see above)'
  assert os.listdir(tmp_path) == []   # a check writes nothing
