"""Pathfinder (LRA; Linsley et al. 2018): are the two dots connected? Pixels as tokens, 2 classes.

Command (LRA "Pathfinder" = 32x32, hard; the release's pathfinder32/ in data/, see docs/data.md):
  python scripts/train.py --config configs/pathfinder.py --workdir runs/pathfinder
Path-X (128x128 = 16384 tokens, hard) is the same task at another resolution; LRA's pathfinder128
config also uses batch 64, gradient clipping 1.0 and a 1 x 32-dim model:
  python scripts/train.py --config configs/pathfinder.py --config.data.resolution=128 \
      --config.batch_size=64 --config.optim.grad_clip_norm=1.0 --workdir runs/pathx

Presets (``--config configs/pathfinder.py:<preset>``); each one's source is in ``SOURCES`` and in the table of
docs/reproduce.md ("Presets"):
  lra            google-research/long-range-arena at HEAD (cd31e5c):
                 lra_benchmarks/image/configs/pathfinder32/transformer_base.py as last changed by commit
                 ee6649e (2021-08-29, "Add the missing config in the public config for transformer on
                 image tasks"): 4 layers (line 24), 4 heads, emb 32, dropout 0.2, qkv 16, mlp 32
                 (lines 25-29), over base_pathfinder32_config.py @ ad0ff01 (its last version): attention
                 dropout 0.1, mean pooling, sinusoidal positions (learn_pos_emb False), lr 1e-3
                 'constant * linear_warmup * cosine_decay' with one epoch (160000 // 512 = 312 steps) of
                 warm-up, no weight decay, batch 512, 200 epochs = 312 x 200 = 62,400 steps, evaluation
                 every epoch. Raw pixels 0..255 with every black pixel -- Pathfinder's background --
                 masked as padding (``inputs > 0``, vocabulary 256: image/input_pipeline.py 186, 205 @
                 ad0ff01, models/transformer/transformer.py 148 @ b4f9fed; data.pixel_padding =
                 'lra'), so attention sees only the lit pixels; no bias in the attention projections
                 and the test on the final weights (common.lra_setting). The repository's current
                 setting; the LRA table's 71.40 was published (211e07d) when the file was
                 lra_pre_ee6649e's. Default.
  lra_pre_ee6649e  The same files before ee6649e (transformer_base.py @ ad0ff01: 1 layer, 4 heads, emb
                 128, qkv 64, mlp 128, dropout 0.2), kept because the LRA maintainers have not said which
                 one is behind the paper: in LRA issue #37 (2021-11-16, after ee6649e) a maintainer
                 writes that the repository's Pathfinder configs are "not synced with the internal
                 config that we have for getting the results in the paper" and gives a 1-layer,
                 128 / 64 / 128 model (8 heads, for the Performer) as the one that gets the reported
                 score, where the 4 x 32 model of the performer config did not converge. (LRA's kernel
                 entries at a2e5057 disagree with each other too: performer_base.py 4 layers / 8 heads /
                 32 / 16 / 32, linear_transformer_base.py 1 layer / 2 heads / 128 / 64 / 128.) The
                 config of the LRA README table's Transformer 71.40 (211e07d); pixels, bias and test
                 checkpoint as lra.
  kernel_learning  The kernel-learning paper did not run Pathfinder (its footnote 1: no model beat
                 chance). This preset is the lra one (4 x 32 since ee6649e; its pixels, bias and test
                 checkpoint included) with that paper's GMM-RKS at M = 128 (its Image value), for
                 running its kernels here; it reproduces no table.
  skyformer      Skyformer's code (pkuzengqi/Skyformer src/config.py 58-103 and src/main.py @ cfe8c8c,
                 common.skyformer_setting): 2 layers, 64 dims, 128 hidden, 2 heads, mean pooling,
                 learned positions, 128 features, raw pixels with black masked as padding (its
                 src/preprocess/create_pathfinder.py 29 keeps the decoded value, src/models/
                 dataset_LRA.py 32 masks ``input_ids != 0``), batch 128, AdamW (0.9, 0.999) eps 1e-6,
                 gradients clipped to [-1, 1], OneCycleLR to lr 2e-4 with warm-up 312 (linear phases),
                 50k steps, validation every 500 steps over 156 batches, the best validation after
                 20 % of the steps tested; the setting of its table 1 Pathfinder column.
  quick          2-core CPU, ~5 min: the easy set (curv_baseline), 1 x 32-dim layer, batch 32, 1000
                 steps, Performer attention (posrf-orf, M = 32; softmax over 1024 tokens costs ~8x more
                 per step on a CPU). Needs the release's pathfinder32/curv_baseline.
  tiny           seconds; used by the smoke tests on lra_tasks.fixtures.write_pathfinder_fixture.
Expected runtime: quick ~6 CPU-minutes of steps plus reading 200k PNGs (~5 min on 2 cores); lra /
lra_pre_ee6649e / skyformer hours on one GPU (not measured here).
Splits: the valid images of the chosen set, permuted with data.split_seed, 80/10/10 (as LRA's sizes).
"""
from __future__ import annotations

from kernelformer.configs import common

