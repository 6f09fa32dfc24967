"""The training loop never waits for the host between boundaries."""
from __future__ import annotations

import contextlib
import json

import jax._src.array as jax_array
import numpy as np

from kernelformer.training import metrics as metrics_lib
from kernelformer.training import loop as loop_lib
from kernelformer.training import trainer
from tests.training import helpers


@contextlib.contextmanager
def count_device_reads():
  """Counts reads of device arrays into host memory (every float(), np.asarray, device_get goes
  through ``ArrayImpl._value``; cached values are not counted). Transfer guards cannot do this on
  CPU, where a device array already lives in host memory and no transfer is guarded."""
  original = jax_array.ArrayImpl._value
  count = [0]

  def counted(self):
    if self._npy_value is None:
      count[0] += 1
    return original.fget(self)

  jax_array.ArrayImpl._value = property(counted)
  try:
    yield count
  finally:
    jax_array.ArrayImpl._value = original


def test_no_device_read_per_step(tmp_path):
  """Runs of 12 and 24 steps with the same boundaries (one log, validation, checkpoint and test at the
  end) read the device the same number of times: nothing is read per step."""
  reads = {}
  for steps in (12, 24):
    c = helpers.tiny_config(tmp_path / 'data', num_train_steps=steps, log_every=steps,
                            eval_every=steps, checkpoint_every=steps)
    with count_device_reads() as count:
      results = trainer.train_and_evaluate(c, str(tmp_path / f'run{steps}'))
    assert results['final_step'] == steps
    reads[steps] = count[0]
  assert reads[12] > 0, 'the counter sees the boundary reads'
  assert reads[24] == reads[12], reads


def test_logged_means_equal_per_step_values(tmp_path):
  """The window summed on the device gives the mean of the per-step values (log_every=3 vs 1)."""
  events = {}
  for log_every in (1, 3):
    c = helpers.tiny_config(tmp_path / 'data', num_train_steps=6, log_every=log_every)
    trainer.train_and_evaluate(c, str(tmp_path / f'log{log_every}'))
    lines = (tmp_path / f'log{log_every}' / 'metrics.jsonl').read_text().splitlines()
    events[log_every] = [json.loads(l) for l in lines if json.loads(l)['split'] == 'train']
  per_step = {e['step']: e for e in events[1]}
  assert [e['step'] for e in events[3]] == [3, 6]
  for e in events[3]:
    for k in ('loss', 'accuracy', 'grad_norm', 'learning_rate'):
      np.testing.assert_allclose(e[k], np.mean([per_step[s][k] for s in range(e['step'] - 2,
                                                                               e['step'] + 1)]),
                                 rtol=1e-5)


def test_metrics_are_strict_json(tmp_path):
  """Non-finite values are written as null, named in 'nonfinite'."""
  w = metrics_lib.MetricsWriter(str(tmp_path))
  w.write('val', 2, {'loss': float('nan'), 'accuracy': 0.5, 'grad_norm': np.float32('inf')})
  w.write_results({'test_loss': float('nan'), 'config': {'x': float('-inf')}})
  w.close()

  def strict(text):
    return json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))

  event = strict((tmp_path / 'metrics.jsonl').read_text().splitlines()[0])
  assert event['loss'] is None and event['grad_norm'] is None and event['accuracy'] == 0.5
  assert event['nonfinite'] == ['loss', 'grad_norm']
  results = strict((tmp_path / 'results.json').read_text())
  assert results['test_loss'] is None and results['nonfinite'] == ['test_loss', 'config.x']


def test_boundaries_are_the_steps_of_validation_checkpoints_and_the_end(tmp_path):
  """``loop.next_boundary`` (computed once per boundary, not per step) walks exactly the steps that
  validate, checkpoint or end the run."""
  c = helpers.tiny_config(tmp_path / 'data', num_train_steps=22, eval_every=4)
  with c.unlocked():
    c.checkpoint_every = 6
  walked, step = [], 0
  while step < 22:
    step = loop_lib.next_boundary(c, 22, step)
    walked.append(step)
  assert walked == [s for s in range(1, 23) if s % 4 == 0 or s % 6 == 0 or s == 22]
  assert loop_lib.next_boundary(c, 22, 13) == 16 and loop_lib.next_boundary(c, 22, 21) == 22
