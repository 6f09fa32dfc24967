"""Which weights the final test measures (``eval.test_checkpoint``; kernelformer/training/selection.py).

Unit: the rule applied after each validation. Run (tiny ListOps through ``train_and_evaluate``):
'final' tests the last step's weights -- the same numbers as testing a copy of the last checkpoint --
and keeps no best/; 'best_after:<f>' keeps only validations after f of the steps.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

from kernelformer.training import selection
from kernelformer.training import trainer
from tests.training import helpers

START = {'best_val_accuracy': -1.0, 'best_step': -1}


def run_rule(rule, accuracies, num_steps):
  """Applies the rule to validations at steps 1..n; returns (meta, steps saved to best/)."""
  meta, saved = dict(START), []
  for step, acc in enumerate(accuracies, start=1):
    update, keep = selection.on_validation(rule, acc, step, num_steps, meta)
    if update:
      meta.update(update)
    if keep:
      saved.append(step)
  return meta, saved


def test_rules():
  acc = [0.5, 0.9, 0.6, 0.7, 0.95, 0.8, 0.96, 0.1, 0.2, 0.3]
  assert run_rule('best', acc, 10) == ({'best_val_accuracy': 0.96, 'best_step': 7}, [1, 2, 5, 7])
  # 'final' keeps nothing, but still reports the best validation.
  assert run_rule('final', acc, 10) == ({'best_val_accuracy': 0.96, 'best_step': 7}, [])
  # Skyformer: only after 20 % of 10 steps (step > 2); step 2's 0.9 stays the bar to beat.
  meta, saved = run_rule('best_after:0.2', acc, 10)
  assert saved == [5, 7] and meta['best_step'] == 7
  # Nothing after the fraction beats the earlier best: nothing saved, so the final weights are tested.
  meta, saved = run_rule('best_after:0.5', [0.9, 0.1, 0.2, 0.3], 4)
  assert saved == [] and meta == {'best_val_accuracy': 0.9, 'best_step': -1}
  meta, saved = run_rule('best_after:0.5', [0.1, 0.2, 0.3, 0.25], 4)
  assert saved == [3]                                   # step 3 > 2; step 2 is not after half
  assert selection.tests_best('best') and selection.tests_best('best_after:0.2')
  assert not selection.tests_best('final')


@pytest.mark.parametrize('bad', ['last', 'best_after', 'best_after:1', 'best_after:-0.1',
                                 'best_after:x', ''])
def test_bad_rules_fail_in_one_line(bad):
  with pytest.raises(ValueError, match='eval.test_checkpoint') as e:
    selection.parse(bad)
  assert '\n' not in str(e.value)


def numbered(directory):
  return sorted(int(n) for n in os.listdir(directory) if n.isdigit()) if os.path.isdir(directory) else []


def test_final_tests_the_last_steps_weights(tmp_path):
  workdir = tmp_path / 'final'
  c = helpers.tiny_config(tmp_path / 'data', eval_every=2, **{'eval.test_checkpoint': 'final'})
  out = trainer.train_and_evaluate(c, str(workdir))
  last = c.num_train_steps
  assert out['tested_checkpoint'] == {'which': 'final', 'step': last, 'rule': 'final'}
  assert numbered(workdir / 'best') == []               # nothing kept: the test needs no best/
  assert last in numbered(workdir / 'checkpoints')
  # Reference: the last checkpoint copied into best/ of a copy, tested by the 'best' rule.
  ref_dir = tmp_path / 'ref'
  shutil.copytree(workdir, ref_dir)
  shutil.rmtree(ref_dir / 'best', ignore_errors=True)
  os.makedirs(ref_dir / 'best')
  shutil.copytree(workdir / 'checkpoints' / str(last), ref_dir / 'best' / str(last))
  again = helpers.tiny_config(tmp_path / 'data', eval_every=2, reevaluate=True,
                              allow_config_change=True)   # eval.test_checkpoint: final -> best
  ref = trainer.train_and_evaluate(again, str(ref_dir))
  assert ref['tested_checkpoint'] == {'which': 'best', 'step': last, 'rule': 'best'}
  assert (out['test_loss'], out['test_accuracy']) == (ref['test_loss'], ref['test_accuracy'])
  on_disk = json.loads((workdir / 'results.json').read_text())
  assert on_disk['tested_checkpoint'] == out['tested_checkpoint']
  assert on_disk['config']['eval']['test_checkpoint'] == 'final'
  # A best/ holding earlier weights is ignored under 'final' (and tested under 'best').
  earlier = [s for s in numbered(workdir / 'checkpoints') if s < last][-1]
  other = tmp_path / 'other'
  shutil.copytree(ref_dir, other)
  shutil.rmtree(other / 'best')
  os.makedirs(other / 'best')
  shutil.copytree(workdir / 'checkpoints' / str(earlier), other / 'best' / str(earlier))
  final_again = helpers.tiny_config(tmp_path / 'data', eval_every=2, reevaluate=True,
                                    allow_config_change=True, **{'eval.test_checkpoint': 'final'})
  out2 = trainer.train_and_evaluate(final_again, str(other))
  assert out2['tested_checkpoint'] == {'which': 'final', 'step': last, 'rule': 'final'}
  assert (out2['test_loss'], out2['test_accuracy']) == (out['test_loss'], out['test_accuracy'])
  best_again = trainer.train_and_evaluate(again, str(other))
  assert best_again['tested_checkpoint'] == {'which': 'best', 'step': earlier, 'rule': 'best'}
  assert best_again['test_loss'] != out['test_loss']


def test_best_after_keeps_only_validations_after_the_fraction(tmp_path):
  workdir = tmp_path / 'after'
  c = helpers.tiny_config(tmp_path / 'data', eval_every=2, **{'eval.test_checkpoint': 'best_after:0.3'})
  out = trainer.train_and_evaluate(c, str(workdir))
  kept = numbered(workdir / 'best')
  events = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  vals = {e['step']: e['accuracy'] for e in events if e['split'] == 'val'}
  assert sorted(vals) == list(range(2, c.num_train_steps + 1, 2))
  # What the rule keeps, recomputed from the logged validations.
  _, want = run_rule_at(vals, c.num_train_steps, 'best_after:0.3')
  assert want and kept == want[-2:], (vals, kept)   # best/ holds the newest two
  assert all(s > c.num_train_steps * 0.3 for s in kept) and 2 not in kept
  assert out['tested_checkpoint'] == {'which': 'best', 'step': kept[-1], 'rule': 'best_after:0.3'}


def run_rule_at(vals, num_steps, rule):
  meta, saved = dict(START), []
  for step in sorted(vals):
    update, keep = selection.on_validation(rule, vals[step], step, num_steps, meta)
    meta.update(update or {})
    if keep:
      saved.append(step)
  return meta, saved
