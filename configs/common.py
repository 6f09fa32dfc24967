"""Fields shared by every task config. One field per line, with the reason when it is not obvious.

Task files (``configs/<task>.py``) call ``base_config()`` and set their data fields and presets.
"""
from __future__ import annotations

import dataclasses

import ml_collections
from ml_collections import config_dict


def attention_config(kind: str = 'softmax') -> ml_collections.ConfigDict:
  """``config.model.attention``: the kind plus every option any registered mechanism reads.

  Options are placeholders (None = the mechanism's own default, which carries the paper's value), so
  switching ``kind`` from the command line never needs another field, and a misspelled option fails
  because the config is locked.
  """
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  c = ml_collections.ConfigDict()
  c.kind = kind
  c.rpe = False                         # add Luo et al.'s relative-position bias to any kind that supports it
  options: dict[str, type] = {}
  for spec in registry.specs():
    for f in dataclasses.fields(spec.module):
      if f.name in ('parent', 'name') or f.name in spec.fixed or f.name in options:
        continue
      default = f.default
      if default is dataclasses.MISSING or default is None:
        options[f.name] = str if f.name in ('implementation',) else object
      else:
        options[f.name] = type(default)
  for name in sorted(options):
    t = options[name]
    c[name] = config_dict.placeholder(t if t is not object else str)
  return c


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0                            # a run is a function of its config and this seed

  c.data = ml_collections.ConfigDict()
  c.data.task = ''                      # lra_tasks name
  c.data.data_dir = 'data'              # root of every task's files (see docs/data.md, "Getting the data")
  c.data.max_length = 1000              # tokens per example (per document for Retrieval)

  c.model = ml_collections.ConfigDict()
  c.model.emb_dim = 512
  c.model.num_layers = 6
  c.model.num_heads = 8
  c.model.qkv_dim = 512                 # total over heads: head_dim = qkv_dim / num_heads
  c.model.mlp_dim = 2048
  c.model.dropout_rate = 0.1
  c.model.pos_encoding = 'sinusoidal'   # 'sinusoidal' | 'learned' | 'none' (when RPE carries positions)
  c.model.pooling = 'cls'               # 'cls' (LRA) | 'mean' (Skyformer/Spectraformer setting)
  c.model.rpe_per_layer = False         # Luo et al. share one bias across layers
  c.model.dtype = 'float32'             # compute dtype: 'float32' | 'bfloat16' (parameters stay float32)
  c.model.attention = attention_config('softmax')
  c.model.attention.attention_dropout = 0.1

  c.optim = ml_collections.ConfigDict()
  c.optim.learning_rate = 0.05          # LRA's "constant" factor of the rsqrt schedule
  c.optim.schedule = 'rsqrt'            # 'rsqrt' (LRA linear warm-up + sqrt decay) | 'cosine' | 'linear' | 'constant'
  c.optim.warmup_steps = 1000
  c.optim.weight_decay = 0.1            # AdamW, decoupled
  c.optim.b1 = 0.9
  c.optim.b2 = 0.98                     # kernel-learning paper table 4
  c.optim.eps = 1e-9
  c.optim.grad_clip_norm = 0.0          # 0 = no clipping
  c.optim.grad_accum_steps = 1          # micro-batches per update, for global batches that do not fit

  c.batch_size = 32                     # GLOBAL batch: split over all devices and processes
  c.eval_batch_size = 0                 # 0 = batch_size
  c.num_train_steps = 5000
  c.eval_every = 500                    # validation every N steps; the best checkpoint is kept by its accuracy
  c.max_eval_batches = 0                # 0 = the whole validation split
  c.checkpoint_every = 500              # a crash loses at most this many steps
  c.keep_checkpoints = 2
  c.log_every = 50
  c.progress = True                     # progress bar with steps/s and ETA
  c.profile_steps = 0                   # >0: write a jax.profiler trace of that many steps to workdir/profile
  return c


def lock(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  c.lock()
  return c
