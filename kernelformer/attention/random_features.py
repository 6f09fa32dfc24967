"""Random-feature attention: every (component function x weight matrix) pair as one registry name.

``RandomFeatureAttention`` is the single Flax module behind all random-feature kernels (Spectraformer
§3, eq. 11: a feature map is a weight matrix W combined with a component function f) and behind the
learned kernels of "On Learning the Transformer Kernel" (§2.1):

  1. q and k are scaled by d^-1/4 (or l2-normalized, ``normalize_qk``), so that a map estimating
     exp(q.k) estimates softmax's exp(q.k / sqrt(d)) (Spectraformer eq. 6), and one estimating the
     Gaussian kernel estimates exp(-|q - k|^2 / (2 sqrt(d))) -- the kernelized attention of Skyformer
     eq. 3, with the same d^-1/4 input scale;
  2. W is drawn per head by a sampler: a fixed one from ``features/weights.py`` (``SAMPLERS``) or a
     learnable one from ``attention/learned.py`` (``LEARNED``, a submodule owning its parameters);
  3. ``phi(q), phi(k)`` from ``features/components.py`` (one head at a time, vmapped over heads);
  4. ``D^-1 phi(Q) (phi(K)^T V)`` by ``attention/linear.py`` (kernel-learning paper eq. 1 rewritten
     below eq. 3; Spectraformer eq. 7), or with a relative-position bias by ``attention/rpe.py``.

Randomness and redraws (docs/architecture.md): ``fold_in(make_rng('features'), index)`` with the draw
index of ``attention/draws.py`` (``step // redraw_every`` in training, as the kernel-learning paper
resamples every 100 iterations, §2.2; the last training step's in evaluation), split per head unless
``share_heads``. Names (``SPECS``, collected by ``kernelformer.registry``): ``<component>-<sampler>``,
the learned samplers' names, the deterministic maps and the LRA repository's Performers -- the tables
of docs/kernels.md list them with their aliases and sources.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from kernelformer.attention import distill as distill_lib
from kernelformer.attention import draws
from kernelformer.attention import linear
from kernelformer.attention import rpe
from kernelformer.attention.spec import AttentionSpec
from kernelformer.features import catalog
from kernelformer.features import components as components_lib
from kernelformer.attention import learned as learned_lib
from kernelformer.features import maps as maps_lib
from kernelformer.features import projection as projection_lib
from kernelformer.features import weights as weights_lib
from kernelformer.features.feature_map import FeatureMap

Array = jax.Array

# The grid of fixed samplers (``features/weights.py`` SAMPLERS keys) and of the built-in projection-based
# components paired with every sampler (records with ``grid``).
FIXED_SAMPLERS = ('iid', 'orf', 'sorf', 'qmc', 'mm', 'sgq', 'fastfood')
RF_COMPONENTS = tuple(r.name for r in components_lib.FEATURE_MAPS if r.grid)


def input_scale(head_dim: int) -> float:
  """d^-1/4: applied to q and k, so exp(q.k) becomes softmax's exp(q.k / sqrt(d))."""
  return float(head_dim) ** -0.25


def l2_normalize(x: Array, eps: float = 1e-6) -> Array:
  """x / |x| over the last axis (Luo et al. 2021's normalized kernelized attention, NPRF)."""
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), eps * eps))


def per_head_features(component: str, q: Array, k: Array, proj, mask: Optional[Array], *,
                      heads_share_proj: bool, causal_chunk: Optional[int] = None,
                      unit_keys: bool = False, positions=None) -> tuple[Array, ...]:
  """``phi(q) [B, L, H, M']``, ``phi(k) [B, S, H, M']``: the component applied one head at a time.

  ``proj`` has a leading head axis unless ``heads_share_proj`` (or is None for elu/relu). With
  ``causal_chunk`` (maps whose record has ``causal_shift`` only) also ``key_shift [B, L, H, M']``,
  the per-row running key maxima for ``linear.linear_attention(..., key_shift=)``. ``unit_keys``
  (l2-normalized keys, a record with ``unit_key_shift``): every key is shifted by the bound that W
  alone sets (no key statistic); the returned ``key_shift`` is that bound on every row. ``positions``
  goes to the ``positional`` maps (``maps.token_positions``), the same for every head.
  """
  record = catalog.get(component)
  fn = record.fn
  extra = {} if causal_chunk is None else {'causal_chunk': causal_chunk}
  if record.positional:
    extra['positions'] = positions
  if record.whole_tensor:
    # One call with every head in the leading axes ([B, H, L, d]): its statistic spans all of them.
    if not heads_share_proj or causal_chunk is not None or unit_keys:
      raise ValueError(f'component {component!r} takes statistics over every head: it needs '
                       'share_heads=True and has no causal form')
    key_mask = None if mask is None else jnp.asarray(mask, bool)[:, None, :]
    out = fn(jnp.swapaxes(q, 1, 2), jnp.swapaxes(k, 1, 2), proj, mask=key_mask, stabilize=True, **extra)
    return tuple(jnp.swapaxes(o, 1, 2) for o in out)

  def one_head(qh, kh, p):
    if unit_keys:
      return fn(qh, kh, p, mask=mask, stabilize=True, causal_chunk=max(1, kh.shape[-2]),
                shift_init=record.unit_key_shift(p, jnp.float32))
    return fn(qh, kh, p, mask=mask, stabilize=True, **extra)

  proj_axis = None if (heads_share_proj or proj is None) else 0
  outs = (2, 2) if (causal_chunk is None and not unit_keys) else (2, 2, 2)
  return jax.vmap(one_head, in_axes=(2, 2, proj_axis), out_axes=outs)(q, k, proj)


