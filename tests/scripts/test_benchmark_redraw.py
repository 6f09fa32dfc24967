"""``kernelformer benchmark redraw``: a trained run's accuracy under its own draws and under others.

A tiny ListOps run with FAVOR+ redrawn every 2 steps trains 6 steps. Its checkpoint evaluated with
the trained draws must give the run's own validation numbers (evaluation uses the last training
step's draws) and the numbers of the draws of step 5 (the same window); the draws of step 0 give
other numbers. The directory is only read: nothing in it changes.
"""
from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from kernelformer import cli
from kernelformer.bench import redraw
from kernelformer.training import trainer
from tests.training import helpers

STEPS = 6


def _tree(path):
  return sorted((os.path.relpath(os.path.join(d, f), path), os.path.getsize(os.path.join(d, f)))
                for d, _, files in os.walk(path) for f in files)


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('redraw')
  config = helpers.tiny_config(tmp / 'data', num_train_steps=STEPS, eval_every=STEPS,
                               checkpoint_every=STEPS, max_eval_batches=0,
                               **{'model.attention.kind': 'posrf-orf',
                                  'model.attention.num_features': 8,
                                  'model.attention.redraw_every': 2})
  workdir = str(tmp / 'run')
  trainer.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
  return workdir


def test_trained_draws_give_the_runs_validation_and_other_draws_differ(run):
  before = _tree(run)
  with open(os.path.join(run, 'metrics.jsonl')) as f:
    val = [e for e in map(json.loads, f) if e['split'] == 'val' and e['step'] == STEPS][-1]
  step, rows = redraw.accuracy_by_draw(run, [STEPS - 1, 0], checkpoint='latest')
  assert step == STEPS
  trained, same_window, first = rows
  assert trained.draw == 'trained' and trained.examples == val['examples']
  np.testing.assert_allclose(trained.loss, val['loss'], rtol=1e-5)
  assert trained.accuracy == pytest.approx(val['accuracy'])
  np.testing.assert_allclose(same_window.loss, trained.loss, rtol=1e-5)
  assert abs(first.loss - trained.loss) > 1e-4          # another W: another model
  assert _tree(run) == before                             # read only


def test_command_prints_the_table_and_refuses_bad_input_in_one_line(run, tmp_path, capsys, caplog):
  out = str(tmp_path / 'table.md')
  assert cli.main(['benchmark', 'redraw', '--workdir', run, '--checkpoint', str(STEPS),
                   '--draw_steps', '0', '--out', out]) == 0
  with open(out) as f:
    table = f.read()
  assert "the checkpoint's last training step" in table and '| step 0 |' in table
  capsys.readouterr()
  # orbax's notices of the read-only open are silenced (the reader asked for it)
  assert not [r for r in caplog.records if 'read only' in r.getMessage().lower().replace('_', ' ')]
  for argv in (['--workdir', str(tmp_path)], ['--workdir', run, '--checkpoint', '999'],
               ['--workdir', run, '--draw_steps', 'x']):
    assert cli.main(['benchmark', 'redraw', *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'Traceback' not in err, err
