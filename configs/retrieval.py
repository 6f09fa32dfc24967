"""Retrieval (LRA; AAN citation pairs as bytes): does paper 1 cite paper 2? A dual encoder, 2 classes.

Command (LRA defaults; the release's new_aan_pairs.*.tsv in data/retrieval, see docs/data.md):
  python scripts/train.py --config configs/retrieval.py --workdir runs/retrieval

Presets (``--config configs/retrieval.py:<preset>``); each one's source is in ``SOURCES`` and in the table
of docs/reproduce.md ("Presets"):
  lra            google-research/long-range-arena at commit 4954d9f (the file's last version we found),
                 lra_benchmarks/matching/configs/base_match_config.py: 4 layers, 128 dims, 4 heads, qkv
                 128, mlp 512, CLS, lr 0.05 'constant * linear_warmup * rsqrt_decay' with 8000 warm-up
                 (longer than the 5k steps, as in LRA), weight decay 0.1, batch 32, 5000 steps, 4000 bytes
                 per document; dropout and attention dropout 0.1 (the LRA Transformer's defaults).
                 Reproduces the LRA paper's table 1 Retrieval column. Default.
  kernel_learning  "On Learning the Transformer Kernel" table 4, Retrieval column (the same LRA model:
                 4 heads x 32) with GMM-RKS and its table 5 M = 64 (table 5 Retrieval M: GMM-RKS 64,
                 FASTFOOD-RKS 32, GENERATIVE-RKS 128, GMM-PRF 128, FASTFOOD-PRF 32, GENERATIVE-PRF 64);
                 reproduces its table 2 Retrieval column.
  skyformer      Skyformer section 5 "Implementation Details" / Spectraformer table 5 shared setting: 2
                 layers, 64 dims, 128 hidden, 2 heads, mean pooling, learned positions, 128 features,
                 batch 16, lr 2e-4 linear decay with 800 warm-up steps, no weight decay, 50k steps, eval
                 every 1000; reproduces Skyformer table 1 / Spectraformer table 2 (Retrieval).
  quick          2-core CPU, ~10 min: 256 bytes per document, 2 x 64-dim layers, batch 16, 1500 steps
                 (~0.37 CPU-s per step measured). Needs the release files (reading the 147k training
                 pairs takes ~30 s). Not a paper setting.
  tiny           seconds; used by the smoke tests on lra_tasks.fixtures.write_retrieval_fixture.
Expected runtime: quick ~9 CPU-minutes of steps plus the read (~10 min on 2 cores); lra /
kernel_learning / skyformer hours on one GPU (not measured here).
Splits: train = new_aan_pairs.train.tsv, val = .eval.tsv, test = .test.tsv.
"""
from __future__ import annotations

from kernelformer.configs import common

PRESETS = ('lra', 'kernel_learning', 'skyformer', 'quick', 'tiny')
LRA_COMMIT = '4954d9fbf071e154a56e3e651a4e3be55dd2178e'
SOURCES = {
    'lra': f'LRA repo @ {LRA_COMMIT[:7]}: matching/configs/base_match_config.py',
    'kernel_learning': 'Learning the Transformer Kernel, tables 4 (Retrieval) and 5 (GMM-RKS M)',
    'skyformer': 'Skyformer section 5 "Implementation Details"; Spectraformer table 5 (warm-up, eval)',
    'quick': 'kernelformer (2-core CPU, minutes); not a paper setting',
    'tiny': 'kernelformer smoke tests; not a paper setting',
}


def retrieval_data(c):
  c.data.task = 'retrieval'
  c.data.max_length = 4000          # bytes per document (each of the two), LRA and the kernel papers


def get_config(preset: str = 'lra'):
  c = common.base_config()
  retrieval_data(c)
  # LRA matching/configs/base_match_config.py @ 4954d9f: 4 x 128, 4 heads, mlp 512, CLS, lr 0.05 rsqrt,
  # 8000 warm-up, weight decay 0.1, 5k steps, batch 32, 4000 bytes.
  c.model.emb_dim = 128
  c.model.qkv_dim = 128
  c.model.mlp_dim = 512
  c.model.num_heads = 4
  c.model.num_layers = 4
  c.model.pooling = 'cls'
  c.optim.learning_rate = 0.05
  c.optim.schedule = 'rsqrt'
  c.optim.warmup_steps = 8000
  c.optim.weight_decay = 0.1
  # LRA's flax optim.Adam decays every parameter (matching/train.py lines 75-76 @ cd31e5c).
  c.optim.decay_mask = 'all'
  c.batch_size = 32
  c.num_train_steps = 5000
  c.eval_every = 500
  c.checkpoint_every = 500

  if preset == 'lra':
    pass
  elif preset == 'kernel_learning':
    # Chowdhury et al., table 4 (Retrieval column); M from table 5.
    c.model.qkv_dim = 128           # 4 heads x 32 (table 4: key/query/value dim 32 per head)
    common.kernel_learning_setting(c, num_features=64)
  elif preset == 'skyformer':
    # Skyformer §5 (batch 16, lr 2e-4 for Retrieval) / Spectraformer table 5 (warm-up 800, eval 1000).
    common.skyformer_setting(c, batch_size=16, learning_rate=2e-4, warmup_steps=800, eval_every=1000)
  elif preset == 'quick':
    c.data.max_length = 256
    common.quick_setting(c, dim=64, num_layers=2, warmup_steps=100, weight_decay=0.01, batch_size=16,
                         num_train_steps=1500,
                         max_eval_batches=120)  # the eval split has 18k pairs: a fixed 1920 of them
  elif preset == 'tiny':
    c.data.max_length = 48
    common.tiny_setting(c, weight_decay=0.01)
  else:
    raise ValueError(f"unknown retrieval preset {preset!r}; valid: {', '.join(PRESETS)}")
  return common.lock(c)
