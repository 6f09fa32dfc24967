"""A data directory that cannot be written (a read-only disk, no permission): ``train`` and
``prepare-data`` end with one line naming the path and what to do, not an OSError traceback."""
from __future__ import annotations

import os
import subprocess

import pytest

import lra_tasks
from kernelformer.commands import prepare_data
from kernelformer.training import trainer
from tests.training import helpers


@pytest.fixture
def readonly_dir(tmp_path):
  """An empty directory nothing can be written into: a read-only tmpfs where we are root (permission
  bits do not stop root), else a directory without write permission."""
  path = tmp_path / 'readonly'
  path.mkdir()
  if os.geteuid() != 0:
    path.chmod(0o555)
    yield path
    path.chmod(0o755)
    return
  if subprocess.run(['mount', '-t', 'tmpfs', '-o', 'ro,size=1m', 'tmpfs', str(path)],
                    capture_output=True).returncode != 0:
    pytest.skip('root without a way to make a read-only directory (mount failed)')
  try:
    yield path
  finally:
    subprocess.run(['umount', str(path)], capture_output=True)


def test_train_into_a_readonly_data_dir_is_one_line(tmp_path, readonly_dir):
  data_dir = readonly_dir / 'data'
  with pytest.raises(lra_tasks.DataError) as e:
    trainer.train_and_evaluate(helpers.tiny_config(data_dir), str(tmp_path / 'run'))
  msg = str(e.value)
  assert '\n' not in msg and str(readonly_dir) in msg and 'data.data_dir' in msg, msg
  assert 'writable' in msg


def test_prepare_data_into_a_readonly_data_dir_is_one_line(readonly_dir, capsys):
  rc = prepare_data.run(['--config', 'listops:tiny', '--data_dir', str(readonly_dir / 'data')])
  err = capsys.readouterr().err.strip()
  assert rc == 1 and len(err.splitlines()) == 1, err
  assert str(readonly_dir) in err and '--data_dir' in err and 'writable' in err, err
