""""On Learning the Transformer Kernel" (Chowdhury et al. 2022) table 2: six learnable kernels and baselines.

Kernels GMM-RKS, FastFood-RKS, Generative-RKS, GMM-PRF, FastFood-PRF, Generative-PRF with the number of
samples M of the paper's table 5 for each kernel and task, and the baselines of its table 2 that this
repository implements: the Softmax Transformer, LinearElu, Performer (``posrf-orf``: FAVOR+, positive
features with orthogonal draws) and Linformer. Each task config's ``kernel_learning`` preset holds the
paper's table 4 hyperparameters (LRA's model sizes, sqrt decay, 10k/20k/5k steps, 200 epochs for Image).

Seeds: the paper does not state how many runs its numbers average; its baseline rows are copied from
LRA (Tay et al. 2021b), which reports single runs. We run three seeds and report mean +- std.

Size: 10 kinds x 4 tasks x 3 seeds = 120 runs.
"""
from __future__ import annotations

from kernelformer.reproduce.sweeps import KIND_KEY, Point, Sweep

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
BASELINES = ('softmax', 'linear-elu', 'posrf-orf', 'linformer')


def get_sweep() -> Sweep:
  points = []
  for t, task in enumerate(TASKS):
    config = f'configs/{task}.py'
    for kind in (*NUM_SAMPLES, *BASELINES):
      for seed in SEEDS:
        overrides = {KIND_KEY: kind, 'seed': seed}
        if kind in NUM_SAMPLES:
          overrides['model.attention.num_features'] = NUM_SAMPLES[kind][t]
        points.append(Point(config=config, preset='kernel_learning',
                            overrides=tuple(overrides.items()), label=kind))
  return Sweep(name='kernel_learning', points=tuple(points), paper='kernel_learning',
               description='On Learning the Transformer Kernel, table 2 (M from table 5), 3 seeds')
