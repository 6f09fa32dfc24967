"""``train_and_evaluate`` end to end on every non-ListOps task's tiny preset and fixture data.

Text and Image run on ``tfds.testing.mock_data``; Retrieval and Pathfinder on files written in the LRA
release format by ``lra_tasks.fixtures``. Each task runs with softmax and with one random-feature kernel
(positive random features, orthogonal projection), a few steps of a one-layer model on one device.
"""
from __future__ import annotations

import contextlib
import json

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from configs import image as image_config
from configs import pathfinder as pathfinder_config
from configs import retrieval as retrieval_config
from configs import text as text_config
from kernelformer.training import trainer
from lra_tasks import fixtures

CONFIGS = {'text': text_config, 'retrieval': retrieval_config, 'image': image_config,
           'pathfinder': pathfinder_config}
MOCK_EXAMPLES = 16


def prepare(task, root):
  """Writes (or mocks) the task's data under ``root``; returns (context manager, test split size)."""
  if task in ('text', 'image'):
    return tfds.testing.mock_data(num_examples=MOCK_EXAMPLES), MOCK_EXAMPLES
  if task == 'retrieval':
    fixtures.write_retrieval_fixture(root, n_per_split=8, seed=0)
    return contextlib.nullcontext(), 8
  written = fixtures.write_pathfinder_fixture(root, 32, 'hard', n_images=22, seed=0)
  n = len(written.labels)
  return contextlib.nullcontext(), n - int(n * 0.9)


@pytest.mark.parametrize('kind', ['softmax', 'posrf-orf'])
@pytest.mark.parametrize('task', sorted(CONFIGS))
def test_train_and_evaluate_on_fixtures(tmp_path, task, kind):
  c = CONFIGS[task].get_config('tiny')
  c.data.data_dir = str(tmp_path / 'data')
  if 'tfds_check' in c.data:
    c.data.tfds_check = False
  c.model.attention.kind = kind
  c.progress = False
  # Two steps, one validation and one checkpoint: compilation is the cost, not the steps.
  c.num_train_steps = c.eval_every = c.checkpoint_every = c.log_every = 2
  context, test_size = prepare(task, str(tmp_path / 'data'))
  with context:
    results = trainer.train_and_evaluate(c, str(tmp_path / 'run'), devices=jax.devices()[:1])
  assert results['task'] == task and results['attention'] == kind
  assert results['final_step'] == c.num_train_steps
  assert results['test_examples'] == test_size
  assert 0.0 <= results['test_accuracy'] <= 1.0 and np.isfinite(results['test_loss'])
  assert results['best_step'] > 0 and results['num_params'] > 0
  events = [json.loads(line) for line in (tmp_path / 'run' / 'metrics.jsonl').read_text().splitlines()]
  assert {e['split'] for e in events} == {'train', 'val', 'test'}
  assert all(np.isfinite(e['loss']) for e in events)
