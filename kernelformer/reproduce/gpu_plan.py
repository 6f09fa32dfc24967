"""The plan of ``scripts/gpu_day.sh reproduce``: what one call trains, as populations, and its time.

  python -m kernelformer.reproduce.gpu_plan --runs R --data D --out O --config C {measure,plan} --seconds S

The jobs, in order, each one population (``training/population.py``): (a) Skyformer table 1's ListOps
column: each kind of KF_REPRODUCE_KINDS (``LISTOPS_KINDS``) at ``--config`` (``listops:skyformer``),
seeds 0..KF_REPRODUCE_SEEDS-1 (3) the members; (b) Zoology figure 2's (64, 4) panel: each KIND:D_MODEL of
KF_REPRODUCE_ZOOLOGY (``ZOOLOGY_POINTS``, the points not yet reproduced) at ``mqar:zoology`` with
configs/sweeps/zoology_fig2_full.py's overrides, its learning rates (KF_REPRODUCE_ZOOLOGY_LRS, Zoology's
4) the members; (c) Skyformer table 3's ListOps column in Skyformer's protocol (AMP, length 2048): up to
KF_REPRODUCE_INSTABILITY_SEEDS (20) seeds, each written when done, in the time (a) and (b) leave.
``measure``: each job's program (``population.build``, random tokens), compiled once, stepped for a few
seconds, in order until the measured jobs fill the time (DIR/rates.json). ``plan`` (the pure ``plan``):
the longest prefix of (a), (b) whose estimates fit, then the next job in the time left (stopped, tested
where it stands, packed for ``reproduce-continue``), then (c); writes DIR/jobs.txt (in order), DIR/JOB.cmd,
DIR/JOB/MEMBER.cmd (a member's single run, which ``reproduce-continue`` continues), DIR/table.args,
DIR/skipped.txt and prints the plan. KF_REPRODUCE_DRY=1: tiny sizes (the CPU dry run).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import time

LISTOPS_KINDS = ('softmax', 'gaussian', 'nystromformer', 'linformer', 'performer-skyformer', 'skyformer')
ZOOLOGY_POINTS = 'softmax:128 linear-elu:64 linear-elu:128 posrf-orf:64 posrf-orf:128 taylor:64 taylor:128'
EVAL_COST = 1 / 3       # an evaluation batch against a training step: a forward pass of three
STARTUP_S = 15.0        # a training process's imports, data loading and checkpoint writes
MIN_PARTIAL_S = 60.0    # the least time worth starting a job that cannot finish
INSTABILITY = 'instability-listops'
DRY_LISTOPS = {'num_train_steps': 4, 'eval_every': 2, 'checkpoint_every': 2}
DRY_ZOOLOGY = {'data.num_train': 512, 'data.num_val': 64, 'data.num_test': 64, 'batch_size': 16,
               'num_train_steps': 4, 'eval_every': 2, 'checkpoint_every': 2, 'model.emb_dim': 16,
               'model.qkv_dim': 16}
DRY_INSTABILITY = ['--steps', '3'] + [a for kv in (
    'data.max_length=32 data.min_gen_length=8 data.max_gen_length=32 data.max_depth=3 data.max_args=3 '
    'data.num_train=256 data.num_val=64 data.num_test=64 model.emb_dim=16 model.qkv_dim=16 '
    'model.mlp_dim=32 batch_size=4 model.attention.num_landmarks=8 model.attention.num_features=8'
).split() for a in ('--set', kv)]


@dataclasses.dataclass(frozen=True)
class Job:
  """A population: its workdir under --runs (a member's: name/<member name>), table group, --config,
  (field, value) overrides of every member, each member's overrides, steps, evaluation batches."""
  name: str
  group: str
  spec: str
  overrides: tuple
  members: tuple
  steps: int = 0
  eval_batches: int = 0


def member_label(job: Job, overrides: dict) -> str:
  return ' '.join([dict(job.overrides)['model.attention.kind']] + [
      f"{'lr' if k == 'optim.learning_rate' else k} {v}" for k, v in overrides.items()])


def estimate(job: Job, rate: dict) -> float:
  """Seconds to train ``job`` at ``rate`` (member_steps_per_s, compile_s): the steps, the evaluations
  (forward passes), the compilation and a process start."""
  per_step = len(job.members) / rate['member_steps_per_s']
  return STARTUP_S + rate['compile_s'] + per_step * (job.steps + EVAL_COST * job.eval_batches)


def plan(rates: dict, seconds: float, jobs, *, min_partial_s: float = MIN_PARTIAL_S) -> dict:
  """The jobs ``seconds`` hold, in order: ``{'jobs': [(job, seconds, complete)], 'seconds': total,
  'left': what remains (for (c))}``. The longest prefix whose estimates (``rates[job.name]``) fit,
  then the next job with the time left if that is at least ``min_partial_s``."""
  chosen, used = [], 0.0
  for job in jobs:
    if job.name not in rates:
      break
    est = estimate(job, rates[job.name])
    if used + est <= seconds:
      chosen.append((job, est, True))
      used += est
      continue
    if seconds - used >= min_partial_s:
      chosen.append((job, seconds - used, False))
      used = seconds
    break
  return {'jobs': chosen, 'seconds': used, 'left': max(0.0, seconds - used)}


def count(name: str, default: str) -> int:
  value = os.environ.get(name, default)
  if not value.isdigit() or int(value) < 1:
    raise ValueError(f'{name}={value!r}: a count >= 1')
  return int(value)


def jobs(listops_spec: str, data_dir: str, log=print) -> tuple[list, list]:
  """(the jobs (a) and (b) in order, lines naming what is skipped: kinds this checkout lacks)."""
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  from kernelformer.configs.sweeps import zoology_fig2_full as zoo  # pylint: disable=g-import-not-at-top
  env, dry = os.environ.get, bool(os.environ.get('KF_REPRODUCE_DRY'))
  seeds = tuple({'seed': s} for s in range(count('KF_REPRODUCE_SEEDS', '3')))
  lrs = [float(x) for x in env('KF_REPRODUCE_ZOOLOGY_LRS', '').split()] or sorted(zoo.LEARNING_RATES)[::-1]
  out, skipped = [], []
  wanted = [('skyformer-table1-listops', f'listops-{k}', listops_spec, k, {}, seeds)
            for k in env('KF_REPRODUCE_KINDS', ' '.join(LISTOPS_KINDS)).split()]
  for point in env('KF_REPRODUCE_ZOOLOGY', ZOOLOGY_POINTS).split():
    kind, _, d = point.partition(':')
    if not d.isdigit():
      raise ValueError(f'KF_REPRODUCE_ZOOLOGY: {point!r} is not KIND:D_MODEL (e.g. taylor:128)')
    wanted.append((f'zoology-fig2-L64-d{d}', f'zoology-{kind}-d{d}', 'mqar:zoology', kind,
                   {'model.emb_dim': int(d), **zoo.model_overrides(kind, int(d))},
                   tuple({'optim.learning_rate': lr} for lr in lrs)))
  for group, name, spec, kind, extra, members in wanted:
    try:
      registry.get(kind)
    except registry.UnknownKernelError:
      log(f'reproduce: attention kind {kind} is not registered in this checkout; skipped')
      skipped.append(f'{kind}: not registered in this checkout')
      continue
    over = {'model.attention.kind': kind, 'progress': False, **extra}
    if group.startswith('skyformer'):
      over['data.data_dir'] = data_dir
      if dry:   # 8 landmarks / features at the tiny length (performer-skyformer's M is its source's)
        over.update(DRY_LISTOPS)
        if not kind.startswith('performer-'):
          m = 'landmarks' if kind in ('skyformer', 'nystromformer') else 'features'
          over[f'model.attention.num_{m}'] = 8
    elif dry:
      over.update(DRY_ZOOLOGY)
    c = config(spec, over)
    evals = c.num_train_steps // c.eval_every + 1
    per_eval = c.max_eval_batches or -(-c.data.num_val // c.batch_size)
    out.append(Job(name, group, spec, tuple(over.items()), members, c.num_train_steps,
                   evals * per_eval + -(-c.data.num_test // c.batch_size)))
  return out, skipped


def config(spec: str, overrides):
  task, _, preset = spec.rpartition(':') if ':' in spec else (spec, '', '')
  task = os.path.basename(task).removesuffix('.py')   # configs/listops.py or listops
  c = importlib.import_module(f'kernelformer.configs.{task}').get_config(*[preset][:bool(preset)])
  c.update_from_flattened_dict(dict(overrides))
  return c


def measure(todo, seconds: float, budget: float, log=print) -> dict:
  """``{job name: {'member_steps_per_s', 'compile_s', 'size'}}``: each job's population (random tokens)
  compiled (its first step), then stepped for ``seconds``; in order, until the jobs measured fill
  ``budget`` seconds less the time measuring took."""
  import jax  # pylint: disable=g-import-not-at-top
  import lra_tasks  # pylint: disable=g-import-not-at-top
  from kernelformer.bench import train_step  # pylint: disable=g-import-not-at-top
  from kernelformer.training import population  # pylint: disable=g-import-not-at-top
  rates, t_start = {}, time.perf_counter()
  for job in todo:
    c = config(job.spec, job.overrides)
    task = lra_tasks.get(c.data.task)
    info = task.info(c.data)
    source = train_step.train_source(task, c.data, info, 4 * c.batch_size)
    t0 = time.perf_counter()
    pop, state, window = population.build(c, info, source, population=list(job.members))
    batches = [pop.batch(i) for i in range(4)]
    state, window = pop.step(state, window, batches[0], *pop.extra())
    jax.block_until_ready(state)
    t1 = time.perf_counter()
    n = 0
    while n < 3 or time.perf_counter() - t1 < seconds:
      state, window = pop.step(state, window, batches[n % 4], *pop.extra())
      n += 1
    jax.block_until_ready(state)
    rate = len(job.members) * n / (time.perf_counter() - t1)
    rates[job.name] = {'member_steps_per_s': rate, 'compile_s': t1 - t0, 'size': len(job.members)}
    log(f'measure: {job.name}: {len(job.members)} members, {rate:.1f} member-steps/s, compiled in '
        f'{t1 - t0:.1f} s')
    del pop, state, window
    if sum(estimate(j, rates[j.name]) for j in todo if j.name in rates) >= \
        budget - (time.perf_counter() - t_start):
      break
  return rates


def write(p: dict, todo, skipped: list, runs: str, out: str, data_dir: str, seeds: int, log=print):
  """The plan's files in ``runs`` (module docstring) and its printout."""
  from kernelformer.training import population  # pylint: disable=g-import-not-at-top
  names, table = [], []
  log(f"plan: {len(p['jobs'])} of {len(todo)} populations, estimated {p['seconds']:.0f} s:")
  for job, secs, complete in p['jobs']:
    flags = [f'--config.{k}={v}' for k, v in job.overrides]
    head = ['-m', 'kernelformer', 'train', '--config', job.spec]
    with open(os.path.join(runs, job.name + '.cmd'), 'w') as f:
      f.write('\n'.join(head + [f'--workdir={os.path.join(runs, job.name)}', *flags,
                                f'--config.population={json.dumps(list(job.members))}']) + '\n')
    os.makedirs(os.path.join(runs, job.name), exist_ok=True)
    for m in job.members:
      wd = os.path.join(runs, job.name, population.member_name(m))
      with open(wd + '.cmd', 'w') as f:
        f.write('\n'.join(head + [f'--workdir={wd}', *flags] +
                          [f'--config.{k}={v}' for k, v in m.items()]) + '\n')
      table += ['--run', f'{job.group}:{member_label(job, m)}={wd}']
    names.append(job.name)
    log(f"  {job.name}: {len(job.members)} members x {job.steps:,} steps, {secs:.0f} s"
        f"{'' if complete else ' (the time left: stopped, tested, packed for reproduce-continue)'}")
  for job in todo[len(p['jobs']):]:
    skipped.append(f'{job.group} {job.name}: not in this call\'s plan (no time)')
    log(f'  {job.name}: not this call')
  dry = os.environ.get('KF_REPRODUCE_DRY')
  if p['left'] >= MIN_PARTIAL_S or dry:
    cmd = ['-m', 'kernelformer', 'reproduce', 'instability', '--task', 'listops', '--seeds', str(seeds),
           '--precision', 'skyformer-amp', '--set', 'data.max_length=2048', '--set',
           f'data.data_dir={data_dir}', '--out_dir', out] + (DRY_INSTABILITY if dry else [])
    with open(os.path.join(runs, INSTABILITY + '.cmd'), 'w') as f:
      f.write('\n'.join(cmd) + '\n')
    names.append(INSTABILITY)
    log(f"  {INSTABILITY}: up to {seeds} seeds in the {p['left']:.0f} s left, each written when done")
  for name, lines in (('jobs.txt', names), ('table.args', table), ('skipped.txt', skipped)):
    with open(os.path.join(runs, name), 'w') as f:
      f.write(''.join(line + '\n' for line in lines))


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog='python -m kernelformer.reproduce.gpu_plan', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  for name in ('--runs', '--data', '--out'):
    parser.add_argument(name, required=True)
  parser.add_argument('--config', default='listops:skyformer', help='the ListOps config (a)')
  parser.add_argument('step', choices=('measure', 'plan'))
  parser.add_argument('--seconds', type=float, required=True, help='the time the jobs may take')
  parser.add_argument('--measure_seconds', type=float, default=3.0)
  args = parser.parse_args(argv)
  try:
    todo, skipped = jobs(args.config, args.data, print if args.step == 'plan' else lambda _: None)
    seeds = count('KF_REPRODUCE_INSTABILITY_SEEDS', '20')
  except (ValueError, KeyError, AttributeError) as e:   # a bad KF_REPRODUCE_* value or --config
    print(f'reproduce: {e}')
    return 2
  rates_path = os.path.join(args.runs, 'rates.json')
  if args.step == 'measure':
    rates = measure(todo, args.measure_seconds, args.seconds)
    with open(rates_path, 'w') as f:
      json.dump(rates, f, indent=1)
    return 0
  with open(rates_path) as f:
    rates = json.load(f)
  write(plan(rates, args.seconds, todo), todo, skipped, args.runs, args.out, args.data, seeds)
  return 0


if __name__ == '__main__':
  sys.exit(main())
