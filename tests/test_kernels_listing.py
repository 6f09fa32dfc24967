"""``kernelformer kernels`` grouped by family with the common kernels first, its --family/--names filters,
and the one-line error for an unknown kind (three nearest names, then where to see them all)."""
from __future__ import annotations

import os
import subprocess
import sys

from kernelformer import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kernels(*args):
  env = {**os.environ, 'PYTHONPATH': ROOT, 'JAX_PLATFORMS': 'cpu'}
  env.pop('KERNELFORMER_PLUGIN', None)
  return subprocess.run([sys.executable, '-m', 'kernelformer', 'kernels', *args], capture_output=True,
                        text=True, env=env, cwd=ROOT, timeout=300)


def test_unknown_kind_names_the_three_nearest():
  try:
    registry.get('posrf-orff')
  except registry.UnknownKernelError as e:
    msg = str(e)
  assert msg.startswith("unknown attention kind 'posrf-orff' (nearest: posrf-orf, ")
  nearest = msg.split('(nearest: ', 1)[1].split(')')[0].split(', ')
  assert len(nearest) == 3 and msg.endswith('; see `kernelformer kernels` for every kind')
  assert len(msg) < 200   # one readable line, not every name
  # A name far from all of them still gets three suggestions; an alias says what it stands for.
  assert len(registry.nearest('zzzz')) == 3
  assert "favor+ (= posrf-orf)" in registry.unknown_message(['favorplus'])


def test_kernels_grouped_by_family_common_first():
  proc = kernels()
  assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr[-2000:]
  blocks = [b for b in proc.stdout.strip().split('\n\n') if b.strip()]
  headings = [b for b in blocks if b.startswith('== ')]
  assert headings[0] == '== baselines: exact attention ==' and \
      headings[1] == '== random features, component posrf =='
  assert [h.split(':')[0] for h in headings[-3:]] == [
      '== learnable random features (the spectral measure is trained) ==',
      '== deterministic feature maps (no random W) ==', '== beyond random features']
  names = [b.split()[0] for b in blocks if not b.startswith('== ')][:-1]  # the last block is the summary
  assert names[:3] == ['softmax', 'gaussian', 'posrf-orf']   # FAVOR+ right after the baselines
  assert sorted(names) == sorted(registry.list_kernels())    # every kernel once
  assert names.index('oprf-orf') < names.index('oprf-iid') < names.index('fastfood-prf') < \
      names.index('linear-elu') < names.index('linformer')


def test_family_and_names_filters():
  proc = kernels('--family', 'learnable', '--names')
  assert proc.returncode == 0
  learned = [s.name for s in registry.specs() if s.fixed.get('weights') in ('fastfoodl', 'gmm', 'generative')]
  assert sorted(proc.stdout.split()) == sorted(learned)
  proc = kernels('--family', 'posrf', '--names')
  assert proc.stdout.split()[0] == 'posrf-orf' and 'nprf-rpe' in proc.stdout.split()
  assert all(registry.get(n).fixed['component'] == 'posrf' for n in proc.stdout.split())
  proc = kernels('--family', 'nope')
  assert proc.returncode == 2 and proc.stderr.count('\n') == 1 and 'beyond-rf' in proc.stderr
