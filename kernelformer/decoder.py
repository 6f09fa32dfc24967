"""Decoder-only (causal) language model over any causal attention kind, with incremental generation.

docs/causal.md "The decoder" is the reference (options, decoding state and memory per kind, why the
step equals the forward). ``Decoder`` is the causal counterpart of ``encoder.Classifier``: token
embeddings (+ positions), pre-LN blocks whose attention is the registry mechanism named by
``attention['kind']`` called with ``causal=True``, a final LayerNorm and next-token logits
``[B, L, vocab]`` (tied to the embedding, or its own Dense). Token ``pad_id`` (0; None for tasks without
padding, such as Zoology's MQAR) is padding: the key mask is ``inputs != pad_id``; the loss weights are
``targets != 0`` (``next_token_loss``). Zoology's model (Arora et al. 2023): ``short_conv=K`` makes blocks
0, 2, ... ``BaseConv`` layers, as Zoology's ``Hybrid([BaseConv, mixer])``; ``state_mixer='identity'``.

Incremental generation (``decode=True``, ``cache`` collection, ``init_cache``): feature kinds carry
``S = sum_j phi(k_j) v_j^T`` and ``z = sum_j phi(k_j)`` (Katharopoulos et al. 2020 §3.4, the RNN form of
eq. 9; Spectraformer eq. 7) plus the running key max ``key_shift`` of the forward's stabiliser
(``components`` ``causal_chunk`` / ``shift_init``, ``linear.causal_linear_attention``), so a step of one
token, a block of T tokens (no RPE: stateful evaluation, ``training/lm_eval.py``) and the full forward
agree at every key norm (``tests/test_decoder.py``); with RPE (Luo et al. eq. 10, no finite recurrence)
the cached ``phi(k_j)``, ``v_j`` of all past j; ``softmax`` and ``gaussian`` a KV cache. Kinds without a
causal form are refused with one line (``causal_problem``): Nystromformer, Linformer, Skyformer, and
OPRF / SADERF (whose A, Psi of Spectraformer eqs. 35-36 are means over the whole sequence).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from kernelformer import registry
from kernelformer import run_config
from kernelformer.attention import gaussian as gaussian_lib
from kernelformer.attention import linear as linear_lib
from kernelformer.attention import random_features as rf_lib
from kernelformer.attention import softmax as softmax_lib
from kernelformer.features import catalog
from kernelformer.layers import (ModelConfig, RelativePositionBias, attention_options, position_bias_wanted,
                                 pre_ln_residuals, qkv_projections)

Array = Any

QUERY_POSITIONS_KEY = 'inputs_query_positions'   # the trainer passes every batch key named inputs*

class CausalKindError(ValueError):
  """An attention kind that has no causal (decoder) form."""


@functools.lru_cache(maxsize=None)
def causal_problem(kind: str) -> Optional[str]:
  """Why ``kind`` cannot serve a decoder (one line), or None if it can."""
  spec = registry.get(kind)
  name = spec.name
  if issubclass(spec.module, rf_lib.RandomFeatureAttention):
    comp = spec.fixed.get('component')
    record = catalog.get(comp)
    if record.non_causal:
      return f'attention kind {name!r} has no causal form: {record.non_causal}'
    if record.sequence_statistics:
      return (f'attention kind {name!r} has no causal form: its {comp} parameters are means over '
              'the whole sequence (Spectraformer eqs. 35-36), so earlier positions would see later '
              'tokens; use posrf-*, trigrf-*, hyperbolic-*, a learned kernel, linear-elu, nprf-rpe '
              'or softmax')
    return None
  if spec.module in (softmax_lib.SoftmaxAttention, gaussian_lib.GaussianAttention):
    return None
  # Any other mechanism: ask it (shape-only) whether it accepts causal=True.
  module = registry.build({'kind': name})
  x = jnp.zeros((1, 4, 1, 4), jnp.float32)
  try:
    jax.eval_shape(lambda: module.init({'params': jax.random.key(0), 'features': jax.random.key(0)},
                                       x, x, x, causal=True))
  except ValueError as e:
    return f'attention kind {name!r}: {str(e).splitlines()[0]}'
  return (f'attention kind {name!r} accepts causal=True but has no incremental decoding step in '
          'kernelformer/decoder.py')


def check_causal(kind: str) -> None:
  problem = causal_problem(registry.get(kind).name)
  if problem:
    raise CausalKindError(problem)


def causal_kinds() -> list[str]:
  """Every registered kind the decoder accepts."""
  return [s.name for s in registry.specs() if causal_problem(s.name) is None]


def _mechanism_kwargs(options: Mapping[str, Any]) -> tuple[registry.AttentionSpec, dict]:
  """The spec and constructor arguments ``registry.build`` would use for ``options``."""
  module = registry.build(attention_options(options))
  spec = registry.get(options['kind'])
  kwargs = {f.name: getattr(module, f.name) for f in dataclasses.fields(module)
            if f.name not in ('parent', 'name')}
  return spec, kwargs


class _FeatureStep(rf_lib.RandomFeatureAttention):
  """``phi(q), phi(k)`` of a block of new tokens with the W of the full forward (module docstring).

  Same fields, parameters and ``_projection`` as ``RandomFeatureAttention``; only the call differs.
  Maps with a key shift (records with ``causal_shift``) continue the running key max ``shift_init``
  ``[B, H, M']`` (``-inf`` before the first token) over the block's chunks of ``chunk`` rows (1 for
  token-by-token decoding) and also return the block's per-chunk shifts ``[B, N, H, M']``; under
  ``unit_keys`` (l2-normalized keys) the shift is W's bound, as in the full forward. Other maps have
  no key-dependent shift: their queries are stabilized per row only (which cancels), keys unshifted.
  """

  @nn.compact
  def __call__(self, q: Array, k: Array, *, shift_init: Array, chunk: int,  # pylint: disable=arguments-differ
               unit_keys: bool = False, step: Optional[Array] = None, start: Optional[Array] = None):
    record = catalog.get(self.component)
    head_dim, num_heads = q.shape[-1], q.shape[-2]
    qf, kf = q.astype(jnp.float32), k.astype(jnp.float32)
    # As RandomFeatureAttention.__call__: l2 normalization (NPRF) or the d^-1/4 input scale.
    if self.normalize_qk:
      qf, kf = rf_lib.l2_normalize(qf), rf_lib.l2_normalize(kf)
    elif record.target_kernel != 'none':
      s = rf_lib.input_scale(head_dim)
      qf, kf = qf * s, kf * s
    proj = self._projection(head_dim, num_heads, step)
    fn = record.fn
    proj_axis = None if (self.share_heads or proj is None) else 0

    if record.causal_shift:
      def shifted(qh, kh, p, s0):
        init = s0[:, None, :]
        if unit_keys:
          init = jnp.maximum(init, record.unit_key_shift(p, jnp.float32))
        return fn(qh, kh, p, mask=None, causal_chunk=chunk, shift_init=init)

      return jax.vmap(shifted, in_axes=(2, 2, proj_axis, 1), out_axes=(2, 2, 2))(qf, kf, proj,
                                                                                shift_init)
    # Queries stabilized with every key masked, so no key statistic enters their shift; keys unshifted
    # (these maps have nothing to shift: elu, relu, grelu, rks, and registered maps without a shift).
    no_keys = jnp.zeros(kf.shape[:2], bool)
    extra = {}
    if record.positional:
      # cosFormer: the new tokens sit at positions start + 1 .. start + T (1-based, as the full forward's
      # unmasked ``token_positions``) with the horizon M = cos_length (the decoder's max_length).
      pos = (start + 1 + jnp.arange(q.shape[1])).astype(jnp.float32)
      extra['positions'] = (pos, pos, jnp.asarray(self.cos_length, jnp.float32))

    def one_head(qh, kh, p):
      return (fn(qh, kh, p, mask=no_keys, stabilize=True, **extra)[0],
              fn(qh, kh, p, mask=None, stabilize=False, **extra)[1])

    phi_q, phi_k = jax.vmap(one_head, in_axes=(2, 2, proj_axis), out_axes=(2, 2))(qf, kf, proj)
    return phi_q, phi_k, None


def _bias_window(position_bias: Array, length: int, max_length: int) -> Array:
  """``[H, 2 max_length - 1]`` -> ``[H, 2 length - 1]``: the offsets -(length-1)..(length-1)."""
  return position_bias[:, max_length - length:max_length + length - 1]


class CausalSelfAttention(nn.Module):
  """q/k/v/out projections (as ``layers.MultiHeadAttention``) around a causal mechanism + its decode step."""

  num_heads: int
  qkv_dim: int
  attention: Mapping[str, Any]
  max_length: int
  decode: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, *, mask=None, step=None, deterministic=True, position_bias=None):
    q, k, v = qkv_projections(x, self.num_heads, self.qkv_dim, self.dtype)
    spec, kwargs = _mechanism_kwargs(self.attention)
    if ('component' in kwargs and catalog.get(kwargs['component']).positional
        and not kwargs.get('cos_length')):
      # cosFormer's horizon M: the longest sequence this decoder sees, the same in the full forward and
      # in every decode step (an M that grew with the decoded length would change past weights).
      kwargs['cos_length'] = self.max_length
    if not self.decode:
      extra = {}
      if position_bias is not None:
        extra['position_bias'] = _bias_window(position_bias, x.shape[1], self.max_length)
      mechanism = spec.module(**kwargs, name='mechanism')
      out = mechanism(q, k, v, mask=mask, causal=True, step=step, deterministic=deterministic,
                      **extra)
    elif issubclass(spec.module, rf_lib.RandomFeatureAttention):
      out = self._feature_step(kwargs, q, k, v, position_bias)
    else:
      out = self._kv_cache_step(spec, q, k, v, position_bias)
    return nn.DenseGeneral(x.shape[-1], axis=(-2, -1), dtype=self.dtype, name='out',
                           kernel_init=nn.initializers.xavier_uniform())(out)

  def _index(self):
    return self.variable('cache', 'index', lambda: jnp.zeros((), jnp.int32))

  def _row_weights(self, position_bias, idx):
    """``exp(b_{j-t} - shift)`` for j <= t, else 0: ``[H, max_length]`` (Luo et al. eq. 10 weights)."""
    j = jnp.arange(self.max_length)
    row = position_bias[:, j - idx + self.max_length - 1].astype(jnp.float32)   # [H, Lmax]
    row = jnp.where(j <= idx, row, -jnp.inf)
    shift = jax.lax.stop_gradient(jnp.max(row, axis=-1, keepdims=True))      # cancels in eq. 10
    return jnp.exp(row - shift)

  def _feature_step(self, kwargs, q, k, v, position_bias):
    """Linear attention for new tokens: the recurrent state, or a feature cache under RPE.

    Without RPE a block of any length T continues the cached state (``linear.causal_linear_attention``
    with the chunk size of the full forward; T = 1 is token-by-token decoding). Under RPE one token per
    call.
    """
    eps = rf_lib.normalizer_eps(kwargs.get('component', ''), kwargs.get('feature_eps'))
    index = self._index()
    idx = index.value
    b, t, h, _ = q.shape
    dv = v.shape[-1]
    rpe = position_bias is not None
    if rpe and t != 1:
      raise ValueError(f'decode=True takes one token per call under a position bias, got {t}')
    # Running key max per feature column; the cache holds zeros before the first token, which stand
    # for -inf ("no key yet") so the first key sets the shift.
    record = catalog.get(kwargs['component'])
    m = record.feature_count(kwargs['num_features'], q.shape[-1], map_dim=kwargs.get('map_dim', 0) or 0)
    shift = self.variable('cache', 'key_shift', jnp.zeros, (b, h, m), jnp.float32)
    shift_in = jnp.where(idx == 0, -jnp.inf, shift.value)
    unit_keys = rpe and kwargs['normalize_qk'] and record.unit_key_shift is not None
    chunk = 1 if rpe else kwargs['chunk_size']
    phi_q, phi_k, key_shift = _FeatureStep(**kwargs, name='mechanism')(
        q, k, shift_init=shift_in, chunk=chunk, unit_keys=unit_keys, step=None, start=idx)  # [B, T, H, M']
    if not rpe:
      state = self.variable('cache', 'state', jnp.zeros, (b, h, m, dv), jnp.float32)
      norm = self.variable('cache', 'normalizer', jnp.zeros, (b, h, m), jnp.float32)
      out, (s, z, beta) = linear_lib.causal_linear_attention(
          phi_q, phi_k, v, (state.value, norm.value, shift_in), chunk_size=chunk,
          key_shift=key_shift, eps=eps)
      state.value, norm.value = s, z
      if key_shift is not None:
        shift.value = beta
      index.value = idx + t
      return out
    ck = self.variable('cache', 'phi_k', jnp.zeros, (b, self.max_length, h, m), jnp.float32)
    cv = self.variable('cache', 'cached_value', jnp.zeros, (b, self.max_length, h, dv), jnp.float32)
    cached = ck.value
    if key_shift is not None:
      # Earlier keys' features move from the old running max to the new one (factor <= 1).
      new_shift = key_shift[:, 0]                                              # [B, H, M']
      factor = jnp.exp(jnp.minimum(shift_in - new_shift, 0.0))               # 0 before any key
      cached = cached * factor[:, None]
      shift.value = new_shift
    ck.value = jax.lax.dynamic_update_slice(cached, phi_k.astype(jnp.float32), (0, idx, 0, 0))
    cv.value = jax.lax.dynamic_update_slice(cv.value, v.astype(jnp.float32), (0, idx, 0, 0))
    c = self._row_weights(position_bias, idx)                                 # [H, Lmax]
    a = linear_lib.einsum_f32('blhm,bshm->bhls', phi_q, ck.value) * c[None, :, None, :]
    num = jnp.einsum('bhls,bshd->blhd', a, cv.value)
    den = jnp.einsum('bhls->blh', a)
    index.value = idx + 1
    return (num / linear_lib.safe_normalizer(den, eps)[..., None]).astype(v.dtype)

  def _kv_cache_step(self, spec, q, k, v, position_bias):
    """One token of softmax / Gaussian attention against a KV cache."""
    if q.shape[1] != 1:
      raise ValueError(f'decode=True takes one token per call, got {q.shape[1]}')
    b, _, h, d = k.shape
    index = self._index()
    idx = index.value
    ck = self.variable('cache', 'cached_key', jnp.zeros, (b, self.max_length, h, d), k.dtype)
    cv = self.variable('cache', 'cached_value', jnp.zeros, (b, self.max_length, h, v.shape[-1]), v.dtype)
    ck.value = jax.lax.dynamic_update_slice(ck.value, k, (0, idx, 0, 0))
    cv.value = jax.lax.dynamic_update_slice(cv.value, v, (0, idx, 0, 0))
    valid = jnp.arange(self.max_length) <= idx
    if spec.module is gaussian_lib.GaussianAttention:
      out = gaussian_lib.gaussian_attention(
          q, ck.value, cv.value, mask=jnp.broadcast_to(valid, (b, self.max_length)))
    else:
      # softmax(q.k / sqrt(d) + b_{j-t}) over the cached keys j <= t (Vaswani et al. eq. 1; Luo eq. 6).
      logits = jnp.einsum('blhd,bshd->bhls', q.astype(jnp.float32), ck.value.astype(jnp.float32))
      logits = logits / math.sqrt(d)
      if position_bias is not None:
        j = jnp.arange(self.max_length)
        logits = logits + position_bias[:, j - idx + self.max_length - 1][None, :, None, :]
      logits = jnp.where(valid, logits, jnp.finfo(jnp.float32).min)
      w = jax.nn.softmax(logits, axis=-1)
      out = jnp.einsum('bhls,bshd->blhd', w, cv.value.astype(jnp.float32)).astype(v.dtype)
    index.value = idx + 1
    return out


STATE_MIXERS = ('mlp', 'identity', 'none')


class ShortConv(nn.Module):
  """Causal depthwise convolution along the length: ``y_t = b + sum_{j<K} w_j * u_{t-K+1+j}`` per channel
  (zeros before the start). Zoology's ``ShortConvolution`` (``zoology/mixers/convolution.py`` at
  d88d6f5, lines 32-62: ``nn.Conv1d(groups=d_model, padding=K-1)`` truncated to the first L outputs),
  with PyTorch's default ``Conv1d`` initialisation, U(-1/sqrt(K), 1/sqrt(K)) for weights and bias
  (Zoology's ``_init_weights`` re-initialises only Linear and Embedding layers).

  ``decode=True``: one token per call; the previous ``K - 1`` inputs are carried in the ``cache``
  collection (``conv_inputs [B, K-1, D]``), so the step equals the full convolution.
  """

  kernel_size: int
  decode: bool = False

  @nn.compact
  def __call__(self, u):
    k, d = self.kernel_size, u.shape[-1]
    bound = 1.0 / math.sqrt(k)
    init = lambda key, shape: jax.random.uniform(key, shape, jnp.float32, -bound, bound)
    w = self.param('kernel', init, (k, d))
    b = self.param('bias', init, (d,))
    if self.decode:
      if u.shape[1] != 1:
        raise ValueError(f'decode=True takes one token per call, got {u.shape[1]}')
      prev = self.variable('cache', 'conv_inputs', jnp.zeros, (u.shape[0], k - 1, d), u.dtype)
      window = jnp.concatenate([prev.value, u], axis=1)                 # [B, K, D]
      prev.value = window[:, 1:]
      return (jnp.einsum('bkd,kd->bd', window, w.astype(u.dtype)) + b.astype(u.dtype))[:, None]
    length = u.shape[1]
    padded = jnp.pad(u, ((0, 0), (k - 1, 0), (0, 0)))
    out = sum(padded[:, j:j + length] * w[j].astype(u.dtype) for j in range(k))
    return out + b.astype(u.dtype)


class BaseConv(nn.Module):
  """Zoology's BaseConv mixer with a short kernel: ``y = ShortConv(u) * (u W + c) + u``
  (``zoology/mixers/base_conv.py`` at d88d6f5, lines 50-63, ``use_act=False``; its Linear initialised
  N(0, 0.02) with zero bias by Zoology's ``_init_weights``, ``zoology/model.py`` lines 144-147)."""

  kernel_size: int
  decode: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, u):
    conv = ShortConv(self.kernel_size, decode=self.decode, name='conv')(u)
    proj = nn.Dense(u.shape[-1], dtype=self.dtype, name='projection',
                    kernel_init=nn.initializers.normal(stddev=0.02))(u)
    return conv * proj + u


class DecoderBlock(nn.Module):
  """Pre-LN block as ``layers.EncoderBlock``, with causal self-attention and a decode step.

  ``mixer='base_conv'`` replaces the attention by Zoology's ``BaseConv`` (``short_conv`` taps).
  ``state_mixer``: ``'mlp'`` (the usual ``x + MLP(LN(x))``); ``'identity'``: Zoology's
  ``TransformerBlock`` with ``state_mixer=torch.nn.Identity`` (``zoology/model.py`` at d88d6f5, lines
  205-215: the second branch is ``norm2``'s output itself, so the block adds ``LN(x)``); ``'none'``:
  no second branch.
  """

  num_heads: int
  qkv_dim: int
  mlp_dim: int
  attention: Mapping[str, Any]
  max_length: int
  dropout_rate: float = 0.0
  decode: bool = False
  dtype: Any = jnp.float32
  mixer: str = 'attention'        # 'attention' | 'base_conv'
  short_conv: int = 3
  state_mixer: str = 'mlp'

  @nn.compact
  def __call__(self, x, *, mask=None, step=None, deterministic=True, position_bias=None):
    if self.mixer == 'base_conv':
      conv = BaseConv(self.short_conv, decode=self.decode, dtype=self.dtype, name='base_conv')
      mix = conv
    else:
      attention = CausalSelfAttention(self.num_heads, self.qkv_dim, self.attention, self.max_length,
                                      decode=self.decode, dtype=self.dtype, name='attention')
      mix = lambda y: attention(y, mask=mask, step=step, deterministic=deterministic,
                                position_bias=position_bias)
    if self.state_mixer == 'mlp':
      return pre_ln_residuals(x, mix, self.mlp_dim, self.dropout_rate, self.dtype, deterministic)
    if self.state_mixer not in STATE_MIXERS:
      raise ValueError(f"state_mixer must be one of {', '.join(STATE_MIXERS)}, got {self.state_mixer!r}")
    y = nn.LayerNorm(dtype=self.dtype)(x)
    x = x + nn.Dropout(self.dropout_rate)(mix(y), deterministic=deterministic)
    if self.state_mixer == 'none':
      return x
    y = nn.LayerNorm(dtype=self.dtype)(x)
    return x + nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)


