"""A sweep small enough for a laptop: 3 kernels x 2 seeds on short ListOps, < 20 minutes on 2 CPU cores
(8-9 min measured on 2 cores; see docs/reproduce.md).

The ``quick`` ListOps preset (expressions of 20-64 tokens, 2 layers x 64 dims, batch 64) trained for
600 instead of 2000 steps: softmax, Performer's FAVOR+ (``posrf-orf``) and Spectraformer's best variant
(``posrf-mm``). It exercises the whole pipeline (sweep, resume, report, plot); its accuracies are far
from the papers' (a different, shorter ListOps and a short schedule) and no paper column is shown.

  python scripts/sweep.py --sweep mini --sweep_dir runs/sweeps/mini
  python scripts/report.py runs/sweeps/mini --out docs/sweeps/mini
"""
from __future__ import annotations

KIND_KEY = 'model.attention.kind'
KINDS = ('softmax', 'posrf-orf', 'posrf-mm')
SEEDS = (0, 1)


def get_sweep() -> dict:
  return dict(name='mini', points=[dict(config='configs/listops.py', preset='quick',
                                        grid={KIND_KEY: KINDS, 'seed': SEEDS})],
              common=dict(num_train_steps=600, eval_every=200, checkpoint_every=200, log_every=100,
                          progress=False),
              description='3 kernels x 2 seeds, ListOps `quick` preset shortened to 600 steps')
