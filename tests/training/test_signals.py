"""SIGINT/SIGTERM at random moments (some inside a checkpoint write) and the watchdog, in real processes.

Each interrupted process must exit 130/143 with one line saying how to resume (or, before training
started, the default behaviour), leave a checkpoint that equals the uninterrupted run's state at that
step, and the chain of resumed runs must end with the uninterrupted run's final state, bit for bit.

``KF_SIGNAL_TRIALS=10 KF_SIGNAL_STEPS=120 python -m pytest -q tests/training/test_signals.py -k chain -s`` runs the
10-interruption chain and prints its table (CI runs a shorter chain: each process costs an import and
a compilation).
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest
import orbax.checkpoint as ocp

from kernelformer.training import fingerprint as fp
from kernelformer.training import loop as loop_lib
from kernelformer.training import trainer
from tests.training import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = os.path.join(ROOT, 'tests', 'training', 'signal_driver.py')
STEPS = int(os.environ.get('KF_SIGNAL_STEPS', '40'))
OVERRIDES = {'num_train_steps': STEPS, 'checkpoint_every': 8, 'eval_every': 8, 'log_every': 1,
             'keep_checkpoints': 10, 'model.attention.kind': 'posrf-orf',
             'model.attention.redraw_every': 4}
SAVE_SLEEP_S = 0.4


class Proc:
  """A driver process whose stdout ``step N`` lines are collected by a thread."""

  def __init__(self, workdir, data_dir, *extra, env=None, prefix=()):
    args = [f'--config.{k}={v!r}' for k, v in OVERRIDES.items()]
    self.p = subprocess.Popen([*prefix, sys.executable, DRIVER, str(workdir), str(data_dir), *args,
                               *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, **(env or {})})
    self.steps: list[int] = []
    self.out: list[str] = []
    self._t = threading.Thread(target=self._read, daemon=True)
    self._t.start()

  def _read(self):
    for line in self.p.stdout:
      self.out.append(line)
      if line.startswith('step '):
        self.steps.append(int(line.split()[1]))

  def wait(self, timeout=240):
    rc = self.p.wait(timeout=timeout)
    self._t.join(5)
    self.stderr = self.p.stderr.read()
    return rc


def last_line(text):
  lines = [l for l in text.strip().splitlines() if l.strip()]
  return lines[-1] if lines else ''


def numbered(directory):
  return sorted(int(n) for n in os.listdir(directory) if n.isdigit()) if os.path.isdir(directory) else []


def restore_state(path):
  return jax.tree.leaves(ocp.StandardCheckpointer().restore(os.path.join(path, 'state')))


def reference(tmp_path):
  """The uninterrupted run in this process: the state digest after every step, and its workdir."""
  config = helpers.tiny_config(tmp_path / 'data', **OVERRIDES)
  digests = {}
  trainer.train_and_evaluate(config, str(tmp_path / 'reference'),
                             hooks=[lambda step, state: digests.__setitem__(step, fp.tree_digest(state))])
  return digests


def interrupt(proc, workdir, rng, sig, moment):
  """Sends ``sig`` at ``moment``; returns the step the process had reported when the signal went."""
  ckpt = os.path.join(workdir, 'checkpoints')
  deadline = time.time() + 180
  if moment == 'early':           # while importing / restoring / compiling / the first steps
    time.sleep(rng.uniform(0.5, 6.0))
  elif moment == 'step':          # a random number of steps into this segment
    target = rng.randint(1, 12)
    start = len(proc.steps)
    while len(proc.steps) < start + target and proc.p.poll() is None and time.time() < deadline:
      time.sleep(0.005)
  else:                           # 'save', 'save-twice': inside a checkpoint write
    before = set(numbered(ckpt))
    while proc.p.poll() is None and time.time() < deadline and not (set(numbered(ckpt)) - before):
      time.sleep(0.005)
  at = proc.steps[-1] if proc.steps else 0
  if proc.p.poll() is None:
    proc.p.send_signal(sig)
    if moment == 'save-twice':
      time.sleep(SAVE_SLEEP_S / 4)
      if proc.p.poll() is None:
        proc.p.send_signal(sig)
  return at


def run_chain(tmp_path, trials, seed):
  digests = reference(tmp_path)
  rng = random.Random(seed)
  workdir = tmp_path / 'chain'
  env = {'KERNELFORMER_TEST_SLOW_SAVE_S': str(SAVE_SLEEP_S)}
  table = []
  moments = ['step', 'save', 'save-twice', 'early']
  for i in range(trials):
    sig = (signal.SIGINT, signal.SIGTERM)[i % 2] if trials > 1 else rng.choice(
        (signal.SIGINT, signal.SIGTERM))
    moment = moments[i % len(moments)] if i < len(moments) else rng.choice(moments)
    proc = Proc(workdir, tmp_path / 'data', '--step_sleep', '0.03', env=env)
    at = interrupt(proc, str(workdir), rng, sig, moment)
    rc = proc.wait()
    line = last_line(proc.stderr)
    assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    assert rc in (0, 130, 143, -signal.SIGTERM), (rc, proc.stderr[-2000:])
    ckpt = str(workdir / 'checkpoints')
    if rc in (130, 143):
      assert rc == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig]
      assert 'resume' in line, line
      if 'checkpoint saved at step' in line:   # the state of the step in flight was saved
        assert numbered(ckpt)[-1] == int(line.split('checkpoint saved at step ')[1].split(';')[0])
        assert numbered(ckpt)[-1] >= at
    assert not [n for n in os.listdir(ckpt) if not n.isdigit()], os.listdir(ckpt)  # no temp dirs
    latest = numbered(ckpt)[-1] if numbered(ckpt) else 0
    equal = True
    if latest:
      meta = json.loads((workdir / 'checkpoints' / str(latest) / 'meta' / 'metadata').read_text())
      equal = meta['state_sha256'] == digests[latest]
    table.append((sig.name, moment, at, rc, latest, equal))
  proc = Proc(workdir, tmp_path / 'data', env=env)
  assert proc.wait() == 0, proc.stderr[-3000:]
  final = restore_state(str(workdir / 'checkpoints' / str(STEPS)))
  ref = restore_state(str(tmp_path / 'reference' / 'checkpoints' / str(STEPS)))
  final_equal = len(final) == len(ref) and all(
      np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(final, ref))
  events = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  keys = [(e['split'], e['step']) for e in events]
  print('\nsignal   moment      step-at-signal  exit  checkpoint  checkpoint-equals-uninterrupted')
  for row in table:
    print('{:8} {:11} {:>14} {:>5} {:>11}  {}'.format(*row[:5], 'yes' if row[5] else 'NO'))
  print(f'final parameters bitwise equal to the uninterrupted run: {"yes" if final_equal else "NO"}')
  return table, final_equal, keys


def test_random_interruption_chain_resumes_bitwise(tmp_path):
  trials = int(os.environ.get('KF_SIGNAL_TRIALS', '3'))
  table, final_equal, keys = run_chain(tmp_path, trials, seed=int(os.environ.get('KF_SIGNAL_SEED',
                                                                                 '0')))
  assert all(row[5] for row in table), table
  assert final_equal
  assert any(row[3] in (130, 143) and row[1].startswith('save') for row in table), table
  assert len(keys) == len(set(keys)), 'metrics.jsonl repeats events after a resume'
  assert sorted(s for split, s in keys if split == 'train') == list(range(1, STEPS + 1))


def test_watchdog_stops_a_hung_step(tmp_path):
  workdir = tmp_path / 'run'
  t0 = time.time()
  proc = Proc(workdir, tmp_path / 'data', '--hang_at', '5', '--config.watchdog_step_s=3.0',
              '--config.watchdog_compile_s=600.0')
  rc = proc.wait(timeout=200)
  elapsed = time.time() - t0
  line = last_line(proc.stderr)
  assert rc == 4, (rc, proc.stderr[-2000:])
  # The hung step is named, or the steps in flight when the host waited (on a backend that runs
  # steps asynchronously the host waits for an earlier step while the hung one is queued).
  named = re.search(r'training steps? (\d+)(?:-(\d+))?', line)
  assert 'watchdog' in line and named, line
  assert int(named.group(1)) <= 5 <= int(named.group(2) or named.group(1)), line
  assert 'Traceback' not in proc.stderr
  # Hooks run as each step is dispatched; at most MAX_IN_FLIGHT steps are queued past the hung one.
  assert 4 <= proc.steps[-1] <= 4 + loop_lib.MAX_IN_FLIGHT
  assert numbered(workdir / 'checkpoints') == []            # checkpoint_every=8: nothing new was saved
  assert not (workdir / 'lock').exists()                     # released on the way out
  assert elapsed < 120


# ----------------------------------------------------------------------------------------------
# A second Ctrl-C at every moment: at once, one line, no segfault, and the line
# names only a checkpoint that exists.


def wait_for(predicate, proc, timeout=180):
  deadline = time.time() + timeout
  while not predicate() and proc.p.poll() is None and time.time() < deadline:
    time.sleep(0.005)
  assert proc.p.poll() is None, (proc.p.returncode, proc.p.stderr.read()[-2000:])


WATCHDOG_PROGRESS = """
import sys, time
from kernelformer.training import signals
w = signals.Watchdog()
t0, steps = time.monotonic(), [0]
def progress():   # a step finishes every 0.1 s for the first 2 s, then none
  return min(int((time.monotonic() - t0) / 0.1), 20)