def sinusoid_at(positions: Array, dim: int, max_scale: float = 10000.0) -> Array:
  """Vaswani et al. §3.5 sinusoids at integer ``positions`` ``[...]`` -> ``[..., dim]``, computed (no
  table), so a decode step's program does not grow with the maximal length. Equals
  ``encoder.sinusoidal_positions`` row by row."""
  div = jnp.exp(jnp.arange(0, dim, 2, dtype=jnp.float32) * -(math.log(max_scale) / dim))
  ang = jnp.asarray(positions, jnp.float32)[..., None] * div
  out = jnp.stack([jnp.sin(ang), jnp.cos(ang)], axis=-1).reshape(*ang.shape[:-1], -1)
  return out[..., :dim]


class Decoder(ModelConfig):
  """Decoder-only LM: ``inputs [B, L]`` (or a batch dict with ``inputs``) -> logits ``[B, L, vocab]``.

  A batch dict that also holds ``inputs_query_positions int32[B, Q]`` (Zoology's MQAR with
  ``data.query_targets``) gets logits ``[B, Q, vocab]`` at those positions only. The fields it shares
  with the encoder are ``layers.ModelConfig``'s (here without dropout by default).
  """

  dropout_rate: float = 0.0
  tie_embeddings: bool = run_config.Model.tie_embeddings
  decode: bool = False
  # Zoology's model options (docs/recall.md): short_conv > 0 makes the even-numbered blocks (0, 2, ...)
  # BaseConv layers with that many taps and the odd ones attention, as Zoology's
  # Hybrid(configs=[BaseConv, mixer]) picks configs[layer_idx % 2] (zoology/mixers/hybrid.py at
  # d88d6f5, line 26); state_mixer as DecoderBlock.
  short_conv: int = run_config.Model.short_conv
  state_mixer: str = run_config.Model.state_mixer
  pad_id: Optional[int] = 0          # masked as a key; None: no token is padding (Zoology's MQAR)

  @nn.compact
  def __call__(self, inputs, *, train: bool = False, step=None):
    query_positions = None
    if isinstance(inputs, Mapping):
      query_positions = inputs.get(QUERY_POSITIONS_KEY)
      inputs = inputs['inputs']
    if query_positions is not None and self.decode:
      raise ValueError(f'{QUERY_POSITIONS_KEY} applies to the full forward, not to decode=True')
    attention = dict(self.attention)
    check_causal(attention['kind'])
    deterministic = not train
    length = inputs.shape[1]
    if length > self.max_length:
      raise ValueError(f'inputs of length {length} exceed max_length {self.max_length}')
    embed = nn.Embed(self.vocab_size, self.emb_dim, name='embed',
                     embedding_init=nn.initializers.normal(stddev=self.emb_dim ** -0.5))
    # Scaled by sqrt(emb) (Vaswani et al. §3.4): unit-scale inputs with a tied, small-init output.
    x = embed(inputs) * math.sqrt(self.emb_dim)
    if self.decode:
      index = self.variable('cache', 'position', lambda: jnp.zeros((), jnp.int32))
      positions = index.value + jnp.arange(length)
      index.value = index.value + length
      mask = None
    else:
      positions = jnp.arange(length)
      mask = None if self.pad_id is None else inputs != self.pad_id
    if self.pos_encoding == 'sinusoidal':
      x = x + sinusoid_at(positions, self.emb_dim)[None]
    elif self.pos_encoding == 'learned':
      table = self.param('pos_embedding', nn.initializers.normal(stddev=0.02),
                         (self.max_length, self.emb_dim), jnp.float32)
      x = x + jnp.take(table, positions, axis=0)[None]
    elif self.pos_encoding != 'none':
      raise ValueError(f"pos_encoding must be 'sinusoidal', 'learned' or 'none', "
                       f'got {self.pos_encoding!r}')
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic).astype(self.dtype)
    bias = None
    if position_bias_wanted(attention):
      bias = RelativePositionBias(self.num_heads, name='position_bias')(self.max_length)
    for i in range(self.num_layers):
      mixer = 'base_conv' if self.short_conv > 0 and i % 2 == 0 else 'attention'
      x = DecoderBlock(self.num_heads, self.qkv_dim, self.mlp_dim, attention, self.max_length,
                       dropout_rate=self.dropout_rate, decode=self.decode, dtype=self.dtype,
                       mixer=mixer, short_conv=self.short_conv, state_mixer=self.state_mixer,
                       name=f'block_{i}')(x, mask=mask, step=step, deterministic=deterministic,
                                          position_bias=bias)
    if query_positions is not None:
      # Logits only where a target is asked: gather those rows before the final norm (per position)
      # and the V-wide projection. Same loss as full logits masked to the queries.
      x = jnp.take_along_axis(x, jnp.asarray(query_positions, jnp.int32)[..., None], axis=1)
    x = nn.LayerNorm(dtype=self.dtype, name='final_norm')(x).astype(jnp.float32)
    if self.tie_embeddings:
      return embed.attend(x)
    return nn.Dense(self.vocab_size, name='lm_head')(x)


