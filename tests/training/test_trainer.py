"""End-to-end tests of train_and_evaluate on the tiny ListOps config (real generator, real loop)."""
from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from kernelformer.training import run_meta
from kernelformer.training import trainer
from kernelformer.training import workdir as workdir_lib
from tests.training import helpers


def tiny_config(tmp_path, **overrides):
  return helpers.tiny_config(tmp_path / 'data', **overrides)


def leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize('kind', ['softmax', 'posrf-orf'])
def test_smoke_train_and_evaluate(tmp_path, kind):
  c = tiny_config(tmp_path, **{'model.attention.kind': kind})
  results = trainer.train_and_evaluate(c, str(tmp_path / 'run'))
  workdir = tmp_path / 'run'
  assert results['final_step'] == c.num_train_steps
  assert 0.0 <= results['test_accuracy'] <= 1.0
  assert results['test_examples'] == c.data.num_test
  assert results['num_params'] > 0 and results['best_step'] > 0
  on_disk = json.loads((workdir / 'results.json').read_text())
  assert on_disk['test_accuracy'] == results['test_accuracy']
  events = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert {e['split'] for e in events} == {'train', 'val', 'test'}
  assert all(np.isfinite(e['loss']) for e in events)
  assert os.listdir(workdir / 'tensorboard')
  assert (workdir / 'best').is_dir() and (workdir / 'checkpoints').is_dir()


def test_resumed_run_equals_uninterrupted(tmp_path, monkeypatch, caplog):
  c = tiny_config(tmp_path, **{'model.attention.kind': 'posrf-iid',
                               'model.attention.redraw_every': 4,
                               'model.dropout_rate': 0.1,
                               'checkpoint_every': 4})
  full = {}
  trainer.train_and_evaluate(c, str(tmp_path / 'full'), hooks=[
      lambda step, state: full.update(params=state.params) if step == c.num_train_steps else None])

  class Crash(Exception):
    pass

  def crash_at_7(step, state):
    if step == 7:
      raise Crash()

  with pytest.raises(Crash):
    trainer.train_and_evaluate(c, str(tmp_path / 'resumed'), hooks=[crash_at_7])
  # The crash lost steps 5-7 only: the latest checkpoint is step 4.
  assert sorted(os.listdir(tmp_path / 'resumed' / 'checkpoints'))[-1] == '4'
  seen = []
  resumed = {}

  def record(step, state):
    seen.append(step)
    if step == c.num_train_steps:
      resumed.update(params=state.params)

  # The resume runs under other code (a new commit): allowed, but named in a warning and recorded.
  first_code = workdir_lib.code_version()
  other_code = {'package_version': 'test', 'git_commit': 'f' * 40, 'git_dirty': False}
  monkeypatch.setattr(workdir_lib, 'code_version', lambda: dict(other_code))
  with caplog.at_level('WARNING'):
    trainer.train_and_evaluate(c, str(tmp_path / 'resumed'), hooks=[record])
  assert seen[0] == 5  # continued after the checkpoint, not from scratch
  for a, b in zip(leaves(full['params']), leaves(resumed['params'])):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  results = json.loads((tmp_path / 'resumed' / 'results.json').read_text())
  assert results['code_versions'] == [{'from_step': 0, 'code_version': first_code},
                                      {'from_step': 4, 'code_version': other_code}]
  assert any('resumed at step 4 under other code (commit ffffffffffff)' in r.getMessage()
             for r in caplog.records)
  uninterrupted = json.loads((tmp_path / 'full' / 'results.json').read_text())
  assert uninterrupted['code_versions'] == [{'from_step': 0, 'code_version': first_code}]


def test_code_segments_resumed_under_the_same_code_add_nothing():
  a = {'package_version': '1', 'git_commit': 'a' * 40, 'git_dirty': False}
  first = run_meta.code_segments(None, 0, a, resumed=False)
  assert first == [{'from_step': 0, 'code_version': a}]
  assert run_meta.code_segments(first, 8, dict(a), resumed=True) == first
  dirty = {**a, 'git_dirty': True}
  assert run_meta.code_segments(first, 8, dirty, resumed=True)[1] == {'from_step': 8, 'code_version': dirty}
  # A checkpoint written before the field existed: its steps are of unknown code, not of today's.
  old = run_meta.code_segments(None, 8, a, resumed=True)
  assert [s['from_step'] for s in old] == [0, 8] and 'unknown' in old[0]['code_version']['package_version']


def test_one_device_and_eight_devices_agree(tmp_path):
  assert jax.device_count() >= 8, 'conftest forces 8 host devices'
  c = tiny_config(tmp_path, **{'model.attention.kind': 'posrf-orf', 'num_train_steps': 4,
                               'eval_every': 4, 'checkpoint_every': 4, 'log_every': 1})
  losses = {}
  for n in (1, 8):
    trainer.train_and_evaluate(c, str(tmp_path / f'dev{n}'), devices=jax.devices()[:n])
    events = [json.loads(l) for l in (tmp_path / f'dev{n}' / 'metrics.jsonl').read_text().splitlines()]
    losses[n] = [e['loss'] for e in events if e['split'] in ('train', 'val')]
  np.testing.assert_allclose(losses[1], losses[8], rtol=2e-5, atol=2e-5)


def test_batch_not_divisible_by_devices(tmp_path):
  c = tiny_config(tmp_path, batch_size=6)
  with pytest.raises(ValueError, match='not divisible by the 8 devices'):
    trainer.train_and_evaluate(c, str(tmp_path / 'run'), devices=jax.devices()[:8])


def test_unknown_kernel_lists_valid_ones(tmp_path):
  c = tiny_config(tmp_path, **{'model.attention.kind': 'posrf-orff'})
  with pytest.raises(ValueError, match=r"unknown attention kind 'posrf-orff' \(nearest: posrf-orf, "
                     r'.*see `kernelformer kernels`'):
    trainer.train_and_evaluate(c, str(tmp_path / 'run'))
