"""Flax Transformer encoders for LRA: a single-input classifier and the Retrieval dual encoder.

Token id 0 is padding everywhere; the key padding mask is ``inputs != 0``. Pooling is masked (CLS token or
mean over real tokens), so padded positions never reach the classifier.

The dual encoder (LRA Retrieval) encodes each document separately with the same weights -- and, for
random-feature and landmark mechanisms, the same features: both documents go through one encoder call
-- and classifies the pair without cross-attention, as LRA requires, with one of two heads
(``retrieval_head``, config.model.retrieval_head):

* ``'lra'``: LRA's ``classifier_head_dual`` with ``interaction=None`` (its Retrieval setting): ``[u, v]``
  -> Dense(mlp_dim) -> ReLU -> Dense(mlp_dim // 2) -> ReLU -> Dense(classes)
  (google-research/long-range-arena lra_benchmarks/models/layers/common_layers.py 236-241 @ b4f9fed,
  the file's last version; matching/configs/base_match_config.py sets no ``interaction``).
* ``'nli'``: ``[u, v, u * v, u - v]`` -> Dense(mlp_dim) -> ReLU -> Dense(classes), the head of
  Skyformer's ``SCHeadDual`` (pkuzengqi/Skyformer src/models/model_LRA.py 68-82 @ cfe8c8c) and of the
  kernel-learning paper's code.
"""
from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from kernelformer import run_config
from kernelformer.layers import (LayerDefaults, ModelConfig, RelativePositionBias, dense_init, embed_init,
                                 position_bias_wanted, remat_block, scanned_layers)

RETRIEVAL_HEADS = ('lra', 'nli')

def sinusoidal_positions(length: int, dim: int, max_scale: float = 10000.0) -> np.ndarray:
  """The sinusoidal table of Vaswani et al. 2017 §3.5, ``[length, dim]``."""
  pos = np.arange(length)[:, None]
  div = np.exp(np.arange(0, dim, 2) * -(np.log(max_scale) / dim))
  table = np.zeros((length, dim), dtype=np.float32)
  table[:, 0::2] = np.sin(pos * div)
  table[:, 1::2] = np.cos(pos * div)[:, :dim // 2]
  return table


class Encoder(ModelConfig):
  """Embeddings + positions + pre-LN blocks + final LayerNorm + masked pooling -> ``[B, emb_dim]``.

  The fields it shares with the decoder are ``layers.ModelConfig``'s."""

  pooling: str = 'cls'                 # 'cls' | 'mean'
  rpe_per_layer: bool = False          # Luo et al. share the bias across layers (False)
  remat: str = run_config.Model.remat  # 'none' | 'block' | a jax.checkpoint_policies name (layers.py)
  scan_layers: bool = run_config.Model.scan_layers   # one nn.scan over the blocks (params stacked)
  qkv_bias: bool = run_config.Model.qkv_bias   # biases of the attention projections
  # Initialisers, LayerNorm epsilon and GELU form (layers.LayerDefaults): flax's as LRA builds its
  # model, or those of Skyformer's torch model (config.model.param_init / layer_norm_eps / gelu_approximate).
  param_init: str = LayerDefaults.param_init
  layer_norm_eps: float = LayerDefaults.layer_norm_eps
  gelu_approximate: bool = LayerDefaults.gelu_approximate

  @nn.compact
  def __call__(self, inputs, *, train: bool = False, step=None):
    deterministic = not train
    mask = inputs != 0
    defaults = LayerDefaults(self.param_init, self.layer_norm_eps, self.gelu_approximate)
    x = nn.Embed(self.vocab_size, self.emb_dim, name='embed',
                 embedding_init=embed_init(self.param_init))(inputs)
    if self.pooling == 'cls':
      # A learned CLS vector in front; it is a real token, so the mask gets one True column.
      cls = self.param('cls', nn.initializers.zeros, (1, 1, self.emb_dim), jnp.float32)
      x = jnp.concatenate([jnp.broadcast_to(cls, (x.shape[0], 1, self.emb_dim)), x], axis=1)
      mask = jnp.concatenate([jnp.ones((mask.shape[0], 1), bool), mask], axis=1)
    elif self.pooling != 'mean':
      raise ValueError(f"pooling must be 'cls' or 'mean', got {self.pooling!r}")
    length = x.shape[1]
    if self.pos_encoding == 'sinusoidal':
      x = x + jnp.asarray(sinusoidal_positions(length, self.emb_dim))[None]
    elif self.pos_encoding == 'learned':
      pos = self.param('pos_embedding', nn.initializers.normal(stddev=0.02),
                       (1, length, self.emb_dim), jnp.float32)
      x = x + pos
    elif self.pos_encoding != 'none':
      raise ValueError(f"pos_encoding must be 'sinusoidal', 'learned' or 'none', "
                       f'got {self.pos_encoding!r}')
    amp = self.dtype == jnp.float16   # torch AMP (layers.DTYPES): float32 residuals and final norm
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic).astype(
        jnp.float32 if amp else self.dtype)
    attention = dict(self.attention)
    shared_bias = None
    per_layer = False
    if position_bias_wanted(attention):
      per_layer = self.rpe_per_layer
      if not per_layer:
        shared_bias = RelativePositionBias(self.num_heads, name='position_bias')(length)
    block = dict(num_heads=self.num_heads, qkv_dim=self.qkv_dim, mlp_dim=self.mlp_dim,
                 attention=attention, dropout_rate=self.dropout_rate,
                 per_layer_position_bias=per_layer, dtype=self.dtype, qkv_bias=self.qkv_bias,
                 defaults=defaults)
    if self.scan_layers:
      # Parameters under 'layers/block/...' with a leading [num_layers] axis; one compiled block.
      x, _ = scanned_layers(self.num_layers, self.remat, deterministic, block)(
          x, mask, step, shared_bias)
    else:
      # Unrolled: parameters under 'block_{i}' whatever ``remat`` (nn.remat keeps the names).
      cls = remat_block(self.remat)
      for i in range(self.num_layers):
        x = cls(**block, name=f'block_{i}')(x, mask, step, deterministic, shared_bias)
    x = nn.LayerNorm(epsilon=self.layer_norm_eps, dtype=jnp.float32 if amp else self.dtype,
                     name='final_norm')(x)
    x = x.astype(jnp.float32)
    if self.pooling == 'cls':
      return x[:, 0]
    w = mask.astype(jnp.float32)[..., None]
    return jnp.sum(x * w, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1.0)


