"""The causal stabilizer never includes a key after its query: exact at every key norm and chunk size.

Every row is shifted by the running key max over the keys up to itself (``components._exp_shifted``
with ``causal_chunk``), and the core forms each product on a shift both rows may see
(``linear._shifted_causal_num_den``, ``linear._shifted_blocks``, ``linear.causal_exp_feature_attention``).
Checked here:

* stored path (component features + ``linear_attention``) and lean scan (chunks whose running max
  rises by at most ``span`` on one shift; with ``span=0`` every chunk per row) against a float64
  evaluation of the same estimator (log space, below), keys x1, x10, x30, chunks 1, 3 and 64 at
  L = 80 (chunk 64: a full and a partial chunk; 3: a ragged end), every shifted component, with padded
  keys (under the vmap over scales the x10 / x30 chunks that rise further put the x1 ones per row too);
* gradients of the lean scan equal those of the stored path at chunks 3 and 64, keys x10;
* a decoder's full forward at chunk 64 and 3 equals step-by-step decoding at keys x10 and x30 (L = 70).

A per-chunk running max (the shift before) fails the first and last at x10 by O(1).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import decoder
from kernelformer.attention import linear
from kernelformer.features import catalog
from kernelformer.features import components
from kernelformer.features import projection as projection_lib
from kernelformer.features import weights
from tests.attention.helpers import fast_jit

L, D, M, DV = 80, 16, 8, 4
SCALES = (1.0, 10.0, 30.0)
CHUNKS = (1, 3, 64)
EPS = 1e-30                   # the module's guard for shifted maps (random_features.normalizer_eps)


def _logits64(name, x, w, a):
  """``(z, t)`` in float64 with ``phi(x)_r = sqrt|c_r| exp(z_r) t_r`` for the shifted components."""
  sq = 0.5 * np.sum(x * x, -1, keepdims=True)
  p = x @ w.T
  if name == 'posrf':
    return p - sq, np.ones_like(p)
  if name == 'hyperbolic':
    z = np.concatenate([p, -p], -1) - sq - 0.5 * math.log(2.0)
    return z, np.ones_like(z)
  if name == 'trigrf':
    t = np.concatenate([np.cos(p), np.sin(p)], -1)
    return np.broadcast_to(sq, t.shape), t
  # oprf / saderf: positive GERF with A (Spectraformer eq. 34, components._gerf_features).
  z = a * np.sum(w * w, -1) + math.sqrt(1 - 4 * a) * p - sq + 0.25 * x.shape[-1] * math.log(1 - 4 * a)
  return z, np.ones_like(z)


def _causal64(name, q, k, v, proj, mask):
  """float64 causal attention of the component's unshifted estimator: ``(out [L, Dv], cond [L])``.

  The data-dependent parameters of oprf / saderf (A, Psi) come from the component's own functions, so
  the estimator is the same; every term is formed in log space relative to its row's largest one.
  Also, per row, ``cond_i = sum |terms| / |sum terms|`` of the normalizer (1 for positive features,
  large where a signed estimate, trigrf, cancels: it scales the rounding of any float32 evaluation) and
  ``eps32 * zmax_i``, the rounding of the exponents (``zmax_i``: the largest exponent magnitude of
  query i plus that of a key it sees), which any float32 evaluation has too.
  """
  w = np.asarray(projection_lib.dense_matrix(proj), np.float64)
  c = np.asarray(projection_lib.row_weights(proj, jnp.float32), np.float64)
  q64, k64, a = np.asarray(q, np.float64), np.asarray(k, np.float64), 0.0
  if name == 'saderf':
    psi = np.asarray(components.saderf_scaling(q[None], k[None], mask[None]))[0]
    q64, k64 = q64 * psi, k64 / psi
    a = float(components.oprf_parameter(q[None] * psi, k[None] / psi, mask[None])[0])
  elif name == 'oprf':
    a = float(components.oprf_parameter(q[None], k[None], mask[None])[0])
  (zq, tq), (zk, tk) = _logits64(name, q64, w, a), _logits64(name, k64, w, a)
  cw = np.tile(c, zq.shape[-1] // c.shape[0])
  visible = np.tril(np.ones((L, L), bool)) & np.asarray(mask)[None, :]
  e = np.where(visible[..., None], zq[:, None, :] + zk[None, :, :], -np.inf)      # [L, S, F]
  top = np.max(e, axis=(1, 2), keepdims=True)
  terms = cw * np.exp(e - np.where(np.isfinite(top), top, 0.0)) * tq[:, None] * tk[None]   # [L, S, F]
  kernel = np.sum(terms, -1)
  den = kernel.sum(-1)
  cond = np.abs(terms).sum((1, 2)) / np.abs(den)
  zk_seen = np.maximum.accumulate(np.where(np.asarray(mask)[:, None], np.abs(zk), 0.0).max(-1))
  zmax = np.abs(zq).max(-1) + zk_seen
  return (kernel @ np.asarray(v, np.float64)) / den[:, None], np.finfo(np.float32).eps * zmax, cond


def _inputs():
  ks = jax.random.split(jax.random.PRNGKey(0), 4)
  s = D ** -0.25                         # the attention module's input scale
  q = s * jax.random.normal(ks[0], (L, D))
  k = s * jax.random.normal(ks[1], (L, D))
  v = jax.random.normal(ks[2], (L, DV))
  proj = weights.SAMPLERS['orf'](ks[3], M, D)
  mask = (jnp.arange(L) < L - 5).at[17].set(False)      # a padded key inside, and a padded tail
  return q, k, v, proj, mask


def _stored(name, q, k, v, proj, mask, chunk):
  pq, pk, shift = catalog.get(name).fn(q[None], k[None], proj, mask=mask[None],
                                              causal_chunk=chunk)
  return linear.linear_attention(pq[:, :, None], pk[:, :, None], v[None, :, None], mask=mask[None],
                                 causal=True, chunk_size=chunk, key_shift=shift[:, :, None],
                                 eps=EPS)[0, :, 0]


def _lean(name, q, k, v, proj, mask, chunk):
  return linear.causal_exp_feature_attention(catalog.get(name).log_space, q, k, v, proj,
                                             mask=mask, chunk_size=chunk, eps=EPS)


def _lean_blocks(name, q, k, v, proj, mask, chunk):
  """The lean scan with every chunk in the per-row form (``span=0``): no chunk takes one shift."""
  return linear.causal_exp_feature_attention(catalog.get(name).log_space, q, k, v, proj,
                                             mask=mask, chunk_size=chunk, eps=EPS, span=0.0)


@pytest.mark.parametrize('name', sorted(r.name for r in catalog.records() if r.causal_shift))
def test_stored_and_lean_equal_float64_estimator(name):
  q, k, v, proj, mask = _inputs()
  paths = [_stored] + ([_lean, _lean_blocks] if catalog.get(name).log_space is not None else [])

  def outputs(k):
    return [path(name, q, k, v, proj, mask, c) for path in paths for c in CHUNKS]

  got = fast_jit(jax.vmap(outputs))(jnp.stack([s * k for s in SCALES]))
  rows = np.asarray(mask)                  # padded rows' outputs are not defined
  for i, scale in enumerate(SCALES):
    ref, rounding, cond = (x[rows] for x in _causal64(name, q, scale * k, v, proj, mask))
    # 1e-4 of the output's scale, times the row's conditioning (1 for positive maps; trigrf's signed
    # normalizer cancels at x1), plus the rounding of the exponents (~1e-4 at x30: |z| ~ 2e3).
    tol = 1e-4 * cond + rounding
    for j, out in enumerate(got):
      where = f'{name}, keys x{scale}, {paths[j // len(CHUNKS)].__name__} chunk {CHUNKS[j % len(CHUNKS)]}'
      assert np.all(np.isfinite(np.asarray(out[i]))), where
      err = np.max(np.abs(np.asarray(out[i])[rows] - ref), axis=-1) / np.max(np.abs(ref))
      worst = int(np.argmax(err / tol))
      assert err[worst] < tol[worst], (f'{where}: {err[worst]:.2e} of the output scale (row '
                                       f'conditioning {cond[worst]:.1f}, exponent rounding '
                                       f'{rounding[worst]:.1e})')


@pytest.mark.parametrize('name', sorted(r.name for r in catalog.records() if r.log_space is not None))
def test_lean_gradients_equal_stored_at_large_keys(name):
  """The lean scan's custom backward (in-chunk blocks included) against autodiff of the stored path,
  keys x10, chunks 3 and 64; both against chunk 1 of the stored path (no in-chunk product)."""
  q, k, v, proj, mask = _inputs()
  k = 10.0 * k
  g = jax.random.normal(jax.random.PRNGKey(9), (L, DV)) * mask[:, None]

  def grads(path, chunk):
    loss = lambda q, k, v, p: jnp.sum(path(name, q, k, v, p, mask, chunk) * g)
    out = jax.grad(loss, argnums=(0, 1, 2, 3), allow_int=True)(q, k, v, proj)
    return [x for x in jax.tree.leaves(out) if x.dtype != jax.dtypes.float0]

  every = fast_jit(lambda: [grads(_stored, 1)] + [grads(p, c) for p in (_stored, _lean, _lean_blocks)
                                                   for c in (3, 64)])()
  reference = every[0]
  assert len(reference) >= 4
  for other in every[1:]:
    for a, b in zip(other, reference):
      assert np.all(np.isfinite(np.asarray(a)))
      scale = float(jnp.max(jnp.abs(b))) + 1e-6
      np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, atol=1e-4)


@pytest.mark.parametrize('kind', ['posrf-orf', 'hyperbolic-sgq', 'trigrf-iid'])
def test_decoder_forward_at_chunk_64_equals_steps_at_large_keys(kind):
  """One kind per shifted map of the decoder: at L = 70 the forward at chunk 64 has an inter- and an
  intra-chunk part; with keys x10 and x30 it equals teacher-forced decoding (and the forward at chunk 3)
  to 1e-4 of the logits' scale."""
  length, vocab = 70, 7

  def model(chunk):
    return decoder.Decoder(vocab_size=vocab, emb_dim=8, num_layers=1, num_heads=2, qkv_dim=8,
                           mlp_dim=16, max_length=length,
                           attention={'kind': kind, 'num_features': 9, 'chunk_size': chunk})

  m64, m3 = model(64), model(3)
  tokens = jax.random.randint(jax.random.key(0), (2, length), 1, vocab)
  fkey = jax.random.key(7)
  params = m64.init({'params': jax.random.key(1), 'features': fkey}, tokens)['params']
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(2), len(leaves))
  params = jax.tree.unflatten(tree, [p + 0.3 * jax.random.normal(kk, p.shape)
                                     for p, kk in zip(leaves, keys)])

  def scaled(scale):
    return jax.tree_util.tree_map_with_path(
        lambda path, x: x * scale if any(getattr(p, 'key', None) == 'key' for p in path) else x, params)

  @jax.jit
  def run(ps):
    return (m64.apply({'params': ps}, tokens, rngs={'features': fkey}),
            m3.apply({'params': ps}, tokens, rngs={'features': fkey}),
            decoder.teacher_forced_logits(m64, ps, tokens, features_key=fkey))

  for scale in (10.0, 30.0):
    full64, full3, steps = (np.asarray(x) for x in run(scaled(scale)))
    assert np.isfinite(steps).all()
    tol = 1e-4 * np.abs(steps).max()
    np.testing.assert_allclose(full64, steps, rtol=0, atol=tol, err_msg=f'{kind} x{scale} chunk 64')
    np.testing.assert_allclose(full3, steps, rtol=0, atol=tol, err_msg=f'{kind} x{scale} chunk 3')


