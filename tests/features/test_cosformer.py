"""cosFormer (Qin et al. 2022, the cos-based re-weighting) against float64 references written from the paper.

The paper's similarity is ``s(q_i, k_j) = relu(q_i).relu(k_j) cos(pi/2 (i - j)/M)`` (positions 1-based,
as the official code, OpenNLPLab/cosFormer cosformer.py @ 8e12da1 l. 45-46), and attention is
``out_i = sum_j s_ij v_j / sum_j s_ij`` over the visible keys. The references below form that quadratic,
re-weighted matrix directly (no cos/sin split); our map is the split one. Checked: the features entry by
entry, the kernel, linear attention on the features (float64, bidirectional and chunked causal) = the
quadratic form, the attention module (float32, masked, left/right/interior padding, both ways), M in the
decoder (its ``max_length``) and the one-line refusal of a too-short ``cos_length``.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import decoder, registry
from kernelformer.attention import linear
from kernelformer.features import catalog
from kernelformer.features import maps

D = 5


def ref_features(x, pos, horizon):
  """[relu(x_i) cos(pi i/(2M)), relu(x_i) sin(pi i/(2M))] for x [..., L, d], pos [..., L], M [...]."""
  r = np.maximum(np.asarray(x, np.float64), 0.0)
  a = math.pi / 2 * np.asarray(pos, np.float64) / np.asarray(horizon, np.float64)[..., None]
  return np.concatenate([r * np.cos(a)[..., None], r * np.sin(a)[..., None]], -1)


def ref_scores(q, k, pos_q, pos_k, horizon):
  """The paper's quadratic form s_ij = relu(q_i).relu(k_j) cos(pi/2 (i - j)/M), [..., L, S]."""
  rq, rk = np.maximum(q, 0.0), np.maximum(k, 0.0)
  dot = np.einsum('...ld,...sd->...ls', rq, rk)
  diff = np.asarray(pos_q, np.float64)[..., :, None] - np.asarray(pos_k, np.float64)[..., None, :]
  return dot * np.cos(math.pi / 2 * diff / np.asarray(horizon, np.float64)[..., None, None])


