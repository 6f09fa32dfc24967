"""The deterministic and learned feature maps of today's linear-attention literature.

Each map is a component in the sense of ``components.py`` (``phi_q, phi_k = fn(q, k, params, mask=...,
stabilize=...)``, one head at a time, features in at least float32, padded keys zeroed) with its
record (``FEATURE_MAPS``) and a registered kind of its own (``attention/random_features.py``), so it
works wherever a kernel does: bidirectional and
causal-chunked linear attention, the decoder's recurrent state, masks, bfloat16, the benchmarks. None of
them estimates another kernel (``target_kernel`` 'none'): the map *is* the kernel, and the attention
module applies no d^-1/4 input scale. Each kernel is ``k(q, k) = phi(q) . phi(k)``.

The formulas, feature counts and parameters are tabulated in docs/kernels.md ("The feature maps
linear-attention work compares since 2023"); per map, the source:

* ``taylor`` -- Based (Arora et al. 2024, "Simple linear attention language models balance the
  recall-throughput tradeoff", §3.1 / eq. 3): second-order Taylor expansion of exp,
  ``phi(q).phi(k) = 1 + q.k/sqrt(d) + (q.k)^2 / (2d)``; ``map_dim = r > 0`` projects q, k per head first.
* ``hedgehog`` -- Zhang et al. 2024 ("The Hedgehog & the Porcupine"), eq. 4 ff.:
  ``[softmax(W x), softmax(-W x)]``, W ``[d, d]`` learned per head, identity init (distillation:
  ``attention/distill.py``).
* ``t2r`` -- Kasai et al. 2021 ("Finetuning pretrained transformers into RNNs"), eq. 4: ``relu(W x + b)``.
* ``dpfp``, ``dpfp-nu2``, ``dpfp-nu3`` -- Schlag et al. 2021 ("Linear transformers are secretly fast
  weight programmers"), eqs. 31-32; features ordered n-major.
* ``rebased`` -- Aksenov et al. 2024 ("Linear transformers with learnable kernel functions are better
  in-context models"), eq. 6: ``vec(x' x'^T)``, ``x' = gamma * norm(x) + beta``.
* ``cosformer`` -- Qin et al. 2022 ("cosFormer: Rethinking Softmax in Attention", ICLR): ``[relu(x_i)
  cos(pi i / (2M)), relu(x_i) sin(pi i / (2M))]``, positions 1-based as the official code
  (OpenNLPLab/cosFormer cosformer.py @ 8e12da1, ``get_index``); a ``positional`` record.
* ``polysketch``, ``polysketch-learned`` -- Kacham, Mirrokni & Zhong 2023 ("PolySketchFormer"): ``(q.k)^4``
  by self-tensoring degree-2 sketches (section 2.1 normalisation as flash-linear-attention reads it);
  the learned one follows fla's ``LearnablePolySketchNonNegativeFeatureMap`` (fla/modules/feature_map.py
  @ bc3b101, l. 161-202). The self-tensor keeps its upper triangle with off-diagonal entries times
  sqrt(2), so ``phi.phi' = (s.s')^2`` exactly (fla omits the sqrt(2)).
* ``performer-zoology`` -- Zoology's Performer feature map as Zoology computes it (``performer_zoology``).
* elementwise maps (Zoology, flash-linear-attention): ``identity``, ``square``, ``squared-relu``,
  ``gelu`` (exact, erf), ``swish``, ``sigmoid``; M' = d.

``identity``, ``square``'s products and ``gelu``/``swish`` can be negative; the attention core's
``safe_normalizer`` keeps a row whose normalizer vanishes finite. All maps here are polynomial or
bounded in x (no exp), so ``stabilize`` has nothing to do.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from kernelformer.features.components import compute_dtype, key_mask, zero_masked
from kernelformer.features.feature_map import FeatureMap
from kernelformer.features.projection import dense_matrix, project

Array = jax.Array

# DPFP's nu (Schlag et al. report nu = 1, 2, 3): kinds dpfp (nu = 1), dpfp-nu2, dpfp-nu3.
DPFP_NU = 1
DPFP_NUS = (1, 2, 3)
# Based's projected feature dimension (its configs use feature_dim = 16).
BASED_FEATURE_DIM = 16
LAYER_NORM_EPS = 1e-5


def _apply(f: Callable[[Array], Array], q: Array, k: Array, mask: Optional[Array]) -> tuple[Array, Array]:
  """``f`` on q and on k in at least float32; padded keys get zero features; input dtypes out."""
  dt = compute_dtype(q)
  mask = key_mask(mask, k)
  phi_q = f(q.astype(dt))
  phi_k = zero_masked(f(k.astype(dt)), mask)
  return phi_q.astype(q.dtype), phi_k.astype(k.dtype)


def _outer(x: Array) -> Array:
  """vec(x x^T) over the last axis: [..., d] -> [..., d*d] (row-major)."""
  d = x.shape[-1]
  return (x[..., :, None] * x[..., None, :]).reshape(*x.shape[:-1], d * d)


def taylor_features(x: Array) -> Array:
  d = x.shape[-1]
  ones = jnp.ones((*x.shape[:-1], 1), x.dtype)
  return jnp.concatenate([ones, x * d ** -0.25, _outer(x) / (math.sqrt(2.0) * math.sqrt(d))], axis=-1)


def dpfp_features(x: Array, nu: int = DPFP_NU) -> Array:
  r = jnp.concatenate([jax.nn.relu(x), jax.nn.relu(-x)], axis=-1)
  # roll by -i: position j holds r_{j+i} (indices mod 2d), as Schlag et al.'s r_i r_{i+nu}.
  return jnp.concatenate([r * jnp.roll(r, -i, axis=-1) for i in range(1, nu + 1)], axis=-1)


def hedgehog_features(x: Array, w: Array) -> Array:
  z = jnp.einsum('...d,md->...m', x, w)
  return jnp.concatenate([jax.nn.softmax(z, axis=-1), jax.nn.softmax(-z, axis=-1)], axis=-1)


def t2r_features(x: Array, w: Array, b: Array) -> Array:
  return jax.nn.relu(jnp.einsum('...d,md->...m', x, w) + b)


def rebased_features(x: Array, gamma: Array, beta: Array) -> Array:
  mu = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
  xn = (x - mu) * jax.lax.rsqrt(var + LAYER_NORM_EPS)
  return _outer(gamma * xn + beta)


ELEMENTWISE: dict[str, tuple[Callable[[Array], Array], str]] = {
    'identity': (lambda x: x, 'x (Zoology "Identity"; fla identity)'),
    'square': (jnp.square, 'x^2 elementwise (Zoology "Square")'),
    'squared_relu': (lambda x: jnp.square(jax.nn.relu(x)), 'relu(x)^2 (fla SquaredReLU)'),
    # The erf form; fla's GELUFeatureMap is the tanh approximation (fla/modules/activations.py gelu_fwd,
    # 493-494 @ bce39a4e), at most 4.7e-4 apart (at x = 2.70).
    'gelu': (lambda x: jax.nn.gelu(x, approximate=False),
             'gelu(x), exact erf form (fla GELU is the tanh approximation)'),
    'swish': (jax.nn.silu, 'x sigmoid(x) (fla Swish)'),
    'sigmoid': (jax.nn.sigmoid, 'sigmoid(x) (fla Sigmoid)'),
}


def cosformer_features(x: Array, angle: Array) -> Array:
  """``[relu(x) cos(angle), relu(x) sin(angle)]``; ``angle [...]`` = pi i / (2M) per token of ``x``."""
  r = jax.nn.relu(x)
  a = angle[..., None].astype(x.dtype)
  return jnp.concatenate([r * jnp.cos(a), r * jnp.sin(a)], axis=-1)


def token_positions(mask: Optional[Array], length_q: int, length_k: int, cos_length: int = 0):
  """``(i_q, i_k, M)`` for the maps whose record is ``positional`` (cosFormer's re-weighting).

  Positions count real tokens only, from 1 (the official code's 1-based index, OpenNLPLab/cosFormer
  cosformer.py @ 8e12da1 l. 46): ``i_k = cumsum(mask)`` over the keys, so padding before, between or
  after the real tokens moves no real token's position; without a mask ``1..S``. Queries share the
  keys' positions in self-attention (L = S), else ``1..L``. ``M = cos_length`` when > 0 (the decoder
  passes its ``max_length``, so a step and the full forward agree), else per example the number of real
  keys (and at least L for cross-attention), as the official ``M = max(src_len, tgt_len)`` (l. 106) of an
  unpadded batch: padding does not change M either.
  """
  if cos_length and max(length_q, length_k) > cos_length:
    raise ValueError(f'cos_length (cosFormer\'s M) = {cos_length} is shorter than the sequence '
                     f'({max(length_q, length_k)} tokens); set it to at least the longest sequence or 0')
  if mask is None:
    i_k = jnp.arange(1, length_k + 1, dtype=jnp.float32)
    count = jnp.asarray(length_k, jnp.float32)
  else:
    m = jnp.asarray(mask, jnp.float32)
    i_k = jnp.cumsum(m, axis=-1)
    count = jnp.sum(m, axis=-1)
  i_q = i_k if length_q == length_k else jnp.arange(1, length_q + 1, dtype=jnp.float32)
  if cos_length:
    horizon = jnp.full(jnp.shape(count), cos_length, jnp.float32)
  else:
    horizon = jnp.maximum(count, 1.0 if length_q == length_k else float(length_q))
  return i_q, i_k, horizon


def cosformer(q, k, proj=None, *, mask=None, stabilize=True, positions=None):
  """cosFormer's features (Qin et al. 2022, the cos-based re-weighting) of queries and keys at positions.

  ``positions = (i_q, i_k, M)``: ``i_q`` broadcastable to ``q.shape[:-1]``, ``i_k`` to ``k.shape[:-1]``
  (1-based token positions), ``M`` broadcastable to the batch shape ``q.shape[:-2]`` (the horizon of
  ``cos(pi/2 (i - j)/M)``; M >= every |i - j| keeps the re-weighting non-negative). None:
  ``token_positions(mask, L, S)`` (real tokens counted from 1, M = their number; without a mask the
  official code's 1..L, 1..S, M = max(L, S)), what the attention module passes too unless ``cos_length``
  is set; the decoder sets M = its ``max_length`` and passes the positions of its new tokens.
  """
  del proj, stabilize
  if positions is None:
    positions = token_positions(mask, q.shape[-2], k.shape[-2])
  i_q, i_k, horizon = positions
  dt = compute_dtype(q)
  horizon = jnp.asarray(horizon, dt)[..., None]                # over the token axis
  scale = (math.pi / 2) / horizon
  ang_q = jnp.broadcast_to(jnp.asarray(i_q, dt) * scale, q.shape[:-1])
  ang_k = jnp.broadcast_to(jnp.asarray(i_k, dt) * scale, k.shape[:-1])
  mask = key_mask(mask, k)
  phi_q = cosformer_features(q.astype(dt), ang_q)
  phi_k = zero_masked(cosformer_features(k.astype(dt), ang_k), mask)
  return phi_q.astype(q.dtype), phi_k.astype(k.dtype)


def _unit_layer_norm(x: Array) -> Array:
  """The affine-free layer norm over the last axis, divided by sqrt(d): |result| = 1 up to the eps."""
  mu = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
  return (x - mu) * jax.lax.rsqrt(var + LAYER_NORM_EPS) * x.shape[-1] ** -0.5


def self_tensor(s: Array) -> Array:
  """``s (x) s`` as its upper triangle, off-diagonal entries times sqrt(2): ``[..., r] -> [..., r(r+1)/2]``.

  ``self_tensor(a).self_tensor(b) = (a.b)^2`` exactly (PolySketchFormer's self-tensoring, the
  non-negative form of a degree-2p sketch from a degree-p one).
  """
  r = s.shape[-1]
  rows, cols = np.triu_indices(r)
  scale = np.where(rows == cols, 1.0, math.sqrt(2.0))
  return s[..., rows] * s[..., cols] * jnp.asarray(scale, s.dtype)


def polysketch_sketch(x: Array, proj) -> Array:
  """The degree-2 sketch ``s(x) = (G1 x^) * (G2 x^) / sqrt(r)``: ``[G1; G2]`` = W's first 2r rows,
  r = floor(num_features / 2), x^ = LN(x)/sqrt(d).

  For iid N(0, I) rows ``E[s(x).s(y)] = (x^.y^)^2`` (``E[(g.x)(g.y)] = x.y`` for each of G1, G2, independent).
  """
  r = proj.num_features // 2          # an odd last row is not used
  z = project(_unit_layer_norm(x), proj)
  return z[..., :r] * z[..., r:2 * r] * r ** -0.5


def polysketch_features(x: Array, proj) -> Array:
  """Random PolySketch, degree 4: ``self_tensor(polysketch_sketch(x))``."""
  return self_tensor(polysketch_sketch(x, proj))


def polysketch_learned_features(x: Array, gamma: Array, beta: Array, w1: Array, w2: Array) -> Array:
  """fla's learnable PolySketch (degree 4): ``self_tensor((W1 x') * (W2 x') / sqrt(d))``.

  ``x' = gamma * LN(x) + beta`` (LN the affine-free layer norm).
  """
  d = x.shape[-1]
  xp = gamma * _unit_layer_norm(x) * math.sqrt(d) + beta
  s = jnp.einsum('...d,rd->...r', xp, w1) * jnp.einsum('...d,rd->...r', xp, w2) * d ** -0.5
  return self_tensor(s)


def performer_zoology_features(x: Array, w: Array) -> Array:
  """``exp(-|x'|^2/2) exp(W' x') / sqrt(M)``, ``x' = x / d^(1/4)``, W' = W's rows set to norm sqrt(d/M)."""
  d, m = x.shape[-1], w.shape[0]
  unit = w * jax.lax.rsqrt(jnp.sum(w * w, axis=-1, keepdims=True))
  xs = x * d ** -0.25
  z = jnp.einsum('...d,md->...m', xs, unit * math.sqrt(d / m))
  return jnp.exp(z - 0.5 * jnp.sum(xs * xs, axis=-1, keepdims=True)) * m ** -0.5


def performer_zoology(q, k, proj, *, mask=None, stabilize=True):
  """Zoology's Performer feature map, as HazyResearch/zoology computes it.

  ``PerformerFeatureMap`` (zoology/mixers/feature_maps/performer.py @ d88d6f5, unchanged since
  b603008; lines 74-141): W is drawn once in ``__init__`` (a buffer of ``expanded_dim`` = 256 rows,
  lines 80-93) by ``orthogonal_gaussian``: blocks of d orthonormal rows (QR of a Gaussian, lines
  125-135), then ``matrix /= np.sqrt(num_squares + remainder / d)`` (line 138), i.e. every row has norm
  ``sqrt(d/M)`` (0.5 at d = 64, M = 256); the scaling to Gaussian norms, ``np.diag(np.sqrt(d) ...)``,
  is commented out (line 139). ``forward`` maps ``x / d^(1/4)`` (line 101) to
  ``h(x) / sqrt(M) * exp(x W^T)`` with ``h(x) = exp(-|x|^2/2)`` (lines 103-117). With rows that short
  the map is not FAVOR+'s estimate of exp(q.k/sqrt(d)) (that needs omega ~ N(0, I)): it defines its own
  kernel. Here W comes from the ORF sampler (orthogonal blocks of d rows) and its rows are rescaled to
  norm sqrt(d/M), which is Zoology's matrix in distribution. Bounded above by ``exp(d/(2M))/sqrt(M)``
  (``omega.x - |x|^2/2 <= |omega|^2/2``), so, as in Zoology, nothing is shifted (``stabilize`` unused).
  """
  del stabilize
  return _apply(lambda x: performer_zoology_features(x, dense_matrix(proj).astype(x.dtype)), q, k, mask)


def polysketch(q, k, proj, *, mask=None, stabilize=True):
  del stabilize
  return _apply(lambda x: polysketch_features(x, proj), q, k, mask)


def polysketch_learned(q, k, proj, *, mask=None, stabilize=True):
  del stabilize
  return _apply(lambda x: polysketch_learned_features(x, *(a.astype(x.dtype) for a in proj)), q, k, mask)


def _elementwise(f):
  def component(q, k, proj=None, *, mask=None, stabilize=True):
    del proj, stabilize
    return _apply(f, q, k, mask)
  return component


def taylor(q, k, proj=None, *, mask=None, stabilize=True):
  """Based's Taylor map; ``proj`` = the learned ``[r, d]`` projection (a 1-tuple) or None."""
  del stabilize

  def f(x):
    if proj is not None:
      x = jnp.einsum('...d,rd->...r', x, proj[0].astype(x.dtype))
    return taylor_features(x)
  return _apply(f, q, k, mask)


def dpfp(q, k, proj=None, *, mask=None, stabilize=True, nu: int = DPFP_NU):
  del proj, stabilize
  return _apply(lambda x: dpfp_features(x, nu), q, k, mask)


def hedgehog(q, k, proj, *, mask=None, stabilize=True):
  del stabilize
  return _apply(lambda x: hedgehog_features(x, proj[0].astype(x.dtype)), q, k, mask)


def t2r(q, k, proj, *, mask=None, stabilize=True):
  del stabilize
  return _apply(lambda x: t2r_features(x, proj[0].astype(x.dtype), proj[1].astype(x.dtype)), q, k, mask)


def rebased(q, k, proj, *, mask=None, stabilize=True):
  del stabilize
  return _apply(lambda x: rebased_features(x, proj[0].astype(x.dtype), proj[1].astype(x.dtype)),
                q, k, mask)


# ------------------------------------------------------------------------------------------------
# Learned parameters (created by the attention module, one set per head, passed as ``proj``). Names
# (for the optimizer's decay mask and checkpoints): ``map_w`` (hedgehog, t2r; taylor with ``map_dim``;
# polysketch-learned's W1), ``map_w2`` (polysketch-learned's W2), ``map_b`` (t2r), ``map_gamma`` /
# ``map_beta`` (rebased, polysketch-learned).


def _identity_init(key, shape, dtype=jnp.float32):
  del key
  eye = jnp.eye(shape[-2], shape[-1], dtype=dtype)
  return jnp.broadcast_to(eye, shape)


def _lecun():
  return jax.nn.initializers.variance_scaling(1.0, 'fan_in', 'truncated_normal', in_axis=-1,
                                              out_axis=-2, batch_axis=(0,))


def taylor_parameters(module, head_dim, num_heads, *, num_features, map_dim):
  del num_features
  if not map_dim:
    return None
  return (module.param('map_w', _lecun(), (num_heads, map_dim, head_dim)),)


def hedgehog_parameters(module, head_dim, num_heads, *, num_features, map_dim):
  del num_features, map_dim
  return (module.param('map_w', _identity_init, (num_heads, head_dim, head_dim)),)


def t2r_parameters(module, head_dim, num_heads, *, num_features, map_dim):
  del map_dim
  return (module.param('map_w', _lecun(), (num_heads, num_features, head_dim)),
          module.param('map_b', jax.nn.initializers.zeros, (num_heads, num_features)))


def rebased_parameters(module, head_dim, num_heads, *, num_features, map_dim):
  del num_features, map_dim
  return (module.param('map_gamma', jax.nn.initializers.ones, (num_heads, head_dim)),
          module.param('map_beta', jax.nn.initializers.zeros, (num_heads, head_dim)))


def polysketch_learned_parameters(module, head_dim, num_heads, *, num_features, map_dim):
  del num_features
  h, d, r = num_heads, head_dim, map_dim or head_dim
  return (module.param('map_gamma', jax.nn.initializers.ones, (h, d)),
          module.param('map_beta', jax.nn.initializers.zeros, (h, d)),
          module.param('map_w', _lecun(), (h, r, d)),
          module.param('map_w2', _lecun(), (h, r, d)))


# ------------------------------------------------------------------------------------------------
# The records (``feature_map.FeatureMap``; ``catalog.py`` collects them). None is ``positive``: relu-based
# maps can give a row all-zero features, identity/gelu/swish/taylor/rebased have signed features
# (taylor's kernel 1 + s + s^2/2 is positive, its features are not), and hedgehog's softmax and sigmoid,
# positive in exact arithmetic, underflow to 0 at large norms (there is no shift to stabilize them,
# unlike the exp-based random features). A map with parameters (learned, or polysketch's random W)
# takes them through ``proj``: parts 1.


def _width(fn: Callable[..., int]) -> Callable[..., int]:
  """A record's ``feature_dim`` from ``fn(d, num_features, map_dim)``."""
  return lambda head_dim, *, num_features=0, map_dim=0: fn(head_dim, num_features, map_dim)


def _own(kind: str, fn, paper: str, kernel: str, width: Callable[..., int], **fields) -> FeatureMap:
  """A map of its own kind: defines its own kernel, row-wise, registered alone as ``kind``."""
  learned = fields.get('parameters') is not None
  return FeatureMap(kind.replace('-nu', '').replace('-', '_'), fn, 'none', parts=1 if learned else 0,
                    statistic='row', kind=kind, paper=paper, approximates=kernel, feature_dim=_width(width),
                    **fields)


def _polysketch_width(d, m, r):
  del r
  r = m // 2
  return r * (r + 1) // 2


FEATURE_MAPS = (
    _own('taylor', taylor, 'Arora et al. 2024 (Based), sec. 3.1, 2nd-order Taylor map of exp',
         '1 + q.k/sqrt(d) + (q.k)^2/(2d) (after the optional learned projection to map_dim)',
         lambda d, m, r: 1 + (r or d) + (r or d) ** 2, parameters=taylor_parameters, map_dim=True,
         learnable='map_w [H, map_dim, d] when map_dim > 0'),
    _own('hedgehog', hedgehog, 'Zhang et al. 2024 (Hedgehog), [softmax(Wx), softmax(-Wx)]',
         "its own kernel phi(q).phi(k), M' = 2d", lambda d, m, r: 2 * d,
         parameters=hedgehog_parameters, learnable='map_w [H, d, d] (identity init)'),
    _own('t2r', t2r, 'Kasai et al. 2021 (T2R), eq. 4, relu(Wx + b)', "its own kernel, M' = num_features",
         lambda d, m, r: m, parameters=t2r_parameters, learnable='map_w [H, M, d], map_b [H, M]'),
    *(_own('dpfp' if nu == 1 else f'dpfp-nu{nu}', functools.partial(dpfp, nu=nu),
           f'Schlag et al. 2021 (DPFP), eqs. 31-32, nu = {nu}', f"its own kernel, M' = {2 * nu} d",
           lambda d, m, r, nu=nu: 2 * d * nu) for nu in DPFP_NUS),
    _own('rebased', rebased, 'Aksenov et al. 2024 (ReBased), eq. 6, (gamma norm(x) + beta)^2',
         "(q'.k')^2 with x' = gamma norm(x) + beta", lambda d, m, r: d * d,
         parameters=rebased_parameters, learnable='map_gamma, map_beta [H, d]'),
    dataclasses.replace(
        _own('cosformer', cosformer, 'Qin et al. 2022 (cosFormer), cos-based re-weighting, relu features '
             'with the cos re-weighting split into cos and sin halves',
             'relu(q_i).relu(k_j) cos(pi/2 (i-j)/M), M = real tokens (cos_length; decoder: max_length)',
             lambda d, m, r: 2 * d),
        positional=True),
    _own('polysketch-learned', polysketch_learned, 'Kacham et al. 2023 (PolySketchFormer), learnable '
         'sketch as flash-linear-attention LearnablePolySketchNonNegativeFeatureMap @ bc3b101',
         "(s(q).s(k))^2, s(x) = (W1 x') * (W2 x')/sqrt(d), x' = gamma LN(x) + beta; "
         "M' = r(r+1)/2, r = map_dim or d",
         lambda d, m, r: (r or d) * ((r or d) + 1) // 2, parameters=polysketch_learned_parameters,
         map_dim=True, learnable='map_gamma, map_beta [H, d], map_w, map_w2 [H, r, d]'),
    *(_own(name.replace('_', '-'), _elementwise(f), f'elementwise feature map {text}',
           "its own kernel, M' = d", lambda d, m, r: d) for name, (f, text) in ELEMENTWISE.items()),
    # Zoology's Performer: ORF directions, rows of norm sqrt(d/M), drawn once, shared by the heads.
    # Normalized as Based does, num / (den + 1e-12): zoology/mixers/based.py 205-209, eps at 69, 102.
    FeatureMap('performer_zoology', performer_zoology, 'none', parts=1, statistic='row',
               kind='performer-zoology', sampler='orf', normalizer_eps=-1e-12,
               kind_options=(('num_features', 256), ('redraw_every', 0), ('share_heads', True)),
               paper=("Zoology's PerformerFeatureMap (Based's figure 3): HazyResearch/zoology @ d88d6f5 "
                      'zoology/mixers/feature_maps/performer.py 74-141 (rows scaled to norm sqrt(d/M), '
                      'line 138; expanded_dim 256); W drawn once'),
               approximates=("its own kernel exp(-|q'|^2/2 - |k'|^2/2) mean_r exp(w_r.(q'+k')), "
                             "x' = x/d^(1/4), |w_r| = sqrt(d/M) (0.5 at d = 64, M = 256)")),
    # A random W drawn by a sampler (iid): registered as the kind ``polysketch`` with that sampler.
    FeatureMap('polysketch', polysketch, 'none', parts=1, statistic='row', kind='polysketch', sampler='iid',
               feature_dim=_width(_polysketch_width),
               paper='Kacham et al. 2023 (PolySketchFormer), random degree-2 Gaussian sketches [G1; G2] '
                     'self-tensored (non-negative), degree p = 4',
               approximates="(q^.k^)^4 with x^ = LN(x)/sqrt(d) (estimate (s(q).s(k))^2 >= 0, "
                            "M' = r(r+1)/2, r = num_features/2)"),
)