def test_gradients_exact_where_early_features_underflow():
  """A first key whose posrf logits are far below the later keys': the running max rises past the
  span within the chunk, so the chunk takes the per-row form, and the discarded one-shift rows'
  normalizers underflow below 5e-20. Differentiating ``num / den`` there formed ``num / den^2`` = inf
  and ``0 * inf`` = NaN in dq and dk (a FAVOR+ BaseConv model at Zoology's MQAR diverged at step 32 on
  this). Gradients equal a float64 evaluation of the same estimator."""
  d, m, n = 16, 8, 4
  ks = jax.random.split(jax.random.PRNGKey(0), 4)
  proj = weights.SAMPLERS['orf'](ks[3], m, d)
  q = 0.5 * jax.random.normal(ks[0], (n, d))
  k = 0.5 * jax.random.normal(ks[1], (n, d))
  k = k.at[0].set(6.0 * k[0])
  v = jax.random.normal(ks[2], (n, DV))
  g = jax.random.normal(jax.random.PRNGKey(5), (n, DV))
  form = catalog.get('posrf').log_space
  lean = lambda q, k: linear.causal_exp_feature_attention(form, q, k, v, proj, chunk_size=n, eps=EPS)
  dq, dk = (np.asarray(x) for x in jax.vjp(lean, q, k)[1](g))
  assert np.isfinite(dq).all() and np.isfinite(dk).all()

  w64, v64, g64 = (np.asarray(x, np.float64) for x in (proj.matrix, v, g))

  def exact(q, k):        # posrf's kernel, (1/M) sum_f exp(zq_f + zk_f), normalized over j <= i
    logits = lambda x: x @ w64.T - 0.5 * jnp.sum(x * x, -1, keepdims=True)
    e = logits(q)[:, None, :] + logits(k)[None, :, :]
    log_kernel = jax.nn.logsumexp(e, axis=-1)
    log_kernel = jnp.where(np.tril(np.ones((n, n), bool)), log_kernel, -jnp.inf)
    return jax.nn.softmax(log_kernel, axis=-1) @ v64

  with jax.enable_x64(True):
    dq64, dk64 = jax.vjp(exact, np.asarray(q, np.float64), np.asarray(k, np.float64))[1](g64)
  for got, want in ((dq, dq64), (dk, dk64)):
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-3, atol=1e-4 * np.abs(want).max())
