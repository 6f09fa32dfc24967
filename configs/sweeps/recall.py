"""MQAR recall vs feature count M and number of key-value pairs, per causal kernel (docs/recall.md).

The ``legacy_quick`` MQAR preset (task ``mqar_legacy``, not Zoology's: lra_tasks/mqar.py; vocabulary 32, length 32, 2 layers x 64 dims, 2 heads of 32, sinusoids)
at 600 steps, one seed: softmax and linear-elu (no M; linear-elu's state is 32 x 32 per head),
and at M in {4, 16, 64} FAVOR+ (posrf-orf), RFA's trigonometric features (trigrf-orf), a learnable
kernel (gmm-prf) and Luo et al.'s nprf-rpe (M <= 16) at 4 pairs; at 8 pairs, 1200 steps, softmax,
linear-elu, posrf-orf and gmm-prf at M = 64 (17 runs; the time bound: see FEATURES_AT; 8 pairs fill
length 32: the pairs, then every key queried once). Ordered pairs-major. OPRF (favor++) and SADERF (favor#) are not in it: their parameters are means over the whole
sequence, so they have no causal form (kernelformer/decoder.py refuses them).

Legacy: the task is ``mqar_legacy``, not Zoology's (values revealed after each query, so later queries
can be answered by elimination); kept so the numbers measured on it stay reproducible. Zoology's task and
model: configs/sweeps/zoology_fig2.py.

  nice -n 10 kernelformer sweep --sweep recall --sweep_dir runs/sweeps/recall
  python -m kernelformer.reproduce.recall_plot runs/sweeps/recall --out docs/recall
The measured table, figure, command and runtime: docs/recall.md.
"""
from __future__ import annotations

KIND_KEY = 'model.attention.kind'
M_KEY = 'model.attention.num_features'
PAIRS_KEY = 'data.num_pairs'
FEATURE_KINDS = ('posrf-orf', 'trigrf-orf', 'gmm-prf', 'nprf-rpe')
PLAIN_KINDS = ('softmax', 'linear-elu')
FEATURES = (4, 16, 64)
PAIRS = (4, 8)
# The time bound (~25 min of sweep on the shared 2-core machine). Every feature kernel stayed at
# 14-34 % at 4 pairs for every M (below the 52 % that elimination gives on this legacy task: docs/recall.md,
# "Chance levels"); nprf-rpe (causal RPE by FFT over every feature) ran at
# 0.8 steps/s at M = 64 (12+ min a run), so it stops at M = 16. At 8 pairs softmax itself was still on
# the plateau after 600 steps (test 34.6 %), so 8 pairs gets 1200 steps and only
# the kernels that say most: softmax, linear-elu, FAVOR+ and the learnable gmm-prf at M = 64.
FEATURES_AT = {4: {'posrf-orf': FEATURES, 'trigrf-orf': FEATURES, 'gmm-prf': FEATURES,
                   'nprf-rpe': (4, 16)},
               8: {'posrf-orf': (64,), 'gmm-prf': (64,)}}
STEPS = 600
STEPS_AT = {8: 1200}


def get_sweep() -> dict:
  points = []
  for pairs in PAIRS:
    extra = {'num_train_steps': STEPS_AT[pairs]} if pairs in STEPS_AT else {}
    points.append(dict(config='configs/mqar.py', preset='legacy_quick',
                       grid={KIND_KEY: PLAIN_KINDS, PAIRS_KEY: (pairs,)}, overrides=extra))
    points += [dict(config='configs/mqar.py', preset='legacy_quick',
                    grid={KIND_KEY: (kind,), M_KEY: ms, PAIRS_KEY: (pairs,)}, overrides=extra)
               for kind, ms in FEATURES_AT[pairs].items()]
  return dict(name='recall', points=points, label_keys=(M_KEY, PAIRS_KEY),
              common=dict(num_train_steps=STEPS, eval_every=300, checkpoint_every=300, log_every=100,
                          progress=False),
              description=f'MQAR accuracy (query positions) vs M and pairs, quick preset at {STEPS} steps')
