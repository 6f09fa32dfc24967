"""Kernels from outside the package: docs/extending.md's file registers a component and a sampler, which
then compute the right attention, train, sweep and report like the built-ins.

Everything that registers runs in a subprocess, so this test process's registry stays the built-in one
(other tests enumerate every registered kernel).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_plugin(tmp_path) -> str:
  """The ``python`` block of docs/extending.md, as the user's own file outside the repository."""
  with open(os.path.join(ROOT, 'docs', 'extending.md'), encoding='utf-8') as f:
    doc = f.read()
  code = re.search(r'```python\n(.*?)```', doc, re.S).group(1)
  path = tmp_path / 'my_kernels.py'
  path.write_text(code)
  return str(path)


def env():
  flags_ = [f for f in os.environ.get('XLA_FLAGS', '').split()
            if not f.startswith('--xla_force_host_platform_device_count')]
  return {**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': ' '.join(flags_), 'PYTHONPATH': ROOT,
          'MPLBACKEND': 'Agg'}


def kf(tmp_path, *args):
  return subprocess.run([sys.executable, '-m', 'kernelformer', *args], capture_output=True, text=True,
                        env=env(), cwd=str(tmp_path), timeout=600)


CHECK = r'''
import sys
import jax, jax.numpy as jnp, numpy as np
from kernelformer import plugins, registry
plugins.load(sys.argv[1]); plugins.load(sys.argv[1])   # idempotent: a second load registers nothing
names = set(registry.list_kernels())
assert {'myprf-orf', 'myprf-antithetic', 'posrf-antithetic', 'trigrf-antithetic'} <= names
from kernelformer.features import weights
w = weights.SAMPLERS['antithetic'](jax.random.PRNGKey(0), 6, 4).matrix
np.testing.assert_array_equal(np.asarray(w[3:]), -np.asarray(w[:3]))
# The plugin's myprf is FAVOR+'s map with other (cancelling) shifts: same W, same attention output.
k1, k2, k3 = jax.random.split(jax.random.PRNGKey(1), 3)
q, k, v = (jax.random.normal(kk, (2, 12, 2, 8)) for kk in (k1, k2, k3))
mask = jnp.arange(12)[None, :] < jnp.array([[12], [7]])
outs = {}
for kind in ('myprf-orf', 'posrf-orf'):
  m = registry.build({'kind': kind, 'num_features': 16})
  params = m.init({'params': k1, 'features': k2}, q, k, v, mask=mask)
  outs[kind] = m.apply(params, q, k, v, mask=mask, rngs={'features': k2})
err = float(jnp.max(jnp.abs(outs['myprf-orf'] - outs['posrf-orf'])[:, :7]))
assert err < 1e-4, err
print('ok', err)
'''


def test_plugin_kernels_register_and_match_the_builtin(tmp_path):
  plugin = write_plugin(tmp_path)
  proc = subprocess.run([sys.executable, '-c', CHECK, plugin], capture_output=True, text=True,
                        env=env(), cwd=str(tmp_path), timeout=300)
  assert proc.returncode == 0 and proc.stdout.startswith('ok'), proc.stderr[-3000:]


def test_plugin_kernel_listed_trained_swept_and_reported(tmp_path):
  plugin = write_plugin(tmp_path)
  data = str(tmp_path / 'data')
  # Listed by `kernelformer kernels`, with the paper the plugin gave.
  proc = kf(tmp_path, 'kernels', '--plugin', plugin, 'myprf-antithetic', 'posrf-antithetic')
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert 'myprf-antithetic' in proc.stdout and 'Performer FAVOR+, Lemma 1' in proc.stdout
  assert 'antithetic pairs' in proc.stdout and 'num_features=128' in proc.stdout
  # Swept beside a built-in (from outside the repository, packaged config name), then reported.
  sweep_dir = str(tmp_path / 'sweep')
  proc = kf(tmp_path, 'sweep', '--config', 'listops:tiny', '--set', f'model.attention.plugin={plugin}',
            '--set', f'data.data_dir={data}', '--set', 'progress=False',
            '--grid', 'model.attention.kind=softmax,myprf-antithetic', '--sweep_dir', sweep_dir)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  results = {}
  for root, _, files in os.walk(sweep_dir):
    if 'results.json' in files:
      with open(os.path.join(root, 'results.json'), encoding='utf-8') as f:
        r = json.load(f)
      results[r['attention']] = r
  assert set(results) == {'softmax', 'myprf-antithetic'}
  assert results['myprf-antithetic']['config']['model']['attention']['plugin'] == plugin
  assert 0.0 <= results['myprf-antithetic']['test_accuracy'] <= 1.0
  # `train` from outside the repository: an alias is stored by its canonical name in results.json.
  proc = kf(tmp_path, 'train', '--config', 'configs/listops.py:tiny', '--workdir', 'alias_run',
            f'--config.data.data_dir={data}', '--config.progress=False', '--config.num_train_steps=2',
            '--config.eval_every=2', '--config.model.attention.kind=performer',
            f'--config.model.attention.plugin={plugin}')
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(tmp_path / 'alias_run' / 'results.json', encoding='utf-8') as f:
    assert json.load(f)['attention'] == 'posrf-orf'
  proc = kf(tmp_path, 'report', sweep_dir, '--paper', 'none')
  assert proc.returncode == 0, proc.stderr[-2000:]
  row = [l for l in proc.stdout.splitlines() if l.startswith('| `myprf-antithetic`')]
  assert row and re.search(r'\| \d+\.\d\d \(1/1\) \|', row[0]), proc.stdout


def test_missing_plugin_is_one_line(tmp_path):
  proc = kf(tmp_path, 'kernels', '--plugin', 'no_such_kernels.py')
  assert proc.returncode != 0 and 'Traceback' not in proc.stderr
  assert 'no_such_kernels.py not found' in proc.stderr.strip().splitlines()[-1]
