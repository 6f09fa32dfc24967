"""Flax building blocks: multi-head attention around any registered mechanism, and the encoder block.

``MultiHeadAttention`` owns the query/key/value/output projections and hands ``[B, L, H, D]`` tensors to the
mechanism named by ``attention['kind']`` (kernelformer.registry). It never special-cases a mechanism: the
mechanism's own options come from the same attention mapping.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from kernelformer import registry
from kernelformer import run_config

Array = Any


# ``config.model.dtype`` -> the activations' dtype (encoder and decoder). 'float16' is torch AMP as
# Skyformer trains (src/main.py 212, src/models/model_LRA.py 53 @ 1a677cb): the encoder's and head's
# Linears in float16, the residual stream, LayerNorm's statistics, the final LayerNorm and the
# attention core in float32 (attention.py 128-132 runs it under ``autocast(enabled=False)`` on
# ``Q.float()``...), the loss in float32 (``steps.cross_entropy``).
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}

# ``config.model.param_init``: how the encoder's parameters are initialised (``dense_init``, ``embed_init``).
INITS = ('lra', 'skyformer')


def check_init(init: str) -> str:
  if init not in INITS:
    raise ValueError(f"model.param_init must be one of {', '.join(map(repr, INITS))}, got {init!r}")
  return init


def dense_init(init: str, fan_in: int, *, attention: bool = False) -> dict[str, Any]:
  """``kernel_init`` and ``bias_init`` of a dense layer with ``fan_in`` inputs under ``model.param_init``.

  * ``'lra'``: flax's layers as LRA builds them -- the attention's q/k/v/output projections
    ``xavier_uniform`` (long-range-arena ``models/transformer/transformer.py`` 64-73 @ b4f9fed, flax
    ``nn.SelfAttention``'s default), every other Dense flax's ``lecun_normal``; biases zero.
  * ``'skyformer'``: every ``torch.nn.Linear`` of Skyformer's model (pkuzengqi/Skyformer
    ``src/models/attention.py`` 109-117, ``model_transformer.py`` 58-63, ``model_LRA.py`` 29-33 @
    cfe8c8c) keeps torch's ``reset_parameters``: weight ``kaiming_uniform_(a=sqrt(5))``, i.e.
    ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, and the bias ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``.
  """
  if check_init(init) == 'skyformer':
    bound = float(fan_in) ** -0.5

    def uniform(key, shape, dtype=jnp.float32):
      return jax.random.uniform(key, shape, dtype, -bound, bound)
    return dict(kernel_init=uniform, bias_init=uniform)
  kernel = nn.initializers.xavier_uniform() if attention else nn.initializers.lecun_normal()
  return dict(kernel_init=kernel, bias_init=nn.initializers.zeros)


def embed_init(init: str):
  """The token embedding's initialiser under ``model.param_init``: ``'lra'`` N(0, 1) (flax ``nn.Embed`` with
  ``normal(stddev=1.0)``, LRA ``models/layers/common_layers.py`` ``Embed``); ``'skyformer'`` N(0, 0.02)
  (Skyformer ``src/models/model_transformer.py`` 19, ``torch.nn.init.normal_(..., std=0.02)``). The
  learned position table is N(0, 0.02) under both (LRA ``AddPositionEmbs``; Skyformer line 22)."""
  return nn.initializers.normal(stddev=0.02 if check_init(init) == 'skyformer' else 1.0)


def attention_options(attention: Mapping[str, Any]) -> dict[str, Any]:
  """The attention mapping without unset (None) options, which fall back to the mechanism's own
  default, so one config serves every kind."""
  return {k: v for k, v in dict(attention).items() if v is not None}


def qkv_projections(x, num_heads: int, qkv_dim: int, dtype, use_bias: bool = True,
                    param_init: str = 'lra') -> tuple[Array, Array, Array]:
  """``q, k, v [B, L, H, qkv_dim / H]`` from ``x``: submodules 'query', 'key', 'value' of the calling module.

  Called inside a compact ``__call__`` (the encoder's and the decoder's attention share it).
  ``use_bias=False`` gives the three projections no bias parameter; ``param_init`` per ``dense_init``.
  """
  if qkv_dim % num_heads:
    raise ValueError(f'qkv_dim={qkv_dim} is not divisible by num_heads={num_heads}')
  dense = lambda name: nn.DenseGeneral(
      (num_heads, qkv_dim // num_heads), dtype=dtype, name=name, use_bias=use_bias,
      **dense_init(param_init, x.shape[-1], attention=True))
  return dense('query')(x), dense('key')(x), dense('value')(x)


class MultiHeadAttention(nn.Module):
  """Projections + a registered attention mechanism."""

  num_heads: int
  qkv_dim: int                        # total width of q/k/v over all heads
  attention: Mapping[str, Any]        # config.model.attention as a dict (must contain 'kind')
  causal: bool = False
  dtype: Any = jnp.float32            # compute dtype; parameters stay float32
  # Whether the query/key/value and output projections have biases (config.model.qkv_bias). LRA's
  # attention has none: flax nn.SelfAttention(..., bias=False), "whether pointwise QKVO dense
  # transforms use bias" (long-range-arena lra_benchmarks/models/transformer/transformer.py 71 @
  # b4f9fed), so the output projection goes with the three.
  use_bias: bool = True
  param_init: str = 'lra'             # config.model.param_init (``dense_init``)

  @nn.compact
  def __call__(self, x, *, mask=None, step=None, deterministic=True, position_bias=None):
    q, k, v = qkv_projections(x, self.num_heads, self.qkv_dim, self.dtype, self.use_bias,
                              self.param_init)
    if self.dtype == jnp.float16:   # torch AMP: the attention core in float32 (DTYPES)
      q, k, v = (t.astype(jnp.float32) for t in (q, k, v))
    mechanism = registry.build(attention_options(self.attention))
    extra = {} if position_bias is None else {'position_bias': position_bias}
    out = mechanism(q, k, v, mask=mask, causal=self.causal, step=step,
                    deterministic=deterministic, **extra)
    return nn.DenseGeneral(x.shape[-1], axis=(-2, -1), dtype=self.dtype, name='out',
                           use_bias=self.use_bias,
                           **dense_init(self.param_init, out.shape[-2] * out.shape[-1], attention=True))(out)


@dataclasses.dataclass(frozen=True)
class LayerDefaults:
  """What differs between a flax-built and a torch-built Transformer besides the architecture
  (``config.model.param_init``, ``layer_norm_eps``, ``gelu_approximate``). The defaults are flax's, as LRA
  builds its model: ``nn.LayerNorm`` epsilon 1e-6 and ``nn.gelu``'s tanh form; Skyformer's torch model
  has ``nn.LayerNorm`` epsilon 1e-5 and ``nn.GELU()``'s exact erf form."""

  param_init: str = run_config.Model.param_init
  layer_norm_eps: float = run_config.Model.layer_norm_eps
  gelu_approximate: bool = run_config.Model.gelu_approximate


