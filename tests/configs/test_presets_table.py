"""Every preset is pinned: to the generated table in docs/reproduce.md, and the LRA ones to upstream values."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kernelformer.reproduce import presets

ROOT = os.path.join(os.path.dirname(__file__), '..', '..')
DOC = os.path.join(ROOT, 'docs', 'reproduce.md')

# google-research/long-range-arena at HEAD cd31e5c, read with git log -p per file; each file at the commit
# of its last change. Keys are (task, preset); values the upstream values as our fields, steps/warm-up
# computed the way the LRA file computes them.
LRA_UPSTREAM = {
    # lra_benchmarks/listops/configs/base_listops_config.py @ 8d3dc39bdc57d59ba806451d6c9ab2625c4b3103
    # (lines 22-49: batch 32, eval_frequency 50, 5000 steps, num_eval_steps 99999, lr 0.05, weight decay
    # 0.1, rsqrt, warm-up 1000, length 2000, CLS, 512 / 8 heads / 4 layers / 512 / 1024);
    # listops/configs/transformer_base.py only sets model_type = "transformer".
    ('listops', 'lra'): dict(
        num_layers=4, num_heads=8, emb_dim=512, qkv_dim=512, mlp_dim=1024, learning_rate=0.05,
        schedule='rsqrt', warmup_steps=1000, weight_decay=0.1, batch_size=32, num_train_steps=5000,
        pooling='cls', max_length=2000, eval_every=50, max_eval_batches=0, decay_mask='all'),
    # The same file @ ad0ff01a5b3492ade621553a1caae383b347e0c1 (before 8d3dc39) = the LRA paper's setup.
    ('listops', 'lra_paper'): dict(
        num_layers=6, num_heads=8, emb_dim=512, qkv_dim=512, mlp_dim=2048, learning_rate=0.05,
        schedule='rsqrt', warmup_steps=1000, weight_decay=0.1, batch_size=32, num_train_steps=5000,
        pooling='cls', max_length=2000, eval_every=20, max_eval_batches=20, decay_mask='all'),
    # lra_benchmarks/image/configs/cifar10/transformer_base.py @ ee6649e0c5cabab560aa5e21be5b910d78c1b5a8
    # (lines 24-29) over base_cifar10_config.py @ a2e5057545f67ef55bc02360a9afd7418bbd0d39.
    ('image', 'lra'): dict(
        num_layers=1, num_heads=8, emb_dim=128, qkv_dim=64, mlp_dim=128, dropout_rate=0.3,
        attention_dropout=0.2, pooling='cls', pos_encoding='learned', learning_rate=0.0005,
        schedule='cosine', warmup_steps=45000 // 256, weight_decay=0.0, batch_size=256,
        num_train_steps=(45000 // 256) * 200, eval_every=45000 // 256),
    # lra_benchmarks/image/configs/pathfinder32/transformer_base.py @ ee6649e (lines 24-29) over
    # base_pathfinder32_config.py @ ad0ff01a5b3492ade621553a1caae383b347e0c1.
    ('pathfinder', 'lra'): dict(
        num_layers=4, num_heads=4, emb_dim=32, qkv_dim=16, mlp_dim=32, dropout_rate=0.2,
        attention_dropout=0.1, pooling='mean', pos_encoding='sinusoidal', learning_rate=0.001,
        schedule='cosine', warmup_steps=160000 // 512, weight_decay=0.0, batch_size=512,
        num_train_steps=(160000 // 512) * 200, eval_every=160000 // 512),
    # pathfinder32/transformer_base.py @ ad0ff01 (before ee6649e; kept for LRA issue #37).
    ('pathfinder', 'lra_pre_ee6649e'): dict(
        num_layers=1, num_heads=4, emb_dim=128, qkv_dim=64, mlp_dim=128, dropout_rate=0.2,
        attention_dropout=0.1, pooling='mean', pos_encoding='sinusoidal', learning_rate=0.001,
        schedule='cosine', warmup_steps=160000 // 512, weight_decay=0.0, batch_size=512,
        num_train_steps=(160000 // 512) * 200),
}


def _field(config, name):
  if name in ('learning_rate', 'schedule', 'warmup_steps', 'weight_decay', 'decay_mask'):
    return config.optim[name]
  if name in ('batch_size', 'num_train_steps', 'eval_every', 'max_eval_batches'):
    return config[name]
  if name == 'max_length':
    return config.data.max_length
  if name == 'attention_dropout':
    return config.model.attention.attention_dropout
  return config.model[name]


@pytest.mark.parametrize('task,preset', sorted(LRA_UPSTREAM))
def test_lra_presets_match_upstream(task, preset):
  config = presets.task_module(task).get_config(preset)
  got = {name: _field(config, name) for name in LRA_UPSTREAM[task, preset]}
  assert got == LRA_UPSTREAM[task, preset]
  assert config.model.attention.kind == 'softmax'


@pytest.mark.parametrize('task,preset', sorted(LRA_UPSTREAM))
def test_lra_presets_cite_the_commit_they_follow(task, preset):
  """The preset's SOURCES entry names the commit of the file it follows (8d3dc39, ee6649e, ad0ff01)."""
  commit = {('listops', 'lra'): '8d3dc39', ('listops', 'lra_paper'): 'ad0ff01',
            ('image', 'lra'): 'ee6649e', ('pathfinder', 'lra'): 'ee6649e',
            ('pathfinder', 'lra_pre_ee6649e'): 'ad0ff01'}[task, preset]
  assert commit in presets.task_module(task).SOURCES[preset]