def normalizer_eps(component: str, feature_eps: Optional[float] = None) -> float:
  """The normalizer guard: ``feature_eps`` if given, else the record's (``FeatureMap.normalizer_eps``)."""
  if feature_eps is not None:
    return float(feature_eps)
  return catalog.get(component).normalizer_eps if catalog.has(component) else linear.DEFAULT_EPS


# True forces the stored-features path (all of phi(Q), phi(K) formed, then the core) for every map: the
# tests and the cost benchmark compare it with the lean paths (``log_space``, ``row_wise`` records).
STORED_FEATURES_ONLY = False


class RandomFeatureAttention(nn.Module):
  """Linear attention with random (or learned, or deterministic) features; see the module docstring.

  Attributes:
    component: the feature map, a ``catalog`` name (its record says what it is).
    weights: weight matrix: a ``weights.SAMPLERS`` key, a ``learned.LEARNED`` key, or 'none' (elu/relu).
    num_features: M, rows of W (feature dimension M' = M or 2M, see ``FeatureMap.feature_count``).
      For GMM samplers M is the total over the mixture components (split evenly).
    redraw_every: steps between redraws of W; 0 = never.
    num_mixture_components: C of the GMM samplers (the paper uses 2, appendix B.2).
    covariance: GMM covariance, 'full' (GMM-RKS) or 'diag' (GMM-PRF).
    fastfood_variant: learnable FastFood variant, 'fixed' | 's' | 'sgb' (appendix C.1).
    normalize_qk: l2-normalize q and k (instead of the d^-1/4 scale) before the map, as Luo et al.'s
      NPRF; the kernel then sees q.k in [-1, 1].
    chunk_size: chunk length of the causal linear-attention core.
    feature_eps: the normalizer guard of the core (|D| below it is replaced by +-eps); None (default)
      = the record's ``normalizer_eps``: 1e-6, 1e-30 for the shifted exp maps, ``D + 1e-12`` for
      performer-zoology (as Zoology).
    share_heads: one draw of W (and one learned sampler) for all heads instead of one per head.
  """

  component: str = 'posrf'
  weights: str = 'orf'
  num_features: int = 128
  redraw_every: int = 100
  num_mixture_components: int = 2
  covariance: str = 'full'
  fastfood_variant: str = 'sgb'
  normalize_qk: bool = False
  chunk_size: int = 64
  feature_eps: Optional[float] = None
  share_heads: bool = False
  impl: str = 'auto'   # 'auto' (fused Pallas on GPU where supported, else XLA) | 'pallas' | 'xla'
  map_dim: int = 0     # taylor: learned per-head projection of q, k to this many dims first (Based: 16)
  cos_length: int = 0  # cosformer: M of cos(pi/2 (i-j)/M); 0 = each example's number of real tokens
  distill_weight: float = 0.0  # > 0: Hedgehog's attention distillation as an aux loss (attention/distill.py)

  def _projection(self, head_dim: int, num_heads: int, step: Optional[Array]):
    """W for this call: ``Projection`` with a leading head axis (or none if ``share_heads``)."""
    record = catalog.get(self.component)
    if not record.uses_projection:
      return None
    if self.weights == 'map':
      # The learned maps of features/maps.py (hedgehog, t2r, rebased, taylor's projection): parameters,
      # one set per head, passed to the component in place of a projection.
      if record.parameters is None:
        return None
      return record.parameters(self, head_dim, num_heads, num_features=self.num_features,
                               map_dim=self.map_dim)
    base = self.make_rng('features')
    if self.weights in learned_lib.LEARNED:
      key = jax.random.fold_in(base, draws.current_draw_index(self, step, self.redraw_every))
      keys = key if self.share_heads else jax.random.split(key, num_heads)
      sampler = learned_lib.build_learned(
          self.weights, self.num_features, head_dim,
          num_components=self.num_mixture_components, covariance=self.covariance,
          fastfood_variant=self.fastfood_variant, name='sampler',
          parent_vmap_heads=not self.share_heads)
      return sampler(keys)
    if self.weights not in weights_lib.SAMPLERS:
      raise ValueError(f'unknown weights {self.weights!r}; valid: '
                       f'{", ".join(sorted(weights_lib.SAMPLERS) + sorted(learned_lib.LEARNED))}')
    sample = weights_lib.SAMPLERS[self.weights]

    def draw(index: Array):
      """The projection of draw ``index``: a pure function of (this layer's base key, index)."""
      keys = jax.random.fold_in(base, index)
      if not self.share_heads:
        keys = jax.random.split(keys, num_heads)
        return jax.vmap(lambda kk: sample(kk, self.num_features, head_dim))(keys)
      return sample(keys, self.num_features, head_dim)

    return self._cached_projection(draw, step)

  def _cached_projection(self, draw, step: Optional[Array]):
    """A fixed sampler's W, drawn once per redraw window and kept in the ``features`` collection.

    The collection holds, per layer, the training draw now in use and its index ``step //
    redraw_every``. A train step whose index equals the stored one reuses the stored W (``lax.cond``:
    the sampler -- ORF's QR, MM's SVD, FastFood's structure -- runs only in the step that starts a new
    window); evaluation reads the stored W, the draw the model last trained with. The draws are the
    same arrays ``draw(index)`` gives, so results are bit-identical to sampling every step. Without the
    collection (``apply`` with parameters only) W is drawn on every call (index 0 in evaluation).
    Learned samplers depend on parameters and are drawn inside every step instead, from the same
    stored index (``draws.current_draw_index``).
    """
    index = draws.draw_index(step, self.redraw_every)
    if not draws.tracks_draws(self):
      return draw(index)
    treedef = jax.tree.structure(jax.eval_shape(draw, index))
    train_leaves = self.variable('features', 'train', lambda: tuple(jax.tree.leaves(draw(0))))
    stored = self.variable('features', 'train_index', lambda: jnp.zeros((), jnp.int32))
    if step is None:
      return jax.tree.unflatten(treedef, train_leaves.value)
    leaves = jax.lax.cond(index == stored.value,
                          lambda: tuple(train_leaves.value),
                          lambda: tuple(jax.tree.leaves(draw(index))))
    if self.is_mutable_collection('features') and not self.is_initializing():
      train_leaves.value, stored.value = leaves, index
    return jax.tree.unflatten(treedef, leaves)

  @nn.compact
  def __call__(self, q: Array, k: Array, v: Array, *, mask: Optional[Array] = None,
               causal: bool = False, step: Optional[Array] = None, deterministic: bool = True,
               position_bias: Optional[Array] = None) -> Array:
    del deterministic  # no dropout in feature-map attention
    record = catalog.get(self.component)     # unknown names: one line listing the valid ones
    if causal and record.non_causal:
      raise ValueError(f'component {self.component!r} has no causal form: {record.non_causal}')
    head_dim, num_heads = q.shape[-1], q.shape[-2]
    # Features in float32 whatever the input dtype (exp in bf16 loses everything).
    qf, kf = q.astype(jnp.float32), k.astype(jnp.float32)
    if self.normalize_qk:
      qf, kf = l2_normalize(qf), l2_normalize(kf)
    elif record.target_kernel != 'none':
      s = input_scale(head_dim)
      qf, kf = qf * s, kf * s
    proj = self._projection(head_dim, num_heads, step)
    if self.distill_weight > 0 and self.weights != 'map':
      raise ValueError(f'distill_weight trains a learned feature map (hedgehog, t2r, rebased, '
                       f'polysketch-learned, taylor with map_dim); component {self.component!r} has none')
    if (self.distill_weight > 0 and self.is_mutable_collection(distill_lib.DISTILL_COLLECTION)
        and not self.is_initializing()):   # init makes every collection mutable: no state from it
      self._sow_distillation(qf, kf, proj, mask, causal)
    path = self._path(record, position_bias, q.shape, v.dtype, causal)
    paths = {'pallas': self._pallas_attention, 'exp': self._exp_attention,
             'row_wise': self._row_wise_attention, 'stored': self._stored_attention}
    return paths[path](qf, kf, v, proj, mask, causal, position_bias,
                       normalizer_eps(self.component, self.feature_eps))

  def _path(self, record, position_bias, q_shape, dtype, causal: bool) -> str:
    """The one core that computes this call, chosen up front from what the map is: 'pallas'
    (``_use_pallas``), 'exp' (a ``LogSpaceForm``), 'row_wise' or 'stored' (docs/architecture.md, "The
    attention module picks its path once")."""
    if self._use_pallas(position_bias, q_shape, dtype, causal):
      return 'pallas'
    if position_bias is not None or STORED_FEATURES_ONLY:
      return 'stored'
    if record.log_space is not None:
      return 'exp'
    return 'row_wise' if record.row_wise else 'stored'

  def _features(self, qf, kf, proj, mask, **kwargs):
    """``per_head_features`` of this module's map (with token positions for the positional maps)."""
    positions = (maps_lib.token_positions(mask, qf.shape[1], kf.shape[1], self.cos_length)
                 if catalog.get(self.component).positional else None)
    return per_head_features(self.component, qf, kf, proj, mask, heads_share_proj=self.share_heads,
                             positions=positions, **kwargs)

  def _sow_features(self, qf, kf, proj, mask, phi=None) -> None:
    """phi(Q), phi(K) into ``intermediates`` for tests and analysis (``mutable=['intermediates']``; a
    no-op otherwise), on one shift for all keys: chunk-shifted features pair up only with the core's
    rescaling."""
    if self.is_mutable_collection('intermediates'):
      phi_q, phi_k = phi or self._features(qf, kf, proj, mask)
      self.sow('intermediates', 'phi_q', phi_q)
      self.sow('intermediates', 'phi_k', phi_k)

  def _exp_attention(self, qf, kf, v, proj, mask, causal, position_bias, eps):
    del position_bias
    self._sow_features(qf, kf, proj, mask)
    form = catalog.get(self.component).log_space
    if causal:
      one_head = lambda qh, kh, vh, p: linear.causal_exp_feature_attention(
          form, qh, kh, vh, p, mask=mask, eps=eps, chunk_size=self.chunk_size)
    else:
      one_head = lambda qh, kh, vh, p: linear.exp_feature_attention(form, qh, kh, vh, p, mask=mask,
                                                                    eps=eps)
    proj_axis = None if (self.share_heads or proj is None) else 0
    return jax.vmap(one_head, in_axes=(2, 2, 2, proj_axis), out_axes=2)(qf, kf, v, proj)

  def _row_wise_attention(self, qf, kf, v, proj, mask, causal, position_bias, eps):
    """``linear.feature_attention`` / ``causal_feature_attention`` with heads as a leading axis of the
    call (``[B, H, L, d]``) rather than a ``vmap`` around it: the chunks' large einsums then run on
    plain leading axes (at Taylor's M' = 4161, L = 2048, H = 2, fwd+bwd took 0.56-0.64x the time of the
    vmapped call, interleaved on this CPU). Per-head parameters are vmapped inside the feature
    computation only (``_heads_component``)."""
    del position_bias
    self._sow_features(qf, kf, proj, mask)
    per_head = not (self.share_heads or proj is None)
    fn = _heads_component(self.component) if per_head else catalog.get(self.component).fn
    qt, kt, vt = (jnp.swapaxes(x, 1, 2) for x in (qf, kf, v))
    key_mask = None if mask is None else jnp.asarray(mask, bool)[:, None, :]
    if causal:
      out = linear.causal_feature_attention(fn, qt, kt, vt, proj, mask=key_mask, eps=eps,
                                            chunk_size=self.chunk_size)
    else:
      out = linear.feature_attention(fn, qt, kt, vt, proj, mask=key_mask, eps=eps)
    return jnp.swapaxes(out, 1, 2)

  def _stored_attention(self, qf, kf, v, proj, mask, causal, position_bias, eps):
    record = catalog.get(self.component)
    # Causal maps with a running key shift: key shifts are running maxima per row (no later key enters
    # an earlier row). Causal RPE on l2-normalized keys (nprf-rpe): one key shift from W alone, set by
    # no key (the record's ``unit_key_shift``); the decoder's step uses the same one.
    chunked = causal and position_bias is None and record.causal_shift
    unit_keys = (causal and position_bias is not None and self.normalize_qk
                 and record.unit_key_shift is not None)
    phi_q, phi_k, *key_shift = self._features(qf, kf, proj, mask, unit_keys=unit_keys,
                                              causal_chunk=self.chunk_size if chunked else None)
    self._sow_features(qf, kf, proj, mask, None if chunked else (phi_q, phi_k))
    if position_bias is not None:
      return rpe.rpe_linear_attention(phi_q, phi_k, v, position_bias, mask=mask, causal=causal, eps=eps)
    return linear.linear_attention(phi_q, phi_k, v, mask=mask, causal=causal, chunk_size=self.chunk_size,
                                   eps=eps, key_shift=key_shift[0] if key_shift else None)

  def _sow_distillation(self, qf, kf, proj, mask, causal) -> None:
    """``distill_weight`` x Hedgehog's distillation loss into ``aux_loss`` (``attention/distill.py``).

    The student's features are those of the stopped q, k with the live map parameters, so this term's
    gradient reaches only the map (Hedgehog's W).
    """
    phi_q, phi_k = self._features(jax.lax.stop_gradient(qf), jax.lax.stop_gradient(kf), proj, mask)
    loss = distill_lib.attention_distillation_loss(qf, kf, phi_q, phi_k, mask=mask, causal=causal)
    self.sow(distill_lib.DISTILL_COLLECTION, 'distill', self.distill_weight * loss)

  def _use_pallas(self, position_bias, q_shape, dtype, causal: bool) -> bool:
    """Whether this call takes the fused Pallas kernels (kernelformer/pallas, docs/pallas.md).

    Bidirectional only (the kernels have no causal form with the per-row running-max shift of the XLA
    path). 'auto' takes them only where ``pallas.supported`` (a GPU, a fused feature, head dim <= 256)
    and the combination is recorded as validated on this device by scripts/gpu_check.py
    (``kernelformer/pallas/validated.py``). Logged once per run.
    """
    if self.impl not in ('auto', 'pallas', 'xla'):
      raise ValueError(f"attention impl must be 'auto', 'pallas' or 'xla', got {self.impl!r}")
    if self.impl == 'xla' or (causal and self.impl == 'auto'):
      return False
    feature = catalog.get(self.component).pallas_feature
    fused_ok = bool(feature) and position_bias is None
    if self.impl == 'pallas':
      if causal:
        raise ValueError('impl=pallas is bidirectional only: the fused kernels have no causal form; use '
                         'impl=xla or auto for causal attention')
      if not fused_ok:
        raise ValueError(
            f'impl=pallas supports components {", ".join(pallas_components())} without a '
            f'position bias; got component {self.component!r}'
            f'{" with a position bias" if position_bias is not None else ""}. Use impl=xla.')
      return True
    from kernelformer import pallas  # pylint: disable=g-import-not-at-top
    if not (fused_ok and pallas.supported(feature, q_shape, dtype, num_features=self.num_features)):
      return False
    from kernelformer.pallas import validated  # pylint: disable=g-import-not-at-top
    return validated.select(feature, causal=False, dtype=jnp.dtype(dtype).name)[0]

  def _pallas_attention(self, qf, kf, v, proj, mask, causal, position_bias, eps):
    del causal, position_bias         # bidirectional and no bias: ``_use_pallas``
    from kernelformer import pallas  # pylint: disable=g-import-not-at-top
    w, weights = None, None
    if proj is not None:
      dense = projection_lib.dense_matrix
      w = dense(proj) if self.share_heads else jax.vmap(dense)(proj)
      weights = proj.feature_weights
    return pallas.feature_attention(qf, kf, v, w, feature=catalog.get(self.component).pallas_feature,
                                    feature_weights=weights, mask=mask, eps=eps)