PRESETS = ('lra', 'lra_pre_ee6649e', 'kernel_learning', 'skyformer', 'quick', 'tiny')
LRA_COMMIT = 'ee6649e0c5cabab560aa5e21be5b910d78c1b5a8'
LRA_PREVIOUS_COMMIT = 'ad0ff01a5b3492ade621553a1caae383b347e0c1'
SOURCES = {
    'lra': f'LRA repo @ {LRA_COMMIT[:7]}: image/configs/pathfinder32/transformer_base.py lines 24-29 over '
           f'base_pathfinder32_config.py @ {LRA_PREVIOUS_COMMIT[:7]}; raw pixels, inputs > 0 mask: '
           'image/input_pipeline.py 186, 205 @ ad0ff01, transformer.py 148 @ b4f9fed; no attention bias: '
           'transformer.py 71; final weights tested: image/train.py 391-400 @ b4f9fed',
    'lra_pre_ee6649e': f'LRA repo @ {LRA_PREVIOUS_COMMIT[:7]}: pathfinder32/transformer_base.py before '
                       f'{LRA_COMMIT[:7]} (kept: LRA issue #37)',
    'kernel_learning': 'the lra preset with Learning the Transformer Kernel\'s GMM-RKS, M = 128 '
                       '(its table 5 Image value; the paper ran no Pathfinder)',
    'skyformer': f'Skyformer code @ {common.SKYFORMER_COMMIT}: src/config.py 58-103 (pathfinder), src/main.py',
    'quick': 'kernelformer (2-core CPU, minutes); not a paper setting',
    'tiny': 'kernelformer smoke tests; not a paper setting',
}


def pathfinder_data(c):
  c.data.task = 'pathfinder'
  c.data.resolution = 32            # 32 (Pathfinder), 64, 128 (Path-X) or 256: pathfinder{resolution}/
  c.data.difficulty = 'hard'        # 'easy' (curv_baseline), 'intermediate' (..._9), 'hard' (..._14)
  c.data.max_length = 0             # 0 = resolution**2 tokens (the only valid non-zero value)
  c.data.split_seed = 0             # seeds the permutation before the 80/10/10 split
  # 'none': tokens are pixel + 1 (vocabulary 257), nothing masked; 'lra': raw pixels 0..255
  # (vocabulary 256) and ``inputs > 0`` is the padding mask, so the black background is masked.
  c.data.pixel_padding = 'none'


def get_config(preset: str = 'lra'):
  c = common.base_config()
  pathfinder_data(c)
  # LRA pathfinder32/transformer_base.py @ ee6649e over base_pathfinder32_config.py @ ad0ff01: 4 x 32,
  # 4 heads, qkv 16, mlp 32, dropout 0.2 / 0.1, mean, lr 1e-3 cosine, 312 warm-up, 62,400 steps, batch 512.
  c.model.emb_dim = 32
  c.model.qkv_dim = 16
  c.model.mlp_dim = 32
  c.model.num_heads = 4
  c.model.num_layers = 4
  c.model.dropout_rate = 0.2
  c.model.attention.attention_dropout = 0.1
  c.model.pooling = 'mean'
  c.model.pos_encoding = 'sinusoidal'
  c.optim.learning_rate = 1e-3
  c.optim.schedule = 'cosine'
  c.optim.warmup_steps = 312        # one epoch of 160000 / 512
  c.optim.weight_decay = 0.0
  c.optim.decay_mask = 'all'        # LRA's flax optim.Adam (image/train.py lines 71-72); no decay here anyway
  c.batch_size = 512
  c.num_train_steps = (160000 // 512) * 200   # LRA: (TRAIN_EXAMPLES // batch) * 200 epochs = 62,400
  c.eval_every = 312                # every epoch, as LRA
  c.checkpoint_every = 3120

  if preset in ('lra', 'lra_pre_ee6649e', 'kernel_learning'):
    common.lra_setting(c)
    c.data.pixel_padding = 'lra'
  if preset == 'lra':
    pass
  elif preset == 'lra_pre_ee6649e':
    # transformer_base.py @ ad0ff01: num_layers 1, emb_dim 128, qkv_dim = emb_dim // 2,
    # mlp_dim = qkv_dim * 2 (4 heads and dropout 0.2 as after ee6649e).
    c.model.emb_dim = 128
    c.model.qkv_dim = 64
    c.model.mlp_dim = 128
    c.model.num_layers = 1
  elif preset == 'kernel_learning':
    common.kernel_learning_setting(c, num_features=128)   # the paper's Image M (no Pathfinder column)
  elif preset == 'skyformer':
    # Skyformer src/config.py 75-86 (pathfinder): batch 128, lr 2e-4, warm-up 312, eval_frequency 500,
    # num_eval_steps 156.
    common.skyformer_setting(c, batch_size=128, learning_rate=2e-4, warmup_steps=312, eval_every=500,
                             max_eval_batches=156)
    c.data.pixel_padding = 'lra'    # create_pathfinder.py: decoded pixels; dataset_LRA.py: mask != 0
  elif preset == 'quick':
    # Sinusoidal positions (as lra); Performer attention: softmax over 1024 tokens is ~8x slower on a CPU.
    c.data.difficulty = 'easy'
    common.quick_setting(c, dim=32, num_layers=1, warmup_steps=50, weight_decay=0.0, batch_size=32,
                         num_train_steps=1000,
                         max_eval_batches=40)   # 1280 of the 20k validation images
    c.model.attention.kind = 'posrf-orf'
    c.model.attention.num_features = 32
  elif preset == 'tiny':
    c.data.difficulty = 'hard'
    common.tiny_setting(c, weight_decay=0.0)
  else:
    raise ValueError(f"unknown pathfinder preset {preset!r}; valid: {', '.join(PRESETS)}")
  return common.lock(c)
