"""Each ``lra`` / ``skyformer`` preset holds its source's values, and names the source with its commit.

Expected values, transcribed from the sources (not from the configs):
* LRA (google-research/long-range-arena): the base configs' model, schedule and eval_frequency
  (listops base_listops_config.py @ 8d3dc39 lines 22-49, @ 211e07d lines 24-51 for lra_paper;
  text_classification/ and matching/ base configs line 24: eval_frequency 100); every train.py tests the
  final weights; transformer.py 71 @ b4f9fed: no attention bias; image/input_pipeline.py 72, 186, 205:
  raw pixels, ``inputs > 0`` mask; common_layers.py 236-241: the [u, v] dual head; flax optim.Adam
  beta1 0.9, beta2 0.98, eps 1e-9 (listops/train.py 72-80).
* Skyformer (pkuzengqi/Skyformer @ cfe8c8c): src/config.py's per-task "training" dicts (batch_size,
  learning_rate, warmup, eval_frequency, num_eval_steps) and src/main.py (AdamW (0.9, 0.999) eps 1e-6,
  clip_grad_value_ 1, OneCycleLR with lr_decay 'linear', best checkpoint after 20 % of the steps).
"""
from __future__ import annotations

import pytest

from configs import image
from configs import listops
from configs import pathfinder
from configs import retrieval
from configs import text

MODULES = {'listops': listops, 'text': text, 'retrieval': retrieval, 'image': image,
           'pathfinder': pathfinder}

LRA_COMMON = {'eval.test_checkpoint': 'final', 'model.qkv_bias': False, 'model.param_init': 'lra',
              'model.layer_norm_eps': 1e-6, 'model.gelu_approximate': True, 'optim.b1': 0.9,
              'optim.b2': 0.98, 'optim.eps': 1e-9, 'optim.grad_clip_value': 0.0}
LRA = {
    ('listops', 'lra'): {'model.num_layers': 4, 'model.mlp_dim': 1024, 'eval_every': 50,
                         'max_eval_batches': 0, 'optim.learning_rate': 0.05, 'optim.warmup_steps': 1000,
                         'num_train_steps': 5000, 'batch_size': 32},
    ('listops', 'lra_paper'): {'model.num_layers': 6, 'model.mlp_dim': 2048, 'eval_every': 20,
                               'max_eval_batches': 20},
    ('text', 'lra'): {'model.num_layers': 4, 'model.emb_dim': 256, 'model.mlp_dim': 1024,
                      'eval_every': 100, 'max_eval_batches': 0, 'optim.warmup_steps': 8000,
                      'num_train_steps': 20000, 'data.max_length': 1000},
    ('text', 'lra_paper'): {'eval_every': 100, 'model.num_layers': 6},
    ('retrieval', 'lra'): {'model.num_layers': 4, 'model.emb_dim': 128, 'model.mlp_dim': 512,
                           'eval_every': 100, 'max_eval_batches': 0, 'num_train_steps': 5000,
                           'model.retrieval_head': 'lra', 'data.max_length': 4000},
    ('image', 'lra'): {'data.pixel_padding': 'lra', 'model.num_heads': 8, 'model.emb_dim': 128,
                       'eval_every': 175},
    ('pathfinder', 'lra'): {'data.pixel_padding': 'lra', 'model.num_layers': 4, 'model.emb_dim': 32},
    ('pathfinder', 'lra_pre_ee6649e'): {'data.pixel_padding': 'lra', 'model.num_layers': 1,
                                        'model.emb_dim': 128},
}

SKY_COMMON = {'model.num_layers': 2, 'model.emb_dim': 64, 'model.qkv_dim': 64, 'model.mlp_dim': 128,
              'model.num_heads': 2, 'model.pooling': 'mean', 'model.pos_encoding': 'learned',
              'model.dropout_rate': 0.1, 'model.attention.attention_dropout': 0.1,
              'model.qkv_bias': True, 'model.retrieval_head': 'nli', 'optim.schedule': 'onecycle-linear',
              'optim.b1': 0.95, 'optim.b2': 0.999, 'optim.eps': 1e-6, 'optim.grad_clip_value': 1.0,
              'optim.grad_clip_norm': 0.0, 'optim.weight_decay': 0.0, 'num_train_steps': 50000,
              'eval.test_checkpoint': 'best_after:0.2', 'model.attention.num_features': 128,
              'model.attention.num_landmarks': 128, 'model.param_init': 'skyformer',
              'model.layer_norm_eps': 1e-5, 'model.gelu_approximate': False}
