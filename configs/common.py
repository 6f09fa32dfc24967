"""Fields shared by every task config. One field per line, with the reason when it is not obvious.

Task files (``configs/<task>.py``) call ``base_config()`` and set their data fields and presets.
"""
from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from kernelformer import data_location


# Every option a built-in mechanism reads, with its type (tests/configs/test_configs_parse.py checks this
# against the registry). A plugin's mechanism adds its own when registered (kernelformer/plugins.py).
OPTIONS: dict[str, type] = dict(
    attention_dropout=float, chunk_size=int, cos_length=int, covariance=str, distill_weight=float,
    fastfood_variant=str, feature_eps=float, gamma=float, impl=str, implementation=str, linformer_k=int,
    map_dim=int, max_length=str, normalize_qk=bool, num_features=int, num_iterations=int,
    num_landmarks=int, num_mixture_components=int, redraw_every=int, share_heads=bool)


def attention_config(kind: str = 'softmax') -> ml_collections.ConfigDict:
  """``config.model.attention``: the kind plus every option any registered mechanism reads.

  Options are placeholders (None = the mechanism's own default, which carries the paper's value), so
  switching ``kind`` from the command line never needs another field, and a misspelled option fails
  because the config is locked.
  """
  c = ml_collections.ConfigDict()
  c.kind = kind
  c.rpe = False                         # add Luo et al.'s relative-position bias to any kind that supports it
  c.plugin = ''                         # FILE.py or module(s), comma-separated, imported first: kernels from outside the package (docs/extending.md)
  for name in sorted(OPTIONS):
    c[name] = config_dict.placeholder(OPTIONS[name])
  return c


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0                            # a run is a function of its config and this seed

  c.data = ml_collections.ConfigDict()
  c.data.task = ''                      # lra_tasks name
  c.data.data_dir = data_location.default_data_dir()  # $KERNELFORMER_DATA, else ~/.cache/kernelformer/data (docs/data.md)
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
  c.model.dtype = 'float32'             # compute dtype: 'float32' | 'bfloat16' | 'float16' (torch AMP: layers.DTYPES)
  # Training memory at long lengths (docs/benchmarks.md, "Remat and layer scan"): the backward keeps
  # every block's activations unless they are recomputed. 'none' keeps them; 'block' recomputes each
  # block from its input (nn.remat); a jax.checkpoint_policies name ('dots_saveable',
  # 'nothing_saveable', ...; kernelformer/layers.py REMAT_CHOICES) keeps only what it names. On XLA:CPU
  # it lowers memory only together with scan_layers=True (4K Text step: 1,548 -> 501 MiB temp).
  c.model.remat = 'none'
  # One nn.scan over the identical blocks (parameters stacked on a layer axis under 'layers'): one
  # compiled block instead of num_layers, so compile time and program size stop growing with depth.
  # Changes the parameter tree (checkpoints of the other setting do not restore) and the per-layer
  # random-feature keys (split by the scan instead of folded from 'block_i').
  c.model.scan_layers = False
  c.model.qkv_bias = True               # biases on the attention's q/k/v/output projections (LRA: none)
  # The encoder's initialisers, LayerNorm epsilon and GELU form (kernelformer/layers.py dense_init,
  # LayerDefaults): flax's, as LRA builds its model ('lra', 1e-6, tanh GELU), or Skyformer's torch model
  # ('skyformer': torch.nn.Linear's U(+-1/sqrt(fan_in)) weights and biases, N(0, 0.02) embeddings; 1e-5;
  # exact GELU). At init the residual stream of the two differs ~50x in scale (embeddings 1 vs 0.02).
  c.model.param_init = 'lra'
  c.model.layer_norm_eps = 1e-6
  c.model.gelu_approximate = True
  c.model.retrieval_head = 'nli'        # Retrieval's head: 'nli' [u, v, u*v, u-v] -> 2 Dense | 'lra' [u, v] -> 3 Dense (kernelformer/encoder.py)
  c.model.attention = attention_config('softmax')
  c.model.attention.attention_dropout = 0.1

  c.optim = ml_collections.ConfigDict()
  c.optim.learning_rate = 0.05          # LRA's "constant" factor of the rsqrt schedule
  c.optim.schedule = 'rsqrt'            # 'rsqrt' (LRA linear warm-up + sqrt decay) | 'cosine' | 'linear' | 'constant' | 'onecycle-linear' | 'onecycle-cosine' (torch OneCycleLR, Skyformer)
  c.optim.warmup_steps = 1000
  c.optim.weight_decay = 0.1            # AdamW, decoupled
  # Which parameters weight_decay reaches (kernelformer/training/optim.py decay_mask): 'matrices' = weight
  # matrices and embeddings only (no biases, LayerNorm, CLS token, nor a learned sampler's GMM means/
  # factors, FastFood row_len/g/b or generator); 'all' = every parameter, as LRA's flax optim.Adam and the
  # kernel-learning paper's torch AdamW(model.parameters()) do. Each preset sets its source's.
  c.optim.decay_mask = 'matrices'
  c.optim.b1 = 0.9
  c.optim.b2 = 0.98                     # kernel-learning paper table 4
  c.optim.eps = 1e-9
  c.optim.grad_clip_norm = 0.0          # 0 = no clipping
  c.optim.grad_clip_value = 0.0         # clip each gradient element to [-v, v] (optax.clip; torch clip_grad_value_); 0 = none
  c.optim.grad_accum_steps = 1          # micro-batches per update, for global batches that do not fit

  c.batch_size = 32                     # GLOBAL batch: split over all devices and processes
  c.eval_batch_size = 0                 # 0 = batch_size
  c.num_train_steps = 5000
  c.eval_every = 500                    # validation every N steps; the best checkpoint is kept by its accuracy
  c.max_eval_batches = 0                # periodic validation only: cap in batches (0 = whole split); the final test always uses the whole test split
  c.checkpoint_every = 500              # a crash loses at most this many steps
  c.keep_checkpoints = 2
  c.eval = ml_collections.ConfigDict()
  # Which weights the final test measures: 'best' (highest validation accuracy) | 'final' (the last
  # step's, as LRA) | 'best_after:<fraction>' (Skyformer: only validations after that share of the
  # steps are kept). kernelformer/training/selection.py; results.json tested_checkpoint names it.
  c.eval.test_checkpoint = 'best'
  c.log_every = 50
  c.progress = True                     # progress bar with steps/s and ETA
  c.profile_steps = 0                   # >0: write a jax.profiler trace of that many steps to workdir/profile
  # Run safety (README "Resuming, outputs, results"):
  c.on_nonfinite = 'stop'               # non-finite loss/grad norm: 'stop' the run (exit 3) | 'skip' the update (not applied, on the device)
  c.watchdog_step_s = 1800.0            # no train step / eval batch finishes within this: exit 4 naming the step (0 = off)
  c.watchdog_compile_s = 7200.0         # the same limit while compiling (0 = off)
  c.allow_config_change = False         # continue a workdir started with another config (recorded in results.json)
  c.reevaluate = False                  # re-test a finished run (else re-running it changes nothing)
  # Runs trained as one program, each its overrides of population.FIELDS in --workdir/<member name>
  # (docs/runs.md, "Populations"), e.g. --config.population="({'seed': 0}, {'seed': 1})".
  c.population = ()
  c.start_over = False                  # no checkpoint restores (all damaged): train from step 0 anyway, moving best/ aside
  return c


