"""Spectraformer (Nguyen et al. 2024) table 2: component function x weight matrix on ListOps, Text, Retrieval.

The 18 variants of table 2 (components PosRF, OPRF, SADERF x weights ORF, SORF, QMC, SGQ, MM, FastFoodL),
plus the reference rows of its table 3 that this repository implements (the original Transformer =
``softmax``, Nystromformer, Linformer, Skyformer; Informer, Reformer and BigBird are paper-only rows in
the report), all with the ``skyformer`` preset of each task config: Skyformer's code (its src/config.py
and src/main.py), whose shared small setting the paper's table 5 summarises (2 layers, 64 dims, 2 heads,
mean pooling, linear decay, 50k steps; Text batch 32 as Skyformer's code). Spectraformer's own training
code was not compared.

W is drawn once and never redrawn (``redraw_every=0`` for the 18 variants): the paper says nothing of
redraws, and its code (dukenguyenxyz/spectraformer @ b79b91b, src/models/attention_performer.py)
registers W as a buffer at construction (230-231) and draws FastFoodL's structure once (239), while its
``redraw_projection_matrix`` (259-262) is never called. (The kernel-learning paper's resampling every
100 iterations, this library's default, is configs/sweeps/kernel_learning.py's.)

Seeds: the paper trained each variant once ("we do not run the experiments on different seeds",
section 4.1; seed 42, table 5). Single runs are noisy here (e.g. PosRF-SORF 22.98 on ListOps against
~37 for its neighbours), so we run three seeds and report mean +- std next to the paper's single number.

Size: 22 kinds x 3 tasks x 3 seeds = 198 runs of 50k steps (the paper: 1.3-5.9 GPU-hours each on a T4).
"""
from __future__ import annotations

KIND_KEY = 'model.attention.kind'
TASKS = ('listops', 'text', 'retrieval')
COMPONENTS = ('posrf', 'oprf', 'saderf')
WEIGHTS = ('orf', 'sorf', 'qmc', 'sgq', 'mm', 'fastfoodl')
REFERENCES = ('softmax', 'nystromformer', 'linformer', 'skyformer')
SEEDS = (0, 1, 2)


def variants() -> list[str]:
  return [f'{c}-{w}' for c in COMPONENTS for w in WEIGHTS]


def kinds() -> list[str]:
  return variants() + list(REFERENCES)


def get_sweep() -> dict:
  points = []
  for task in TASKS:
    points += [dict(config=f'configs/{task}.py', preset='skyformer', grid={KIND_KEY: variants(), 'seed': SEEDS},
                    overrides={'model.attention.redraw_every': 0}),
               dict(config=f'configs/{task}.py', preset='skyformer', grid={KIND_KEY: REFERENCES, 'seed': SEEDS})]
  return dict(name='spectraformer', points=points, paper='spectraformer',
              description='Spectraformer table 2 (and table 3 references), skyformer preset, 3 seeds')
