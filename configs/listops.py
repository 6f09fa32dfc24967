"""ListOps (LRA; Nangia & Bowman 2018): 10-way classification of nested MAX/MIN/MED/SM expressions.

Command (LRA defaults, the LRA paper's table 1 setting):
  python scripts/train.py --config configs/listops.py --workdir runs/listops

Presets (``--config configs/listops.py:<preset>``); each one's source is in ``SOURCES`` and in the table of
docs/reproduce.md ("Presets"):
  quick          2-core CPU, ~5 min: short expressions (lengths 20-64), small model. README numbers. Not a
                 paper setting.
  tiny           seconds; used by the smoke tests.
  lra            google-research/long-range-arena at commit ad0ff01 (the file's last version we found),
                 lra_benchmarks/listops/configs/base_listops_config.py (transformer_base.py only sets the
                 model type): 6 layers, 8 heads, emb 512, qkv 512, mlp 2048, CLS, lr 0.05
                 'constant * linear_warmup * rsqrt_decay' with 1000 warm-up steps, weight decay 0.1,
                 batch 32, 5000 steps, length 2000; dropout and attention dropout 0.1 (the LRA
                 Transformer's defaults). The LRA paper's ListOps setup states the same model (512
                 dims, 8 heads, 6 layers, FFN 2048, 5K steps), so there is no separate paper preset. Reproduces
                 the LRA paper's table 1 ListOps column. Default.
  kernel_learning  "On Learning the Transformer Kernel" tables 4/5 (10k steps, lr 5e-3, 6 layers, CLS);
                 reproduces its table 2 ListOps column (pick the kernel with --config.model.attention.kind).
  skyformer      Skyformer section 5 "Implementation Details" / Spectraformer table 5 shared setting: 2
                 layers, 64 dims, 128 hidden, 2 heads, mean pooling, 128 features, batch 32, lr 1e-4,
                 warm-up 1000, 50k steps; reproduces Skyformer table 1 / Spectraformer table 2 (ListOps).
Expected runtime: quick ~5 min on 2 CPU cores; lra / kernel_learning hours on one GPU.
The data is generated on first use (seeded) into data_dir/listops, or LRA's released basic_*.tsv are read
from there.
"""
from __future__ import annotations

from configs import common

PRESETS = ('lra', 'kernel_learning', 'skyformer', 'quick', 'tiny')
LRA_COMMIT = 'ad0ff01a5b3492ade621553a1caae383b347e0c1'
SOURCES = {
    'lra': f'LRA repo @ {LRA_COMMIT[:7]}: listops/configs/base_listops_config.py '
           '(= the LRA paper\'s ListOps setup)',
    'kernel_learning': 'Learning the Transformer Kernel, tables 4 (ListOps) and 5 (GMM-RKS M)',
    'skyformer': 'Skyformer section 5 "Implementation Details"; Spectraformer table 5 (warm-up)',
    'quick': 'kernelformer (2-core CPU, minutes); not a paper setting',
    'tiny': 'kernelformer smoke tests; not a paper setting',
}


def listops_data(c):
  c.data.task = 'listops'
  c.data.max_length = 2000          # LRA: lengths are < 2000 so nothing is truncated
  c.data.min_gen_length = 500       # generator keeps 500 < length < 2000 (strict), as the LRA generator
  c.data.max_gen_length = 2000
  c.data.num_train = 96000
  c.data.num_val = 2000
  c.data.num_test = 2000
  c.data.max_depth = 10
  c.data.max_args = 10
  c.data.generator_seed = 0         # the data is a function of this seed and the fields above
  c.data.generate = True            # generate missing files; False expects LRA's released files


def get_config(preset: str = 'lra'):
  c = common.base_config()
  listops_data(c)
  # LRA listops/configs/base_listops_config.py @ ad0ff01: 6 x 512, 8 heads, qkv 512, mlp 2048, CLS,
  # lr 0.05 rsqrt with 1000 warm-up, weight decay 0.1, 5k steps, batch 32 (the model is base_config()'s).
  c.optim.learning_rate = 0.05
  c.optim.weight_decay = 0.1
  c.num_train_steps = 5000
  c.eval_every = 500
  c.checkpoint_every = 500

  if preset == 'lra':
    pass
  elif preset == 'kernel_learning':
    # Chowdhury et al., "On Learning the Transformer Kernel", table 4 (ListOps column); M from table 5.
    c.optim.learning_rate = 5e-3
    c.num_train_steps = 10000
    c.model.qkv_dim = 512           # 8 heads x 64 (table 4: key/query/value dim 64 per head)
    common.kernel_learning_setting(c, num_features=256)
  elif preset == 'skyformer':
    # Skyformer §5 (batch 32, lr 1e-4 for ListOps) / Spectraformer table 5 (warm-up 1000).
    common.skyformer_setting(c, batch_size=32, learning_rate=1e-4, warmup_steps=1000)
  elif preset in ('quick', 'tiny'):
    quick = preset == 'quick'
    c.data.max_length = 64 if quick else 32
    c.data.min_gen_length = 20 if quick else 8
    c.data.max_gen_length = 64 if quick else 32
    c.data.max_depth = 4 if quick else 3
    c.data.max_args = 5 if quick else 3
    c.data.num_train = 20000 if quick else 256
    c.data.num_val = 1000 if quick else 64
    c.data.num_test = 1000 if quick else 64
    if quick:
      common.quick_setting(c, dim=64, num_layers=2, num_heads=4, learning_rate=2e-3, warmup_steps=200,
                           weight_decay=0.01, batch_size=64, num_train_steps=2000, eval_every=500,
                           log_every=100)
    else:
      common.tiny_setting(c, weight_decay=0.01, warmup_steps=5, num_train_steps=12, eval_every=6,
                          log_every=3)
  else:
    raise ValueError(f"unknown listops preset {preset!r}; valid: {', '.join(PRESETS)}")
  return common.lock(c)
