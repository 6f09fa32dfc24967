"""Byte-level enwik8 (lra_tasks/enwik8.py): the 90/5/5 split, next-byte windows, the missing-data line,
prepare from a local zip with a manifest, and train.py end to end on a fixture with bits per byte."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import ml_collections
import numpy as np
import pytest

import lra_tasks
from lra_tasks import enwik8

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _data(tmp_path, num_bytes=2000, max_length=16):
  return ml_collections.ConfigDict({'task': 'enwik8', 'data_dir': str(tmp_path),
                                    'num_bytes': num_bytes, 'max_length': max_length})


def test_standard_split_bounds():
  b = enwik8.split_bounds(10 ** 8)
  assert b == {'train': (0, 90_000_000), 'val': (90_000_000, 95_000_000),
               'test': (95_000_000, 100_000_000)}


def test_windows_are_next_byte_pairs(tmp_path):
  blob = enwik8.write_fixture(str(tmp_path), 2100)
  data = _data(tmp_path)
  task = lra_tasks.get('enwik8')
  info = task.info(data)
  assert info.language_model and info.metric == 'bits_per_byte' and info.vocab_size == 257
  val = task.source(data, 'val')           # bytes 1800..1900 of 2000 (the file is longer)
  assert len(val) == -(-(100 - 1) // 16)   # the last window padded: all 99 targets scored
  ex = val[2]
  start = 1800 + 2 * 16
  raw = np.frombuffer(blob, np.uint8).astype(np.int32) + 1
  np.testing.assert_array_equal(ex['inputs'], raw[start:start + 16])
  np.testing.assert_array_equal(ex['targets'], raw[start + 1:start + 17])
  test = task.source(data, 'test')         # bytes 1900..2000: 99 targets in 7 windows, the last padded
  last = test[len(test) - 1]
  assert len(test) == 7 and len(task.source(data, 'train')) == (1800 - 1) // 16   # train: full ones
  real = 99 - 6 * 16
  np.testing.assert_array_equal(last['targets'][:real], raw[1900 + 6 * 16 + 1:2000])
  assert (last['targets'][real:] == 0).all() and (last['inputs'][real + 1:] == 0).all()


def _stacked(src, idx):
  examples = [src[int(i)] for i in idx]
  return {k: np.stack([e[k] for e in examples]) for k in ('inputs', 'targets')}


def _assert_batches_equal(src, idx):
  batch, stacked = src.read_batch(np.asarray(idx, dtype=np.int64)), _stacked(src, idx)
  assert set(batch) == {'inputs', 'targets'}
  for k in stacked:
    assert batch[k].dtype == np.int32 and batch[k].shape == stacked[k].shape, k
    np.testing.assert_array_equal(batch[k], stacked[k], err_msg=k)


@pytest.mark.parametrize('span,length,stride,pad_tail', [
    (100, 16, None, False),   # training: full windows only
    (100, 16, None, True),    # validation / disjoint: the last window padded
    (100, 16, 8, True),       # sliding at L/2, the last window padded
    (100, 16, 3, True),       # a stride that does not divide L
    (100, 16, 1, True),       # every position
    (97, 16, 16, True),       # the last window ends exactly at stop: none padded
    (10, 16, None, True),     # a split shorter than one window: one padded window
    (17, 16, None, False),    # exactly one full window
])
def test_read_batch_is_the_stacked_windows(span, length, stride, pad_tail):
  """Every index set -- all windows, each alone (the last too), random multisets with repeats, an
  empty one -- gives what stacking the per-window reads gives, byte for byte."""
  rng = np.random.default_rng(span * length + (stride or 0))
  mm = rng.integers(0, 256, size=span + 40, dtype=np.uint8)
  src = enwik8.WindowSource(mm, 20, 20 + span, length, stride, pad_tail=pad_tail)
  n = len(src)
  assert n > 0
  _assert_batches_equal(src, np.arange(n))
  _assert_batches_equal(src, np.arange(n)[::-1])
  for i in range(n):
    _assert_batches_equal(src, [i])
  for _ in range(20):
    _assert_batches_equal(src, rng.integers(0, n, size=int(rng.integers(1, 2 * n + 2))))
  empty = src.read_batch(np.zeros(0, np.int64))
  assert empty['inputs'].shape == empty['targets'].shape == (0, length)
  for bad in ([n], [-1], [0, n + 3]):
    with pytest.raises(IndexError):
      src.read_batch(np.asarray(bad))


@pytest.mark.parametrize('split,context', [('train', 'disjoint'), ('val', 'disjoint'),
                                           ('test', 'disjoint'), ('test', 'sliding')])
def test_read_batch_of_the_task_sources(tmp_path, split, context):
  """The memory-mapped splits as the task builds them, through the pipeline's ``read``: the training
  windows, the padded validation ones, and the disjoint and sliding (stride L/2) test windows."""
  from kernelformer.training import input_pipeline
  enwik8.write_fixture(str(tmp_path), 2100)
  data = _data(tmp_path)
  data.eval_context = context
  data.eval_stride = 0
  src = lra_tasks.get('enwik8').source(data, split)
  assert src.stride == (8 if context == 'sliding' else 16)
  idx = np.random.default_rng(1).permutation(len(src))
  for b in range(0, len(idx), 7):
    batch, stacked = input_pipeline.read(src, idx[b:b + 7]), _stacked(src, idx[b:b + 7])
    for k in stacked:
      np.testing.assert_array_equal(batch[k], stacked[k])
  _assert_batches_equal(src, [len(src) - 1, 0, len(src) - 1])


def test_missing_and_short_data_name_path_and_command(tmp_path):
  task = lra_tasks.get('enwik8')
  (line,) = task.check(_data(tmp_path))
  assert str(tmp_path / 'enwik8' / 'enwik8') in line
  assert f'python scripts/prepare_data.py --task enwik8 --data_dir {tmp_path}' in line
  enwik8.write_fixture(str(tmp_path), 100)
  (line,) = task.check(_data(tmp_path))
  assert 'holds 100 bytes' in line
  with pytest.raises(lra_tasks.DataError):
    task.source(_data(tmp_path), 'train')


def test_a_split_shorter_than_one_window_is_an_error(tmp_path):
  """num_bytes=200 at max_length 32 leaves 10 validation and 10 test bytes: not one window of 33."""
  with pytest.raises(lra_tasks.DataError) as e:
    lra_tasks.get('enwik8').info(_data(tmp_path, num_bytes=200, max_length=32))
  msg = str(e.value)
  assert 'val split of 10 bytes' in msg and 'at least 660' in msg and '\n' not in msg, msg
  lra_tasks.get('enwik8').info(_data(tmp_path, num_bytes=660, max_length=32))   # the least that fits


def test_prepare_from_zip_writes_manifest_and_check_catches_corruption(tmp_path):
  blob = enwik8.write_fixture(str(tmp_path / 'src'), 3000)
  zpath = tmp_path / 'enwik8.zip'
  with zipfile.ZipFile(zpath, 'w') as z:
    z.writestr('enwik8', blob)
  script = os.path.join(ROOT, 'scripts', 'prepare_data.py')
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  run = lambda *a: subprocess.run([sys.executable, script, '--task', 'enwik8', '--data_dir',
                                   str(tmp_path / 'd'), *a], capture_output=True, text=True,
                                  env=env, timeout=120)
  proc = run('--source', str(zpath))
  # 3000 bytes are fewer than the standard 10^8: prepared, but --check reports the short file.
  assert (tmp_path / 'd' / 'enwik8' / 'enwik8').read_bytes() == blob
  assert (tmp_path / 'd' / 'enwik8' / 'MANIFEST.json').is_file()
  assert proc.returncode == 1 and 'holds 3000 bytes' in proc.stdout + proc.stderr
  data = _data(tmp_path / 'd', num_bytes=3000)
  assert enwik8.verify(data) == []
  with open(tmp_path / 'd' / 'enwik8' / 'enwik8', 'r+b') as f:
    f.write(b'X')
  assert 'sha256' in ' '.join(enwik8.verify(data))


def test_train_cli_tiny_reports_bits_per_byte(tmp_path):
  enwik8.write_fixture(str(tmp_path / 'data'), 20000)
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  cmd = [sys.executable, os.path.join(ROOT, 'scripts', 'train.py'),
         '--config', os.path.join(ROOT, 'configs', 'enwik8.py') + ':tiny',
         '--workdir', str(tmp_path / 'run'), '--config.progress=False',
         f'--config.data.data_dir={tmp_path / "data"}']
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  results = json.loads((tmp_path / 'run' / 'results.json').read_text())
  assert results['task'] == 'enwik8'
  bpb = results['test_bits_per_byte']
  # Cross-entropy in bits: positive, and at most ~log2(257) plus slack for a 6-step model.
  assert 0.0 < bpb < 12.0
  assert abs(bpb - results['test_loss'] / np.log(2.0)) < 1e-9
  # The whole test split (1000 bytes), every byte but the first scored once, with the preset's
  # sliding windows at stride max_length / 2.
  assert results['test_examples'] == 1000 - 1
  assert results['eval_context'] == 'sliding' and results['eval_stride'] == 16


def test_train_cli_missing_enwik8_one_line(tmp_path):
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  cmd = [sys.executable, os.path.join(ROOT, 'scripts', 'train.py'),
         '--config', os.path.join(ROOT, 'configs', 'enwik8.py') + ':tiny',
         '--workdir', str(tmp_path / 'run'), '--config.progress=False',
         f'--config.data.data_dir={tmp_path / "nodata"}']
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
  assert proc.returncode != 0 and 'Traceback' not in proc.stderr
  last = [l for l in proc.stderr.splitlines() if l.strip()][-1]
  assert str(tmp_path / 'nodata' / 'enwik8' / 'enwik8') in last and '--task enwik8' in last
