"""Padding-amount invariance for EVERY registered attention mechanism (``list_kernels()``).

The same real tokens (5 in one sequence, 2 in the other) padded to L = 8 and to 4L = 32, with different
garbage in the padded positions, must give the same output on the real tokens. Random mechanisms get
the same ``rngs={'features': ...}`` and the same training ``step`` in both calls: their draw may depend
on the feature RNG, the step and the layer path, never on L. 3 landmarks / projected keys and 9 random
features keep the shapes tiny and make Nyströmformer's segments matter (5 real tokens -> segments of 2).

Mechanisms whose spec sets ``length_dependent`` (depend on absolute length or position by definition)
are listed in docs/kernels.md; the list is pinned here. Linformer is the one such mechanism, and with end
padding inside ``max_length`` it is invariant as well (padded keys are zeroed before E, F), so it is
tested like the others; what its mark means (absolute positions) is tested separately.

nprf-rpe gets a relative-position bias that is one function of the offset j - i, sliced to each length
(index ``j - i + L - 1``), as the registry's layout prescribes.
"""
from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelformer
from kernelformer import registry
from tests.attention.helpers import fast_jit

B, H, D = 2, 2, 4
SHORT, LONG = 8, 32
REAL = (5, 2)
OPTIONS = {'num_features': 9, 'num_landmarks': 3, 'linformer_k': 3, 'max_length': LONG,
           'chunk_size': 4, 'num_mixture_components': 2, 'redraw_every': 10}
NAMES = kernelformer.list_kernels()
DOCS = pathlib.Path(__file__).resolve().parents[2] / 'docs' / 'kernels.md'

# Documented in docs/kernels.md ("Length-dependent mechanisms").
LENGTH_DEPENDENT = {'linformer'}


def _real_and_garbage(seed):
  ks = jax.random.split(jax.random.PRNGKey(seed), 6)
  real = tuple(0.7 * jax.random.normal(kk, (B, LONG, H, D)) for kk in ks[:3])
  garbage = tuple(5.0 * jax.random.normal(kk, (B, LONG, H, D)) for kk in ks[3:])
  return real, garbage


def _padded(length, real, garbage):
  mask = jnp.arange(length)[None, :] < jnp.asarray(REAL)[:, None]
  return tuple(jnp.where(mask[:, :, None, None], r[:, :length], g[:, :length])
               for r, g in zip(real, garbage)), mask


def _bias_table(length, full):
  """The [H, 2 length - 1] slice of one offset function ``full [H, 2 LONG - 1]``."""
  return full[:, LONG - length:LONG + length - 1]


def _outputs(name, *, swap_garbage=False):
  spec = registry.get(name)
  module = registry.build({'kind': name, **OPTIONS})
  key = jax.random.PRNGKey(0)
  rngs = {'features': jax.random.PRNGKey(1), 'dropout': key}
  real, garbage = _real_and_garbage(2)
  if swap_garbage:                                  # other garbage in the long version
    garbage = tuple(-3.0 * g[:, ::-1] for g in garbage)
  short, mask_s = _padded(SHORT, real, _real_and_garbage(3)[1])
  long_, mask_l = _padded(LONG, real, garbage)
  full_bias = 0.3 * jax.random.normal(jax.random.PRNGKey(7), (H, 2 * LONG - 1))
  step = jnp.asarray(13, jnp.int32)

  def extra(length):
    return {'position_bias': _bias_table(length, full_bias)} if spec.requires_position_bias else {}

  def run(short, mask_s, long_, mask_l):
    variables = module.init({'params': key, **rngs}, *long_, mask=mask_l, **extra(LONG))
    apply = lambda qkv, m, n: module.apply(variables, *qkv, mask=m, step=step, deterministic=True,
                                           rngs=rngs, **extra(n))
    return apply(short, mask_s, SHORT), apply(long_, mask_l, LONG)

  return fast_jit(run)(short, mask_s, long_, mask_l)


# Mechanisms that fail padding invariance although their definition does not depend on L (none now:
# Skyformer's landmark draw used to, fixed by skyformer.row_uniforms).
KNOWN_FAILURES: dict[str, str] = {}


@pytest.mark.parametrize('name', [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[n]))
    if n in KNOWN_FAILURES else n for n in NAMES])
def test_same_real_outputs_padded_to_l_or_4l(name):
  out_s, out_l = _outputs(name)
  assert out_s.shape == (B, SHORT, H, D) and out_l.shape == (B, LONG, H, D)
  for b, n in enumerate(REAL):
    got, want = np.asarray(out_l[b, :n]), np.asarray(out_s[b, :n])
    assert np.all(np.isfinite(want)), name
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5,
                               err_msg=f'{name}: padding to {LONG} instead of {SHORT} changed example {b}')


def test_length_dependent_marks_are_the_documented_ones():
  marked = {s.name for s in registry.specs() if s.length_dependent}
  assert marked == LENGTH_DEPENDENT
  text = DOCS.read_text()
  section = text[text.index('## Length-dependent mechanisms'):]
  section = section[:section.find('\n## ', 3)] if '\n## ' in section[3:] else section
  for name in marked:
    assert f'`{name}`' in section, f'{name} is marked length_dependent but not documented'


def test_linformer_depends_on_absolute_position():
  """What the mark means: the same 3 tokens at positions 0-2 or 4-6 give different outputs."""
  module = registry.build({'kind': 'linformer', **OPTIONS})
  real, _ = _real_and_garbage(4)
  q, k, v = (x[:, :SHORT] for x in real)
  first = jnp.arange(SHORT)[None, :] < 3
  moved = (jnp.arange(SHORT)[None, :] >= 4) & (jnp.arange(SHORT)[None, :] < 7)
  roll = lambda x: jnp.roll(x, 4, axis=1)
  variables = module.init(jax.random.PRNGKey(0), q, k, v, mask=jnp.broadcast_to(first, (B, SHORT)))

  @fast_jit
  def both(variables):
    a = module.apply(variables, q, k, v, mask=jnp.broadcast_to(first, (B, SHORT)))
    b = module.apply(variables, roll(q), roll(k), roll(v), mask=jnp.broadcast_to(moved, (B, SHORT)))
    return a[:, :3], b[:, 4:7]

  a, b = both(variables)
  assert float(jnp.max(jnp.abs(a - b))) > 1e-3
