"""Kernels from outside the package: docs/extending.md's file registers a component and a sampler, which
then compute the right attention, train, sweep and report like the built-ins.

Everything that registers runs in a subprocess, so this test process's registry stays the built-in one
(other tests enumerate every registered kernel).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys

from tests import procs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_plugin(folder) -> str:
  """The ``python`` block of docs/extending.md, as the user's own file outside the repository."""
  with open(os.path.join(ROOT, 'docs', 'extending.md'), encoding='utf-8') as f:
    doc = f.read()
  code = re.search(r'```python\n(.*?)```', doc, re.S).group(1)
  path = folder / 'my_kernels.py'
  path.write_text(code)
  return str(path)


def env():
  return procs.env(1, PYTHONPATH=ROOT, MPLBACKEND='Agg')


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
from kernelformer.features import catalog, weights
# Every grid component (built-in, grelu, the plugin's) with every sampler (fixed, the plugin's); the
# grid's components are those with an i.i.d. kernel (not e.g. posrf_lra, one paper's fixed setting).
grid = [r.name for r in catalog.records() if r.uses_projection and f'{r.name}-iid' in names]
assert {'trigrf', 'rks', 'posrf', 'hyperbolic', 'oprf', 'saderf', 'grelu', 'myprf'} <= set(grid), grid
for c in grid:
  for s in weights.SAMPLERS:
    registry.get(f'{c}-{s}')
registry.get('myprf-fastfoodl')   # learnable FastFood, as every built-in grid component has
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


def doc_commands() -> str:
  """The ``bash`` block of docs/extending.md, verbatim."""
  with open(os.path.join(ROOT, 'docs', 'extending.md'), encoding='utf-8') as f:
    return re.search(r'```bash\n(.*?)```', f.read(), re.S).group(1)


COMPONENT_ONLY = '''
import jax.numpy as jnp
from kernelformer import plugins
from kernelformer.features.projection import project


@plugins.register_component('absrf', target_kernel='none', parts=1)
def absrf(q, k, proj, *, mask=None, stabilize=True):
  fk = jnp.abs(project(k, proj))
  if mask is not None:
    fk = jnp.where(mask[..., None], fk, 0.0)
  return jnp.abs(project(q, proj)), fk
'''

SAMPLER_ONLY = '''
import jax
from kernelformer import plugins
from kernelformer.features.projection import Projection


@plugins.register_sampler('halfnormal')
def halfnormal(key, num_features, dim):
  return Projection(matrix=jax.random.normal(key, (num_features, dim)))
'''

REVERSE = r'''
import sys
from kernelformer import plugins, registry
plugins.load(sys.argv[1]); plugins.load(sys.argv[2])   # the component first, then the sampler
assert registry.get('absrf-halfnormal').fixed == {'component': 'absrf', 'weights': 'halfnormal'}
assert plugins.sources('absrf-halfnormal') == [sys.argv[1], sys.argv[2]], plugins.sources('absrf-halfnormal')
assert plugins.sources('absrf-orf') == [sys.argv[1]] and plugins.sources('grelu-halfnormal') == [sys.argv[2]]
assert plugins.sources('posrf-orf') == []
print('ok')
'''


def test_component_then_sampler_make_their_pair(tmp_path):
  comp, samp = tmp_path / 'comp.py', tmp_path / 'samp.py'
  comp.write_text(COMPONENT_ONLY)
  samp.write_text(SAMPLER_ONLY)
  proc = subprocess.run([sys.executable, '-c', REVERSE, str(comp), str(samp)], capture_output=True,
                        text=True, env=env(), cwd=str(tmp_path), timeout=300)
  assert proc.returncode == 0 and proc.stdout.startswith('ok'), proc.stderr[-3000:]


