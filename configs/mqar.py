"""MQAR, multi-query associative recall (Arora et al. 2023, "Zoology"), with a causal decoder.

Command:
  python scripts/train.py --config configs/mqar.py:cpu --workdir runs/mqar_cpu

Presets (``--config configs/mqar.py:<preset>``):
  zoology       Zoology's figure-2 setting at its smallest panel (length 64, 4 pairs, d_model 64), as
                ``zoology/experiments/paper_configs/iclr24_zoology_figure2/configs.py`` (HazyResearch/
                zoology d88d6f5; the same values at 66f4918, ``zoology/experiments/paper/figure2.py``,
                and the layer count fixed to 2 for every mixer by fcc6af7): task ``mqar`` (Zoology's
                generator, vocabulary 8,192, power-law gaps a = 0.01, no random fillers), 100,000
                training and 3,000 test examples, batch 512, 64 epochs (12,544 steps at 196 batches per
                epoch), AdamW (PyTorch defaults b = (0.9, 0.999), eps 1e-8) lr 1e-3 (the sweep takes
                logspace(-4, -2, 4)) with weight decay 0.1 (``zoology/config.py`` TrainConfig) and a
                cosine decay to 0 over the run (CosineAnnealingLR per epoch, no warm-up,
                ``zoology/train.py`` lines 185-192). Model (``iclr24_zoology_figure2/configs.py`` lines
                55-61, 138-146): 2 layers of softmax attention, 1 head, attention dropout 0.1, learned
                positions (``max_position_embeddings=input_seq_len`` for attention), no MLP
                (``state_mixer=torch.nn.Identity``: ``model.state_mixer='identity'``), output tied to
                the embedding. For the other mixers Zoology uses ``short_conv=3`` (see ``cpu``).
                Validation (every epoch, 3,000 examples) above 0.99 accuracy ends the run
                (``early_stop_accuracy``; ``zoology/config.py`` 132-133, ``train.py`` 197-205).
                The panel at this budget: configs/sweeps/zoology_fig2_full.py (not run here yet).
  cpu           the same task and model at CPU scale (docs/recall.md): batch 64, 10,000 training
                examples, 500 test, the step count of configs/sweeps/zoology_fig2.py.
  legacy_quick  this repository's MQAR before it followed Zoology's generator (task ``mqar_legacy``: vocabulary 32, values with
                replacement, each value repeated after its query; 2 layers of 64 dims, 2 heads, 800
                steps at lr 3e-3, softmax; test accuracy 0.9995, docs/causal.md). Kept for the runs
                measured on it (configs/sweeps/recall.py).
  based         Based's figure-3 feature-map study (Arora et al. 2024; HazyResearch/zoology d88d6f5,
                ``zoology/experiments/paper_configs/arxiv24_based_figure3/configs.py``) at CPU scale, for
                configs/sweeps/based_fig3.py: Zoology's task (vocabulary 8,192, lines 10-17), Based's
                model layout (2 layers: a BaseConv layer with a kernel-3 short convolution, then the
                linear-attention layer, 1 head, no positions, no MLP; lines 45-57, 98-123), weight decay
                0.1, cosine decay, lr 10^-1.5 (the top of Based's grid ``np.logspace(-3, -1.5, 4)``, line
                131). Training examples as the source (100,000 at length 64; the sweep sets 20,000 at 128
                and 256, lines 15-17) but 600 steps x batch 32 (19,200 examples: every one fresh), not 32
                epochs at batch 256; 1,000 test examples per setting (lines 22-28), 200 for validation.
                **Random fillers** (``data.random_non_queries=True``): Based's configs leave
                ``MQARConfig.random_non_queries`` at its default, True (``zoology/data/multiquery_ar.py``
                line 12; applied at lines 135-137: every 0 of the inputs becomes a uniform id in [0, V));
                Zoology's figure-2 configs set it False (``zoology`` and ``cpu`` presets).
  tiny          seconds; the smoke tests: Zoology's task and model options (BaseConv + attention,
                identity state mixer, no positions) at vocabulary 16, length 16, 2 pairs.
Data is generated on the fly from ``data.seed`` (nothing on disk). ``data.task='selective_copy'`` runs
the selective-copy task with the same fields (``num_pairs`` = tokens to copy).
Pick the kernel with ``--config.model.attention.kind`` (causal kinds only: see docs/causal.md).

Where our model differs from Zoology's (docs/recall.md, "Where our model still differs from
Zoology's"): token embeddings are N(0, 1/d) scaled by sqrt(d) (Zoology: N(0, 0.02^2), unscaled), other
layers keep this repository's initialisation, Zoology's embedding dropout 0.1 is not applied
(``model.dropout_rate`` is both the embedding and the residual dropout; Zoology's residual dropout is
0), and the cosine schedule decays per step (Zoology: per epoch). Not a difference: weight decay 0.1
on every parameter (``optim.decay_mask='all'``, set by ``zoology_optim`` for the zoology, cpu and
based presets), as Zoology's torch AdamW over ``model.parameters()`` (``zoology/train.py`` 185-189 @
d88d6f5).
"""
from __future__ import annotations