def position_bias_wanted(attention: Mapping[str, Any]) -> bool:
  """Whether a model makes a relative-position bias for ``attention`` (rpe set, or a kind that needs
  one); that the kind takes one is checked once, by ``run_config.attention_of``."""
  return bool(attention.get('rpe')) or registry.get(attention['kind']).requires_position_bias


class MlpBlock(nn.Module):
  mlp_dim: int
  dropout_rate: float = 0.1
  dtype: Any = jnp.float32
  defaults: LayerDefaults = LayerDefaults()

  @nn.compact
  def __call__(self, x, *, deterministic=True):
    d = self.defaults
    y = nn.Dense(self.mlp_dim, dtype=self.dtype, **dense_init(d.param_init, x.shape[-1]))(x)
    y = nn.gelu(y, approximate=d.gelu_approximate)
    y = nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    return nn.Dense(x.shape[-1], dtype=self.dtype, **dense_init(d.param_init, self.mlp_dim))(y)


def pre_ln_residuals(x, attend, mlp_dim: int, dropout_rate: float, dtype, deterministic: bool,
                     defaults: LayerDefaults = LayerDefaults()):
  """The pre-LayerNorm block body: ``x + Drop(attend(LN(x)))``, then ``x + Drop(MLP(LN(x)))``.

  Called inside a compact ``__call__`` (encoder and decoder blocks share it); its LayerNorms and
  MlpBlock become submodules of the caller with the names they always had.
  """
  y = nn.LayerNorm(epsilon=defaults.layer_norm_eps, dtype=dtype)(x)
  x = x + nn.Dropout(dropout_rate)(attend(y), deterministic=deterministic)
  y = nn.LayerNorm(epsilon=defaults.layer_norm_eps, dtype=dtype)(x)
  y = MlpBlock(mlp_dim, dropout_rate, dtype=dtype, defaults=defaults)(y, deterministic=deterministic)
  return x + nn.Dropout(dropout_rate)(y, deterministic=deterministic)