@functools.lru_cache(maxsize=None)
def _heads_component(component: str):
  """``component`` for q, k ``[B, H, C, d]`` with parameters carrying a leading head axis: vmapped over
  heads around the feature computation only (one stable function per name, for the lean paths' cache)."""
  fn = catalog.get(component).fn

  def heads(q, k, proj, *, mask=None, stabilize=True):
    one = lambda qh, kh, p, m: fn(qh, kh, p, mask=m, stabilize=stabilize)
    return jax.vmap(one, in_axes=(1, 1, 0, None if mask is None else 1), out_axes=1)(q, k, proj, mask)
  return heads


def pallas_components() -> list[str]:
  """The maps with a fused Pallas kernel (records with a ``pallas_feature``)."""
  return sorted(r.name for r in catalog.records() if r.pallas_feature)


# ----------------------------------------------------------------------------------------------
# The kinds (``SPECS``, collected by ``kernelformer.registry``). Paper and kernel text of a component come
# from its record (``catalog``); the names and the sampler papers are this module's.
# ----------------------------------------------------------------------------------------------

_KL = 'Chowdhury et al. 2022, On Learning the Transformer Kernel'
_SPECTRA = 'Nguyen, Joshi & Salim, Spectraformer'

_SAMPLER_INFO = {
    # sampler: (paper, Spectraformer alias suffix or None); a registered sampler adds its paper
    # (``grid_specs(sampler=...)``).
    'iid': ('i.i.d. Gaussian W (Spectraformer "Base", eq. 16)', 'base'),
    'orf': ('orthogonal random features (Yu et al. 2016)', None),
    'sorf': ('structured orthogonal random features (Yu et al. 2016)', None),
    'qmc': ('quasi-Monte Carlo (Avron et al. 2016)', None),
    'mm': ('moment matching (Shen et al. 2017)', None),
    'sgq': ('sparse-grid quadrature (Dao et al. 2017)', None),
    'fastfood': ('random FastFood (Le et al. 2013), not learned', None),
}