from kernelformer.configs import common

PRESETS = ('zoology', 'cpu', 'based', 'legacy_quick', 'tiny')
ZOOLOGY_VOCAB = 8192      # iclr24_zoology_figure2/configs.py line 11
# Based figure 3's learning rates, np.logspace(-3, -1.5, 4) (arxiv24_based_figure3/configs.py line 131);
# the ``based`` preset takes the largest (the one that learns fastest in a CPU-sized run).
BASED_LEARNING_RATES = (1e-3, 10 ** -2.5, 1e-2, 10 ** -1.5)
BASED_LR = BASED_LEARNING_RATES[-1]


def recall_data(c, *, vocab_size: int, num_pairs: int, length: int, num_train: int,
                num_eval: int, task: str = 'mqar') -> None:
  c.data.task = task
  c.data.max_length = length        # tokens per sequence
  c.data.vocab_size = vocab_size    # mqar: keys [1, V/2), values [V/2, V), filler 0
  c.data.num_pairs = num_pairs      # key-value pairs per sequence (all of them are queried)
  c.data.seed = 0                   # example i of a split = f(seed, split, i)
  c.data.num_train = num_train      # generated on access, so this only sets the epoch length
  c.data.num_val = num_eval
  c.data.num_test = num_eval
  if task == 'mqar':
    c.data.power_a = 0.01           # Zoology's power-law gap exponent (MQARConfig.power_a)
    c.data.random_non_queries = False   # Zoology's figure-2 configs: fillers stay 0
    c.data.query_targets = True     # targets only at the queries: logits computed only there


def zoology_model(c, *, dim: int, short_conv: int = 0) -> None:
  """Zoology's TransformerBlock LM: 2 layers, 1 head, no MLP, tied output (see the module docstring).
  ``short_conv`` > 0: BaseConv layers (that many taps) alternate with the mixer and there are no
  positions, as Zoology's non-attention mixers (Hybrid([BaseConv(kernel_size=3), mixer])); 0: learned
  positions, as its attention runs."""
  c.model.emb_dim = dim
  c.model.qkv_dim = dim
  c.model.mlp_dim = dim             # unused: state_mixer='identity'
  c.model.num_heads = 1
  c.model.num_layers = 2
  c.model.state_mixer = 'identity'
  c.model.short_conv = short_conv
  c.model.pos_encoding = 'none' if short_conv else 'learned'
  c.model.dropout_rate = 0.0
  c.model.attention.attention_dropout = 0.1


def zoology_optim(c, *, learning_rate: float, num_train_steps: int, batch_size: int) -> None:
  c.optim.learning_rate = learning_rate
  c.optim.schedule = 'cosine'
  c.optim.warmup_steps = 0
  c.optim.weight_decay = 0.1
  # Zoology's optimizer is torch AdamW over model.parameters(): every parameter is decayed (biases,
  # LayerNorm and embeddings too), i.e. optim.decay_mask='all'.
  c.optim.decay_mask = 'all'
  c.optim.b1, c.optim.b2, c.optim.eps = 0.9, 0.999, 1e-8
  c.batch_size = batch_size
  c.num_train_steps = num_train_steps


