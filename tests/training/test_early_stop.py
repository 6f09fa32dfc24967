"""``early_stop_accuracy``: validation accuracy above it ends the run (Zoology's stopping rule).

A run without the rule gives the validation accuracies; a threshold just below the first rise is then
crossed at a known evaluation, and the run with the rule must stop exactly there, test its best
checkpoint, say so in results.json, and never train past it -- neither when re-run nor when resumed
from its checkpoint without results.json (a crash during the test).
"""
from __future__ import annotations

import json
import os
import shutil

import jax

from configs import mqar
from kernelformer.training import trainer
from tests.training import helpers

STEPS, EVERY = 12, 3


def _config(data_dir, threshold=None):
  c = helpers.tiny_config(data_dir, num_train_steps=STEPS, eval_every=EVERY, checkpoint_every=EVERY)
  if threshold is not None:
    c.unlock()
    c.early_stop_accuracy = threshold
    c.lock()
  return c


def _val(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    events = [json.loads(line) for line in f]
  return [(e['step'], e['accuracy']) for e in events if e['split'] == 'val']


def test_validation_above_the_threshold_ends_the_run_and_it_stays_ended(tmp_path):
  data, one = tmp_path / 'data', jax.devices()[:1]
  full = trainer.train_and_evaluate(_config(data), str(tmp_path / 'full'), devices=one)
  assert full['final_step'] == STEPS and full['stopped_early'] is None
  best, stop, threshold, reached = 0.0, None, None, None
  for step, acc in _val(tmp_path / 'full'):
    if step < STEPS and acc > best:
      stop, threshold, reached = step, (best + acc) / 2, acc   # crossed first here
      break
    best = max(best, acc)
  assert stop is not None, _val(tmp_path / 'full')

  # Equal is not above (zoology/train.py 198-200 @ d88d6f5: ``metrics[...] > threshold``): a threshold
  # equal to the accuracy reached at ``stop`` does not stop there, only at a later, higher one.
  equal = trainer.train_and_evaluate(_config(data, reached), str(tmp_path / 'equal'), devices=one)
  later = [s for s, a in _val(tmp_path / 'full') if s > stop and a > reached and s < STEPS]
  assert equal['final_step'] == (later[0] if later else STEPS), (_val(tmp_path / 'full'), reached)

  run = str(tmp_path / 'stopped')
  res = trainer.train_and_evaluate(_config(data, threshold), run, devices=one)
  assert res['final_step'] == stop and res['steps_trained'] == stop
  assert res['stopped_early']['step'] == stop and res['stopped_early']['threshold'] == threshold
  assert res['stopped_early']['val_accuracy'] > threshold
  assert [s for s, _ in _val(run)] == [s for s, _ in _val(tmp_path / 'full') if s <= stop]
  assert res['tested_checkpoint']['which'] == 'best' and res['tested_checkpoint']['step'] == stop
  assert res['test_accuracy'] == full['test_accuracy'] or full['best_step'] != stop

  again = trainer.train_and_evaluate(_config(data, threshold), run, devices=one)
  assert again.status == 'finished' and again['final_step'] == stop

  # Results lost after the checkpoint at the stop was written: the resumed run tests, trains nothing.
  os.remove(os.path.join(run, 'results.json'))
  resumed = trainer.train_and_evaluate(_config(data, threshold), run, devices=one)
  assert resumed['final_step'] == stop and resumed['stopped_early']['step'] == stop
  assert resumed['test_accuracy'] == res['test_accuracy']

  # A threshold never crossed changes nothing.
  shutil.rmtree(run)
  never = trainer.train_and_evaluate(_config(data, 1.0), run, devices=one)
  assert never['final_step'] == STEPS and never['stopped_early'] is None
  assert never['test_accuracy'] == full['test_accuracy']


def test_zoology_preset_stops_at_zoologys_threshold():
  c = mqar.get_config('zoology')
  assert c.early_stop_accuracy == 0.99 and c.eval_every == 196   # every epoch, as zoology/train.py
  assert mqar.get_config('cpu').early_stop_accuracy == 0.0
