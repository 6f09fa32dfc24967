"""Long Range Arena (Tay et al. 2021) table 1, the rows this repository implements, at the configs of
the commit that published it.

LRA's README table (google-research/long-range-arena 211e07d, 2020-11-08; the paper's table 1 numbers)
was published when ``base_listops_config.py`` was 6 layers / FFN 2048 / evaluation every 20 steps
(``configs/listops.py:lra_paper``) and ``pathfinder32/transformer_base.py`` the 1-layer 128 / 64 / 128
file (``configs/pathfinder.py:lra_pre_ee6649e``); Text and Retrieval have had today's settings since
4954d9f (``lra``). Image's file then added nothing to ``base_cifar10_config.py`` (1 head, 32 / 32 / 64),
which no preset holds; this sweep runs ``configs/image.py:lra``, the 8-head model that LRA issue #33
found to reproduce 42.44 and ee6649e wrote into the file. Each point's preset is the ``preset`` of its
softmax row in ``kernelformer/reproduce/paper_numbers.csv`` (``lra`` for Image).

Rows: softmax (Transformer), linear-elu (Linear Trans.), LRA's Performer (``performer-lra-listops`` on
ListOps, ``performer-relu-det`` elsewhere, as ``configs/sweeps/kernel_learning.py`` explains) and
linformer. The repository held no config files for the non-Transformer models at 211e07d, so they run
on the Transformer's preset with the kind switched. LRA reports single runs; three seeds here.

Size: 4 rows x 5 tasks x 3 seeds = 60 runs.
"""
from __future__ import annotations

KIND_KEY = 'model.attention.kind'
TASKS = ('listops', 'text', 'retrieval', 'image', 'pathfinder')
PRESET = {'listops': 'lra_paper', 'text': 'lra', 'retrieval': 'lra', 'image': 'lra',
          'pathfinder': 'lra_pre_ee6649e'}
SEEDS = (0, 1, 2)
LRA_PERFORMER = {'listops': 'performer-lra-listops', 'text': 'performer-relu-det',
                 'retrieval': 'performer-relu-det', 'image': 'performer-relu-det',
                 'pathfinder': 'performer-relu-det'}
LRA_PERFORMER_LABEL = 'performer (LRA)'
ROWS = ('softmax', 'linear-elu', LRA_PERFORMER_LABEL, 'linformer')


def get_sweep() -> dict:
  points = [dict(config=f'configs/{task}.py', preset=PRESET[task], label=row,
                 grid={KIND_KEY: (LRA_PERFORMER[task] if row == LRA_PERFORMER_LABEL else row,),
                       'seed': SEEDS})
            for task in TASKS for row in ROWS]
  return dict(name='lra', points=points, paper='lra',
              description="LRA table 1 (README @ 211e07d) at the publication commit's presets, 3 seeds")