# Table 1 of the kernel-learning paper (L length, d_q head dim, M samples, C mixture components).
_CPLX_RF = 'O(L M d_q) time, O(L(d_q + M + M d_q/L)) space'           # Performer row
_CPLX_FASTFOOD = 'O(L M d_q) time, O(L(d_q + M + M d_q/L)) space'     # FASTFOOD(RKS/PRF) row
_CPLX_GMM_RKS = 'O(M C (d_q^2 + L d_q)) time, O(L(d_q + C(d_q^2/L + M d_q/L + M))) space'
_CPLX_GMM_PRF = 'O(L C M d_q) time, O(L(d_q + C M d_q/L + C M)) space'
_CPLX_GEN = 'O(M (d_q^2 + L d_q)) time, O(L(d_q + d_q^2/L + M d_q/L + M)) space'
_CPLX_ELU = 'O(L d_q^2) time, O(L(d_q + d_q^2/L)) space'               # LinearElu row
_FASTFOODL = 'FastFood diagonals S, G, B (fastfood_variant sgb; s: S only; fixed: none)'

# Names the literature gives to particular combinations (lowercase; the registry is case-insensitive).
_LITERATURE_ALIASES = {
    'posrf-orf': ('favor+', 'performer'),
    'oprf-orf': ('favor++',),
    'saderf-orf': ('favor#',),
}


