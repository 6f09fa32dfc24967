"""The ``kernelformer`` command: --help exits 0 everywhere and lists the choices; kernels, config and the
packaged config names work from outside the repository; pyproject pins what requirements.txt pins."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import yaml

from configs import listops
from kernelformer import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env():
  return {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': ROOT}


def start(cwd, *args, script=None):
  cmd = [sys.executable, script] if script else [sys.executable, '-m', 'kernelformer']
  return subprocess.Popen([*cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env(), cwd=str(cwd))


def finish(proc):
  out, err = proc.communicate(timeout=300)
  return proc.returncode, out, err


def test_every_help_exits_0_and_lists_choices(tmp_path):
  jobs = {
      'top': start(tmp_path, '--help'),
      'train': start(tmp_path, 'train', '--help'),
      'script_train': start(tmp_path, '--help', script=os.path.join(ROOT, 'scripts', 'train.py')),
      'sweep': start(tmp_path, 'sweep', '--help'),
      'report': start(tmp_path, 'report', '--help'),
      'prepare': start(tmp_path, 'prepare-data', '--help'),
      'bench': start(tmp_path, 'benchmark', 'attention', '--help'),
      'kernels': start(tmp_path, 'kernels', '--help'),
      'config': start(tmp_path, 'config', '--help'),
  }
  res = {k: finish(p) for k, p in jobs.items()}
  for name, (rc, out, err) in res.items():
    assert rc == 0, (name, err[-2000:])
  top = res['top'][1]
  for command in ('train', 'sweep', 'report', 'prepare-data', 'benchmark', 'kernels', 'config'):
    assert re.search(rf'^  {command} ', top, re.M), command
  for name in ('train', 'script_train'):
    out = res[name][1]
    assert '--workdir' in out and '--coordinator_address' in out       # its flags
    assert re.search(r'listops\s+lra, .*quick, tiny', out)              # presets per task
    assert 'model.attention.*:' in out and 'num_features' in out and 'plugin' in out   # fields
    assert 'posrf-orf' in out and 'skyformer' in out                    # kernels
  assert '--grid' in res['sweep'][1] and 'mini' in res['sweep'][1]      # named sweeps
  assert 'spectraformer' in res['report'][1] and '--paper' in res['report'][1]
  assert '--check' in res['prepare'][1] and '--out_dir' in res['bench'][1]
  assert 'runs/benchmarks' in res['bench'][1]


def test_unknown_command_one_line(tmp_path):
  rc, out, err = finish(start(tmp_path, 'trian'))
  assert rc == 2 and 'Did you mean train?' in err and 'Traceback' not in err


def test_kernels_lists_every_kernel_with_aliases_and_options(tmp_path):
  rc, out, err = finish(start(tmp_path, 'kernels'))
  assert rc == 0, err[-2000:]
  blocks = {b.split()[0]: b for b in out.strip().split('\n\n') if b.strip()}
  assert set(registry.list_kernels()) <= set(blocks)
  orf = blocks['posrf-orf']
  assert 'aliases: favor+, performer' in orf and 'Choromanski' in orf
  options = re.search(r'options: (.*)', orf, re.S).group(1)
  listed = dict(re.findall(r'(\w+)=([^,\s]+)', options))
  assert sorted(listed) == registry.option_names('posrf-orf')
  assert listed['num_features'] == '128' and listed['redraw_every'] == '100'


def test_config_prints_resolved_config_from_anywhere(tmp_path):
  # A packaged path, resolved although tmp_path holds no configs/ folder; an alias and an override.
  rc, out, err = finish(start(tmp_path, 'config', 'configs/listops.py:quick',
                              '--config.model.attention.kind=performer', '--config.seed=7'))
  assert rc == 0, err[-2000:]
  header, body = out.split('\n', 1)
  assert header.endswith("(attention kind 'performer' is 'posrf-orf')")
  printed = yaml.safe_load(body)
  expected = listops.get_config('quick').to_dict()
  assert printed['num_train_steps'] == expected['num_train_steps']
  assert printed['model']['num_layers'] == expected['model']['num_layers']
  assert printed['seed'] == 7 and printed['model']['attention']['kind'] == 'performer'
  # The task's presets; then a misspelled field and a missing file: one line, no traceback.
  rc, out, err = finish(start(tmp_path, 'config', 'listops', '--presets'))
  assert rc == 0 and re.search(r'^  quick\s+2-core CPU', out, re.M), out
  rc, out, err = finish(start(tmp_path, 'config', 'listops:quick', '--config.model.num_layer=3'))
  assert rc != 0 and 'Traceback' not in err and 'num_layer' in err
  rc, out, err = finish(start(tmp_path, 'config', 'nosuch.py:quick'))
  assert rc == 2 and 'Traceback' not in err and 'nosuch.py not found' in err


def test_pyproject_pins_what_requirements_pin():
  import tomllib  # pylint: disable=g-import-not-at-top
  with open(os.path.join(ROOT, 'pyproject.toml'), 'rb') as f:
    project = tomllib.load(f)['project']
  with open(os.path.join(ROOT, 'requirements.txt'), encoding='utf-8') as f:
    lock = {l.split('==')[0].lower(): l.split('==')[1] for l in f.read().split('\n')
            if '==' in l and not l.startswith('#')}
  pins = lambda reqs: {r.split('==')[0].lower(): r.split('==')[1] for r in reqs}  # noqa: E731
  runtime, dev = pins(project['dependencies']), pins(project['optional-dependencies']['dev'])
  assert {**runtime, **dev} == lock
  assert project['scripts']['kernelformer'] == 'kernelformer.cli:main'
  assert pins(project['optional-dependencies']['tensorboard'])['tensorboard']
