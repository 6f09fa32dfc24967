"""Retrieval (LRA; AAN citation pairs as bytes): does paper 1 cite paper 2? A dual encoder, 2 classes.

Command (LRA defaults; the release's new_aan_pairs.*.tsv in data/retrieval, see docs/data.md):
  python scripts/train.py --config configs/retrieval.py --workdir runs/retrieval

Presets (``--config configs/retrieval.py:<preset>``); each one's source is in ``SOURCES`` and in the table
of docs/reproduce.md ("Presets"):
  lra            google-research/long-range-arena lra_benchmarks/matching/configs/base_match_config.py as
                 last changed by a2e5057 (2021-03-04, the licence header only; the settings are
                 4954d9f's, 2020-11-04): 4 layers (line 48), 128 dims (46), 4 heads, qkv 128, mlp 512
                 (50), CLS, lr 0.05 'constant * linear_warmup * rsqrt_decay' (39) with 8000 warm-up
                 (40; longer than the 5k steps, as in LRA), weight decay 0.1 (28), batch 32 (23), 5000
                 steps (25), evaluation every 100 steps (24) on the whole validation split, 4000 bytes
                 per document (41); dropout and attention dropout 0.1 (the LRA Transformer's
                 defaults). LRA's dual head on [u, v] (model.retrieval_head = 'lra':
                 models/layers/common_layers.py 236-241 @ b4f9fed, interaction=None), no bias in the
                 attention projections and the test on the final weights (common.lra_setting). The
                 file's settings when LRA's README table (Transformer Retrieval 57.46) was added at
                 211e07d; no run of it here yet. Default.
  kernel_learning  "On Learning the Transformer Kernel" table 4, Retrieval column (the same LRA model:
                 4 heads x 32) with GMM-RKS and its table 5 M = 64 (table 5 Retrieval M: GMM-RKS 64,
                 FASTFOOD-RKS 32, GENERATIVE-RKS 128, GMM-PRF 128, FASTFOOD-PRF 32, GENERATIVE-PRF 64):
                 the setting of its table 2 Retrieval column.
  skyformer      Skyformer's code (pkuzengqi/Skyformer src/config.py 104-154 and src/main.py @ cfe8c8c,
                 common.skyformer_setting): 2 layers, 64 dims, 128 hidden, 2 heads, mean pooling,
                 learned positions, 128 features, [u, v, u*v, u-v] head (src/models/model_LRA.py
                 68-82), batch 16, AdamW (0.9, 0.999) eps 1e-6, gradients clipped to [-1, 1],
                 OneCycleLR to lr 2e-4 with warm-up 800 (linear phases), 50k steps, validation every
                 1000 steps over 300 batches, the best validation after 20 % of the steps tested; the
                 setting of Skyformer table 1 / Spectraformer table 2 (Retrieval).
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
LRA_COMMIT = 'a2e5057545f67ef55bc02360a9afd7418bbd0d39'
SOURCES = {
    'lra': f'LRA repo @ {LRA_COMMIT[:7]}: matching/configs/base_match_config.py lines 23-50 (settings of '
           '4954d9f; eval_frequency 100: line 24); head: models/layers/common_layers.py 236-241 @ b4f9fed; '
           'no attention bias: transformer.py 71 @ b4f9fed; final weights tested: matching/train.py '
           '310-319 @ fd1763a',
    'kernel_learning': 'Learning the Transformer Kernel, tables 4 (Retrieval) and 5 (GMM-RKS M)',
    'skyformer': f'Skyformer code @ {common.SKYFORMER_COMMIT}: src/config.py 104-154 (retrieval), src/main.py',
    'quick': 'kernelformer (2-core CPU, minutes); not a paper setting',
    'tiny': 'kernelformer smoke tests; not a paper setting',
}


def retrieval_data(c):
  c.data.task = 'retrieval'
  c.data.max_length = 4000          # bytes per document (each of the two), LRA and the kernel papers


def get_config(preset: str = 'lra'):
  c = common.base_config()
  retrieval_data(c)
  # LRA matching/configs/base_match_config.py @ a2e5057 (= 4954d9f's settings): 4 x 128, 4 heads, mlp 512, CLS, lr 0.05 rsqrt,
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
    common.lra_setting(c)
    c.model.retrieval_head = 'lra'  # common_layers.py classifier_head_dual, interaction=None
    c.eval_every = 100              # base_match_config.py line 24: eval_frequency = 100
  elif preset == 'kernel_learning':
    # Chowdhury et al., table 4 (Retrieval column); M from table 5.
    c.model.qkv_dim = 128           # 4 heads x 32 (table 4: key/query/value dim 32 per head)
    common.kernel_learning_setting(c, num_features=64)
  elif preset == 'skyformer':
    # Skyformer src/config.py 126-137 (retrieval): batch 16, lr 2e-4, warm-up 800, eval_frequency
    # 1000, num_eval_steps 300.
    common.skyformer_setting(c, batch_size=16, learning_rate=2e-4, warmup_steps=800, eval_every=1000,
                             max_eval_batches=300)
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
