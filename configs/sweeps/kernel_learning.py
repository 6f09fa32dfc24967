""""On Learning the Transformer Kernel" (Chowdhury et al. 2022) table 2: six learnable kernels and baselines.

Kernels GMM-RKS, FastFood-RKS, Generative-RKS, GMM-PRF, FastFood-PRF, Generative-PRF with the number of
samples M of the paper's table 5 for each kernel and task, and the baselines of its table 2 that this
repository implements: the Softmax Transformer, LinearElu, Performer and Linformer. Each task config's
``kernel_learning`` preset holds the paper's table 4 hyperparameters (LRA's model sizes, sqrt decay,
10k/20k/5k steps, 200 epochs for Image).

The baseline numbers of table 2 are LRA's own runs ("Accuracy scores for all baseline models are due to
Tay et al. (2021b)"), so the Performer row runs LRA's Performer, not FAVOR+ as the Performer paper
defines it (``posrf-orf``; kept for the papers that ran it, Skyformer's and Spectraformer's):

* Text, Retrieval, Image: ``performer-relu-det`` -- LRA's ``<task>/configs/performer_base.py`` keep every
  default of ``make_fast_generalized_attention`` (google-research/long-range-arena
  ``lra_benchmarks/models/performer/performer.py`` line 31: ``_DEFAULT_ATTENTION_FN_CLS = 'generalized'``;
  ``performer_attention.py`` lines 262-309 @ cd31e5c: ``features_type='deterministic'`` (no W),
  ``kernel_fn=relu``, ``kernel_epsilon=0.001``, ``normalize_data=False``): relu(x) + 1e-3;
* ListOps: ``performer-lra-listops`` -- ``listops/configs/performer_base.py`` @ 093bfc6 selects
  ``attention_fn_cls="softmax"`` with ``nb_features=2, ortho_scaling=0.0`` (positive softmax features,
  2 orthogonal rows with Gaussian-row norms, redrawn every call).

Both are one report row, ``performer (LRA)``. Seeds: the paper does not state how many runs its numbers
average; its baseline rows are copied from LRA, which reports single runs. We run three seeds and report
mean +- std.

Size: 10 kinds x 4 tasks x 3 seeds = 120 runs.
"""
from __future__ import annotations

KIND_KEY = 'model.attention.kind'
TASKS = ('listops', 'text', 'retrieval', 'image')
SEEDS = (0, 1, 2)
# Table 5: number of random samples M per kernel and task (ListOps, Text, Retrieval, Image).
NUM_SAMPLES = {
    'gmm-rks': (256, 128, 64, 128),
    'fastfood-rks': (64, 64, 32, 8),
    'generative-rks': (256, 256, 128, 128),
    'gmm-prf': (256, 256, 128, 128),
    'fastfood-prf': (64, 64, 32, 8),
    'generative-prf': (128, 128, 64, 8),
}
# LRA's Performer per task (see the module docstring), one report row.
LRA_PERFORMER = {'listops': 'performer-lra-listops', 'text': 'performer-relu-det',
                 'retrieval': 'performer-relu-det', 'image': 'performer-relu-det'}
LRA_PERFORMER_LABEL = 'performer (LRA)'
BASELINES = ('softmax', 'linear-elu', LRA_PERFORMER_LABEL, 'linformer')


def get_sweep() -> dict:
  points = []
  for t, task in enumerate(TASKS):
    for row in (*NUM_SAMPLES, *BASELINES):
      kind = LRA_PERFORMER[task] if row == LRA_PERFORMER_LABEL else row
      m = {'model.attention.num_features': NUM_SAMPLES[kind][t]} if kind in NUM_SAMPLES else {}
      points += [dict(config=f'configs/{task}.py', preset='kernel_learning', label=row,
                      overrides={KIND_KEY: kind, 'seed': seed, **m}) for seed in SEEDS]
  return dict(name='kernel_learning', points=points, paper='kernel_learning',
              description='On Learning the Transformer Kernel, table 2 (M from table 5), 3 seeds; '
                          "the Performer row is LRA's Performer")
