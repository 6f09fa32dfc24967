"""Pathfinder loader speed: batches/s from the raw PNGs vs from the decoded cache, on one fixture, one run.

  python scripts/benchmark_loader.py                       # 4000 images at 32x32, batch 64
  python scripts/benchmark_loader.py --images 2000 --resolution 128 --json out.json

Both loaders give identical batches (checked here on every measured batch); what differs is the
cost. The raw loader decodes every PNG when the split is first asked for (per process, so at every
start of a run) and then serves batches from int32 arrays in memory; the cached loader maps the
uint8 array that ``scripts/prepare_data.py`` decoded once and converts one row per example. So
three numbers per loader, all from the same process and fixture (``lra_tasks.fixtures``, the release
format):

* ``setup_s``: from nothing to a ready training source (raw: decode all images; cache: map it);
* ``first_epoch_batches_per_s``: one epoch of training batches including ``setup_s``, what a run's
  start sees;
* ``steady_batches_per_s``: batches after setup (raw: from memory; cache: from the page cache).

The one-off cache build time is reported too. Batches come from the trainer's own
``input_pipeline.TrainBatches`` (shuffled, seeded).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from kernelformer.training import input_pipeline  # noqa: E402
from lra_tasks import cache  # noqa: E402
from lra_tasks import fixtures  # noqa: E402
from lra_tasks import pathfinder  # noqa: E402


def _epoch(source, batch_size: int, start: float, reference=None) -> tuple[float, float, list]:
  """Times one epoch of training batches; returns (first-epoch rate incl. setup, steady rate, batches)."""
  batches = input_pipeline.TrainBatches(source, batch_size, seed=0)
  steps = max(1, len(source) // batch_size)
  first = time.perf_counter()
  out = []
  for step in range(steps):
    batch = batches.batch(step)
    if reference is not None:
      for name in batch:
        np.testing.assert_array_equal(batch[name], reference[step][name])
    else:
      out.append(batch)
  end = time.perf_counter()
  return steps / (end - start), steps / (end - first), out


def main(argv: list[str]) -> dict:
  p = argparse.ArgumentParser(prog='kernelformer benchmark loader', description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--images', type=int, default=4000)
  p.add_argument('--resolution', type=int, default=32, choices=pathfinder.RESOLUTIONS)
  p.add_argument('--batch_size', type=int, default=64)
  p.add_argument('--workdir', default=None, help='where to write the fixture (default: a temp dir)')
  p.add_argument('--json', default=None, help='also write the results to this file')
  args = p.parse_args(argv)

  with tempfile.TemporaryDirectory() as tmp:
    root = args.workdir or tmp
    start = time.perf_counter()
    fixtures.write_pathfinder_fixture(root, args.resolution, 'hard', args.images, seed=0)
    fixture_s = time.perf_counter() - start
    data = ml_collections.ConfigDict({'data_dir': root, 'resolution': args.resolution,
                                      'difficulty': 'hard', 'max_length': 0, 'split_seed': 0})

    pathfinder.forget_decoded()   # a fresh process: nothing decoded yet
    start = time.perf_counter()
    raw = pathfinder.TASK.source(data, 'train')
    raw_setup = time.perf_counter() - start
    raw_first, raw_steady, reference = _epoch(raw, args.batch_size, start)

    start = time.perf_counter()
    where = pathfinder.build_cache(data)
    build_s = time.perf_counter() - start
    pathfinder.forget_decoded()
    start = time.perf_counter()
    cached = pathfinder.TASK.source(data, 'train')
    cache_setup = time.perf_counter() - start
    cache_first, cache_steady, _ = _epoch(cached, args.batch_size, start, reference)
    cache_bytes = cache.disk_bytes(where)

  results = {
      'images': args.images, 'resolution': args.resolution, 'batch_size': args.batch_size,
      'train_examples': len(raw), 'batches_per_epoch': len(reference),
      'fixture_write_s': round(fixture_s, 3), 'cache_build_s': round(build_s, 3),
      'cache_bytes': cache_bytes,
      'raw': {'setup_s': round(raw_setup, 4), 'first_epoch_batches_per_s': round(raw_first, 1),
              'steady_batches_per_s': round(raw_steady, 1)},
      'cache': {'setup_s': round(cache_setup, 4), 'first_epoch_batches_per_s': round(cache_first, 1),
                'steady_batches_per_s': round(cache_steady, 1)},
      'identical_batches': True,
  }
  print(f'Pathfinder {args.resolution}x{args.resolution}, {args.images} images '
        f'({len(raw)} train), batch {args.batch_size}, {len(reference)} batches per epoch')
  print(f'{"loader":8} {"setup s":>9} {"1st epoch b/s":>14} {"steady b/s":>11}')
  for name in ('raw', 'cache'):
    r = results[name]
    print(f'{name:8} {r["setup_s"]:9.3f} {r["first_epoch_batches_per_s"]:14.1f} '
          f'{r["steady_batches_per_s"]:11.1f}')
  print(f'cache built once in {build_s:.2f} s ({cache_bytes / 1e6:.1f} MB); batches identical')
  if args.json:
    with open(args.json, 'w', encoding='utf-8') as f:
      json.dump(results, f, indent=2)
  return results


if __name__ == '__main__':
  main(sys.argv[1:])
