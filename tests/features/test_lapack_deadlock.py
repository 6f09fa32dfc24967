"""Regression test: random-feature models with QR/SVD samplers never hang on CPU.

Cause: jaxlib splits a batched LAPACK call over XLA's CPU intra-op pool and blocks the calling pool
thread until the pieces finish; XLA runs independent thunks (one layer's draw, another's) on the same
pool, so with two or more batched decompositions ready at once every pool thread could block waiting
for work no thread was free to run. ``weights.serial_on_cpu`` decomposes one matrix at a time instead.
The workload runs in a subprocess under a timeout: a regression shows as a timeout, not a hung suite.
Without the fix the minimal program hung 3 of 3 times on a 2-core machine.
"""
from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from kernelformer.features import weights

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Every sampler that calls LAPACK: orf (QR), mm (SVD); sgq/qmc/sorf/fastfood/iid do not.
LAPACK_SAMPLERS = ('orf', 'mm')


def test_four_layer_models_with_lapack_samplers_finish():
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
  cases = ['minimal', *LAPACK_SAMPLERS]
  try:
    proc = subprocess.run([sys.executable, os.path.join(ROOT, 'tests', 'features', 'lapack_driver.py'),
                           *cases], capture_output=True, text=True, timeout=420, env=env, cwd=ROOT)
  except subprocess.TimeoutExpired as e:
    done = (e.stdout or b'').decode() if isinstance(e.stdout, bytes) else (e.stdout or '')
    raise AssertionError(f'deadlock: finished only {done.split()!r} of {cases} in 420 s') from None
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert [line.split()[1] for line in proc.stdout.splitlines() if line.startswith('ok ')] == cases


def test_serial_decomposition_is_bit_identical_to_the_batched_call():
  g = jax.random.normal(jax.random.PRNGKey(1), (3, 2, 16, 16))
  q1, r1 = jax.jit(weights._qr)(g)                                   # pylint: disable=protected-access
  q2, r2 = jax.jit(jnp.linalg.qr)(g)
  np.testing.assert_array_equal(q1, q2)
  np.testing.assert_array_equal(r1, r2)
  q3, _ = jax.jit(jax.vmap(jax.vmap(weights._qr)))(g)                # pylint: disable=protected-access
  np.testing.assert_array_equal(q3, q2)
  a = jax.random.normal(jax.random.PRNGKey(2), (4, 40, 16))
  u1, _, v1 = jax.jit(jax.vmap(weights._thin_svd))(a)                # pylint: disable=protected-access
  u2, _, v2 = jax.jit(lambda a: jnp.linalg.svd(a, full_matrices=False))(a)
  np.testing.assert_array_equal(u1, u2)
  np.testing.assert_array_equal(v1, v2)
