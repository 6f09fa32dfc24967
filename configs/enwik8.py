"""Byte-level enwik8 language modelling with a causal decoder; reports bits per byte.

Data (once): python scripts/prepare_data.py --task enwik8 --data_dir data   (downloads enwik8.zip,
  http://mattmahoney.net/dc/enwik8.zip, 36 MB; extracts the 10^8-byte file; writes MANIFEST.json)
Command:
  python scripts/train.py --config configs/enwik8.py:quick --workdir runs/enwik8_quick

Presets (``--config configs/enwik8.py:<preset>``):
  luo    Luo et al. 2021 ("Stable, Fast and Accurate: Kernelized Attention with Relative Positional
         Encoding"), §4.2 and appendix A.2, their language-model setting: 6 decoder layers, 8 heads,
         hidden 512, feed-forward 2048, sequence length 512, dropout 0.1, weight decay 0.01, batch 64,
         feature map dimension 64, Adam (0.9, 0.98) eps 1e-6, peak learning rate 2e-3, 150k steps,
         6k warm-up then inverse square root, NPRF with RPE; tested on disjoint 512-byte windows
         (data.eval_context = 'disjoint'): "the sequence length is set to 512 during both training
         and evaluation. All models are trained without access to the context from previous
         mini-batches" (§4.2). NB Luo et al. run it on WikiText-103 (word level, their table 2),
         not on enwik8: these are their sizes applied to bytes, so no number of theirs is
         reproduced by this preset.
  quick  a 2-core CPU in minutes: 2 layers of 64 dims, 128-byte context (a sanity run, not a result).
  tiny   seconds; the smoke tests (with data.num_bytes of a small fixture file).
The test metric is ``test_bits_per_byte`` in results.json: mean next-byte cross-entropy / ln 2 over the
test split, every byte but the first scored once, with the context scheme ``data.eval_context``
(recorded in results.json with ``eval_stride``; kernelformer/training/lm_eval.py):
  'sliding' (quick, tiny)  windows at stride data.eval_stride (0 = max_length // 2) scoring their last
                       stride bytes: every byte sees >= max_length - stride bytes of context;
  'disjoint' (luo)     non-overlapping windows, a byte sees 0..max_length-1 bytes (half on average);
  'stateful'           causal linear kernels without RPE: the windows in order with the decoder's
                       recurrent state carried across them (every byte sees the whole preceding test
                       text); refused in one line for softmax, gaussian and nprf-rpe.
Periodic validation uses non-overlapping windows (it only selects the checkpoint).
"""
from __future__ import annotations

from kernelformer.configs import common

PRESETS = ('luo', 'quick', 'tiny')


def get_config(preset: str = 'luo'):
  c = common.base_config()
  c.data.task = 'enwik8'
  c.data.max_length = 512           # bytes of context per example (Luo et al.: 512)
  c.data.num_bytes = 10 ** 8        # first 10^8 bytes: 90M / 5M / 5M train / val / test
  c.data.eval_context = 'sliding'   # test context scheme: 'disjoint' | 'sliding' | 'stateful'
  c.data.eval_stride = 0            # sliding stride S (0 = max_length // 2): >= L - S bytes of context
  c.model.tie_embeddings = True
  c.model.pos_encoding = 'none'     # NPRF-RPE carries positions (Luo et al. eq. 6)
  c.model.attention.kind = 'nprf-rpe'
  c.model.attention.num_features = 64
  c.model.attention.attention_dropout = 0.1
  if preset == 'luo':
    c.data.eval_context = 'disjoint'   # Luo et al. §4.2: 512 tokens in evaluation, no earlier context
    c.model.num_layers = 6
    c.model.num_heads = 8
    c.model.emb_dim = 512
    c.model.qkv_dim = 512
    c.model.mlp_dim = 2048
    c.model.dropout_rate = 0.1
    c.optim.weight_decay = 0.01
    c.optim.b1, c.optim.b2, c.optim.eps = 0.9, 0.98, 1e-6
    c.optim.schedule = 'rsqrt'
    c.optim.warmup_steps = 6000
    c.optim.learning_rate = 2e-3 * 6000 ** 0.5   # rsqrt peaks at lr / sqrt(warmup) = 2e-3
    c.batch_size = 64
    c.num_train_steps = 150000
    c.eval_every = 5000
    c.max_eval_batches = 100
    c.checkpoint_every = 5000
  elif preset == 'quick':
    c.data.max_length = 128
    common.quick_setting(c, dim=64, num_layers=2, num_heads=2, learning_rate=2e-3,
                         warmup_steps=100, weight_decay=0.01, batch_size=32, num_train_steps=1000,
                         eval_every=500, log_every=100, max_eval_batches=50)
    c.model.attention.num_features = 32
  elif preset == 'tiny':
    c.data.max_length = 32
    c.data.num_bytes = 20000
    common.tiny_setting(c, weight_decay=0.01, warmup_steps=2, num_train_steps=6, eval_every=3,
                        log_every=3)
    c.model.attention.num_features = 8
    c.max_eval_batches = 4
  else:
    raise ValueError(f"unknown enwik8 preset {preset!r}; valid: {', '.join(PRESETS)}")
  return common.lock(c)
