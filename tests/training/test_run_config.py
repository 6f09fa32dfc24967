"""``kernelformer.run_config``: the run's typed record, each default written once.

A record default says what a field's absence means (an older run's config); configs/common.py's value
is what a new config holds. They are the same value except where the absence of a field meant another
behaviour than today's default (``ABSENCE_DIFFERS``, each with its reason).
"""
from __future__ import annotations

import dataclasses

import pytest

from configs import common
from kernelformer import run_config
from kernelformer.training import fingerprint, validate
from tests.training import helpers

# Fields whose absence means another value than configs/common.py's default for a new config.
ABSENCE_DIFFERS = {
    'watchdog_step_s': 'a config without the watchdog ran without one (0 = off)',
    'watchdog_compile_s': 'as watchdog_step_s',
}
# Record fields configs/common.py does not hold: the task configs that use them set them.
TASK_FIELDS = {'model.short_conv', 'model.state_mixer', 'model.tie_embeddings', 'early_stop_accuracy'}


def _defaults(cls, prefix=''):
  for f in dataclasses.fields(cls):
    if f.default is not dataclasses.MISSING and not dataclasses.is_dataclass(f.default):
      yield prefix + f.name, f.default


def _all_defaults():
  yield from _defaults(run_config.Run)
  for name, cls in (('model', run_config.Model), ('optim', run_config.Optim), ('eval', run_config.Eval),
                    ('model.attention', run_config.Attention)):
    yield from _defaults(cls, name + '.')


def _base_value(path):
  node = common.base_config()
  for part in path.split('.'):
    node = node[part]
  return node


def test_each_record_default_is_the_base_configs_value():
  checked = 0
  for path, default in _all_defaults():
    if path in ABSENCE_DIFFERS or path in TASK_FIELDS:
      continue
    base = _base_value(path)
    assert base == default and type(base) is type(default), (path, base, default)
    checked += 1
  assert checked >= 15
  for path in ABSENCE_DIFFERS:
    assert _base_value(path) != run_config.legacy(path)


def test_every_base_field_is_a_record_field():
  """The record mirrors the config: no field of configs/common.py is left unread by the record."""
  names = {f.name for f in dataclasses.fields(run_config.Run)}
  base = common.base_config()
  assert set(base) - {'data'} <= names
  for section, cls in (('model', run_config.Model), ('optim', run_config.Optim), ('eval', run_config.Eval)):
    fields = {f.name for f in dataclasses.fields(cls)}
    assert set(base[section]) <= fields, (section, set(base[section]) - fields)


def test_the_fingerprints_added_fields_are_the_record_defaults():
  for name, value in fingerprint.ADDED_FIELDS.items():
    assert value == run_config.legacy(name), name
  assert fingerprint.ADDED_FIELDS['model.layer_norm_eps'] == run_config.Model.layer_norm_eps


def test_an_older_config_gets_the_record_defaults(tmp_path):
  c = helpers.tiny_config(tmp_path).to_dict()
  for section, name in (('model', 'layer_norm_eps'), ('model', 'qkv_bias'), ('optim', 'decay_mask')):
    del c[section][name]
  del c['eval'], c['on_nonfinite'], c['watchdog_step_s']
  run = run_config.of(c)
  assert (run.model.layer_norm_eps, run.model.qkv_bias, run.optim.decay_mask) == (1e-6, True, 'matrices')
  assert (run.eval.test_checkpoint, run.on_nonfinite, run.watchdog_step_s) == ('best', 'stop', 0.0)
  del c['model']['emb_dim']
  with pytest.raises(run_config.ConfigError, match=r'^config.model.emb_dim is missing'):
    run_config.of(c)


def test_validation_returns_the_record_with_the_kind_resolved_once(tmp_path):
  c = helpers.tiny_config(tmp_path, **{'model.attention.kind': 'performer'})
  run = validate.validate_config(c)
  assert isinstance(run, run_config.Run) and dataclasses.is_dataclass(run)
  assert run.model.attention.spec.name == 'posrf-orf'   # the alias resolved to the registry's spec
  with pytest.raises(dataclasses.FrozenInstanceError):
    run.seed = 1   # the record is frozen


def test_rpe_on_a_kind_without_a_bias_is_one_line(tmp_path):
  c = helpers.tiny_config(tmp_path, **{'model.attention.kind': 'linformer', 'model.attention.rpe': True})
  with pytest.raises(validate.ConfigError,
                     match=r"^config.model.attention.rpe=True is invalid for kind 'linformer'"):
    validate.validate_config(c)
