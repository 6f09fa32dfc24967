"""Files that misbehave: every write of a run's files fails with one line and leaves
the earlier file as it was; reads are bounded; a file-size limit and orbax's own output end in one line.

Full disks are links to /dev/full (every write fails with ENOSPC); file-size limits are RLIMIT_FSIZE
set before a child process starts (EFBIG: Python ignores SIGXFSZ, and so does the training process).
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest

from kernelformer.training import metrics as metrics_lib
from kernelformer.training import record as record_lib
from kernelformer.training import trainer
from kernelformer.training import workdir as workdir_lib
from tests.training import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FULL = '/dev/full'


def one_line(e):
  text = str(e.value)
  assert '\n' not in text and 'Traceback' not in text, text
  return text


def test_metrics_event_on_a_full_disk(tmp_path):
  os.symlink(FULL, tmp_path / 'metrics.jsonl')
  writer = metrics_lib.MetricsWriter(str(tmp_path))
  with pytest.raises(workdir_lib.RunError) as e:
    writer.write('train', 1, {'loss': 1.0})
  assert f'could not write {tmp_path / "metrics.jsonl"} (No space left on device)' in one_line(e)
  writer.close()   # closing after a failed write raises nothing more


@pytest.mark.parametrize('name', ['results.json', 'config.json'])
def test_results_and_config_on_a_full_disk_keep_the_earlier_file(tmp_path, name):
  (tmp_path / name).write_text('{"earlier": 1}')
  os.symlink(FULL, tmp_path / f'{name}.tmp-{os.getpid()}')   # the temporary file it writes first
  writer = metrics_lib.MetricsWriter(str(tmp_path))
  with pytest.raises(workdir_lib.RunError) as e:
    if name == 'results.json':
      writer.write_results({'test_accuracy': 0.5})
    else:
      writer.write_config(helpers.tiny_config(tmp_path / 'data'))
  assert f'could not write {tmp_path / name} (No space left on device)' in one_line(e)
  assert (tmp_path / name).read_text() == '{"earlier": 1}'
  assert not os.path.lexists(tmp_path / f'{name}.tmp-{os.getpid()}')
  writer.close()


def test_run_record_and_lock_on_a_full_disk(tmp_path):
  record = record_lib.RunRecord(str(tmp_path))
  os.symlink(FULL, tmp_path / f'run.json.tmp-{os.getpid()}')
  with pytest.raises(workdir_lib.RunError) as e:
    record.write(helpers.tiny_config(tmp_path / 'data'), [], 0)
  assert f'could not write {tmp_path / "run.json"} (No space left on device)' in one_line(e)
  assert not os.path.lexists(tmp_path / 'run.json')
  os.symlink(FULL, tmp_path / f'lock.{os.getpid()}.tmp')
  with pytest.raises(workdir_lib.RunError) as e:
    workdir_lib.WorkdirLock(str(tmp_path)).acquire()
  assert f'could not write {tmp_path / "lock"} (No space left on device)' in one_line(e)
  assert not os.path.lexists(tmp_path / 'lock')


def test_metrics_reader_is_bounded(tmp_path):
  """A line longer than the bound (a runaway write) is dropped without being held; the rest is kept."""
  good = [json.dumps({'split': 'train', 'step': s, 'loss': 1.0}) + '\n' for s in (1, 2, 3)]
  with open(tmp_path / 'metrics.jsonl', 'w') as f:
    f.write(good[0])
    f.write('x' * (3 * workdir_lib.MAX_METRICS_LINE))      # no newline for 3 MiB
    f.write('\n' + good[1] + good[2])
  assert workdir_lib.truncate_metrics(str(tmp_path), 2) == 2  # the long line and step 3
  assert (tmp_path / 'metrics.jsonl').read_text() == good[0] + good[1]
  # A link to a device is refused before it is read (reading /dev/zero never ends).
  os.remove(tmp_path / 'metrics.jsonl')
  os.symlink('/dev/zero', tmp_path / 'metrics.jsonl')
  with pytest.raises(workdir_lib.RunError, match='is a character device'):
    workdir_lib.truncate_metrics(str(tmp_path), 2)


def test_results_on_a_full_disk_at_the_end_of_a_run_then_the_same_command_finishes(tmp_path,
                                                                                  monkeypatch):
  workdir = tmp_path / 'run'
  real = record_lib.new_record

  @contextlib.contextmanager
  def full_disk(path):   # results.json's temporary file, where the run's record is staged
    with real(path) as staged:
      os.symlink(FULL, os.path.join(staged, f'results.json.tmp-{os.getpid()}'))
      yield staged

  monkeypatch.setattr(record_lib, 'new_record', full_disk)
  c = helpers.tiny_config(tmp_path / 'data')
  with pytest.raises(workdir_lib.RunError) as e:
    trainer.train_and_evaluate(c, str(workdir))
  line = one_line(e)
  assert f'could not write {workdir / "record.tmp" / "results.json"} (No space left on device)' in line
  assert f'the last checkpoint on disk is step {c.num_train_steps}' in line
  assert not (workdir / 'results.json').exists() and not (workdir / 'lock').exists()
  assert not os.path.lexists(workdir / 'record.tmp')   # the staged record went; the disk has room:
  monkeypatch.undo()
  results = trainer.train_and_evaluate(c, str(workdir))   # the final checkpoint is tested
  assert results.status == 'reevaluated' or results['final_step'] == c.num_train_steps
  assert json.loads((workdir / 'results.json').read_text())['test_accuracy'] == results['test_accuracy']


def _with_fsize_limit(limit, argv):
  """``argv`` (a python command) run under RLIMIT_FSIZE ``limit``: set in a small python that then execs
  it (no preexec_fn: forking this multithreaded jax process could deadlock)."""
  setter = ('import os, resource, sys; '
            f'resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); '
            'os.execv(sys.executable, [sys.executable, *sys.argv[1:]])')
  return [sys.executable, '-c', setter, *argv]


def test_file_size_limit_ends_in_one_line(tmp_path):
  """A checkpoint file past ``ulimit -f``: one line (orbax's 100+ lines of its own kept in a log file),
  exit 1, and no other output at all (no 'overriding jax.Array' warning at start)."""
  data = tmp_path / 'data'
  helpers.tiny_config(data)
  p = subprocess.run(_with_fsize_limit(20_000, [
      '-m', 'kernelformer', 'train', '--config', 'listops:tiny', f'--workdir={tmp_path / "run"}',
      f'--config.data.data_dir={data}', '--config.progress=False']),
                     capture_output=True, text=True, cwd=ROOT,
                     # without the suite's compilation cache (tests/conftest.py), whose writes the
                     # limit would also refuse, each with a warning of jax's
                     env={**os.environ, 'PYTHONPATH': ROOT, 'JAX_ENABLE_COMPILATION_CACHE': 'false'},
                     timeout=300)
  assert p.returncode == 1, p.stderr[-3000:]
  lines = p.stderr.strip().splitlines()
  assert len(lines) == 1, p.stderr[-5000:]
  assert 'could not write checkpoint' in lines[0] and 'File too large' in lines[0], lines[0]
  log = lines[0].rsplit("orbax's log: ", 1)[1]
  assert os.path.getsize(log) > 0   # what orbax printed is kept, not lost
  os.remove(log)
  assert not [n for n in os.listdir(tmp_path / 'run' / 'best') if not n.isdigit()]   # no temp dirs


def test_checkpoint_module_prints_no_override_warning():
  p = subprocess.run([sys.executable, '-c', 'from kernelformer.training import checkpoint'],
                     capture_output=True, text=True, cwd=ROOT, env={**os.environ, 'PYTHONPATH': ROOT},
                     timeout=120)
  assert p.returncode == 0, p.stderr
  assert 'overriding' not in p.stderr and 'type_handler_registry' not in p.stderr, p.stderr


def test_tensorboard_events_on_a_full_disk(tmp_path):
  """Events are written in the caller's thread: a full disk is one line, not a dead background thread
  (whose full queue would then block the run)."""
  writer = metrics_lib.MetricsWriter(str(tmp_path))
  writer.write('train', 1, {'loss': 1.0})
  events = [n for n in os.listdir(tmp_path / 'tensorboard') if n.startswith('events.out.tfevents.')]
  assert len(events) == 1 and os.path.getsize(tmp_path / 'tensorboard' / events[0]) > 0
  # The disk fills: the event file's writes now fail.
  path = tmp_path / 'tensorboard' / events[0]
  writer._tb._py_recordio_writer._writer = open(FULL, 'wb')  # pylint: disable=protected-access
  with pytest.raises(workdir_lib.RunError) as e:
    writer.write('train', 2, {'loss': 1.0})
  assert f'could not write {path} (No space left on device)' in one_line(e)
  writer.close()