def get_config(preset: str = 'cpu'):
  c = common.base_config()
  c.model.tie_embeddings = True     # decoder: output projection = embedding transpose
  c.model.attention.kind = 'softmax'
  c.model.attention.attention_dropout = 0.0
  c.model.dropout_rate = 0.0
  c.model.state_mixer = 'mlp'
  c.model.short_conv = 0
  # > 0: validation accuracy above this ends the run (at an evaluation; the trainer's stopping rule).
  c.early_stop_accuracy = 0.0
  if preset == 'zoology':
    recall_data(c, vocab_size=ZOOLOGY_VOCAB, num_pairs=4, length=64, num_train=100_000,
                num_eval=3_000)
    zoology_model(c, dim=64)
    zoology_optim(c, learning_rate=1e-3, num_train_steps=64 * 196, batch_size=512)
    c.eval_every = 196               # Zoology evaluates every epoch
    c.checkpoint_every = 196 * 8
    # zoology/config.py 132-133 (early_stopping_metric 'valid/accuracy', threshold 0.99) and
    # zoology/train.py 197-205 (after each epoch's evaluation, accuracy > 0.99 ends the run), d88d6f5.
    c.early_stop_accuracy = 0.99
  elif preset == 'cpu':
    recall_data(c, vocab_size=ZOOLOGY_VOCAB, num_pairs=4, length=64, num_train=10_000, num_eval=500)
    zoology_model(c, dim=64)
    zoology_optim(c, learning_rate=1e-3, num_train_steps=600, batch_size=64)
    c.eval_every = 300
    c.checkpoint_every = 300
    c.log_every = 100
  elif preset == 'based':
    recall_data(c, vocab_size=ZOOLOGY_VOCAB, num_pairs=4, length=64, num_train=100_000,
                num_eval=1_000)
    c.data.num_val = 200
    zoology_model(c, dim=64, short_conv=3)
    c.model.attention.attention_dropout = 0.0   # Based's mixer: dropout = nn.Identity (based.py line 101)
    zoology_optim(c, learning_rate=BASED_LR, num_train_steps=600, batch_size=32)
    # Based's figure-3 configs keep MQARConfig's default random_non_queries=True (multiquery_ar.py l. 12).
    c.data.random_non_queries = True
    c.eval_every = 600
    c.checkpoint_every = 600
    c.log_every = 100
  elif preset == 'legacy_quick':
    # Why these sizes: recall needs a two-layer induction circuit (layer 1 copies each key into the
    # position of the value after it, layer 2 matches the query key against those copies), and it forms
    # after a plateau at ~1/num_pairs accuracy (guessing among the context's values). The plateau is
    # what grows with the problem: measured here with softmax, vocabulary 64 / 8 pairs / length 64
    # stayed at 0.20-0.29 for 1500 steps (the earlier preset); vocabulary 32 / 4 pairs / length 32
    # leaves it at ~200 steps and reaches 1.00 by 300, at ~4x fewer FLOPs per step (vocabulary 32 /
    # 12 pairs / length 64 needs ~500 steps). 800 steps leave a margin for other seeds and kernels;
    # the recall sweep raises num_pairs on this preset (configs/sweeps/recall.py).
    recall_data(c, vocab_size=32, num_pairs=4, length=32, num_train=100000, num_eval=512,
                task='mqar_legacy')
    common.quick_setting(c, dim=64, num_layers=2, num_heads=2, learning_rate=3e-3,
                         warmup_steps=100, weight_decay=0.0, batch_size=64, num_train_steps=800,
                         eval_every=200, log_every=100)
    c.model.dropout_rate = 0.0
    # Sinusoids, not learned positions: a learned table starts ~50x smaller than the sqrt(d)-scaled
    # token embeddings, and the previous-token head that recall needs forms far later (measured: 0.20
    # at 700 steps).
    c.model.pos_encoding = 'sinusoidal'
  elif preset == 'tiny':
    recall_data(c, vocab_size=16, num_pairs=2, length=16, num_train=256, num_eval=32)
    common.tiny_setting(c, weight_decay=0.0, warmup_steps=2, num_train_steps=6, eval_every=3,
                        log_every=3)
    c.model.num_layers = 2
    c.model.state_mixer = 'identity'
    c.model.short_conv = 3
    c.model.pos_encoding = 'none'
  else:
    raise ValueError(f"unknown mqar preset {preset!r}; valid: {', '.join(PRESETS)}")
  c.model.attention.num_features = 8 if preset == 'tiny' else 64
  return common.lock(c)