def _spec(name: str, component: str, weights: str, *, paper: str, approximates: str,
          complexity: str, learnable: str = '-', aliases: tuple[str, ...] = (),
          extra_fixed: Optional[dict] = None) -> AttentionSpec:
  fixed = {'component': component, 'weights': weights, **(extra_fixed or {})}
  return AttentionSpec(
      name=name, module=RandomFeatureAttention, fixed=fixed, paper=paper,
      approximates=approximates, complexity=complexity, learnable=learnable, aliases=aliases,
      supports_position_bias=True)


def _builtin_specs() -> list[AttentionSpec]:
  specs = []
  for comp in RF_COMPONENTS:
    rec = catalog.get(comp)
    for samp in FIXED_SAMPLERS:
      samp_paper, spectra = _SAMPLER_INFO[samp]
      name = f'{comp}-{samp}'
      aliases = _LITERATURE_ALIASES.get(name, ())
      if spectra:
        aliases += (f'{comp}-{spectra}',)
      specs.append(_spec(name, comp, samp, paper=f'{rec.paper}; W: {samp_paper}',
                         approximates=rec.kernel_text,
                         complexity=_CPLX_FASTFOOD if samp == 'fastfood' else _CPLX_RF, aliases=aliases))

  # Learnable FastFood (FastFoodL), any component; the kernel-learning paper's two are canonical.
  ff_names = {'rks': ('fastfood-rks', f'{_KL} eq. 6'), 'posrf': ('fastfood-prf', f'{_KL} eqs. 9, 12')}
  for comp in RF_COMPONENTS:
    rec = catalog.get(comp)
    name, paper = ff_names.get(comp, (f'{comp}-fastfoodl', f'{_SPECTRA} eq. 17 (FastFoodL), Table 2'))
    aliases = (f'{comp}-fastfoodl',) if comp in ff_names else ()
    specs.append(_spec(name, comp, 'fastfoodl', paper=f'{paper}; component: {rec.paper}',
                       approximates=f'learned kernel (init: {rec.kernel_text})', complexity=_CPLX_FASTFOOD,
                       learnable=_FASTFOODL, aliases=aliases))

  learned_kernels = [
      ('gmm-rks', 'rks', 'gmm', f'{_KL} eqs. 4-5', _CPLX_GMM_RKS, 'full',
       'GMM means mu_c [C, d], full factors Sigma_c [C, d, d]'),
      ('gmm-prf', 'posrf', 'gmm', f'{_KL} eqs. 8-10', _CPLX_GMM_PRF, 'diag',
       'GMM means mu_c [C, d], diagonal scales [C, d]'),
      ('generative-rks', 'rks', 'generative', f'{_KL} eq. 7', _CPLX_GEN, None,
       'generator: 4 x (dense, batch norm, LeakyReLU), dense + tanh, output batch norm'),
      ('generative-prf', 'posrf', 'generative', f'{_KL} eqs. 9, 11', _CPLX_GEN, None,
       'generator: 4 x (dense, batch norm, LeakyReLU), dense + tanh, output batch norm'),
  ]
  for name, comp, samp, paper, cplx, cov, learnable in learned_kernels:
    specs.append(_spec(name, comp, samp, paper=paper,
                       approximates=f'learned kernel (init: {catalog.get(comp).kernel_text})',
                       complexity=cplx, learnable=learnable,
                       extra_fixed=None if cov is None else {'covariance': cov}))

  elu, relu = catalog.get('elu'), catalog.get('relu')
  specs.append(_spec('linear-elu', 'elu', 'none', paper=elu.paper, approximates=elu.kernel_text,
                     complexity=_CPLX_ELU, aliases=('linear', 'elu', 'linearelu')))
  specs.append(_spec('relu', 'relu', 'none', paper=relu.paper, approximates=relu.kernel_text,
                     complexity=_CPLX_ELU, aliases=('linear-relu',)))

  # Generalized ReLU features relu(W x) + 1e-3 (the official Performer generalized attention,
  # components.grelu): 'performer-relu' is its ORF form (features_type='ortho'), the other samplers
  # follow the grid's <component>-<sampler> names, 'performer-relu-det' is its W-free default
  # (features_type='deterministic'), the Performer that LRA's Text/Retrieval/Image/Pathfinder configs run.
  grelu = catalog.get('grelu')
  for samp in FIXED_SAMPLERS:
    name = 'performer-relu' if samp == 'orf' else f'grelu-{samp}'
    specs.append(_spec(name, 'grelu', samp, paper=f'{grelu.paper}; W: {_SAMPLER_INFO[samp][0]}',
                       approximates=grelu.kernel_text, complexity=_CPLX_RF,
                       aliases=('grelu-orf',) if samp == 'orf' else ()))
  det = catalog.get('grelu_det')
  specs.append(_spec('performer-relu-det', 'grelu_det', 'none', paper=det.paper,
                     approximates=det.kernel_text, complexity=_CPLX_ELU, aliases=('lra-performer',)))

  # LRA's ListOps Performer: listops/configs/performer_base.py @ 093bfc6 sets attention_fn_cls="softmax"
  # (make_fast_softmax_attention) with nb_features=2 and ortho_scaling=0.0, every other argument its
  # default (ortho_features=True, redraw_features=True, nonnegative_features=True, stabilizer 1e-6).
  specs.append(_spec(
      'performer-lra-listops', 'posrf_lra', 'orf',
      paper=('LRA (Tay et al. 2021) ListOps Performer: google-research/long-range-arena '
             'listops/configs/performer_base.py @ 093bfc6 (make_fast_softmax_attention, '
             'nb_features=2, ortho_scaling=0.0); features: performer_attention.py '
             'nonnegative_softmax_kernel_feature_creator; W: ORF rows with Gaussian-row norms'),
      approximates="softmax exp(q.k/sqrt(d)) by FAVOR+ with M = 2, LRA's shifts and a +1e-6 floor",
      complexity=_CPLX_RF, aliases=('lra-listops-performer', 'lra-performer-listops'),
      extra_fixed={'num_features': 2, 'redraw_every': 1, 'share_heads': True}))

  # Luo et al.'s NPRF-Transformer with RPE: ``component='posrf'``, the positive random features of eq. 5;
  # ``weights='iid'``: eq. 5 draws every w_i independently from N(0, I_d) (ORF and Sphere-PRF are only
  # ablations, §4.5, with equal results); ``normalize_qk=True``: §3.3 normalizes queries and keys by their
  # l2 norms, so ``phi(q).phi(k)`` estimates ``exp(q.k / (|q| |k|))`` and its variance (eq. 14) stays
  # bounded. The paper applies no temperature to the normalized vectors (q.k lies in [-1, 1]); the
  # sharpness that normalization removes comes back through the unbounded RPE ``b_{j-i}`` - hence
  # ``requires_position_bias``. The feature dimension stays the ``num_features`` option: Luo et al. use
  # 16-64 (64 for language modelling, 32 for images, 16/24 for translation), and the FFT cost grows with
  # M * Dv.
  specs.append(AttentionSpec(
      name='nprf-rpe', module=RandomFeatureAttention,
      fixed={'component': 'posrf', 'weights': 'iid', 'normalize_qk': True},
      paper='Luo et al. 2021, eqs. 5, 10 and §3.3 (Algorithm 1)',
      approximates='softmax with RPE, exp(q.k/(|q||k|) + b_{j-i}), on l2-normalized q, k',
      complexity='O(L log L M d) time, O(L M d) memory (FFT over M (d + 1) channels)',
      learnable='b_{j-i} (owned by the encoder, shared across layers)',
      aliases=('nprf', 'luo-rpe'),
      supports_position_bias=True, requires_position_bias=True))

  # The deterministic, learned and sketched maps of features/maps.py: one kind each (``record.kind``).
  for rec in catalog.records():
    if rec.kind:
      specs.append(_own_kind_spec(rec))
  return specs


