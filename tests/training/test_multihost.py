"""Multi-host training: two processes on localhost equal one process with two devices (a run, and a
population of two members, one on each process's device, as a pod's slices train a packed sweep).

Two CPU processes, one device each, joined as scripts/train.py joins them (``--coordinator_address``,
``--num_processes``, ``--process_id`` -> ``cli.maybe_initialize_distributed``: gloo collectives), train
the tiny ListOps config; each reads only its half of every global batch (``sharding.local_slice``) and
the halves are assembled with ``jax.make_array_from_process_local_data``. The run is interrupted after
step 4 in both processes and resumed from the step-3 checkpoint, which orbax restores with both processes.
The final parameters must equal those of an uninterrupted single-process run on two devices to float
tolerance, and only process 0 may have written metrics. The driver below is what each process runs.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np

import lra_tasks
from configs import listops
from tests import procs as procs_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 6

DRIVER = r'''
import json, os, sys
mode, workdir, data_dir, out, crash_at = sys.argv[1:6]
import jax
jax.config.update('jax_default_matmul_precision', 'highest')
from absl import flags
from kernelformer.training import cli
cli.define_distributed_flags()
if mode == 'multi':
  # The start-up path of scripts/train.py: its flags, then jax.distributed.initialize (gloo on CPU).
  port, process_id = sys.argv[6], int(sys.argv[7])
  flags.FLAGS([sys.argv[0], f'--coordinator_address=localhost:{port}', '--num_processes=2',
               f'--process_id={process_id}'])
  cli.maybe_initialize_distributed()
else:
  flags.FLAGS.mark_as_parsed()
import numpy as np
from configs import listops
from kernelformer.training import trainer


class Crash(Exception):
  pass


c = listops.get_config('tiny')
c.data.data_dir = data_dir
c.progress = False
c.model.attention.kind = 'posrf-orf'
c.num_train_steps = STEPS
c.eval_every = 3
c.checkpoint_every = 3
c.log_every = 1
seen, final = [], {}


def hook(step, state):
  seen.append(step)
  if step == c.num_train_steps:
    # Replicated parameters: this process's shard is the whole array.
    final.update({jax.tree_util.keystr(path): np.asarray(x.addressable_shards[0].data)
                  for path, x in jax.tree_util.tree_flatten_with_path(state.params)[0]})
  if step == int(crash_at):
    raise Crash()


devices = jax.devices()[:2] if mode == 'single' else None
assert len(jax.devices()) == 2 and len(jax.local_devices()) == (2 if mode == 'single' else 1)
code = 0
try:
  results = trainer.train_and_evaluate(c, workdir, hooks=[hook], devices=devices)
except Crash:
  code = 3
record = {'process_index': jax.process_index(), 'process_count': jax.process_count(), 'seen': seen}
if code == 0:
  record.update({k: results[k] for k in ('test_accuracy', 'num_devices', 'num_processes')})
  if jax.process_index() == 0:
    np.savez(out + '.npz', **final)
with open(f'{out}.{jax.process_index()}.json', 'w') as f:
  json.dump(record, f)
if mode == 'multi':
  jax.distributed.shutdown()
sys.exit(code)
'''.replace('STEPS', str(STEPS))


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def launch(driver, args, devices, log):
  env = procs_lib.env(devices, PYTHONPATH=ROOT)
  return subprocess.Popen([sys.executable, str(driver), *map(str, args)], env=env, cwd=ROOT,
                          stdout=open(log, 'w'), stderr=subprocess.STDOUT)


def wait_all(procs, logs, codes):
  try:
    for p, log, code in zip(procs, logs, codes):
      assert p.wait(timeout=400) == code, f'exit {p.returncode}:\n' + open(log).read()[-3000:]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()


def _setup(tmp_path, driver_text):
  """The driver file and the tiny ListOps data, generated once here: the concurrent runs would
  otherwise both write it."""
  driver = tmp_path / 'driver.py'
  driver.write_text(driver_text)
  config = listops.get_config('tiny')
  config.data.data_dir = str(tmp_path / 'data')
  lra_tasks.get('listops').prepare(config.data)
  return driver, tmp_path / 'data', tmp_path / 'multi', tmp_path / 'single'


def test_two_processes_equal_one_process_with_two_devices(tmp_path):
  driver, data, multi, single = _setup(tmp_path, DRIVER)

  # Leg 1: two processes, interrupted after step 4; meanwhile the single-process reference run.
  port = free_port()
  logs = [tmp_path / f'leg1_p{i}.log' for i in range(2)] + [tmp_path / 'single.log']
  procs = [launch(driver, ['multi', multi, data, tmp_path / 'leg1', 4, port, i], 1, logs[i])
           for i in range(2)]
  procs.append(launch(driver, ['single', single, data, tmp_path / 'single', -1], 2, logs[2]))
  wait_all(procs, logs, [3, 3, 0])
  # Leg 2: both processes resume from the last checkpoint (step 3) and finish.
  port = free_port()
  logs = [tmp_path / f'leg2_p{i}.log' for i in range(2)]
  procs = [launch(driver, ['multi', multi, data, tmp_path / 'leg2', -1, port, i], 1, logs[i])
           for i in range(2)]
  wait_all(procs, logs, [0, 0])

  for i in range(2):
    rec = json.loads((tmp_path / f'leg2.{i}.json').read_text())
    assert rec['process_index'] == i and rec['process_count'] == 2
    assert rec['seen'] == [4, 5, 6]  # resumed after the step-3 checkpoint, not from scratch
    assert rec['num_processes'] == 2 and rec['num_devices'] == 2
  ref = json.loads((tmp_path / 'single.0.json').read_text())
  assert ref['num_processes'] == 1 and ref['num_devices'] == 2 and ref['seen'] == [1, 2, 3, 4, 5, 6]

  a, b = np.load(tmp_path / 'leg2.npz'), np.load(tmp_path / 'single.npz')
  assert sorted(a.files) == sorted(b.files) and len(a.files) > 5
  for name in a.files:
    np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)
  assert json.loads((tmp_path / 'leg2.0.json').read_text())['test_accuracy'] == ref['test_accuracy']

  # Only process 0 wrote: each step after the resume point is logged once, and one results.json.
  events = [json.loads(l) for l in (multi / 'metrics.jsonl').read_text().splitlines()]
  train_steps = [e['step'] for e in events if e['split'] == 'train']
  assert train_steps.count(STEPS) == 1 and train_steps.count(5) == 1
  assert sorted(set(train_steps)) == list(range(1, STEPS + 1))
  assert json.loads((multi / 'results.json').read_text())['num_processes'] == 2


POPULATION_DRIVER = r'''
import json, os, sys
mode, root, data_dir, out, crash_at = sys.argv[1:6]
import jax
jax.config.update('jax_default_matmul_precision', 'highest')
from absl import flags
from kernelformer.training import cli
cli.define_distributed_flags()
if mode == 'multi':
  flags.FLAGS([sys.argv[0], f'--coordinator_address=localhost:{sys.argv[6]}', '--num_processes=2',
               f'--process_id={sys.argv[7]}'])
  cli.maybe_initialize_distributed()
else:
  flags.FLAGS.mark_as_parsed()
from configs import listops
from kernelformer.training import population_run
c = listops.get_config('tiny')
c.data.data_dir, c.progress, c.num_train_steps, c.eval_every, c.checkpoint_every = data_dir, False, 6, 3, 3
c.population = ({'seed': 0}, {'seed': 1, 'optim.learning_rate': 3e-3})


def hook(step, state):
  if step == int(crash_at):
    raise KeyboardInterrupt


try:
  results = population_run.train_population(c, [os.path.join(root, 'm0'), os.path.join(root, 'm1')],
                                            hooks=[hook], devices=jax.devices()[:2])
  code = 0 if [r.status for r in results] == ['trained'] * 2 else 1
except KeyboardInterrupt:
  code = 3
if mode == 'multi':
  jax.distributed.shutdown()
sys.exit(code)
'''


def test_a_population_on_two_processes_equals_one_process_with_two_devices(tmp_path):
  """Each process trains one member; interrupted after step 4 and resumed, each member's results and
  checkpoints (their state digests) equal those of one process training both on two devices."""
  driver, data, multi, single = _setup(tmp_path, POPULATION_DRIVER)
  for crash_at, codes in ((4, [3, 3, 0]), (-1, [0, 0])):
    port = free_port()
    logs = [tmp_path / f'p{i}_{crash_at}.log' for i in range(3)]
    procs = [launch(driver, ['multi', multi, data, tmp_path, crash_at, port, i], 1, logs[i])
             for i in range(2)]
    if len(codes) == 3:
      procs.append(launch(driver, ['single', single, data, tmp_path, -1], 2, logs[2]))
    wait_all(procs, logs[:len(codes)], codes)
  assert all(f'{multi / m}/checkpoints at step 3' in logs[0].read_text() for m in ('m0', 'm1'))
  for member in ('m0', 'm1'):
    got, want = (json.loads((d / member / 'results.json').read_text()) for d in (multi, single))
    assert got['num_processes'] == 2 and want['num_processes'] == 1
    for key in ('test_accuracy', 'test_loss', 'best_step', 'final_step', 'config_fingerprint'):
      assert got[key] == want[key], (member, key)
    for step in (3, 6):
      digest = [json.loads((d / member / 'checkpoints' / str(step) / 'meta' / 'metadata').read_text())
                ['state_sha256'] for d in (multi, single)]
      assert digest[0] == digest[1], (member, step)