def test_doc_commands_train_sweep_and_report_a_plugin_kernel(tmp_path):
  """docs/extending.md's commands, run as written from a folder outside the repository, with a
  ``kernelformer`` on PATH that runs this checkout: the plugin kind trains and shows in the report."""
  plugin = write_plugin(tmp_path)
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  (bin_dir / 'kernelformer').write_text(f'#!/bin/sh\nexec {sys.executable} -m kernelformer "$@"\n')
  (bin_dir / 'kernelformer').chmod(0o755)
  e = {**env(), 'PATH': f'{bin_dir}{os.pathsep}{os.environ.get("PATH", "")}',
       'KERNELFORMER_DATA': str(tmp_path / 'data')}
  proc = subprocess.run(['bash', '-e', '-o', 'pipefail', '-c', doc_commands()], capture_output=True,
                        text=True, env=e, cwd=str(tmp_path), timeout=900)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  # No warning on the normal path (absl's W..., Python's warnings, orbax's handler override).
  noise = [l for l in re.split(r'[\r\n]', proc.stderr) if re.match(r'\s*(W\d{4} |WARNING|warning|\S+Warning)', l)]
  assert not noise, noise
  listed = proc.stdout.split('\n| ')[0].split()
  assert {'myprf-orf', 'myprf-antithetic', 'posrf-antithetic', 'grelu-antithetic',
          'myprf-fastfoodl'} <= set(listed), listed
  # train: the plugin kind, with the plugin file and its digest in results.json.
  with open(tmp_path / 'runs' / 'myprf' / 'results.json', encoding='utf-8') as f:
    r = json.load(f)
  assert r['attention'] == 'myprf-orf' and 0.0 <= r['test_accuracy'] <= 1.0
  digest = hashlib.sha256(open(plugin, 'rb').read()).hexdigest()
  assert r['plugins'] == [{'file': plugin, 'sha256': digest}]
  assert r['config']['model']['attention']['plugin'] == plugin
  # The train command's progress bar (the first one drawn: its lines up to the next bar's first,
  # labelled 'compile+step 1') ends at the final line's steps/s. Its last line counts: on a loaded
  # machine the bar may also be drawn at the last step before the trainer's final timing.
  lines = re.split(r'[\r\n]', proc.stderr)
  starts = [i for i, l in enumerate(lines) if 'compile+step 1' in l]
  train_bar = lines[:starts[1]] if len(starts) > 1 else lines
  bars = [l for l in train_bar if re.search(r' (\d+)/\1 \[.* steps/s', l)]
  assert bars and f"{r['steps_per_sec']:.1f} steps/s" in bars[-1], (bars[-1:], r['steps_per_sec'])
  # sweep: a built-in, the plugin's component and the plugin's sampler with a built-in component.
  results = {}
  for root, _, files in os.walk(tmp_path / 'runs' / 'sweeps' / 'mine'):
    if 'results.json' in files:
      with open(os.path.join(root, 'results.json'), encoding='utf-8') as f:
        rr = json.load(f)
      results[rr['attention']] = rr
  assert set(results) == {'posrf-orf', 'myprf-orf', 'posrf-antithetic'}
  assert results['posrf-orf']['plugins'] == results['myprf-orf']['plugins'] == \
      [{'file': plugin, 'sha256': digest}]  # named by model.attention.plugin
  # report: a row per kind.
  for kind in results:
    row = [l for l in proc.stdout.splitlines() if l.startswith(f'| `{kind}`')]
    assert row and re.search(r'\| \d+\.\d\d \(1/1\) \|', row[0]), proc.stdout[-3000:]


CONFIG_FILE = '''
import my_kernels  # noqa: F401  (beside this file: no PYTHONPATH needed)
from kernelformer.configs import listops


def get_config(preset='tiny'):
  c = listops.get_config(preset)
  c.model.attention.kind = 'myprf-antithetic'
  return c
'''


def test_config_file_import_and_plugin_flag(tmp_path):
  """A config file that imports the plugin beside it loads from another folder (config, sweep);
  ``--plugin`` makes a plugin kind valid before the config's kind is checked."""
  (tmp_path / 'mine').mkdir()
  plugin = write_plugin(tmp_path / 'mine')
  (tmp_path / 'mine' / 'myconf.py').write_text(CONFIG_FILE)
  proc = kf(tmp_path, 'config', 'mine/myconf.py:tiny')
  assert proc.returncode == 0 and 'kind: myprf-antithetic' in proc.stdout, proc.stderr[-2000:]
  proc = kf(tmp_path, 'sweep', '--config', 'mine/myconf.py:tiny', '--grid', 'seed=0,1', '--sweep_dir',
            'sw', '--dry_run')
  assert proc.returncode == 0 and '2 runs: 0 done, 0 resume, 2 new, 0 error' in proc.stdout, \
      proc.stdout[-2000:] + proc.stderr[-2000:]
  proc = kf(tmp_path, 'config', 'listops:tiny', '--plugin', plugin,
            '--config.model.attention.kind=grelu-antithetic')
  assert proc.returncode == 0 and 'kind: grelu-antithetic' in proc.stdout, proc.stderr[-2000:]
  proc = kf(tmp_path, 'config', 'listops:tiny', '--config.model.attention.kind=grelu-antithetic')
  assert proc.returncode != 0 and "unknown attention kind 'grelu-antithetic'" in proc.stderr