def _own_kind_spec(rec: FeatureMap, name: str = '') -> AttentionSpec:
  """The one kind of a map registered on its own: ``rec.kind`` with its sampler, its learned
  parameters ('map') or no W ('none')."""
  if rec.sampler:
    return _spec(name or rec.kind, rec.name, rec.sampler,
                 paper=f'{rec.paper}; W: {_SAMPLER_INFO[rec.sampler][0]}',
                 approximates=rec.kernel_text, complexity=_CPLX_RF, extra_fixed=dict(rec.kind_options))
  return _spec(name or rec.kind, rec.name, 'map' if rec.uses_projection else 'none', paper=rec.paper,
               approximates=rec.kernel_text, complexity=_CPLX_ELU, learnable=rec.learnable or '-',
               extra_fixed=dict(rec.kind_options))


SPECS = tuple(_builtin_specs())


# ----------------------------------------------------------------------------------------------
# Components and samplers registered from outside the package (``kernelformer.plugins``;
# docs/extending.md). Each joins the grid, whichever comes first: a new projection-based component is
# paired with every fixed sampler, every registered sampler and learnable FastFood (fastfoodl); a new
# sampler with every projection-based component (the grid's, grelu, registered ones), as
# ``<component>-<sampler>``.
# ----------------------------------------------------------------------------------------------