class EncoderBlock(nn.Module):
  """Pre-LayerNorm Transformer block: x + Attn(LN(x)), then x + MLP(LN(x))."""

  num_heads: int
  qkv_dim: int
  mlp_dim: int
  attention: Mapping[str, Any]
  dropout_rate: float = 0.1
  causal: bool = False
  per_layer_position_bias: bool = False   # Luo et al. share b across layers; True gives each layer its own
  max_length: Optional[int] = None
  dtype: Any = jnp.float32
  qkv_bias: bool = True                   # biases of the attention projections (MultiHeadAttention.use_bias)
  defaults: LayerDefaults = LayerDefaults()  # initialisers, LayerNorm epsilon, GELU form

  @nn.compact
  def __call__(self, x, mask=None, step=None, deterministic=True, position_bias=None):
    # Positional arguments allowed (not keyword-only) for nn.remat's static_argnums (``deterministic``
    # is argument 4, counting self) and for nn.scan (see ``LayerStep``).
    if self.per_layer_position_bias:
      position_bias = RelativePositionBias(self.num_heads, name='position_bias')(x.shape[1])
    attention = MultiHeadAttention(self.num_heads, self.qkv_dim, self.attention, causal=self.causal,
                                   dtype=self.dtype, use_bias=self.qkv_bias,
                                   param_init=self.defaults.param_init, name='attention')
    return pre_ln_residuals(
        x, lambda y: attention(y, mask=mask, step=step, deterministic=deterministic,
                               position_bias=position_bias),
        self.mlp_dim, self.dropout_rate, self.dtype, deterministic, self.defaults)


# ``config.model.remat``: 'none', 'block' (nn.remat around each block: only its input is kept for the
# backward) or a named jax.checkpoint_policies policy (what inside the block may be kept).
REMAT_POLICIES = ('dots_saveable', 'nothing_saveable', 'everything_saveable',
                  'dots_with_no_batch_dims_saveable', 'checkpoint_dots',
                  'checkpoint_dots_with_no_batch_dims')
REMAT_CHOICES = ('none', 'block') + REMAT_POLICIES


def remat_block(remat: str, *, in_scan: bool = False):
  """``EncoderBlock`` wrapped per ``remat`` (see REMAT_CHOICES); the class itself for 'none'.

  The wrapped class has the same parameters under the same names (lifted transforms keep the module
  tree), so a remat model restores a plain model's checkpoint and vice versa. ``deterministic`` is
  static (it selects dropout). Under nn.scan ``prevent_cse`` is off: the scan already keeps XLA from
  merging the recomputation into the forward, and the CSE barrier would only cost speed.
  """
  if remat == 'none':
    return EncoderBlock
  if remat not in REMAT_CHOICES:
    raise ValueError(f"model.remat must be one of {', '.join(map(repr, REMAT_CHOICES))}, "
                     f'got {remat!r}')
  policy = None if remat == 'block' else getattr(jax.checkpoint_policies, remat)
  return nn.remat(EncoderBlock, policy=policy, prevent_cse=not in_scan, static_argnums=(4,))


