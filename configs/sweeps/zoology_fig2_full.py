"""Zoology's figure 2, smallest panel (length 64, 4 key-value pairs), at Zoology's budget and stopping rule.

Source: HazyResearch/zoology d88d6f5 ``zoology/experiments/paper_configs/iclr24_zoology_figure2/
configs.py`` (lines 11-16: vocabulary 8,192, (64, 4), batch 512; 35-41: 100,000 training and 3,000
test sequences, power-law gaps a = 0.01; 46-52: d_model 64..512, lr ``np.logspace(-4, -2, 4)``;
138-151: 2 layers, no MLP, 64 epochs) and ``zoology/config.py`` 132-133 / ``zoology/train.py``
197-205 (after each epoch's evaluation, accuracy > 0.99 ends the run). Every point is the ``zoology``
preset of configs/mqar.py unchanged (that budget and rule: 12,544 steps at most, ``early_stop_accuracy
= 0.99`` checked every 196 steps) at d_model 64 and 128, with:

* ``softmax``: Zoology's attention rows (2 attention layers, 1 head, learned positions, dropout 0.1);
* ``linear-elu``, ``posrf-orf`` (FAVOR+, M = d_model) and ``taylor`` (Based's second-order Taylor map
  after a learned projection to 8 dims: figure 2's ``based`` mixer, lines 90-116, ``feature_dim=8``
  line 107): each as Zoology's ``Hybrid([BaseConv(kernel_size=3), mixer])`` layers, i.e. ``model.short_conv=3``,
  no positions.

Figure 2 plots, per (mixer, d_model), the best accuracy over the four learning rates. The points run in
DESCENDING learning rate (outermost), then kind, then d_model: a panel stopped early still has every
(kind, d_model) at the rates already run, and the best over those is a lower bound on the plotted
value (the report says which rates ran). 32 runs; each resumes from its checkpoint when re-run.

Runtime (docs/reproduce.md, "Reproduced"): ~1 h 50 min per run at d_model 64 and ~3 h at 128 on two
idle x86-64 cores without early stopping (a run that reaches 0.99 stops at the end of that epoch), ~70 h
for the panel; minutes per run on a GPU.

  nice -n 10 kernelformer sweep --sweep zoology_fig2_full --sweep_dir runs/sweeps/zoology_fig2_full
  python -m kernelformer.reproduce.recall_plot runs/sweeps/zoology_fig2_full \\
      --out docs/recall/zoology_fig2_full --best_of optim.learning_rate
"""
from __future__ import annotations

import numpy as np

KIND_KEY = 'model.attention.kind'
CONFIG, PRESET = 'configs/mqar.py', 'zoology'
LR_KEY = 'optim.learning_rate'
LEARNING_RATES = tuple(float(x) for x in np.logspace(-4, -2, 4))   # Zoology's sweep
D_MODELS = (64, 128)
KINDS = ('softmax', 'linear-elu', 'posrf-orf', 'taylor')
TAYLOR_FEATURE_DIM = 8            # figure 2's Based mixer: feature_dim=8


def model_overrides(kind: str, d: int) -> dict:
  """The overrides of one (kind, d_model) besides the kind and d_model themselves."""
  m = {'model.qkv_dim': d}
  if kind != 'softmax':
    m.update({'model.short_conv': 3, 'model.pos_encoding': 'none'})
  if kind == 'posrf-orf':
    m['model.attention.num_features'] = d
  if kind == 'taylor':
    m['model.attention.map_dim'] = TAYLOR_FEATURE_DIM
  return m


def panel_points(config: str, preset: str, kinds: tuple[str, ...]) -> list[dict]:
  """The panel's points on ``config``'s ``preset`` in run order: learning rates descending (outermost),
  then ``kinds``, then d_model. configs/sweeps/zoology_fig2.py runs the same points at CPU scale."""
  return [dict(config=config, preset=preset, grid={KIND_KEY: (kind,), 'model.emb_dim': (d,), LR_KEY: (lr,)},
               overrides=model_overrides(kind, d))
          for lr in sorted(LEARNING_RATES, reverse=True) for kind in kinds for d in D_MODELS]


def get_sweep() -> dict:
  return dict(name='zoology_fig2_full', points=panel_points(CONFIG, PRESET, KINDS),
              common=dict(log_every=196, progress=False), label_keys=('model.emb_dim', LR_KEY),
              description='Zoology figure 2 (L=64, 4 pairs) at its budget: 100k sequences, <= 64 '
                          'epochs at batch 512, stop at validation accuracy > 0.99, lr '
                          'logspace(-4,-2,4) descending, best per point')