w.arm(lambda: f'training step {progress() + 1}', 0.5, progress)
time.sleep(10)
print('not stopped', flush=True)
"""


def test_watchdog_restarts_its_deadline_while_steps_finish():
  """A host waiting for several queued steps arms the watchdog once (``Loop.wait``): the limit applies
  per finished step (the progress probe), and the text is made when it fires."""
  t0 = time.monotonic()
  proc = subprocess.run([sys.executable, '-c', WATCHDOG_PROGRESS], capture_output=True, text=True,
                        timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                            os.path.abspath(__file__)))))
  elapsed = time.monotonic() - t0
  assert proc.returncode == 4, proc.stderr[-2000:]
  assert 'no progress for 0.5 s while training step 21;' in proc.stderr, proc.stderr[-2000:]
  assert 'not stopped' not in proc.stdout
  assert elapsed > 2.4, elapsed   # not before the last step + 0.5 s (a 0.5 s limit from arm: ~0.5 s)


WATCHDOG_PAUSED = """
import sys, time
from kernelformer.training import signals
w = signals.Watchdog()
w.arm('training step 1', float(sys.argv[1]))
print('armed', flush=True)
t = time.monotonic()
while time.monotonic() - t < float(sys.argv[2]) + 1.0:   # a step that outlasts the stop by 1 s
  time.sleep(0.01)
