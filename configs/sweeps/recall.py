"""MQAR recall vs feature count M and number of key-value pairs, per causal kernel (docs/recall.md).

The ``quick`` MQAR preset (vocabulary 32, length 32, 2 layers x 64 dims, 2 heads of 32, sinusoids)
shortened to 600 steps, one seed: softmax and linear-elu (no M; linear-elu's state is 32 x 32 per head),
and at M in {4, 16, 64} FAVOR+ (posrf-orf), RFA's trigonometric features (trigrf-orf), a learnable
kernel (gmm-prf) and Luo et al.'s nprf-rpe; each at 4 and 8 pairs (28 runs; 8 pairs fill length 32:
the pairs, then every key queried once). Ordered pairs-major, so a time-bounded run finishes 4 pairs
first. OPRF (favor++) and SADERF (favor#) are not in it: their parameters are means over the whole
sequence, so they have no causal form (kernelformer/decoder.py refuses them).

Zoology (Arora et al. 2023) finds attention solves MQAR while fixed-size linear-attention states
degrade as the number of pairs grows relative to the state size; this sweep asks whether random-feature
states (size M' x d per head) follow that ordering at CPU scale.

  nice -n 10 kernelformer sweep --sweep recall --sweep_dir runs/sweeps/recall
  python -m kernelformer.reproduce.recall_plot runs/sweeps/recall --out docs/recall
The measured table, figure, command and runtime: docs/recall.md.
"""
from __future__ import annotations

from kernelformer.reproduce.sweeps import KIND_KEY, Sweep, grid

M_KEY = 'model.attention.num_features'
PAIRS_KEY = 'data.num_pairs'
FEATURE_KINDS = ('posrf-orf', 'trigrf-orf', 'gmm-prf', 'nprf-rpe')
PLAIN_KINDS = ('softmax', 'linear-elu')
FEATURES = (4, 16, 64)
PAIRS = (4, 8)
STEPS = 600


def get_sweep() -> Sweep:
  points = []
  for pairs in PAIRS:
    points += grid('configs/mqar.py', 'quick', {KIND_KEY: PLAIN_KINDS, PAIRS_KEY: (pairs,)})
    points += grid('configs/mqar.py', 'quick',
                   {KIND_KEY: FEATURE_KINDS, M_KEY: FEATURES, PAIRS_KEY: (pairs,)})
  common = (('num_train_steps', STEPS), ('eval_every', 300), ('checkpoint_every', 300),
            ('log_every', 100), ('progress', False))
  return Sweep(name='recall', points=tuple(points), common=common, label_keys=(M_KEY, PAIRS_KEY),
               description=f'MQAR accuracy (query positions) vs M and pairs, quick preset at {STEPS} '
                           'steps')