class Classifier(nn.Module):
  """Encoder + MLP head (LRA: Dense(mlp_dim) -> ReLU -> Dense(num_classes); the dual head per
  ``retrieval_head``, see the module docstring)."""

  num_classes: int
  encoder: Mapping[str, Any]     # Encoder fields
  mlp_dim: int
  dual: bool = False             # Retrieval: two documents, encoded separately with shared weights
  retrieval_head: str = run_config.Model.retrieval_head   # the dual head: 'lra' | 'nli' (RETRIEVAL_HEADS)

  @nn.compact
  def __call__(self, batch: Mapping[str, Any], *, train: bool = False, step=None):
    if self.retrieval_head not in RETRIEVAL_HEADS:
      raise ValueError(f"model.retrieval_head must be one of {', '.join(map(repr, RETRIEVAL_HEADS))}, "
                       f'got {self.retrieval_head!r}')
    enc = Encoder(**self.encoder, name='encoder')
    dtype = jnp.float16 if enc.dtype == jnp.float16 else jnp.float32   # torch AMP (layers.DTYPES)
    dense = lambda n, fan_in, name: nn.Dense(n, name=name, dtype=dtype, **dense_init(enc.param_init, fan_in))
    if self.dual:
      # One encoder call over both documents (stacked on the batch axis), so the towers are truly
      # siamese: the same random features, landmarks and redraw for both, which two separate calls
      # would not give (each call takes its own ``make_rng('features')``). Every mechanism treats
      # batch rows independently, so this equals encoding each document alone with those features.
      x1, x2 = batch['inputs1'], batch['inputs2']
      width = max(x1.shape[1], x2.shape[1])
      pad = lambda x: jnp.pad(x, ((0, 0), (0, width - x.shape[1])))  # token 0 is padding
      both = enc(jnp.concatenate([pad(x1), pad(x2)], axis=0), train=train, step=step)
      u, v = both[:x1.shape[0]], both[x1.shape[0]:]
      if self.retrieval_head == 'lra':
        h = jnp.concatenate([u, v], axis=-1)
        h = nn.relu(dense(self.mlp_dim, h.shape[-1], 'head_hidden')(h))
        h = nn.relu(dense(self.mlp_dim // 2, self.mlp_dim, 'head_hidden2')(h))
        return dense(self.num_classes, self.mlp_dim // 2, 'head_out')(h)
      h = jnp.concatenate([u, v, u * v, u - v], axis=-1)
    else:
      h = enc(batch['inputs'], train=train, step=step)
    h = nn.relu(dense(self.mlp_dim, h.shape[-1], 'head_hidden')(h))
    return dense(self.num_classes, self.mlp_dim, 'head_out')(h)


def build_classifier(m: run_config.Model, info: Any) -> Classifier:
  """The classifier of the model record for a classification task's ``TaskInfo``."""
  fields = ModelConfig.of(m, info)   # the fields the encoder shares with the decoder
  attention = fields['attention']
  if 'max_length' in attention and attention['max_length'] is None:
    attention['max_length'] = info.max_length + (1 if m.pooling == 'cls' else 0)
  encoder = dict(fields, pooling=m.pooling, rpe_per_layer=m.rpe_per_layer, remat=m.remat,
                 scan_layers=m.scan_layers, qkv_bias=m.qkv_bias, param_init=m.param_init,
                 layer_norm_eps=m.layer_norm_eps, gelu_approximate=m.gelu_approximate)
  return Classifier(num_classes=info.num_classes, encoder=encoder, mlp_dim=m.mlp_dim, dual=info.dual,
                    retrieval_head=m.retrieval_head)
