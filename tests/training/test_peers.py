"""A multi-process run whose peer dies stops within seconds with one line.

Unit tests drive ``PeerMonitor`` with a fake key-value client; the end-to-end test runs two real
processes joined by ``cli.maybe_initialize_distributed`` (as scripts/train.py joins them), kills
process 1 in the middle of training and expects process 0 to exit with ``EXIT_PEER_LOST`` and one
line naming process 1, long before JAX's own heartbeat timeout (100 s).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import lra_tasks
from configs import listops
from kernelformer.training import peers
from tests import procs
from tests.training.test_multihost import ROOT, free_port


class FakeStore:
  """The coordination service's key-value store as seen by one process."""

  def __init__(self, shared):
    self.shared = shared
    self.fail = False

  def key_value_set(self, key, value, allow_overwrite=False):
    if self.fail:
      raise RuntimeError('UNAVAILABLE: coordinator unreachable')
    self.shared[key] = value

  def key_value_try_get(self, key):
    if self.fail:
      raise RuntimeError('UNAVAILABLE: coordinator unreachable')
    if key not in self.shared:
      raise KeyError(key)
    return self.shared[key]


def _monitor(index, count, store, lines, **kw):
  client = {'c': store}
  m = peers.PeerMonitor(index, count, timeout_s=0.3, interval_s=0.02, on_lost=lines.append,
                        client_fn=lambda: client['c'], **kw)
  return m, client


def test_a_silent_peer_is_named_and_a_live_one_is_not():
  shared, lines0, lines1 = {}, [], []
  m0, _ = _monitor(0, 2, FakeStore(shared), lines0)
  m1, _ = _monitor(1, 2, FakeStore(shared), lines1)
  m0.start(), m1.start()
  time.sleep(0.8)
  assert lines0 == [] and lines1 == []           # both beating: nobody is lost
  m1.stop()                                      # process 1 goes silent (died)
  deadline = time.time() + 3
  while not lines0 and time.time() < deadline:
    time.sleep(0.02)
  m0.stop()
  assert len(lines0) == 1 and 'process 1 of 2 stopped responding' in lines0[0]


def test_lost_coordinator_and_clean_shutdown():
  shared, lines = {}, []
  store = FakeStore(shared)
  m, _ = _monitor(1, 2, store, lines)
  # The peer beats from another thread so only the coordinator can be the problem.
  stop = threading.Event()

  def peer():
    n = 0
    while not stop.wait(0.02):
      n += 1
      shared[peers._KEY.format(0)] = str(n)  # pylint: disable=protected-access
  threading.Thread(target=peer, daemon=True).start()
  m.start()
  time.sleep(0.3)
  store.fail = True
  deadline = time.time() + 3
  while not lines and time.time() < deadline:
    time.sleep(0.02)
  stop.set()
  assert len(lines) == 1 and 'lost contact with the coordinator' in lines[0]
  # After jax.distributed.shutdown() the client is None: the thread ends without a word.
  lines2 = []
  m2, client = _monitor(1, 2, FakeStore({}), lines2)
  m2.start()
  client['c'] = None
  time.sleep(0.6)
  assert lines2 == []


def _launch(args, log):
  env = procs.env(1, PYTHONPATH=ROOT)
  return subprocess.Popen([sys.executable, '-m', 'kernelformer', 'train', *map(str, args)], env=env,
                          cwd=ROOT, stdout=open(log, 'w'), stderr=subprocess.STDOUT)


def _train_events(workdir):
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return []
  with open(path, encoding='utf-8') as f:
    return [json.loads(l) for l in f if '"train"' in l]


def test_a_killed_process_stops_the_survivor_within_seconds(tmp_path):
  """Through the real entry point: ``kernelformer train`` x 2, then kill -9 of process 1."""
  data = tmp_path / 'data'
  config = listops.get_config('tiny')
  config.data.data_dir = str(data)
  lra_tasks.get('listops').prepare(config.data)
  port, workdir = free_port(), tmp_path / 'run'
  logs = [tmp_path / f'p{i}.log' for i in range(2)]
  common = ['--config', 'configs/listops.py:tiny', '--workdir', workdir,
            f'--config.data.data_dir={data}', '--config.num_train_steps=100000',
            '--config.log_every=1', '--config.progress=False', '--config.eval_every=100000',
            '--config.checkpoint_every=2', f'--coordinator_address=localhost:{port}',
            '--num_processes=2', '--peer_timeout_s=4']
  procs = [_launch([*common, f'--process_id={i}'], logs[i]) for i in range(2)]
  try:
    deadline = time.time() + 300
    while time.time() < deadline and not any(e['step'] >= 3 for e in _train_events(workdir)):
      assert all(p.poll() is None for p in procs), [open(l).read()[-2000:] for l in logs]
      time.sleep(0.2)
    procs[1].kill()                                    # SIGKILL: no handler, no goodbye
    killed = time.time()
    code = procs[0].wait(timeout=90)
    stopped_after = time.time() - killed
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  log = open(logs[0]).read()
  last = [l for l in log.splitlines() if l.strip()][-1]
  assert code == peers.EXIT_PEER_LOST, log[-3000:]
  assert 'process 1 of 2 stopped responding' in last, log[-3000:]
  assert 'Traceback' not in log, log[-3000:]
  print(f'survivor stopped {stopped_after:.1f} s after the kill')
  assert stopped_after < 30, stopped_after           # JAX alone: ~100 s, then an abort
  assert os.path.isdir(workdir / 'checkpoints')      # the last complete checkpoint is kept