def test_features_and_kernel_equal_the_paper_in_float64():
  rng = np.random.default_rng(0)
  q, k = rng.standard_normal((2, 6, D)), rng.standard_normal((2, 6, D))
  pos = np.array([[1, 2, 3, 4, 5, 6], [3, 4, 5, 6, 7, 8]], np.float64)
  horizon = np.array([6.0, 11.0])
  with jax.enable_x64(True):
    pq, pk = catalog.get('cosformer').fn(jnp.asarray(q), jnp.asarray(k), None,
                                       positions=(jnp.asarray(pos), jnp.asarray(pos), jnp.asarray(horizon)))
    assert pq.dtype == jnp.float64 and pq.shape == (2, 6, 2 * D) == (2, 6, catalog.get('cosformer').feature_count(0, D))
    np.testing.assert_allclose(np.asarray(pq), ref_features(q, pos, horizon), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(np.asarray(pk), ref_features(k, pos, horizon), rtol=1e-13, atol=1e-15)
    kern = np.einsum('blm,bsm->bls', np.asarray(pq), np.asarray(pk))
    np.testing.assert_allclose(kern, ref_scores(q, k, pos, pos, horizon), rtol=1e-12, atol=1e-14)
    # Without positions: the official code's 1..L, 1..S and M = max(L, S) (cosformer.py l. 106-112).
    q3 = q[:, :4]
    pq, pk = catalog.get('cosformer').fn(jnp.asarray(q3), jnp.asarray(k), None)
    np.testing.assert_allclose(np.asarray(pq), ref_features(q3, np.arange(1, 5)[None], np.array([6.0, 6.0])),
                               rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(np.asarray(pk), ref_features(k, np.arange(1, 7)[None], np.array([6.0, 6.0])),
                               rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize('causal', [False, True])
def test_linear_attention_equals_the_quadratic_reweighted_form_in_float64(causal):
  """Ptolemy's split is exact: the right-product (linear) form on the float64 features = the explicit
  re-weighted quadratic matrix to 1e-11; the library's core (float32 accumulation, chunked when causal)
  on the same features agrees to float32 rounding."""
  rng = np.random.default_rng(1)
  b, l, h = 2, 11, 2
  q, k = rng.uniform(-0.3, 1.5, (b, l, h, D)), rng.uniform(-0.3, 1.5, (b, l, h, D))
  v = rng.standard_normal((b, l, h, 3))
  pos, horizon = np.arange(1, l + 1, dtype=np.float64), float(l)
  with jax.enable_x64(True):
    one = lambda qh, kh: catalog.get('cosformer').fn(qh, kh, None, positions=(pos, pos, horizon))
    pq, pk = jax.vmap(one, in_axes=(2, 2), out_axes=(2, 2))(jnp.asarray(q), jnp.asarray(k))
    pq, pk = np.asarray(pq), np.asarray(pk)
  assert pq.dtype == np.float64
  # Linear form: phi(q_i) . sum_j phi(k_j) v_j^T / phi(q_i) . sum_j phi(k_j), j over all keys or j <= i.
  kv = np.einsum('bshm,bshd->bshmd', pk, v)
  if causal:
    kv_sum, k_sum = np.cumsum(kv, axis=1), np.cumsum(pk, axis=1)
  else:
    kv_sum, k_sum = kv.sum(1, keepdims=True), pk.sum(1, keepdims=True)
  linear_form = (np.einsum('blhm,blhmd->blhd', pq, kv_sum)
                 / np.einsum('blhm,blhm->blh', pq, k_sum)[..., None])
  s = ref_scores(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), pos, pos, np.full((b, h), horizon))
  if causal:
    s = s * np.tril(np.ones((l, l)))
  ref = np.einsum('bhls,bshd->blhd', s, v) / s.sum(-1).transpose(0, 2, 1)[..., None]
  np.testing.assert_allclose(linear_form, ref, rtol=1e-11, atol=1e-13)
  out = linear.linear_attention(jnp.asarray(pq, jnp.float32), jnp.asarray(pk, jnp.float32),
                                jnp.asarray(v, jnp.float32), causal=causal, chunk_size=4)
  np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=1e-4, atol=1e-5)


def _module_reference(q, k, v, mask, causal):
  """Float64 attention of each example's real tokens only (compacted): positions 1..n, M = n."""
  out = np.zeros(q.shape[:3] + (v.shape[-1],))
  for b in range(q.shape[0]):
    idx = np.flatnonzero(mask[b])
    n = len(idx)
    pos = np.arange(1, n + 1, dtype=np.float64)
    qb, kb = q[b, idx].transpose(1, 0, 2), k[b, idx].transpose(1, 0, 2)       # [H, n, d]
    s = ref_scores(qb, kb, pos, pos, np.full((q.shape[2],), float(n)))
    if causal:
      s = s * np.tril(np.ones((n, n)))
    out[b, idx] = (np.einsum('hls,shd->lhd', s, v[b, idx]) / s.sum(-1).T[..., None])
  return out


def test_module_equals_the_paper_with_left_right_and_interior_padding():
  """The attention module (float32) on padded batches = float64 attention of the real tokens alone.

  Positions count real tokens (``maps.token_positions``: cumsum of the mask) and M is their number, so
  left, right and interior padding move nothing: the reference sees only the real tokens, compacted.
  """
  b, l, h = 3, 12, 2
  rng = np.random.default_rng(2)
  q, k = rng.uniform(-0.2, 1.5, (b, l, h, D)), rng.uniform(-0.2, 1.5, (b, l, h, D))
  v = rng.standard_normal((b, l, h, 3))
  j = np.arange(l)
  mask = np.stack([j < 7,                       # right padding
                   j >= 4,                      # left padding
                   (j % 3) != 1])               # padding between real tokens
  qg, kg, vg = (np.where(mask[:, :, None, None], x, 30.0 * rng.standard_normal(x.shape)) for x in (q, k, v))
  module = registry.build({'kind': 'cosformer', 'chunk_size': 4})
  args = [jnp.asarray(a, jnp.float32) for a in (qg, kg, vg)]
  variables = module.init({'params': jax.random.PRNGKey(0), 'features': jax.random.PRNGKey(1)}, *args,
                          mask=jnp.asarray(mask))
  for causal in (False, True):
    out = np.asarray(module.apply(variables, *args, mask=jnp.asarray(mask), causal=causal), np.float64)
    ref = _module_reference(q, k, v, mask, causal)
    for bb in range(b):
      np.testing.assert_allclose(out[bb, mask[bb]], ref[bb, mask[bb]], rtol=2e-4, atol=2e-5,
                                 err_msg=f'causal={causal}, example {bb}')


def test_bf16_inputs_match_float32():
  b, l, h = 2, 8, 2
  rng = np.random.default_rng(3)
  q, k, v = (jnp.asarray(rng.uniform(-0.2, 1.5, (b, l, h, D)), jnp.bfloat16) for _ in range(3))
  module = registry.build({'kind': 'cosformer', 'chunk_size': 4})
  variables = module.init(jax.random.PRNGKey(0), q, k, v)
  for causal in (False, True):
    low = module.apply(variables, q, k, v, causal=causal)
    assert low.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(low)))
    high = module.apply(variables, *(x.astype(jnp.float32) for x in (q, k, v)), causal=causal)
    np.testing.assert_allclose(np.asarray(low, np.float32), np.asarray(high), rtol=2e-2, atol=2e-2)