def next_token_loss(logits: Array, targets: Array) -> tuple[Array, Array, Array]:
  """Per-token cross-entropy, correctness and weights; weight 0 where ``targets == 0`` (padding or, in
  recall tasks, positions that are not queries). Each ``[B, L]`` float32."""
  weights = (targets != 0).astype(jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
  correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
  return losses * weights, correct * weights, weights


def init_cache(model: Decoder, batch_size: int) -> dict:
  """An all-zero ``cache`` collection for ``model.clone(decode=True)`` (shapes only; no compute)."""
  dec = model.clone(decode=True)
  shapes = jax.eval_shape(
      lambda: dec.init({'params': jax.random.key(0), 'features': jax.random.key(0)},
                       jnp.ones((batch_size, 1), jnp.int32)))['cache']
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def decode_step(model: Decoder, params, cache, tokens, *, features_key) -> tuple[Array, dict]:
  """Logits of the next token after ``tokens [B, 1]`` and the updated cache."""
  logits, new = model.clone(decode=True).apply(
      {'params': params, 'cache': cache}, tokens, rngs={'features': features_key},
      mutable=['cache'])
  return logits[:, 0], new['cache']


def _feed(model: Decoder, params, tokens, features_key):
  """The cache after ``tokens [B, L]``, fed one decode step at a time (lax.scan), and each step's
  logits ``[L, B, V]``."""
  def body(c, tok):
    logits, c = decode_step(model, params, c, tok[:, None], features_key=features_key)
    return c, logits

  return jax.lax.scan(body, init_cache(model, tokens.shape[0]), jnp.swapaxes(tokens, 0, 1))


def teacher_forced_logits(model: Decoder, params, tokens, *, features_key) -> Array:
  """Step-by-step logits ``[B, L, V]`` for given ``tokens [B, L]`` (lax.scan over decode steps)."""
  return jnp.swapaxes(_feed(model, params, tokens, features_key)[1], 0, 1)


def generate(model: Decoder, params, prompt, num_tokens: int, *, features_key) -> Array:
  """Greedy continuation: ``prompt [B, P]`` -> ``[B, num_tokens]`` new tokens, one step per token."""
  cache, logits = _feed(model, params, prompt, features_key)
  first = jnp.argmax(logits[-1], -1).astype(prompt.dtype)

  def body(carry, _):
    c, tok = carry
    lg, c = decode_step(model, params, c, tok[:, None], features_key=features_key)
    nxt = jnp.argmax(lg, -1).astype(tok.dtype)
    return (c, nxt), tok

  _, out = jax.lax.scan(body, (cache, first), None, length=num_tokens)
  return jnp.swapaxes(out, 0, 1)


def build_decoder(m: run_config.Model, info) -> Decoder:
  """The Decoder of the model record and a language-model ``TaskInfo`` (the trainer's entry point)."""
  check_causal(m.attention.spec.name)
  return Decoder(**ModelConfig.of(m, info), tie_embeddings=m.tie_embeddings, short_conv=m.short_conv,
                 state_mixer=m.state_mixer, pad_id=getattr(info, 'pad_id', 0))
