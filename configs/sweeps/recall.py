"""MQAR recall vs feature count M and number of key-value pairs, per causal kernel (docs/causal.md).

The ``quick`` MQAR preset (vocabulary 64, length 64, 2 layers x 64 dims, sinusoids) shortened to 600
steps, one seed: softmax and linear-elu (no M), and at M in {8, 32}: FAVOR+ (posrf-orf), RFA's
trigonometric features (trigrf-orf), a learnable kernel (gmm-prf) and Luo et al.'s nprf-rpe; each at
4 and 8 pairs (20 runs). OPRF (favor++) and SADERF (favor#) are not in it: their parameters are means
over the whole sequence, so they have no causal form (kernelformer/decoder.py refuses them).

Zoology (Arora et al. 2023) finds attention solves MQAR while fixed-size linear-attention states
degrade as the number of pairs grows relative to the state size; this sweep asks whether random-feature
states (size M' x d per head) follow that ordering at CPU scale.

  nice -n 19 python scripts/sweep.py --sweep recall --sweep_dir runs/sweeps/recall
  python scripts/report.py runs/sweeps/recall --out docs/sweeps/recall
NOT YET RUN here (see docs/causal.md for its status).
"""
from __future__ import annotations

from kernelformer.reproduce.sweeps import KIND_KEY, Sweep, grid

M_KEY = 'model.attention.num_features'
PAIRS_KEY = 'data.num_pairs'
FEATURE_KINDS = ('posrf-orf', 'trigrf-orf', 'gmm-prf', 'nprf-rpe')
PLAIN_KINDS = ('softmax', 'linear-elu')
FEATURES = (8, 32)
PAIRS = (4, 8)


def get_sweep() -> Sweep:
  points = grid('configs/mqar.py', 'quick', {KIND_KEY: PLAIN_KINDS, PAIRS_KEY: PAIRS})
  points += grid('configs/mqar.py', 'quick',
                 {KIND_KEY: FEATURE_KINDS, M_KEY: FEATURES, PAIRS_KEY: PAIRS})
  common = (('num_train_steps', 600), ('eval_every', 300), ('checkpoint_every', 300),
            ('log_every', 100), ('progress', False))
  return Sweep(name='recall', points=tuple(points), common=common, label_keys=(M_KEY, PAIRS_KEY),
               description='MQAR accuracy (query positions) vs M and pairs, quick preset at 600 steps')