_BUILTIN_COMPONENTS = frozenset(catalog.names())


def _user_grid_components() -> list[str]:
  return [r.name for r in catalog.records()
          if r.name not in _BUILTIN_COMPONENTS and r.uses_projection and not r.kind]


def grid_specs(*, component: Optional[str] = None, sampler: Optional[str] = None,
               paper: str = '', approximates: str = '') -> list[AttentionSpec]:
  """The kinds a newly added component or sampler completes (for ``registry.register``).

  ``component`` must already be in the catalog (``catalog.register``), ``sampler`` in
  ``weights.SAMPLERS`` (``weights.register_sampler``); give exactly one. A component with a ``kind``
  gets that one kind (like the maps of features/maps.py); one that takes no projection (``parts=0``)
  gets one kind named after itself, like ``relu``; the others every ``<component>-<sampler>`` and
  ``<component>-fastfoodl``. ``paper`` / ``approximates`` override the record's (a sampler's paper).
  """
  if (component is None) == (sampler is None):
    raise ValueError('give exactly one of component= and sampler=')
  if component is not None:
    rec = catalog.get(component)
    comp_paper = paper or rec.paper or f'{component} (user component)'
    target_text = approximates or rec.kernel_text
    if rec.kind or not rec.uses_projection:
      rec = dataclasses.replace(rec, paper=comp_paper, approximates=target_text)
      return [_own_kind_spec(rec, name=rec.kind or component)]
    specs = []
    for samp in _SAMPLER_INFO:
      specs.append(_spec(f'{component}-{samp}', component, samp,
                         paper=f'{comp_paper}; W: {_SAMPLER_INFO[samp][0]}',
                         approximates=target_text, complexity=_CPLX_RF))
    # Learnable FastFood (FastFoodL), as every built-in projection component has it.
    specs.append(_spec(f'{component}-fastfoodl', component, 'fastfoodl',
                       paper=f'{_SPECTRA} eq. 17 (FastFoodL), Table 2; component: {comp_paper}',
                       approximates=f'learned kernel (init: {target_text})', complexity=_CPLX_FASTFOOD,
                       learnable=_FASTFOODL))
    return specs
  if sampler in _SAMPLER_INFO:
    raise ValueError(f'weight sampler {sampler!r} is registered twice')
  _SAMPLER_INFO[sampler] = (paper or f'{sampler} (user sampler)', None)
  specs = []
  # Every projection-based component: the grid's, the generalized ReLU's and the registered ones.
  for comp in (*RF_COMPONENTS, 'grelu', *_user_grid_components()):
    rec = catalog.get(comp)
    comp_paper = rec.paper or f'{comp} (user component)'
    specs.append(_spec(f'{comp}-{sampler}', comp, sampler,
                       paper=f'{comp_paper}; W: {_SAMPLER_INFO[sampler][0]}',
                       approximates=approximates or rec.kernel_text, complexity=_CPLX_RF))
  return specs
