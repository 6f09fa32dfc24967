"""Member-steps/s of a population (``training/population.py``) against its members' single runs.

  kernelformer benchmark population                        # listops:skyformer and mqar:zoology
  kernelformer benchmark population --configs listops:skyformer --batch 4 --length 256 --steps 3

For each config and size P (members: seeds 0..P-1), each round runs ``--steps`` steps of the population's
jitted step, then P single runs of ``--steps`` steps one after another (``steps_lib.build_steps``' step;
every seed's single run is the same program, so one is compiled), interleaved so a shared machine's load
hits both alike. Batches are read beforehand: each member's own data order from the task's training
split where it is on disk or generated (MQAR), else random tokens. member-steps/s = P x steps / seconds;
the ratio is the median over rounds of population / singles (goal on a CPU: >= 0.95). Memory: XLA's
compiled temp + argument + output bytes (``memory_analysis``) per member, and the single run's.
Writes ``population.md`` into --out_dir (default runs/benchmarks/) and prints it.
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time

from kernelformer.commands import _common


def measure(spec: str, sizes, steps: int, rounds: int, batch: int, length: int) -> list:
  import jax  # pylint: disable=g-import-not-at-top
  import lra_tasks  # pylint: disable=g-import-not-at-top
  from kernelformer import run_config  # pylint: disable=g-import-not-at-top
  from kernelformer.bench import train_step  # pylint: disable=g-import-not-at-top
  from kernelformer.training import input_pipeline, metrics, population, steps as steps_lib  # pylint: disable=g-import-not-at-top
  task, _, preset = spec.partition(':')
  config = importlib.import_module(f'kernelformer.configs.{task}').get_config(preset)
  with config.unlocked():
    config.batch_size, config.data.max_length = batch or config.batch_size, length or config.data.max_length
  task = lra_tasks.get(config.data.task)
  info = task.info(config.data)
  source = train_step.train_source(task, config.data, info, 4 * config.batch_size)
  parts, single = steps_lib.build_steps(run_config.of(config), info, None)
  window, data = steps_lib.empty_window(), input_pipeline.TrainBatches(source, config.batch_size, 0)
  pops = {p: population.build(config, info, source, population=[{'seed': s} for s in range(p)])
          for p in sizes}
  rates = {p: ([], []) for p in sizes}
  start = 0
  for r in range(rounds + 1):             # round 0 compiles and warms up
    for p, (pop, state, pwindow) in pops.items():
      batches = [pop.batch(start + s) for s in range(steps)]
      ones = [data.batch(start + s) for s in range(steps)]
      t0 = time.perf_counter()
      for b in batches:
        state, pwindow = pop.step(state, pwindow, b, *pop.extra())
      jax.block_until_ready(state)
      t1 = time.perf_counter()
      for _ in range(p):
        for b in ones:
          single, window = parts['loop_step'](single, window, b)
      jax.block_until_ready(single)
      t2 = time.perf_counter()
      pops[p] = (pop, state, pwindow)
      if r:
        rates[p][0].append(p * steps / (t1 - t0))
        rates[p][1].append(p * steps / (t2 - t1))
    start += steps
  mib = lambda compiled, members=1: metrics.memory_of(compiled, total=True) / members / 2**20
  single_mib = mib(parts['loop_step'].lower(single, window, ones[0]).compile())
  rows = []
  for p, (pop, state, pwindow) in pops.items():
    rows.append((spec, p, statistics.median(rates[p][0]), statistics.median(rates[p][1]),
                 statistics.median(a / b for a, b in zip(*rates[p])),
                 mib(pop.compile(state, pwindow, pop.batch(0)), p), single_mib))
  return rows


def main(argv) -> int:
  parser = argparse.ArgumentParser(prog='kernelformer benchmark population', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--configs', default='listops:skyformer,mqar:zoology', help='TASK:PRESET,...')
  parser.add_argument('--sizes', default='1,2,4,8', help='population sizes')
  parser.add_argument('--steps', type=int, default=5, help='steps per member per round')
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--batch', type=int, default=0, help="batch_size (0: the preset's)")
  parser.add_argument('--length', type=int, default=0, help="data.max_length (0: the preset's)")
  parser.add_argument('--out_dir', default=os.path.join('runs', 'benchmarks'))
  args = parser.parse_args(argv)
  from kernelformer.bench import measure as measure_lib  # pylint: disable=g-import-not-at-top
  sizes = [int(s) for s in args.sizes.split(',')]
  rows = [row for spec in args.configs.split(',') for row in
          measure(spec, sizes, args.steps, args.rounds, args.batch, args.length)]

  def table(header: str) -> str:
    lines = [header, '', '| config | P | member-steps/s, population | member-steps/s, P single runs | '
             'ratio | compiled MiB per member | single run MiB |', '|---|--:|--:|--:|--:|--:|--:|']
    lines += [f'| {s} | {p} | {a:.2f} | {b:.2f} | {r:.2f} | {m:.1f} | {o:.1f} |'
              for s, p, a, b, r, m, o in rows]
    return '\n'.join(lines) + '\n'
  _common.write_benchmark_table(
      'population', argv, args.out_dir, f'load average after the run: {measure_lib.load_average()}; '
      f'{args.steps} steps per member per round, {args.rounds} rounds.', table)
  return 0
