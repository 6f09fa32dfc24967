"""kernelformer/reproduce/recall_plot.py: a fake recall sweep directory becomes the per-pairs tables
(M columns, missing runs as missing) and the figure, with M' read from the decoder's decode state."""
from __future__ import annotations

import json
import os

import pytest

from kernelformer.reproduce import recall_plot


def _run(tmp, workdir, kind, pairs, m, acc):
  over = {'data.num_pairs': pairs, 'model.attention.kind': kind}
  if m is not None:
    over['model.attention.num_features'] = m
  entry = {'workdir': workdir, 'kind': kind, 'task': 'mqar', 'seed': 0, 'preset': 'quick',
           'overrides': over}
  if acc is not None:
    os.makedirs(tmp / workdir)
    cfg = {'seed': 0, 'data': {'task': 'mqar', 'num_pairs': pairs},
           'model': {'num_heads': 2, 'qkv_dim': 16,
                     'attention': {'kind': kind, 'num_features': m or 64}}}
    (tmp / workdir / 'results.json').write_text(json.dumps(
        {'test_accuracy': acc, 'config': cfg, 'attention': kind, 'task': 'mqar', 'wall_time_s': 3.0}))
  return entry


def test_table_and_figure(tmp_path):
  runs = [_run(tmp_path, 'a', 'softmax', 4, None, 0.99),
          _run(tmp_path, 'b', 'linear-elu', 4, None, 0.5),
          _run(tmp_path, 'c', 'posrf-orf', 4, 4, 0.25),
          _run(tmp_path, 'd', 'trigrf-orf', 4, 4, 0.75),
          _run(tmp_path, 'e', 'posrf-orf', 4, 16, None),      # planned, not finished
          _run(tmp_path, 'f', 'nprf-rpe', 8, 16, 0.125)]
  (tmp_path / 'sweep.json').write_text(json.dumps({'name': 'recall', 'runs': runs}))
  rows = {r['workdir']: r for r in recall_plot.collect(str(tmp_path))}
  # M' is the decode state's feature dimension: trigrf has sin and cos (2M); linear-elu uses d_head.
  assert (rows['c']['mprime'], rows['d']['mprime'], rows['b']['mprime']) == (4, 8, 8)
  assert rows['c']['state'] == '4 x 8' and 'KV cache' in rows['a']['state']
  assert 'feature cache' in rows['f']['state'] and rows['e']['accuracy'] is None
  md = recall_plot.markdown(list(rows.values()))
  four, eight = md.split('**8 pairs**')
  assert '| M = 4 | M = 16 |' in four
  assert '| posrf-orf | 25.0 | — |' in four and '| trigrf-orf | 75.0 |  |' in four
  assert '| softmax | 99.0 (no M) |' in four and '| linear-elu | 50.0 (no M) |' in four
  assert '| nprf-rpe |  | 12.5 |' in eight and 'softmax' not in eight
  assert recall_plot.plot(list(rows.values()), str(tmp_path / 'fig.png'))
  assert (tmp_path / 'fig.png').stat().st_size > 1000


def test_cli_missing_directory_one_line(tmp_path, capsys):
  assert recall_plot.main([str(tmp_path / 'nope'), '--out', str(tmp_path / 'x')]) == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and 'nope' in err


def test_dropped_points_and_step_labels(tmp_path):
  """An unfinished run the current definition no longer plans is not shown as missing (a finished one
  stays), and runs of different lengths get the step count in their row label."""
  runs = [_run(tmp_path, 'a', 'softmax', 8, None, 0.35), _run(tmp_path, 'b', 'softmax', 8, None, 1.0),
          _run(tmp_path, 'c', 'posrf-orf', 8, 64, None), _run(tmp_path, 'd', 'gmm-prf', 8, 64, None)]
  runs[0]['common'] = {'num_train_steps': 600}
  runs[1]['overrides']['num_train_steps'] = 1200
  (tmp_path / 'sweep.json').write_text(json.dumps({'name': 'recall', 'runs': runs}))
  rows = recall_plot.collect(str(tmp_path), plan={'b', 'd'})
  assert sorted(r['workdir'] for r in rows) == ['a', 'b', 'd']
  md = recall_plot.markdown(rows)
  assert '| softmax, 600 steps | 35.0 (no M) |' in md and '| softmax, 1200 steps | 100.0 (no M) |' in md
  assert 'gmm-prf, preset steps' in md and 'posrf-orf' not in md


def test_best_of_learning_rate_table(tmp_path):
  """--best_of: a cell is the best accuracy over the learning rates of its point, with the winner; a
  point with unfinished runs says how many finished; every run is listed."""
  runs = []
  for wd, kind, d, lr, acc in (('a', 'softmax', 64, 1e-3, 0.5), ('b', 'softmax', 64, 1e-2, 0.9),
                               ('c', 'softmax', 128, 1e-3, 0.25), ('d', 'softmax', 128, 1e-2, None),
                               ('e', 'linear-elu', 64, 1e-2, 0.125)):
    over = {'model.attention.kind': kind, 'model.emb_dim': d, 'optim.learning_rate': lr}
    runs.append({'workdir': wd, 'kind': kind, 'task': 'mqar', 'seed': 0, 'preset': 'cpu',
                 'overrides': over})
    if acc is not None:
      os.makedirs(tmp_path / wd)
      cfg = {'seed': 0, 'model': {'emb_dim': d, 'attention': {'kind': kind}},
             'optim': {'learning_rate': lr}}
      stop = {'step': 40, 'val_accuracy': 0.995, 'threshold': 0.99} if wd == 'b' else None
      (tmp_path / wd / 'results.json').write_text(json.dumps(
          {'test_accuracy': acc, 'config': cfg, 'attention': kind, 'task': 'mqar',
           'best_val_accuracy': acc, 'best_step': 40, 'final_step': 40 if stop else 100,
           'stopped_early': stop, 'wall_time_s': 90.0}))
  (tmp_path / 'sweep.json').write_text(json.dumps({'name': 'zoology_fig2', 'runs': runs}))
  out = tmp_path / 'out' / 'z'
  assert recall_plot.main([str(tmp_path), '--out', str(out), '--best_of', 'optim.learning_rate']) == 0
  md = (tmp_path / 'out' / 'z.md').read_text()
  assert '| softmax | 90.0 [0.01] | 25.0 [0.001] (1 of 2 runs) |' in md
  assert '| linear-elu | 12.5 [0.01] |  |' in md
  assert '| softmax | 128 | 25.0 | — |' in md
  # Every finished run with its steps (an accuracy stop named) and wall time; unfinished ones not.
  finished = md.split('Finished runs')[1]
  assert '| softmax | 64 | 0.01 | 90.00 | 90.00 (40) | 40 (val > 0.99) | 2 |' in finished
  assert '| softmax | 64 | 0.001 | 50.00 | 50.00 (40) | 100 | 2 |' in finished
  assert finished.count('| softmax | 128 |') == 1
  assert (tmp_path / 'out' / 'z.png').stat().st_size > 1000