def test_missing_plugin_is_one_line(tmp_path):
  proc = kf(tmp_path, 'kernels', '--plugin', 'no_such_kernels.py')
  assert proc.returncode != 0 and 'Traceback' not in proc.stderr
  assert 'no_such_kernels.py not found' in proc.stderr.strip().splitlines()[-1]


MAP_PLUGIN = '''
"""A feature map of one's own: one function and one record, in one file."""
import jax
import jax.numpy as jnp

from kernelformer import plugins
from kernelformer.features.feature_map import FeatureMap


def softplus_map(q, k, proj=None, *, mask=None, stabilize=True):
  phi_k = jax.nn.softplus(k)
  if mask is not None:
    phi_k = jnp.where(mask[..., None], phi_k, 0.0)
  return jax.nn.softplus(q), phi_k


SOFTPLUS = plugins.register_feature_map(FeatureMap(
    'softplus_map', softplus_map, target_kernel='none', parts=0, positive=True, statistic='row',
    kind='softplus-map', paper='softplus(x) features, a plugin map'))
'''

MAP_CHECK = r'''
import sys
import jax, jax.numpy as jnp, numpy as np
from kernelformer import plugins, registry
plugins.load(sys.argv[1])
from kernelformer.features import catalog
assert catalog.get('softplus_map').row_wise and registry.get('softplus-map').fixed == {
    'component': 'softplus_map', 'weights': 'none'}
ks = jax.random.split(jax.random.PRNGKey(3), 3)
q, k, v = (jax.random.normal(kk, (2, 10, 2, 4)) for kk in ks)
mask = jnp.arange(10)[None, :] < jnp.array([[10], [6]])
sp = lambda x: np.log1p(np.exp(np.asarray(x, np.float64)))
for causal in (False, True):
  m = registry.build({'kind': 'softplus-map', 'chunk_size': 4})
  out = np.asarray(m.apply(m.init(ks[0], q, k, v, mask=mask), q, k, v, mask=mask, causal=causal))
  s = np.einsum('blhd,bshd->bhls', sp(q), sp(k)) * np.asarray(mask)[:, None, None, :]
  if causal:
    s = s * np.tril(np.ones((10, 10)))
  want = np.einsum('bhls,bshd->blhd', s / s.sum(-1, keepdims=True), np.asarray(v, np.float64))
  real = np.asarray(mask)[:, :, None, None]
  err = np.max(np.abs(np.where(real, out - want, 0.0)))
  assert err < 1e-5, (causal, err)
print('ok')
'''


def test_a_plugin_feature_map_is_one_record_and_trains_with_the_plugin_flag(tmp_path):
  """A user's file adds a map as one function + one record; the library computes its attention
  (float64 reference, bidirectional and causal, masked), lists it, and ``train --plugin`` trains it."""
  plugin = tmp_path / 'mymap.py'
  plugin.write_text(MAP_PLUGIN)
  proc = subprocess.run([sys.executable, '-c', MAP_CHECK, str(plugin)], capture_output=True, text=True,
                        env=env(), cwd=str(tmp_path), timeout=300)
  assert proc.returncode == 0 and proc.stdout.startswith('ok'), proc.stderr[-3000:]
  proc = kf(tmp_path, 'kernels', '--plugin', str(plugin), 'softplus-map')
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "feature map: softplus_map (positive; M' = d; causal: yes)" in proc.stdout, proc.stdout
  e = {**env(), 'KERNELFORMER_DATA': str(tmp_path / 'data')}
  proc = subprocess.run([sys.executable, '-m', 'kernelformer', 'train', '--plugin', 'mymap.py',
                         '--config', 'listops:tiny', '--workdir', 'runs/softplus',
                         '--config.model.attention.kind=softplus-map', '--config.num_train_steps=4',
                         '--config.eval_every=4', '--config.checkpoint_every=4'],
                        capture_output=True, text=True, env=e, cwd=str(tmp_path), timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  with open(tmp_path / 'runs' / 'softplus' / 'results.json', encoding='utf-8') as f:
    r = json.load(f)
  assert r['attention'] == 'softplus-map' and 0.0 <= r['test_accuracy'] <= 1.0
  digest = hashlib.sha256(plugin.read_bytes()).hexdigest()
  assert r['plugins'] == [{'file': str(plugin), 'sha256': digest}]