def lock(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  c.lock()
  return c


SKYFORMER_COMMIT = 'cfe8c8c'   # pkuzengqi/Skyformer: src/main.py and src/config.py's only version (HEAD 1a677cb)


def lra_setting(c: ml_collections.ConfigDict) -> None:
  """What every LRA-repository preset shares beyond its config file (google-research/long-range-arena).

  * No bias in the attention projections: ``nn.SelfAttention(..., bias=False)``
    (lra_benchmarks/models/transformer/transformer.py 71 @ b4f9fed; the Performer's, performer.py 99).
  * The test measures the final weights, not a best-validation checkpoint: each task's ``train.py``
    evaluates the test split with the model it ends training with (listops/train.py 207-211, 249-254
    and text_classification/train.py 204-206, 248-253 @ fd1763a; image/train.py 391-400 @ b4f9fed;
    matching/train.py 310-319 @ fd1763a tests at every evaluation).
  """
  c.model.qkv_bias = False
  c.eval.test_checkpoint = 'final'


def skyformer_setting(c: ml_collections.ConfigDict, *, batch_size: int, learning_rate: float,
                      warmup_steps: int, eval_every: int, max_eval_batches: int) -> None:
  """The ``skyformer`` preset: Skyformer's code (pkuzengqi/Skyformer src/main.py, src/config.py @ cfe8c8c).

  The model of the paper's section 5 "Implementation Details" and of src/config.py (e.g. ListOps
  lines 13-28): 2 layers, embedding and transformer dim 64, hidden 128, 2 heads of 32, dropout and
  attention dropout 0.1, mean pooling, learned positions (``learn_pos_emb``), biased q/k/v projections
  (torch nn.Linear, src/models/attention.py 109-111); 128 features for every method, so both
  ``num_features`` (random-feature kinds) and ``num_landmarks`` (Skyformer, Nystromformer) are 128.

  Training, src/main.py:
  * AdamW betas (0.9, 0.999), eps 1e-6, the task's weight decay (0 for every task) (286-290);
  * gradients clipped element-wise to [-1, 1] (``clip_grad_value_``, 84): ``optim.grad_clip_value``;
  * ``OneCycleLR(max_lr=lr, pct_start=warmup / num_train_steps, anneal_strategy=lr_decay,
    total_steps=num_train_steps)`` (292-298) with torch's defaults (div_factor 25, final_div_factor
    1e4, cycle_momentum between 0.85 and 0.95; ``optim.b1`` = 0.95 is beta1 at step 0).
    ``lr_decay`` is "linear" for every task in src/config.py, so both phases are linear
    ('onecycle-linear'; torch's own default would be cosine);
  * validation every ``eval_frequency`` steps over ``num_eval_steps`` batches of the training batch
    (149-151): ``eval_every`` / ``max_eval_batches``;
  * the best validation checkpoint is saved only after 20 % of the steps (155-160):
    ``eval.test_checkpoint = 'best_after:0.2'``;
  * 50k steps (src/config.py ``num_train_steps``).

  Not reproduced, each a difference from Skyformer's run: its validation batches continue through an
  endless reshuffled dev set from one evaluation to the next (src/models/dataset_LRA.py 24-45), ours
  are the same first batches each time; its test drops the last partial batch (main.py 281); it
  trains under torch AMP (main.py 212; ``--config.model.dtype=float16`` emulates it with torch's loss
  scale, optim.loss_scaled; not set here: instability's float32 protocol starts from this preset); its mean
  pooling averages padded positions too (src/models/model_LRA.py 12), ours only real tokens.

  Args:
    c: the task config, changed in place.
    batch_size: the task's ``batch_size`` in src/config.py.
    learning_rate: the task's ``learning_rate`` (OneCycleLR's max_lr).
    warmup_steps: the task's ``warmup`` (OneCycleLR's first phase: pct_start * total steps).
    eval_every: the task's ``eval_frequency``.
    max_eval_batches: the task's ``num_eval_steps``.
  """
  c.model.emb_dim = 64
  c.model.qkv_dim = 64
  c.model.mlp_dim = 128
  c.model.num_heads = 2
  c.model.num_layers = 2
  c.model.dropout_rate = 0.1
  c.model.attention.attention_dropout = 0.1
  c.model.pooling = 'mean'
  c.model.pos_encoding = 'learned'
  c.model.qkv_bias = True
  # torch's layers as Skyformer builds them: nn.Linear's default init (src/models/attention.py 109-117,
  # model_transformer.py 58-63, model_LRA.py 29-33), embeddings N(0, 0.02) (model_transformer.py 19, 22),
  # nn.LayerNorm's eps 1e-5 (51, 56, 86), nn.GELU()'s exact form (60).
  c.model.param_init = 'skyformer'
  c.model.layer_norm_eps = 1e-5
  c.model.gelu_approximate = False
  c.model.retrieval_head = 'nli'    # SCHeadDual: [X_0, X_1, X_0 * X_1, X_0 - X_1] (model_LRA.py 68-82)
  c.model.attention.kind = 'skyformer'
  c.model.attention.num_features = 128
  c.model.attention.num_landmarks = 128
  c.optim.learning_rate = learning_rate
  c.optim.schedule = 'onecycle-linear'
  c.optim.warmup_steps = warmup_steps
  c.optim.b1, c.optim.b2, c.optim.eps = 0.95, 0.999, 1e-6
  c.optim.grad_clip_value = 1.0
  c.optim.weight_decay = 0.0
  c.optim.decay_mask = 'all'        # torch AdamW(model.parameters()); no decay here anyway
  c.batch_size = batch_size
  c.num_train_steps = 50000
  c.eval_every = eval_every
  c.max_eval_batches = max_eval_batches
  c.eval.test_checkpoint = 'best_after:0.2'
  c.checkpoint_every = 1000


def kernel_learning_setting(c: ml_collections.ConfigDict, *, num_features: int) -> None:
  """The ``kernel_learning`` preset's kernel: GMM-RKS with the task's M.

  Chowdhury et al., "On Learning the Transformer Kernel": GMM-RKS is the kernel the presets default to
  (any of the paper's six is picked with ``--config.model.attention.kind``); its table 5 lists the
  number of random samples M per kernel and task, and ``num_features`` is the GMM-RKS entry of the
  task's column (the task config quotes the whole column). The model sizes are the task's (table 4)
  and stay in the task config.

  Args:
    c: the task config, changed in place.
    num_features: M, the number of random features (table 5, GMM-RKS row).
  """
  c.model.attention.kind = 'gmm-rks'
  c.model.attention.num_features = num_features
  # The paper's code decays every parameter, the learned samplers' included: torch
  # optim.AdamW(model.parameters(), ..., weight_decay=1e-1) in cs1160701/OnLearningTheKernel
  # {listops,text,retrieval}/train.py (listops lines 173-179 @ a8e3d3b).
  c.optim.decay_mask = 'all'


def _cpu_setting(c: ml_collections.ConfigDict, *, dim: int, num_heads: int, num_layers: int,
                 dropout_rate: float, learning_rate: float, warmup_steps: int, weight_decay: float,
                 batch_size: int, num_train_steps: int, eval_every: int, checkpoint_every: int,
                 log_every: int, max_eval_batches: int) -> None:
  """The model and schedule of the CPU presets; ``quick_setting`` and ``tiny_setting`` pick the values."""
  c.model.emb_dim = dim
  c.model.qkv_dim = dim
  c.model.mlp_dim = 2 * dim
  c.model.num_heads = num_heads
  c.model.num_layers = num_layers
  c.model.pooling = 'mean'
  c.model.dropout_rate = dropout_rate
  c.model.attention.attention_dropout = 0.0
  c.optim.schedule = 'cosine'
  c.optim.learning_rate = learning_rate
  c.optim.warmup_steps = warmup_steps
  c.optim.weight_decay = weight_decay
  c.optim.decay_mask = 'matrices'   # kernelformer's own setting (the README's measured runs)
  c.batch_size = batch_size
  c.num_train_steps = num_train_steps
  c.eval_every = eval_every
  c.max_eval_batches = max_eval_batches
  c.checkpoint_every = checkpoint_every
  c.log_every = log_every


def quick_setting(c: ml_collections.ConfigDict, *, dim: int, num_layers: int, warmup_steps: int,
                  weight_decay: float, batch_size: int, num_train_steps: int, num_heads: int = 2,
                  learning_rate: float = 1e-3, eval_every: int = 250, log_every: int = 50,
                  max_eval_batches: int = 0) -> None:
  """The ``quick`` preset (minutes on a 2-core CPU; the README's measured runs). Not a paper setting.

  A small model (emb = qkv = ``dim``, mlp 2 x ``dim``, mean pooling, dropout 0.1, no attention dropout)
  under a cosine schedule, checkpointing every 500 steps; the sizes and step counts are the task's.

  Args:
    c: the task config, changed in place.
    dim: embedding and qkv width (mlp is twice it).
    num_layers: encoder layers.
    warmup_steps: warm-up steps of the cosine schedule.
    weight_decay: AdamW decoupled weight decay.
    batch_size: global batch.
    num_train_steps: training steps.
    num_heads: attention heads.
    learning_rate: peak learning rate.
    eval_every: validation frequency in steps.
    log_every: logging frequency in steps.
    max_eval_batches: validation batches per evaluation (0 = the whole split).
  """
  _cpu_setting(c, dim=dim, num_heads=num_heads, num_layers=num_layers, dropout_rate=0.1,
               learning_rate=learning_rate, warmup_steps=warmup_steps, weight_decay=weight_decay,
               batch_size=batch_size, num_train_steps=num_train_steps, eval_every=eval_every,
               checkpoint_every=500, log_every=log_every, max_eval_batches=max_eval_batches)


def tiny_setting(c: ml_collections.ConfigDict, *, weight_decay: float, warmup_steps: int = 1,
                 num_train_steps: int = 4, eval_every: int = 2, log_every: int = 2) -> None:
  """The ``tiny`` preset of the smoke tests (seconds): 1 layer of 16 dims, 2 heads, batch 8, no dropout.

  Evaluation and checkpoints come every ``eval_every`` steps so that a few steps exercise both (and a
  resume). Not a paper setting.

  Args:
    c: the task config, changed in place.
    weight_decay: AdamW decoupled weight decay (the task's ``quick`` value).
    warmup_steps: warm-up steps of the cosine schedule.
    num_train_steps: training steps.
    eval_every: validation and checkpoint frequency in steps.
    log_every: logging frequency in steps.
  """
  _cpu_setting(c, dim=16, num_heads=2, num_layers=1, dropout_rate=0.0, learning_rate=2e-3,
               warmup_steps=warmup_steps, weight_decay=weight_decay, batch_size=8,
               num_train_steps=num_train_steps, eval_every=eval_every, checkpoint_every=eval_every,
               log_every=log_every, max_eval_batches=0)
