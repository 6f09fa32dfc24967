"""Every config file and preset loads the way scripts/train.py loads it, is locked, and builds a model."""
from __future__ import annotations

import glob
import importlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags

import lra_tasks
from kernelformer import run_config
from kernelformer.training import steps as steps_lib

CONFIG_DIR = os.path.join(os.path.dirname(__file__), '..', '..', 'configs')
# Every task config offers these; a config file may declare its own list as PRESETS.
STANDARD_PRESETS = ('lra', 'kernel_learning', 'skyformer', 'quick', 'tiny')
TASK_CONFIGS = ('listops', 'text', 'retrieval', 'image', 'pathfinder')


def config_files():
  names = sorted(os.path.splitext(os.path.basename(p))[0]
                 for p in glob.glob(os.path.join(CONFIG_DIR, '*.py')))
  return [n for n in names if n not in ('__init__', 'common')]


def presets(name):
  return tuple(getattr(importlib.import_module(f'configs.{name}'), 'PRESETS', STANDARD_PRESETS))


CASES = [(name, preset) for name in config_files() for preset in presets(name)]


def load(name, preset, *overrides):
  """``--config=configs/<name>.py:<preset>`` through ml_collections' config_flags, as the CLI does."""
  path = os.path.normpath(os.path.join(CONFIG_DIR, f'{name}.py'))
  argv = ['train.py', f'--config={path}:{preset}', *overrides]
  flag_values = flags.FlagValues()
  # sys_argv: the flag finds its --config.* overrides in this argv rather than in sys.argv.
  config_flags.DEFINE_config_file('config', default=None, flag_values=flag_values, lock_config=True,
                                  sys_argv=argv)
  flag_values(argv)
  return flag_values.config


def test_every_task_config_is_present():
  assert set(TASK_CONFIGS) <= set(config_files())
  for name in TASK_CONFIGS:
    # The standard presets, plus a paper's own setting where it differs from the repository's (Text).
    assert presets(name)[:1] == ('lra',) and set(STANDARD_PRESETS) <= set(presets(name))
  assert set(presets('text')) - set(STANDARD_PRESETS) == {'lra_paper'}


@pytest.mark.parametrize('name, preset', CASES)
def test_config_parses_and_is_locked(name, preset):
  config = load(name, preset)
  assert config.is_locked
  with pytest.raises(AttributeError):
    config.model.emb_dimm = 3  # a misspelled field fails instead of being silently added
  if name in TASK_CONFIGS:
    assert config.data.task == name
    assert config.batch_size >= 1 and config.num_train_steps >= 1
    assert config.model.qkv_dim % config.model.num_heads == 0


def test_overrides_and_unknown_presets():
  config = load('retrieval', 'tiny', '--config.data.max_length=77',
                '--config.model.attention.kind=posrf-orf')
  assert config.data.max_length == 77 and config.model.attention.kind == 'posrf-orf'
  for name in TASK_CONFIGS:
    module = importlib.import_module(f'configs.{name}')
    with pytest.raises(ValueError, match='skyformer'):
      module.get_config('no_such_preset')


@pytest.mark.parametrize('name', TASK_CONFIGS)
def test_build_model_for_every_preset(name):
  """The preset's model and attention options build and initialize (shapes only: no compute)."""
  for preset in presets(name):
    config = load(name, preset)
    info = lra_tasks.get(config.data.task).info(config.data)
    run = run_config.of(config)
    model = steps_lib.build_model(run, info)
    assert model.dual == (name == 'retrieval') and model.num_classes == info.num_classes
    dummy = {n: jnp.ones((1, info.max_length), jnp.int32) for n in steps_lib.input_names(info)}
    keys = {'params': jax.random.key(0), 'features': jax.random.key(1),
            'dropout': jax.random.key(2)}
    shapes = jax.eval_shape(lambda m=model, d=dummy: m.init(keys, d, train=False))
    embed = shapes['params']['encoder']['embed']['embedding']
    assert embed.shape == (info.vocab_size, config.model.emb_dim)
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes['params'])) > 0


def test_attention_options_are_the_registry_options():
  """configs/common.py lists the built-in mechanisms' options as data (configs never import the
  registry); the list must be exactly what the registered modules declare."""
  from kernelformer import registry
  from kernelformer.configs import common
  builtin = [s for s in registry.specs() if s.module.__module__.startswith('kernelformer.')]
  assert common.OPTIONS == registry.option_types(builtin)


def test_a_plugin_mechanisms_options_become_config_fields(tmp_path):
  import subprocess
  import sys
  code = '''
import flax.linen as nn
from kernelformer import plugins
from kernelformer.configs import common
class Mine(nn.Module):
  my_scale: float = 2.0
  num_features: int = 3
  def __call__(self, q, k, v, **kw):
    return v
plugins.register_mechanism('mine-opt', Mine)
c = common.attention_config('mine-opt')
print(c.get_type('my_scale').__name__, c.my_scale, c.get_type('num_features').__name__)
'''
  root = os.path.join(os.path.dirname(__file__), '..', '..')
  (tmp_path / 'mine.py').write_text(code)
  out = subprocess.run([sys.executable, str(tmp_path / 'mine.py')], cwd=root, capture_output=True, text=True,
                       check=True).stdout.split()
  assert out == ['float', 'None', 'int']