w.disarm()
w.close()
print('finished', flush=True)
"""


@pytest.mark.parametrize('stop_s,limit_s', [(5, 3), (12, 2)])
def test_a_stopped_process_is_not_hung(stop_s, limit_s):
  """SIGSTOP for longer than the limit in the middle of a step: when the process continues the
  step finishes and the watchdog does not fire (the stopped time does not count, whatever its length;
  a hung step never stops the watchdog's own thread: test_watchdog_stops_a_hung_step)."""
  p = subprocess.Popen([sys.executable, '-c', WATCHDOG_PAUSED, str(limit_s), str(stop_s)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
  assert p.stdout.readline() == 'armed\n'
  time.sleep(0.3)
  p.send_signal(signal.SIGSTOP)
  time.sleep(stop_s)
  p.send_signal(signal.SIGCONT)
  out, err = p.communicate(timeout=60)
  assert p.returncode == 0 and out == 'finished\n', (p.returncode, err[-2000:])


# A sitecustomize for the child below: the first ``import jax`` writes a marker and then takes 60 s, so
# the test signals a process that is certainly importing jax (a fixed sleep was before jax on a loaded
# machine and past it, in data preparation, on a quiet one).
SLOW_JAX_IMPORT = """
import importlib.abc, os, sys, time
class _SlowJax(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name == 'jax':
      sys.meta_path.remove(self)
      open(os.environ['KF_TEST_JAX_MARKER'], 'w').close()
      time.sleep(60)
    return None
sys.meta_path.insert(0, _SlowJax())
"""


def test_second_sigint_while_jax_imports_exits_at_once(tmp_path):
  workdir = tmp_path / 'run'
  hook, marker = tmp_path / 'hook', tmp_path / 'importing-jax'
  hook.mkdir()
  (hook / 'sitecustomize.py').write_text(SLOW_JAX_IMPORT)
  p = subprocess.Popen([sys.executable, '-m', 'kernelformer', 'train', '--config', 'listops:tiny',
                        f'--workdir={workdir}', f'--config.data.data_dir={tmp_path / "data"}'],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                       env={**os.environ, 'PYTHONPATH': f'{hook}{os.pathsep}{ROOT}',
                            'KF_TEST_JAX_MARKER': str(marker)})
  deadline = time.monotonic() + 60
  while not marker.exists() and p.poll() is None and time.monotonic() < deadline:
    time.sleep(0.02)
  assert marker.exists() and p.poll() is None, 'the child never started importing jax'
  for _ in range(2):
    p.send_signal(signal.SIGINT)
    time.sleep(0.1)
  _, err = p.communicate(timeout=60)
  assert p.returncode == 130, (p.returncode, err[-2000:])
  assert 'Traceback' not in err and len(err.strip().splitlines()) == 1, err
  assert 'interrupted before training: nothing was written' in err
  assert not workdir.exists()


def test_second_sigint_while_compiling_exits_at_once_naming_no_checkpoint(tmp_path):
  workdir = tmp_path / 'run'
  # A real compilation to interrupt: not a load from the suite's compilation cache (tests/conftest.py).
  proc = Proc(workdir, tmp_path / 'data', env={'JAX_ENABLE_COMPILATION_CACHE': 'false'})
  wait_for(lambda: 'compiling\n' in proc.out, proc)
  proc.p.send_signal(signal.SIGINT)
  time.sleep(0.1)
  t0 = time.time()
  proc.p.send_signal(signal.SIGINT)
  rc = proc.wait(timeout=120)
  elapsed = time.time() - t0
  line = last_line(proc.stderr)
  assert rc == 130, (rc, proc.stderr[-3000:])
  assert 'Traceback' not in proc.stderr and 'Fatal Python error' not in proc.stderr, proc.stderr[-3000:]
  assert 'SIGINT again: stopped at once' in line and f'no checkpoint in {workdir} yet' in line, line
  assert proc.steps == [] and numbered(workdir / 'checkpoints') == []
  assert not (workdir / 'lock').exists()
  assert elapsed < 5, elapsed     # not after the compilation, not after interpreter shutdown


def test_second_sigint_during_a_checkpoint_write_stops_once_it_is_complete(tmp_path):
  workdir = tmp_path / 'run'
  proc = Proc(workdir, tmp_path / 'data', env={'KERNELFORMER_TEST_SLOW_SAVE_S': '1.5'})
  ckpt = workdir / 'checkpoints'
  wait_for(lambda: numbered(ckpt), proc)   # checkpoints/8 renamed into place; the write not yet over
  proc.p.send_signal(signal.SIGINT)
  time.sleep(0.1)
  proc.p.send_signal(signal.SIGINT)
  rc = proc.wait(timeout=120)
  line = last_line(proc.stderr)
  assert rc == 130, (rc, proc.stderr[-3000:])
  assert 'Traceback' not in proc.stderr
  assert 'SIGINT again: stopped at once after completing the checkpoint being written' in line, line
  assert f'the last checkpoint on disk is step 8 ({ckpt / "8"})' in line, line
  assert 9 not in proc.steps                        # stopped right after the write, before step 9
  assert numbered(ckpt) == [8] and os.listdir(ckpt) == ['8']
  assert len(restore_state(str(ckpt / '8'))) > 0    # complete: it restores
  assert not (workdir / 'lock').exists()


@pytest.mark.skipif(shutil.which('timeout') is None, reason='needs GNU coreutils timeout')
def test_a_run_stopped_by_gnu_timeout_saves_its_checkpoint(tmp_path):
  """``timeout -s INT`` signals the command and then its process group: one request, delivered twice
  within microseconds, must stop the run after its checkpoint, not as a second Ctrl-C."""
  workdir = tmp_path / 'run'
  proc = Proc(workdir, tmp_path / 'data', '--step_sleep', '0.03', prefix=('timeout', '-s', 'INT', '600'))
  wait_for(lambda: len(proc.steps) >= 3, proc)
  proc.p.send_signal(signal.SIGINT)   # to timeout itself: it forwards as when its time is up
  rc = proc.wait(timeout=120)
  line = last_line(proc.stderr)
  assert rc == 130, (rc, proc.stderr[-3000:])
  assert 'SIGINT again' not in proc.stderr, proc.stderr[-3000:]
  assert 'checkpoint saved at step' in line, line
  saved = int(line.split('checkpoint saved at step ')[1].split(';')[0])
  assert numbered(workdir / 'checkpoints')[-1] == saved >= 3


def test_a_signal_repeated_within_the_window_is_one_request():
  """The reader thread's rule, deterministic (the kernel merges the two deliveries of ``timeout`` when
  the first is still pending, so the process test above sees both only some of the time)."""
  from kernelformer.training import signals   # pylint: disable=import-outside-toplevel
  seen = []

  class Reader(signals._Reader):  # pylint: disable=protected-access
    def _dispatch(self, signum):
      seen.append(signum)

  r, w = os.pipe()
  thread = threading.Thread(target=Reader()._read, args=(r,), daemon=True)  # pylint: disable=protected-access
  thread.start()
  os.write(w, bytes([signal.SIGINT, signal.SIGINT]))        # one read: the same delivery twice
  time.sleep(0.2)
  os.write(w, bytes([signal.SIGINT]))                        # later: a second request
  os.write(w, bytes([signal.SIGINT, signal.SIGTERM]))        # within the window of the one before
  time.sleep(0.2)
  os.write(w, bytes([0]))                                    # ends the reader
  thread.join(5)
  os.close(r)
  os.close(w)
  assert seen == [signal.SIGINT, signal.SIGINT, signal.SIGTERM]


AFTER_THE_RESULT = """
import atexit, runpy, sys, time
atexit.register(time.sleep, 3)   # the process is still exiting when the signal comes
sys.argv = ['kernelformer', 'train', '--config', 'configs/listops.py:tiny', *sys.argv[1:]]
runpy.run_module('kernelformer', run_name='__main__')
"""


def test_a_sigint_after_the_result_line_exits_0(tmp_path):
  """The run is done once its result is printed: a Ctrl-C while the process exits loses nothing and
  ends it with 0."""
  p = subprocess.Popen([sys.executable, '-c', AFTER_THE_RESULT, '--workdir', str(tmp_path / 'run'),
                        '--config.progress=False', f'--config.data.data_dir={tmp_path / "data"}'],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
  for line in p.stdout:
    if line.startswith('test accuracy'):
      break
  p.send_signal(signal.SIGINT)
  out, err = p.communicate(timeout=60)
  assert p.returncode == 0, (p.returncode, err[-2000:])
  assert 'Traceback' not in err and 'KeyboardInterrupt' not in err, err[-2000:]