class LayerStep(nn.Module):
  """One layer as an ``nn.scan`` body: ``(x, mask, step, position_bias) -> (block(x), None)``.

  ``block`` holds the ``EncoderBlock`` fields; the block is the child 'block', under ``remat``.
  """

  block: Mapping[str, Any]
  remat: str = 'none'
  deterministic: bool = True

  @nn.compact
  def __call__(self, x, mask, step, position_bias):
    cls = remat_block(self.remat, in_scan=True)
    return cls(**self.block, name='block')(x, mask, step, self.deterministic, position_bias), None


def scanned_layers(num_layers: int, remat: str, deterministic: bool, block: Mapping[str, Any],
                   name: str = 'layers') -> nn.Module:
  """``num_layers`` identical blocks as one ``nn.scan``: parameters stacked on a leading layer axis.

  Every collection a block writes is scanned too (``variable_axes`` 0): 'params', the 'features'
  collection of cached random-feature draws (``random_features._cached_projection``) and sown
  'intermediates'. ``split_rngs`` gives each layer its own 'params', 'dropout' and 'features' key, so
  layers are initialized, dropped out and feature-sampled independently (as the unrolled blocks are,
  where ``make_rng`` folds in the distinct module paths ``block_i``).
  """
  scan = nn.scan(LayerStep,
                 variable_axes={'params': 0, 'features': 0, 'intermediates': 0},
                 split_rngs={'params': True, 'dropout': True, 'features': True},
                 in_axes=(nn.broadcast, nn.broadcast, nn.broadcast), length=num_layers)
  return scan(block=block, remat=remat, deterministic=deterministic, name=name)


class RelativePositionBias(nn.Module):
  """Learnable b_{j-i}, one per head and offset (Luo et al. 2021, §3.3): ``[H, 2L - 1]``.

  Index ``j - i + L - 1`` holds the bias for key j and query i. Initialized to zero, so training starts
  from the position-free kernel.
  """

  num_heads: int

  @nn.compact
  def __call__(self, length: int):
    return self.param('bias', nn.initializers.zeros, (self.num_heads, 2 * length - 1), jnp.float32)


class ModelConfig(nn.Module):
  """The record of the fields the encoder and the decoder share: ``encoder.Encoder`` and
  ``decoder.Decoder`` subclass it and add their own. ``of(config.model, info)`` reads them from a
  record (``run_config.Model``) and a task's ``TaskInfo`` -- where a model's ``dtype`` is checked."""

  vocab_size: int
  emb_dim: int
  num_layers: int
  num_heads: int
  qkv_dim: int
  mlp_dim: int
  attention: Mapping[str, Any]
  max_length: int
  dropout_rate: float = 0.1
  pos_encoding: str = 'sinusoidal'     # 'sinusoidal' | 'learned' | 'none' (RPE carries positions)
  dtype: Any = jnp.float32             # of the activations (``DTYPES``); parameters stay float32

  @classmethod
  def names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name not in ('parent', 'name'))

  @staticmethod
  def of(m: run_config.Model, info: Any) -> dict[str, Any]:
    """The shared fields (``names()``) of the model record for a task of ``info.vocab_size`` tokens
    and ``info.max_length`` positions; the attention mapping as a fresh dict."""
    if m.dtype not in DTYPES:
      raise ValueError(f"model.dtype must be one of {', '.join(DTYPES)}, got {m.dtype!r}")
    return dict(vocab_size=info.vocab_size, emb_dim=m.emb_dim, num_layers=m.num_layers,
                num_heads=m.num_heads, qkv_dim=m.qkv_dim, mlp_dim=m.mlp_dim,
                attention=dict(m.attention.options),
                max_length=info.max_length, dropout_rate=m.dropout_rate,
                pos_encoding=m.pos_encoding, dtype=DTYPES[m.dtype])
