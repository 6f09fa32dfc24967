"""``performer-lra-listops``: LRA's ListOps Performer (listops/configs/performer_base.py @ 093bfc6).

Checked against a numpy transcription of LRA's ``nonnegative_softmax_kernel_feature_creator``
(google-research/long-range-arena lra_benchmarks/models/performer/performer_attention.py lines 50-108 at
cd31e5c), written here independently of ``components.posrf_lra``:

* feature values for a fixed W, for the component and for the registered kind (whose d^-1/4 input scale,
  1/sqrt(M) and shared-across-heads W are the module's);
* W: 2 rows (nb_features=2), orthogonal, shared by all heads, row norms those of Gaussian rows
  (ortho_scaling=0: chi_d, not all sqrt(d));
* a new W at every training step (redraw on every call), a fixed one for evaluation;
* the normalized attention output against LRA's formula; no causal form.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import decoder, registry
from kernelformer.features import components
from kernelformer.features.projection import Projection

KIND = 'performer-lra-listops'
EPS = 1e-6     # make_fast_softmax_attention(numerical_stabilizer=0.000001)


def lra_features(data, w, *, is_query, valid=None):
  """LRA's feature creator for one head: ``data [B, L, d]`` (unscaled), ``w [M, d]``.

  data_normalizer = d^-1/4; ratio = M^-1/2; data_dash = (normalizer x) . w; diag = |normalizer x|^2 / 2;
  queries: ratio (exp(data_dash - diag - max over features) + eps); keys: ratio (exp(data_dash - diag -
  max over keys and features) + eps). ``valid`` (keys only): padded keys are left out of the max and
  zeroed (kernelformer's masking; LRA itself has no mask there).
  """
  data = np.asarray(data, np.float64)
  w = np.asarray(w, np.float64)
  normalizer = 1.0 / np.sqrt(np.sqrt(data.shape[-1]))
  ratio = 1.0 / np.sqrt(w.shape[0])
  dash = np.einsum('bld,md->blm', normalizer * data, w)
  diag = (np.sum(data ** 2, axis=-1, keepdims=True) / 2.0) * normalizer * normalizer
  if is_query:
    return ratio * (np.exp(dash - diag - dash.max(axis=-1, keepdims=True)) + EPS)
  masked = dash if valid is None else np.where(valid[..., None], dash, -np.inf)
  out = ratio * (np.exp(dash - diag - masked.max(axis=(-2, -1), keepdims=True)) + EPS)
  return out if valid is None else np.where(valid[..., None], out, 0.0)


def lra_attention(q, k, v, w, valid=None):
  """Bidirectional renormalized FAVOR (performer_attention.py lines 644-705), one head.

  Returns the output ``[B, L, dv]`` and the unguarded normalizer ``[B, L]``.
  """
  qp = lra_features(q, w, is_query=True)
  kp = lra_features(k, w, is_query=False, valid=valid)
  num = np.einsum('blm,bsm,bsd->bld', qp, kp, np.asarray(v, np.float64))
  den = np.einsum('blm,bsm->bl', qp, kp)
  guarded = den + 2 * EPS * (np.abs(den) <= EPS)
  return num / guarded[..., None], den


def _qkv(seed, b=2, length=7, h=3, d=8, scale=1.5):
  ks = jax.random.split(jax.random.key(seed), 3)
  return tuple(scale * jax.random.normal(kk, (b, length, h, d)) for kk in ks)


def test_component_features_equal_lra_for_a_fixed_w():
  d = 8
  q, k, _ = _qkv(0, h=1, d=d)
  q, k = q[:, :, 0], k[:, :, 0]
  w = np.array(jax.random.normal(jax.random.key(5), (2, d)))
  valid = np.array([[True] * 7, [True] * 4 + [False] * 3])
  s = d ** -0.25                                     # the attention module's input scale
  phi_q, phi_k = components.posrf_lra(q * s, k * s, Projection(matrix=jnp.asarray(w)),
                                      mask=jnp.asarray(valid))
  np.testing.assert_allclose(phi_q, lra_features(q, w, is_query=True), rtol=2e-5, atol=1e-9)
  np.testing.assert_allclose(phi_k, lra_features(k, w, is_query=False, valid=valid), rtol=2e-5,
                             atol=1e-9)
  # The floor of 1e-6 / sqrt(2) is there (it is what makes this map differ from posrf's).
  assert float(jnp.min(phi_q)) >= EPS / np.sqrt(2) * (1 - 1e-6)


def _apply(module, variables, qkv, step, mask=None, features_key=1):
  out, state = module.apply(variables, *qkv, mask=mask, step=step, rngs={'features': jax.random.key(
      features_key)}, mutable=['features', 'intermediates'])
  return out, state


def _init(module, qkv):
  return module.init({'params': jax.random.key(0), 'features': jax.random.key(1)}, *qkv)


def test_registered_kind_features_and_output_equal_lra():
  """Whatever num_features / redraw_every / share_heads a config holds, the kind is LRA's: M = 2."""
  module = registry.build({'kind': KIND, 'num_features': 64, 'redraw_every': 100, 'share_heads': False})
  assert (module.num_features, module.redraw_every, module.share_heads) == (2, 1, True)
  qkv = _qkv(1)
  mask = jnp.asarray([[True] * 7, [True] * 5 + [False] * 2])
  variables = _init(module, qkv)
  out, state = _apply(module, variables, qkv, jnp.int32(4), mask=mask)
  w = np.asarray(jax.tree.leaves(state['features']['train'])[0])
  assert w.shape == (2, 8)                            # one W for all heads (LRA's projection_matrix)
  phi_q = state['intermediates']['phi_q'][0]
  phi_k = state['intermediates']['phi_k'][0]
  q, k, v = (np.asarray(x) for x in qkv)
  for head in range(q.shape[2]):
    np.testing.assert_allclose(phi_q[:, :, head], lra_features(q[:, :, head], w, is_query=True),
                               rtol=2e-5, atol=1e-9)
    np.testing.assert_allclose(
        phi_k[:, :, head], lra_features(k[:, :, head], w, is_query=False, valid=np.asarray(mask)),
        rtol=2e-5, atol=1e-9)
    # Rows whose normalizer is above the guard (LRA: R + 2e-6 where |R| <= 1e-6; here the core's
    # feature_eps guard): the outputs are LRA's.
    want, den = lra_attention(q[:, :, head], k[:, :, head], v[:, :, head], w, valid=np.asarray(mask))
    rows = den > 2 * EPS
    assert rows.sum() >= rows.size // 2
    np.testing.assert_allclose(np.asarray(out[:, :, head])[rows], want[rows], rtol=1e-4, atol=1e-5)


def _w(module, variables, qkv, step):
  """The W the module uses at ``step`` (None: evaluation), jitted over the step."""
  if step is None:
    _, state = _apply(module, variables, qkv, None)
    return np.asarray(jax.tree.leaves(state['features']['train'])[0])
  return np.asarray(_w_jit(module, variables, qkv, jnp.asarray(step, jnp.int32)))


def _w_jit(module, variables, qkv, step):
  key = (id(module), id(variables), id(qkv))
  if key not in _W_FNS:
    _W_FNS[key] = jax.jit(lambda t: jax.tree.leaves(
        _apply(module, variables, qkv, t)[1]['features']['train'])[0])
  return _W_FNS[key](step)


_W_FNS = {}


def test_a_new_w_every_step_and_evaluation_uses_the_last_steps():
  module = registry.build({'kind': KIND})
  qkv = _qkv(2)
  variables = _init(module, qkv)
  draws = [_w(module, variables, qkv, jnp.int32(t)) for t in range(4)]
  for i in range(4):
    for j in range(i):
      assert not np.allclose(draws[i], draws[j]), (i, j)
  # The same step gives the same draw (a pure function of the layer's key and the step).
  np.testing.assert_array_equal(_w(module, variables, qkv, jnp.int32(2)), draws[2])
  ev = _w(module, variables, qkv, None)
  np.testing.assert_array_equal(_w(module, variables, _qkv(9), None), ev)
  # Evaluation after step 3 (its features collection) uses step 3's W, whatever the inputs.
  _, trained = _apply(module, variables, qkv, jnp.int32(3))
  after = {**variables, 'features': trained['features']}
  np.testing.assert_array_equal(_w(module, after, _qkv(9), None), draws[3])
  # Different steps give different outputs, not just different stored matrices.
  out0, _ = _apply(module, variables, qkv, jnp.int32(0))
  out1, _ = _apply(module, variables, qkv, jnp.int32(1))
  assert float(jnp.max(jnp.abs(out0 - out1))) > 1e-4


def test_rows_orthogonal_with_gaussian_row_norms():
  """ortho_scaling=0: orthogonal directions, each row's norm that of a N(0, I_d) vector (chi_d)."""
  d = 8
  module = registry.build({'kind': KIND})
  qkv = _qkv(3, d=d)
  variables = _init(module, qkv)
  ws = np.stack([_w(module, variables, qkv, jnp.int32(t)) for t in range(200)])     # [200, 2, d]
  dots = np.einsum('nd,nd->n', ws[:, 0], ws[:, 1])
  np.testing.assert_allclose(dots, 0.0, atol=1e-4)
  norms = np.linalg.norm(ws, axis=-1).ravel()
  assert norms.std() > 0.3                               # not renormalised to sqrt(d) (ortho_scaling=1)
  # chi_8: mean sqrt(2) Gamma(4.5) / Gamma(4) = 2.7344, variance 8 - mean^2 = 0.5230; 400 samples.
  assert abs(norms.mean() - 2.7344) < 4 * np.sqrt(0.5230 / norms.size)
  assert abs(norms.var() - 0.5230) < 0.15


def test_no_causal_form():
  assert KIND not in decoder.causal_kinds()
  assert 'no causal form' in decoder.causal_problem(KIND)
  module = registry.build({'kind': KIND})
  qkv = _qkv(4)
  with pytest.raises(ValueError, match='no causal form'):
    module.init({'params': jax.random.key(0), 'features': jax.random.key(1)}, *qkv, causal=True)


def test_aliases_and_listing():
  assert registry.canonical_name('lra-listops-performer') == KIND
  assert KIND in registry.list_kernels()
