"""Which weights the final test measures: ``config.eval.test_checkpoint``.

* ``'best'``: the checkpoint of the highest validation accuracy over the whole run (kept in ``best/``).
  The default, and what every run did before the field existed.
* ``'final'``: the weights after the last step. LRA's ``train.py`` files test the model in memory at
  the end of training (google-research/long-range-arena lra_benchmarks/listops/train.py 207-211,
  249-254; text_classification/train.py 204-206, 248-253 @ fd1763a; image/train.py 391-400 @ b4f9fed;
  matching/train.py 310-319 @ fd1763a tests at every evaluation, the last of which is the final step).
  Validation still runs and the best validation accuracy and its step are reported, but no ``best/``
  checkpoint is written.
* ``'best_after:<fraction>'``: Skyformer's rule (pkuzengqi/Skyformer src/main.py 155-160 @ cfe8c8c):
  a validation that beats every earlier one -- those before the fraction included -- is saved only
  once more than ``fraction * num_train_steps`` steps are done; the test measures the last one saved,
  or, when none was (no validation after the fraction beat the earlier best), the final weights, as
  Skyformer's ``main`` tests the model in memory when no checkpoint file exists (lines 317-322).

``on_validation`` is the rule the trainer applies after each validation; ``tests_best`` says whether
the test restores ``best/`` at all. results.json records the rule next to the tested checkpoint.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

CHOICES = "'best', 'final' or 'best_after:<fraction>' with 0 <= fraction < 1"


def parse(rule: str) -> tuple[str, float]:
  """``('best', 0.0)``, ``('final', 0.0)`` or ``('best_after', fraction)``; ValueError (one line) else."""
  rule = str(rule)
  if rule in ('best', 'final'):
    return rule, 0.0
  if rule.startswith('best_after:'):
    try:
      fraction = float(rule.split(':', 1)[1])
    except ValueError:
      fraction = -1.0
    if 0.0 <= fraction < 1.0:
      return 'best_after', fraction
  raise ValueError(f'config.eval.test_checkpoint={rule!r} is invalid: must be {CHOICES}')


def tests_best(rule: str) -> bool:
  """Whether the test restores ``best/`` (when it holds a checkpoint) rather than the final weights."""
  return parse(rule)[0] != 'final'


def on_validation(rule: str, accuracy: float, step: int, num_steps: int,
                  meta: Mapping[str, Any]) -> tuple[Optional[dict], bool]:
  """After a validation at ``step``: ``(meta update or None, save best/ now)``.

  ``meta['best_val_accuracy']`` is the highest validation accuracy so far (the bar a validation must
  beat); ``meta['best_step']`` is the step of the checkpoint kept in ``best/`` (under ``'final'``:
  of the best validation, nothing being kept).
  """
  kind, fraction = parse(rule)
  if not accuracy > meta['best_val_accuracy']:
    return None, False
  if kind == 'best':
    return {'best_val_accuracy': accuracy, 'best_step': step}, True
  if kind == 'final':
    return {'best_val_accuracy': accuracy, 'best_step': step}, False
  if step > fraction * num_steps:   # Skyformer: (train_step_idx + 1) > total_step * 0.2
    return {'best_val_accuracy': accuracy, 'best_step': step}, True
  return {'best_val_accuracy': accuracy}, False
