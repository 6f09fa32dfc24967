"""The feature maps of features/maps.py against float64 references written from their papers.

Each reference below is a direct numpy transcription of the paper's formula (not of our code): Based's
Taylor map (Arora et al. 2024, sec. 3.1), Hedgehog (Zhang et al. 2024), T2R (Kasai et al. 2021, eq. 4),
DPFP (Schlag et al. 2021, eqs. 31-32), ReBased (Aksenov et al. 2024, eq. 6) and the elementwise maps.
Features are compared entry by entry (order included) and, where the paper states the kernel in closed
form (Taylor, ReBased), the kernel phi(q).phi(k) too. Then every registered map kind runs through the
attention module, bidirectional and causal, with a padding mask, against float64 attention formed from
the reference features and the module's own parameters.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from kernelformer import registry
from kernelformer.features import catalog
from kernelformer.features import maps
from tests.attention import helpers

D = 6


def _np_layer_norm(x):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + maps.LAYER_NORM_EPS)


def _np_softmax(z):
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def ref_phi(component: str, x: np.ndarray, params) -> np.ndarray:
  """phi(x) for x [..., d] in float64, from the papers' definitions."""
  x = np.asarray(x, np.float64)
  p = None if params is None else [np.asarray(a, np.float64) for a in params]
  d = x.shape[-1]
  if component == 'taylor':                       # Based: [1, x/d^(1/4), (x (x) x)/(sqrt(2) sqrt(d))]
    if p is not None:
      x = x @ p[0].T
      d = x.shape[-1]
    feats = [np.ones(x.shape[:-1] + (1,)), x / d ** 0.25]
    quad = np.stack([x[..., i] * x[..., j] for i in range(d) for j in range(d)], -1)
    return np.concatenate(feats + [quad / (math.sqrt(2) * math.sqrt(d))], -1)
  if component == 'hedgehog':                     # [softmax(Wx), softmax(-Wx)]
    z = x @ p[0].T
    return np.concatenate([_np_softmax(z), _np_softmax(-z)], -1)
  if component == 't2r':                          # relu(Wx + b)
    return np.maximum(x @ p[0].T + p[1], 0.0)
  if component.startswith('dpfp'):                # r = [relu(x), relu(-x)]; r_i r_{i+n}, n = 1..nu
    nu = 1 if component == 'dpfp' else int(component[4:])
    r = np.concatenate([np.maximum(x, 0), np.maximum(-x, 0)], -1)
    two_d = r.shape[-1]
    return np.stack([r[..., i] * r[..., (i + n) % two_d] for n in range(1, nu + 1)
                     for i in range(two_d)], -1)
  if component == 'rebased':                      # x' = gamma LN(x) + beta; x' (x) x'
    xp = p[0] * _np_layer_norm(x) + p[1]
    return np.stack([xp[..., i] * xp[..., j] for i in range(d) for j in range(d)], -1)
  if component == 'polysketch_learned':           # s = (W1 x') * (W2 x') / sqrt(d); s (x) s, upper triangle
    xp = p[0] * _np_layer_norm(x) + p[1]          # with the off-diagonal terms counted twice (sqrt(2))
    s = (xp @ p[2].T) * (xp @ p[3].T) / math.sqrt(d)
    r = s.shape[-1]
    return np.stack([s[..., i] * s[..., j] * (1.0 if i == j else math.sqrt(2.0))
                     for i in range(r) for j in range(i, r)], -1)
  elementwise = {
      'identity': lambda t: t, 'square': lambda t: t * t,
      'squared_relu': lambda t: np.maximum(t, 0) ** 2,
      'gelu': lambda t: 0.5 * t * (1 + special.erf(t / math.sqrt(2))),
      'swish': lambda t: t / (1 + np.exp(-t)), 'sigmoid': lambda t: 1 / (1 + np.exp(-t))}
  return elementwise[component](x)


# cosFormer's features depend on each token's position too: tests/features/test_cosformer.py.
# The maps of their own kind (not polysketch's random W: tests/features/test_polysketch.py).
KINDS = {r.kind: r.name for r in maps.FEATURE_MAPS if not r.sampler}
COMPONENTS = sorted(r.name for r in maps.FEATURE_MAPS if not r.sampler and not r.positional)


def _params(component, map_dim=4, num_features=10):
  return helpers.example_params(component, D, jax.random.PRNGKey(7), num_features=num_features,
                             map_dim=map_dim)