def test_every_preset_states_its_decay_mask_and_lra_decays_everything():
  """LRA's flax optim.Adam and the kernel-learning paper's torch AdamW decay every parameter."""
  for task in presets.TASKS:
    module = presets.task_module(task)
    for preset in module.PRESETS:
      mask = module.get_config(preset).optim.decay_mask
      if preset.startswith('lra') or preset == 'kernel_learning':
        assert mask == 'all', (task, preset)
      elif preset in ('quick', 'tiny'):
        assert mask == 'matrices', (task, preset)


def test_pathfinder_steps_are_lra_epochs():
  """312 steps per epoch x 200 epochs (LRA's integer division), not a rounded 62,500."""
  assert presets.task_module('pathfinder').get_config('lra').num_train_steps == 62400


def test_committed_table_is_generated_from_the_configs():
  with open(DOC, encoding='utf-8') as f:
    committed = presets.committed(f.read())
  assert committed == presets.render(), (
      'docs/reproduce.md preset table is stale: run python scripts/preset_table.py')


def test_table_has_one_row_per_preset_with_its_source():
  rows = presets.rows()
  expected = [(t, p) for t in presets.TASKS for p in presets.task_module(t).PRESETS]
  assert [(r.task, r.preset) for r in rows] == expected
  for r in rows:
    assert r.source.strip(), (r.task, r.preset)
    assert len(r.cells()) == len(presets.COLUMNS)


@pytest.mark.parametrize('task', presets.TASKS)
def test_every_preset_names_its_source_in_the_docstring(task):
  module = presets.task_module(task)
  assert set(module.SOURCES) == set(module.PRESETS)
  for preset in module.PRESETS:
    assert f'  {preset} ' in module.__doc__, f'{task}: docstring does not describe {preset!r}'
  if hasattr(module, 'LRA_COMMIT'):
    assert module.LRA_COMMIT[:7] in module.__doc__ and module.LRA_COMMIT[:7] in module.SOURCES['lra']


def test_a_changed_preset_makes_the_table_stale(monkeypatch):
  """The pin works: a one-field change in a config is a table difference."""
  module = presets.task_module('pathfinder')   # the module the table reads (kernelformer.configs)
  original = module.get_config

  def changed(preset='lra'):
    c = original(preset)
    if preset == 'lra':
      with c.unlocked():
        c.num_train_steps = 62500
    return c

  before = presets.render()
  monkeypatch.setattr(module, 'get_config', changed)
  after = presets.render()
  assert before != after and '62,500' in after and '62,500' not in before


def test_replace_between_markers_and_missing_markers():
  text = f'intro\n{presets.BEGIN}\nold\n{presets.END}\noutro\n'
  new = presets.replaced(text, '| a |\n')
  assert new == f'intro\n{presets.BEGIN}\n| a |\n{presets.END}\noutro\n'
  assert presets.committed(new) == '| a |\n'
  with pytest.raises(ValueError, match='markers'):
    presets.committed('no markers here')


def test_script_check_fails_on_a_stale_doc(tmp_path):
  doc = tmp_path / 'doc.md'
  doc.write_text(f'x\n{presets.BEGIN}\n| stale |\n{presets.END}\n', encoding='utf-8')
  script = os.path.join(ROOT, 'scripts', 'preset_table.py')
  run = lambda *a: subprocess.run([sys.executable, script, f'--doc={doc}', *a], capture_output=True,
                                  text=True, check=False)
  stale = run('--check')
  assert stale.returncode == 1 and 'out of date' in stale.stderr and 'Traceback' not in stale.stderr
  assert run().returncode == 0
  assert run('--check').returncode == 0
  assert presets.committed(doc.read_text(encoding='utf-8')) == presets.render()


@pytest.mark.parametrize('spec,layers,mlp,commit', [('listops:lra', 4, 1024, '8d3dc39')])
def test_kernelformer_config_shows_the_model_and_cites_the_commit(spec, layers, mlp, commit):
  """The CLI prints the preset's SOURCES line (the other presets' commits: the test above)."""
  import yaml  # pylint: disable=g-import-not-at-top
  env = {**os.environ, 'PYTHONPATH': os.path.abspath(ROOT)}
  proc = subprocess.run([sys.executable, '-m', 'kernelformer', 'config', spec], capture_output=True,
                        text=True, env=env, cwd=os.path.abspath(ROOT), timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = proc.stdout.splitlines()
  assert lines[1].startswith('# source: ') and commit in lines[1]
  model = yaml.safe_load(proc.stdout)['model']
  assert (model['num_layers'], model['mlp_dim']) == (layers, mlp)