def test_decoder_uses_max_length_as_m_in_full_forward_and_steps():
  """M = the decoder's max_length (not the prompt's length): steps = full forward = the paper's form."""
  vocab, length, max_length = 7, 6, 10
  model = decoder.Decoder(vocab_size=vocab, emb_dim=8, num_layers=1, num_heads=2, qkv_dim=8, mlp_dim=16,
                          attention={'kind': 'cosformer', 'chunk_size': 4}, max_length=max_length)
  tokens = jax.random.randint(jax.random.key(0), (2, length), 1, vocab)
  fkey = jax.random.key(1)
  params = model.init({'params': jax.random.key(2), 'features': fkey}, tokens)['params']
  full = model.apply({'params': params}, tokens, rngs={'features': fkey})
  steps = decoder.teacher_forced_logits(model, params, tokens, features_key=fkey)
  np.testing.assert_allclose(np.asarray(steps), np.asarray(full), rtol=1e-4, atol=1e-5)
  # The attention inside sees M = max_length: its sown features are those of the paper at M = 10.
  _, inter = model.apply({'params': params}, tokens, rngs={'features': fkey}, mutable=['intermediates'])
  phi_q = np.asarray(jax.tree.leaves(inter)[0])                                   # [B, L, H, 2 d_h]
  half = phi_q.shape[-1] // 2
  angle = np.arctan2(phi_q[..., half:], phi_q[..., :half])                       # where relu(q) > 0
  want = np.broadcast_to((math.pi / 2 * np.arange(1, length + 1) / max_length)[None, :, None, None],
                         angle.shape)
  seen = phi_q[..., :half] > 1e-6
  assert seen.any()
  np.testing.assert_allclose(angle[seen], want[seen], rtol=1e-5)


def test_too_short_cos_length_is_one_clear_error():
  module = registry.build({'kind': 'cosformer', 'cos_length': 4})
  x = jnp.ones((1, 6, 2, D))
  with pytest.raises(ValueError, match=r"cos_length \(cosFormer's M\) = 4 is shorter than the sequence"):
    module.init(jax.random.PRNGKey(0), x, x, x)
  # At least the sequence length: M = cos_length for every example.
  pos = maps.token_positions(jnp.array([[True] * 3 + [False] * 3]), 6, 6, cos_length=8)
  np.testing.assert_array_equal(np.asarray(pos[1]), [[1, 2, 3, 3, 3, 3]])
  np.testing.assert_array_equal(np.asarray(pos[2]), [8.0])