@pytest.mark.parametrize('component', COMPONENTS)
def test_features_equal_the_paper_in_float64(component):
  rng = np.random.default_rng(0)
  q = 1.5 * rng.standard_normal((3, 5, D))
  k = 1.5 * rng.standard_normal((3, 4, D))
  variants = [_params(component)]
  if component == 'taylor':
    variants.append(None)                          # without Based's projection
  with jax.enable_x64(True):
    for params in variants:
      p64 = None if params is None else tuple(jnp.asarray(np.asarray(a), jnp.float64) for a in params)
      pq, pk = catalog.get(component).fn(jnp.asarray(q), jnp.asarray(k), p64)
      assert pq.dtype == jnp.float64
      np.testing.assert_allclose(np.asarray(pq), ref_phi(component, q, params), rtol=1e-12, atol=1e-14)
      np.testing.assert_allclose(np.asarray(pk), ref_phi(component, k, params), rtol=1e-12, atol=1e-14)
      width = catalog.get(component).feature_count(10, D, map_dim=0 if params is None else 4)
      if not catalog.get(component).map_dim:
        assert width == catalog.get(component).feature_count(10, D)
      assert pq.shape[-1] == width
      kern = np.einsum('blm,bsm->bls', np.asarray(pq), np.asarray(pk))
      if component == 'taylor':                    # the kernel Based states: 1 + s/sqrt(d) + s^2/(2d)
        qq, kk = (q, k) if params is None else (q @ np.asarray(params[0]).T, k @ np.asarray(params[0]).T)
        s, dd = np.einsum('bld,bsd->bls', qq, kk), qq.shape[-1]
        np.testing.assert_allclose(kern, 1 + s / math.sqrt(dd) + s ** 2 / (2 * dd), rtol=1e-12)
      if component == 'rebased':                   # (q'.k')^2
        g, b = (np.asarray(a, np.float64) for a in params)
        qp, kp = g * _np_layer_norm(q) + b, g * _np_layer_norm(k) + b
        np.testing.assert_allclose(kern, np.einsum('bld,bsd->bls', qp, kp) ** 2, rtol=1e-11)
      if component == 'polysketch_learned':        # self-tensoring: (s(q).s(k))^2
        g, b, w1, w2 = (np.asarray(a, np.float64) for a in params)
        xp = lambda x: g * _np_layer_norm(x) + b
        sk = lambda x: (xp(x) @ w1.T) * (xp(x) @ w2.T) / math.sqrt(D)
        np.testing.assert_allclose(kern, np.einsum('blr,bsr->bls', sk(q), sk(k)) ** 2, rtol=1e-11)


def test_learned_maps_start_where_their_papers_start():
  """Hedgehog's W starts at the identity, ReBased's gamma/beta at 1/0, T2R's bias at 0."""
  for kind, names in (('hedgehog', ('map_w',)), ('rebased', ('map_gamma', 'map_beta')),
                      ('t2r', ('map_w', 'map_b')), ('taylor', ('map_w',)),
                      ('polysketch-learned', ('map_gamma', 'map_beta', 'map_w', 'map_w2'))):
    m = registry.build({'kind': kind, 'num_features': 10, 'map_dim': 3})
    x = jnp.ones((1, 4, 2, D))
    params = m.init({'params': jax.random.PRNGKey(0), 'features': jax.random.PRNGKey(1)}, x, x, x)['params']
    assert tuple(sorted(params)) == tuple(sorted(names)), kind
    for leaf in params.values():
      assert leaf.shape[0] == 2, kind                      # one set per head
  eye = registry.build({'kind': 'hedgehog'}).init(
      {'params': jax.random.PRNGKey(0), 'features': jax.random.PRNGKey(1)}, x, x, x)['params']['map_w']
  np.testing.assert_array_equal(eye, np.broadcast_to(np.eye(D), (2, D, D)))
  # Without map_dim the Taylor map has no parameters (Based's projection is optional).
  assert not registry.build({'kind': 'taylor'}).init(
      {'params': jax.random.PRNGKey(0), 'features': jax.random.PRNGKey(1)}, x, x, x).get('params')


def _ref_attention(pq, pk, v, mask, causal):
  s = np.einsum('blhm,bshm->bhls', pq, pk) * mask[:, None, None, :]
  if causal:
    s = s * np.tril(np.ones(s.shape[-2:]))
  num = np.einsum('bhls,bshd->blhd', s, v)
  den = s.sum(-1).transpose(0, 2, 1)[..., None]
  return num / den


@pytest.mark.parametrize('kind', sorted(k for k, comp in KINDS.items() if not catalog.get(comp).positional))
def test_every_map_kind_attends_as_its_reference(kind):
  """Module output (float32) = float64 attention formed from the reference features, masked, both ways."""
  comp = KINDS[kind]
  b, l, h = 2, 9, 2
  rng = np.random.default_rng(1)
  # Positive inputs for the maps whose rows could otherwise have a zero normalizer (relu-based maps,
  # identity, gelu, swish): the reference divides without a guard.
  q, k = rng.uniform(0.2, 1.5, (b, l, h, D)), rng.uniform(0.2, 1.5, (b, l, h, D))
  v = rng.standard_normal((b, l, h, 3))
  mask = np.arange(l)[None, :] < np.array([[l], [5]])
  module = registry.build({'kind': kind, 'num_features': 10, 'map_dim': 4, 'chunk_size': 4})
  args = [jnp.asarray(a, jnp.float32) for a in (q, k, v)]
  variables = module.init({'params': jax.random.PRNGKey(0), 'features': jax.random.PRNGKey(1)}, *args,
                          mask=jnp.asarray(mask))
  params = variables.get('params', {})
  # Move learned parameters off their initial values so the test sees them used.
  params = jax.tree.map(lambda a: a + 0.3 * jax.random.normal(jax.random.PRNGKey(2), a.shape), params)
  names = {'taylor': ('map_w',), 'hedgehog': ('map_w',), 't2r': ('map_w', 'map_b'),
           'rebased': ('map_gamma', 'map_beta'),
           'polysketch_learned': ('map_gamma', 'map_beta', 'map_w', 'map_w2')}.get(comp, ())
  for causal in (False, True):
    out = module.apply({**variables, 'params': params}, *args, mask=jnp.asarray(mask), causal=causal,
                       rngs={'features': jax.random.PRNGKey(1)})
    pq = np.zeros(q.shape[:3] + (catalog.get(comp).feature_count(10, D, map_dim=4),))
    pk = np.zeros_like(pq)
    for hh in range(h):
      head = tuple(np.asarray(params[n][hh]) for n in names) if names else None
      pq[:, :, hh] = ref_phi(comp, q[:, :, hh], head)
      pk[:, :, hh] = ref_phi(comp, k[:, :, hh], head)
    ref = _ref_attention(pq, pk, v, mask, causal)
    scale = np.abs(ref).max()
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=2e-4, atol=2e-5 * scale,
                               err_msg=f'{kind} causal={causal}')