# src/config.py "training": (batch_size, learning_rate, warmup, eval_frequency, num_eval_steps).
SKY = {'listops': (32, 1e-4, 1000, 500, 62), 'pathfinder': (128, 2e-4, 312, 500, 156),
       'retrieval': (16, 2e-4, 800, 1000, 300), 'text': (32, 1e-4, 80, 500, 200),
       'image': (256, 1e-4, 175, 50, 20)}


def _get(c, dotted):
  for part in dotted.split('.'):
    c = c[part]
  return c


@pytest.mark.parametrize('task,preset', sorted(LRA))
def test_lra_presets_hold_the_repository_values(task, preset):
  module = MODULES[task]
  c = module.get_config(preset)
  for field, want in {**LRA_COMMON, **LRA[(task, preset)]}.items():
    assert _get(c, field) == want, (task, preset, field)
  assert module.SOURCES[preset].startswith('LRA')


@pytest.mark.parametrize('task', sorted(SKY))
def test_skyformer_presets_hold_skyformers_code(task):
  module = MODULES[task]
  c = module.get_config('skyformer')
  batch, lr, warmup, every, batches = SKY[task]
  want = {**SKY_COMMON, 'batch_size': batch, 'optim.learning_rate': lr, 'optim.warmup_steps': warmup,
          'eval_every': every, 'max_eval_batches': batches}
  if task in ('image', 'pathfinder'):
    want['data.pixel_padding'] = 'lra'
  for field, value in want.items():
    assert _get(c, field) == value, (task, field)
  assert 'cfe8c8c' in module.SOURCES['skyformer'] and 'src/config.py' in module.SOURCES['skyformer']


def test_other_presets_keep_the_earlier_behaviour():
  for module in MODULES.values():
    for preset in ('quick', 'tiny'):
      c = module.get_config(preset)
      assert (c.eval.test_checkpoint, c.model.qkv_bias, c.model.retrieval_head,
              c.optim.grad_clip_value) == ('best', True, 'nli', 0.0)
      if 'pixel_padding' in c.data:
        assert c.data.pixel_padding == 'none'


def test_enwik8_luo_tests_disjoint_windows():
  from configs import enwik8  # pylint: disable=g-import-not-at-top
  # Luo et al. §4.2: 512 tokens in training and evaluation, no context from earlier batches.
  assert enwik8.get_config('luo').data.eval_context == 'disjoint'
  assert enwik8.get_config('luo').data.max_length == 512


def test_workdirs_recorded_before_the_options_resume_unless_a_preset_changed_them():
  from kernelformer.training import fingerprint  # pylint: disable=g-import-not-at-top
  new_fields = ('data.pixel_padding', 'model.qkv_bias', 'model.retrieval_head',
                'optim.grad_clip_value', 'eval.test_checkpoint')
  for module, preset in ((image, 'quick'), (retrieval, 'quick'), (listops, 'kernel_learning')):
    fields = fingerprint.config_fields(module.get_config(preset))
    old = {k: v for k, v in fields.items() if k not in new_fields}
    assert fingerprint.differences(old, fields) == [], (module.__name__, preset)
  fields = fingerprint.config_fields(retrieval.get_config('lra'))
  old = {k: v for k, v in fields.items() if k not in new_fields}
  # A Retrieval lra workdir of before (its eval_every was recorded as 100 here to isolate the new
  # fields): resuming it with today's preset names exactly the changed options.
  diffs = fingerprint.differences({**old, 'eval_every': 100}, fields)
  assert diffs == ['eval.test_checkpoint: best -> final', 'model.qkv_bias: True -> False',
                   'model.retrieval_head: nli -> lra']
