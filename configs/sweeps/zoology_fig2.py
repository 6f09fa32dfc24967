"""Zoology's figure 2, smallest panel (length 64, 4 key-value pairs), at CPU scale (docs/recall.md).

Zoology (Arora et al. 2023) figure 2: MQAR accuracy against d_model, the best of four learning rates
``np.logspace(-4, -2, 4)`` per point, weight decay 0.1, vocabulary 8,192, 2 layers, 1 head, no MLP
(``zoology/experiments/paper_configs/iclr24_zoology_figure2/configs.py``, HazyResearch/zoology
d88d6f5, lines 11-16, 46-52, 138-151; ``zoology/config.py`` weight_decay 0.1). Here: d_model 64 and
128, and three causal kernels on the ``cpu`` preset of configs/mqar.py (Zoology's task and model):

* ``softmax`` as Zoology's attention rows: 2 attention layers, learned positions, attention dropout 0.1;
* ``linear-elu`` and ``posrf-orf`` (FAVOR+, M = d_model features, redrawn every 100 steps, this
  repository's default) as Zoology's non-attention rows (its ``based`` entry): a BaseConv layer with a
  kernel-3 causal short convolution, then the linear-attention layer, no positions
  (``model.short_conv=3``, ``model.pos_encoding='none'``).

24 runs. The training budget is NOT Zoology's (100,000 examples x 64 epochs at batch 512, ~6.4M
examples): STEPS = 200 steps at batch 32 (6,400 examples, 0.1 % of Zoology's), sized so the panel takes ~25 min
on the shared 2-core CPU (measured before the run: 3.3-3.7 steps/s at batch 64, d_model 64, under load
8-16, plus ~25 s per run for start-up, compilation and evaluation). Test: 500 fresh examples (2,000 queries) per run.

  nice -n 10 kernelformer sweep --sweep zoology_fig2 --sweep_dir runs/sweeps/zoology_fig2
  python -m kernelformer.reproduce.recall_plot runs/sweeps/zoology_fig2 --out docs/recall/zoology_fig2 \
      --best_of optim.learning_rate
"""
from __future__ import annotations

# Zoology's learning rates, d_models, per-kernel layout and run order, shared with the full-budget panel
# (a sweep file's folder is importable while it loads).
from zoology_fig2_full import LR_KEY, panel_points

KINDS = ('softmax', 'linear-elu', 'posrf-orf')
STEPS = 200
BATCH = 32


def get_sweep() -> dict:
  # Learning rates outermost, largest first: a panel cut short still has every (kernel, d_model) at
  # the rates that move fastest in few steps.
  return dict(name='zoology_fig2', points=panel_points('configs/mqar.py', 'cpu', KINDS),
              common=dict(num_train_steps=STEPS, batch_size=BATCH, eval_every=STEPS,
                          checkpoint_every=STEPS, log_every=40, progress=False),
              label_keys=('model.emb_dim', LR_KEY),
              description=f'Zoology figure 2 (L=64, 4 pairs) at CPU scale: {STEPS} steps x batch '
                          f'{BATCH}, lr logspace(-4,-2,4), best per point')
