"""The table of ``scripts/gpu_day.sh reproduce``: its runs' results.json beside the published numbers.

  python -m kernelformer.reproduce.gpu_table --out OUT_DIR --env OUT_DIR/env.json \\
      --run 'skyformer-listops:skyformer=/tmp/gpu_runs/skyformer' --run 'zoology-d64:softmax@0.01=...'

Each ``--run GROUP:LABEL=WORKDIR`` names one training run; its ``results.json`` (or its absence: the run
did not finish) and, for a run stopped by its time limit and tested at the step it reached, that step
become one row. Writes ``OUT_DIR/results.json`` (every run's results, the environment, the commands)
and ``OUT_DIR/results.md`` (a markdown table) and prints the table.

Published numbers: Skyformer table 1 (ListOps test accuracy, %, from ``paper_numbers.csv``, matched by
the paper's model name) and Zoology figure 2 (MQAR accuracy at length 64 / 4 pairs, d_model 64,
attention, named by the group's ``-d<d_model>``; Zoology publishes no table of it): ≈ 1.00 at d_model 64
and 128, read off ``assets/figure2.png`` @ d88d6f5 (y ticks 0-1.0 every 0.25, zoology_figure2.py 48): the
marker lies on the 1.0 gridline within a pixel (0.007), above Zoology's 0.99 stop (train.py 197-200).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Optional

# Our kind -> the model name of Skyformer's table 1 whose number it reproduces.
SKYFORMER_MODELS = {'softmax': 'Self-Attention', 'gaussian': 'Kernelized Attention',
                    'nystromformer': 'Nystromformer', 'linformer': 'Linformer',
                    'performer-skyformer': 'Performer', 'posrf-orf': 'Performer',
                    'skyformer': 'Skyformer'}
# Zoology figure 2, (64, 4) panel, attention: the best of 4 learning rates at each d_model, read off the plot.
ZOOLOGY_FIG2_ATTENTION = {64: 1.0, 128: 1.0}


def zoology_d_model(group: str) -> int:
  """The d_model of a Zoology group named ``zoology-fig2-L64-d<d_model>`` (64 when it names none)."""
  m = re.search(r'-d(\d+)$', group)
  return int(m.group(1)) if m else 64


def published(group: str, kind: str) -> tuple[Optional[float], str]:
  """(number in the unit of our metric, where it is printed)."""
  if group.startswith('skyformer'):
    from kernelformer.reproduce import paper_numbers  # pylint: disable=g-import-not-at-top
    model = SKYFORMER_MODELS.get(kind)
    for n in paper_numbers.for_paper('skyformer'):
      if n.task == 'listops' and n.model == model:
        return n.accuracy / 100.0, f'Skyformer {n.cite()}, {n.model}'
    return None, ''
  if group.startswith('zoology'):
    d = zoology_d_model(group)
    if d not in ZOOLOGY_FIG2_ATTENTION or kind != 'softmax':
      return None, ''
    return ZOOLOGY_FIG2_ATTENTION[d], f'Zoology figure 2 (read off the plot), d_model {d}, best of 4 lrs'
  return None, ''


def planned_steps(res: dict) -> int:
  """The run's schedule length: the first ``num_train_steps`` it was started with (a run stopped by
  its time limit is tested by re-running it with ``num_train_steps`` = the step reached, a recorded
  config change ``'num_train_steps: 50000 -> S'``)."""
  for change in res.get('config_changes') or []:
    for field in change.get('fields', []) if isinstance(change, dict) else []:
      name, _, values = str(field).partition(': ')
      if name == 'num_train_steps' and ' -> ' in values:
        return int(values.split(' -> ')[0])
  return int((res.get('config') or {}).get('num_train_steps', 0) or 0)


def row(group: str, label: str, workdir: str) -> dict:
  path = os.path.join(workdir, 'results.json')
  out = {'group': group, 'label': label, 'workdir': workdir}
  if not os.path.exists(path):
    out['status'] = 'no results.json (the run did not finish or did not start; see its log)'
    return out
  with open(path) as f:
    res = json.load(f)
  cfg = res.get('config', {})
  planned = planned_steps(res)
  full = res.get('final_step') == planned or res.get('stopped_early')
  dtype = (cfg.get('model') or {}).get('dtype')   # float16 trains under torch's loss scale (AMP)
  out.update({
      'status': 'finished' if full else 'truncated',
      'kind': res.get('attention'), 'test_accuracy': res.get('test_accuracy'),
      'best_val_accuracy': res.get('best_val_accuracy'), 'final_step': res.get('final_step'),
      'planned_steps': planned, 'stopped_early': res.get('stopped_early'),
      'steps_per_sec': res.get('steps_per_sec'), 'wall_time_s': res.get('wall_time_s'),
      'learning_rate': (cfg.get('optim') or {}).get('learning_rate'),
      'precision': 'float16 AMP' if dtype == 'float16' else dtype,
      'config_changes': res.get('config_changes'), 'results': res})
  pub, where = published(group, out['kind'])
  out['published'], out['published_where'] = pub, where
  return out


def _f(x, fmt='{:.4f}') -> str:
  return '—' if x is None else fmt.format(x)


def markdown(rows: list[dict], env: dict) -> str:
  lines = [f"Device: {env.get('device', '?')}; {env.get('versions', '')}", '',
           '| group | run | kind | lr | precision | published | ours (test accuracy) | '
           'steps (of planned) | steps/s | wall s | status |', '|---|---|---|---|---|---|---|---|---|---|---|']
  for r in rows:
    steps = (f"{r['final_step']:,} of {r['planned_steps']:,}" if r.get('final_step') is not None
             else '—')
    if r.get('stopped_early'):
      steps += f" (stopped: val {r['stopped_early']['val_accuracy']:.4f} > {r['stopped_early']['threshold']})"
    lines.append(f"| {r['group']} | {r['label']} | {r.get('kind') or '—'} | "
                 f"{_f(r.get('learning_rate'), '{:.3g}')} | {r.get('precision') or '—'} | "
                 f"{_f(r.get('published'), '{:.4f}')} | "
                 f"{_f(r.get('test_accuracy'))} | {steps} | {_f(r.get('steps_per_sec'), '{:.1f}')} | "
                 f"{_f(r.get('wall_time_s'), '{:.0f}')} | {r['status']} |")
  best = {}
  for r in rows:
    key = (r['group'], r.get('kind'))
    if r.get('test_accuracy') is not None and r['group'].startswith('zoology'):
      if key not in best or r['test_accuracy'] > best[key]['test_accuracy']:
        best[key] = r
  for (g, kind), r in best.items():
    lines.append(f"\n{g} {kind}: best over the learning rates that ran = {r['test_accuracy']:.4f} "
                 f"(lr {_f(r.get('learning_rate'), '{:.3g}')}); Zoology figure 2 ≈ "
                 f"{_f(r.get('published'), '{:.2f}')}.")
  skipped = env.get('skipped') or []
  if skipped:
    lines.append('\nNot run: ' + '; '.join(skipped))
  if env.get('commands'):
    lines += ['', 'Commands:', ''] + [f'    {c}' for c in env['commands']]
  return '\n'.join(lines) + '\n'


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog='python -m kernelformer.reproduce.gpu_table',
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--out', required=True, help='directory for results.json and results.md')
  parser.add_argument('--run', action='append', default=[], metavar='GROUP:LABEL=WORKDIR')
  parser.add_argument('--env', default='', help='JSON file: device, versions, commands, skipped')
  args = parser.parse_args(argv)
  rows = []
  for spec in args.run:
    head, sep, workdir = spec.partition('=')
    group, sep2, label = head.partition(':')
    if not sep or not sep2 or not workdir:
      print(f'error: --run {spec!r}: expected GROUP:LABEL=WORKDIR', file=sys.stderr)
      return 2
    rows.append(row(group, label, workdir))
  env = {}
  if args.env and os.path.exists(args.env):
    with open(args.env) as f:
      env = json.load(f)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, 'results.json'), 'w') as f:
    json.dump({'environment': env, 'runs': rows}, f, indent=1)
  text = markdown(rows, env)
  with open(os.path.join(args.out, 'results.md'), 'w') as f:
    f.write(text)
  print(text)
  return 0


if __name__ == '__main__':
  sys.exit(main())
