"""scripts/train.py: user mistakes end with one line saying what to do (run as a user would)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import procs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_train(tmp_path, *args):
  env = procs.env(1)
  cmd = [sys.executable, os.path.join(ROOT, 'scripts', 'train.py'),
         '--config', os.path.join(ROOT, 'configs', 'listops.py') + ':tiny',
         '--workdir', str(tmp_path / 'run'), '--config.progress=False', *args]
  return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)


def last_line(proc):
  lines = [l for l in proc.stderr.strip().splitlines() if l.strip()]
  return lines[-1] if lines else ''


def test_misspelled_config_field(tmp_path):
  proc = run_train(tmp_path, '--config.model.num_layer=3')
  assert proc.returncode != 0
  assert 'Traceback' not in proc.stderr
  assert 'num_layer' in last_line(proc)


def test_missing_data_names_path_and_fix(tmp_path):
  proc = run_train(tmp_path, f'--config.data.data_dir={tmp_path}/nodata', '--config.data.generate=False')
  assert proc.returncode == 1
  assert 'Traceback' not in proc.stderr
  line = last_line(proc)
  assert 'basic_train.tsv' in line and str(tmp_path / 'nodata') in line


def test_malformed_row_names_file_and_line(tmp_path):
  data = tmp_path / 'data' / 'listops'
  data.mkdir(parents=True)
  good = 'Source\tTarget\r\n( ( [MAX 2 ) 3 ) ] )\t3\r\n'
  (data / 'basic_val.tsv').write_text(good, newline='')
  (data / 'basic_test.tsv').write_text(good, newline='')
  (data / 'basic_train.tsv').write_text(good + '( ( [MAX 2 ) 3 ) ] )\tseven\r\n', newline='')
  proc = run_train(tmp_path, f'--config.data.data_dir={tmp_path}/data', '--config.data.generate=False',
                   '--config.data.min_gen_length=500', '--config.data.max_gen_length=2000',
                   '--config.data.num_train=96000', '--config.data.num_val=2000',
                   '--config.data.num_test=2000', '--config.data.max_depth=10',
                   '--config.data.max_args=10')
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert 'Traceback' not in proc.stderr
  line = last_line(proc)
  assert 'basic_train.tsv:3' in line


def test_unknown_kernel_one_line(tmp_path):
  proc = run_train(tmp_path, '--config.model.attention.kind=favorplus')
  assert proc.returncode == 1
  assert 'Traceback' not in proc.stderr
  assert "'favorplus' (nearest: favor+ (= posrf-orf), " in last_line(proc)
  assert last_line(proc).endswith('see `kernelformer kernels` for every kind')


def test_indivisible_batch_one_line(tmp_path):
  env_flags = ['--config.batch_size=7']
  env = procs.env(2)
  cmd = [sys.executable, os.path.join(ROOT, 'scripts', 'train.py'),
         '--config', os.path.join(ROOT, 'configs', 'listops.py') + ':tiny',
         '--workdir', str(tmp_path / 'run'), '--config.progress=False',
         f'--config.data.data_dir={tmp_path}/data', *env_flags]
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
  assert proc.returncode == 1
  assert 'Traceback' not in proc.stderr
  assert 'not divisible by the 2 devices' in last_line(proc)


def test_config_that_is_a_directory_says_so(tmp_path):
  from kernelformer.commands import _common
  (tmp_path / 'mine.py').write_text('')
  with pytest.raises(_common.UserError) as e:
    _common.resolve_config_path(str(tmp_path))
  assert 'is a directory, not a config file' in str(e.value) and 'mine.py' in str(e.value)
  assert 'not found' not in str(e.value)
