"""Skyformer (Chen et al. 2021) table 1: softmax, Gaussian kernelized attention, Skyformer and baselines.

Five LRA tasks (Text, ListOps, Retrieval, Pathfinder, Image) with each task config's ``skyformer`` preset,
Skyformer's code (src/config.py and src/main.py @ cfe8c8c: the section-5 model of 2 layers, 64 dims, 128
hidden, 2 heads, mean pooling, 128 features or landmarks; AdamW (0.9, 0.999) eps 1e-6, gradients clipped
to [-1, 1], torch OneCycleLR with linear phases, 50k steps, validation on the task's number of batches,
the best validation checkpoint after 20 % of the steps tested; configs/common.py skyformer_setting).
Rows this repository implements: Self-Attention (``softmax``), Kernelized Attention (``gaussian``),
Nystromformer, Linformer, Performer (``performer-skyformer``: Skyformer's own Performer, pkuzengqi/Skyformer
@ 1a677cb src/models/attention_performer.py 9-25 and src/models/performer.py 174-227 -- one ORF draw kept
as a buffer, 128 features, d^-1/4 applied twice, one key maximum over the whole tensor, +1e-4; the kind
kernelformer/reproduce/paper_numbers.csv names for the row) and Skyformer; the paper's Informer, Reformer
and BigBird rows appear in the report as paper-only rows.

Seeds: "all experiment results are averaged across three runs with different random seeds" (section 5),
so three seeds here as well.

Size: 6 kinds x 5 tasks x 3 seeds = 90 runs.
"""
from __future__ import annotations

KIND_KEY = 'model.attention.kind'
TASKS = ('text', 'listops', 'retrieval', 'pathfinder', 'image')
KINDS = ('softmax', 'gaussian', 'nystromformer', 'linformer', 'performer-skyformer', 'skyformer')
SEEDS = (0, 1, 2)


def get_sweep() -> dict:
  points = [dict(config=f'configs/{task}.py', preset='skyformer', grid={KIND_KEY: KINDS, 'seed': SEEDS})
            for task in TASKS]
  return dict(name='skyformer', points=points, paper='skyformer',
              description='Skyformer table 1, skyformer preset, 3 seeds')
