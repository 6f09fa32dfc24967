"""scripts/report.py: cells are mean ± std over seeds, missing runs stay visible, paper numbers line up."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np

from kernelformer import registry
from kernelformer.reproduce import paper_numbers
from kernelformer.reproduce import report as report_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Test accuracies (fractions) of the finished runs; (kind, task, seed) missing = never finished.
ACC = {
    ('posrf-orf', 'listops', 0): 0.361, ('posrf-orf', 'listops', 1): 0.372,
    ('posrf-orf', 'listops', 2): 0.349,
    ('posrf-orf', 'text', 0): 0.612, ('posrf-orf', 'text', 1): 0.604,
    ('softmax', 'listops', 0): 0.380,
}
KINDS, TASKS, SEEDS = ('posrf-orf', 'softmax'), ('listops', 'text'), (0, 1, 2)


def make_sweep_dir(root):
  """A sweep directory as scripts/sweep.py leaves it: sweep.json, results.json, failures.jsonl."""
  runs = []
  for task in TASKS:
    for kind in KINDS:
      for seed in SEEDS:
        workdir = f'{task}-skyformer/kind={kind}__seed={seed}'
        runs.append({'workdir': workdir, 'label': kind, 'kind': kind, 'task': task, 'seed': seed})
        if (kind, task, seed) in ACC:
          os.makedirs(root / workdir)
          mem = {'argument_size_in_bytes': 3 * 2 ** 20, 'temp_size_in_bytes': (1 + seed) * 2 ** 20,
                 'output_size_in_bytes': 5, 'generated_code_size_in_bytes': 0}
          results = {'task': task, 'attention': kind, 'test_accuracy': ACC[(kind, task, seed)],
                     'best_val_accuracy': 0.4, 'best_step': 500, 'steps_per_sec': 10.0 + seed,
                     'compiled_memory_bytes': mem, 'num_devices': 1, 'backend': 'cpu',
                     'config': {'seed': seed}}
          (root / workdir / 'results.json').write_text(json.dumps(results))
  (root / 'sweep.json').write_text(json.dumps({'name': 'demo', 'paper': 'spectraformer',
                                               'description': 'demo sweep', 'runs': runs}))
  failure = {'workdir': 'text-skyformer/kind=softmax__seed=1', 'error': 'FloatingPointError: NaN loss'}
  (root / 'failures.jsonl').write_text(json.dumps(failure) + '\n')


def test_cells_mean_std_counts_and_paper_numbers(tmp_path):
  make_sweep_dir(tmp_path)
  rep = report_lib.build(str(tmp_path))
  assert rep.labels == ['posrf-orf', 'softmax'] and rep.tasks == ['listops', 'text']
  cell = rep.cells[('posrf-orf', 'listops')]
  values = 100 * np.array([0.361, 0.372, 0.349])
  np.testing.assert_allclose(cell.mean, values.mean(), rtol=1e-12)
  np.testing.assert_allclose(cell.std, values.std(ddof=1), rtol=1e-12)
  assert cell.text() == f'{values.mean():.2f} ± {values.std(ddof=1):.2f} (3/3)'
  assert rep.cells[('posrf-orf', 'text')].text().endswith('(2/3)')
  assert rep.cells[('softmax', 'listops')].text() == '38.00 (1/3)'  # one seed: no std
  assert rep.cells[('softmax', 'text')].text() == '— (0/3, 1 failed)'
  # Memory: argument + temp bytes, averaged over finished seeds; speed averaged likewise.
  assert rep.cells[('posrf-orf', 'listops')].memory_bytes == (3 + 2) * 2 ** 20
  assert rep.cells[('posrf-orf', 'listops')].steps_per_sec == 11.0
  # The paper's printed numbers (Spectraformer tables 2 and 3) beside ours.
  assert rep.cells[('posrf-orf', 'listops')].paper.accuracy == 37.35
  assert rep.cells[('softmax', 'text')].paper.accuracy == 61.95
  assert rep.cells[('softmax', 'text')].paper.table == 'Table 3'

  md = report_lib.markdown(rep)
  rows = {l.split(' | ')[0].strip('| `'): l for l in md.splitlines() if l.startswith('| `')}
  # The softmax row stays although its Text cell has no finished run; its average is then missing.
  first = md.split('## Training speed')[0]
  soft = [l for l in first.splitlines() if l.startswith('| `softmax`')][0].split(' | ')
  assert soft[1:] == ['38.00 (1/3)', '38.37', '— (0/3, 1 failed)', '61.95', '—', '50.16 |']
  orf = [l for l in first.splitlines() if l.startswith('| `posrf-orf`')][0].split(' | ')
  assert orf[2] == '37.35' and orf[4] == '61.60'
  assert float(orf[5]) == round((values.mean() + 100 * (0.612 + 0.604) / 2) / 2, 2)
  assert 'posrf-orf' in rows and 'Informer' in md and 'OPRF-MM' in md  # paper-only rows listed
  assert 'failed: FloatingPointError: NaN loss' in md


def test_csv_png_and_cli(tmp_path):
  make_sweep_dir(tmp_path / 'sw')
  out = tmp_path / 'out' / 'demo'
  env = {**os.environ, 'MPLBACKEND': 'Agg'}
  proc = subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'report.py'),
                         str(tmp_path / 'sw'), '--out', str(out)],
                        capture_output=True, text=True, env=env, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert '| `posrf-orf` |' in proc.stdout
  with open(str(out) + '.csv', encoding='utf-8') as f:
    cells = list(csv.DictReader(f))
  assert len(cells) == len(KINDS) * len(TASKS)
  soft_text = [c for c in cells if c['kernel'] == 'softmax' and c['task'] == 'text'][0]
  assert soft_text['finished'] == '0' and soft_text['planned'] == '3' and soft_text['failed'] == '1'
  assert soft_text['accuracy_mean'] == '' and soft_text['paper_accuracy'] == '61.95'
  with open(str(out) + '_runs.csv', encoding='utf-8') as f:
    runs = list(csv.DictReader(f))
  assert len(runs) == len(KINDS) * len(TASKS) * len(SEEDS)
  assert sum(r['status'] == 'finished' for r in runs) == len(ACC)
  png = open(str(out) + '.png', 'rb').read()
  assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 10_000
  # --paper none hides the paper columns.
  rep = report_lib.build(str(tmp_path / 'sw'), paper='none')
  assert 'paper' not in report_lib.markdown(rep).split('\n## ')[0].split('\n| ')[1]


def test_paper_numbers_are_consistent_with_the_registry():
  numbers = paper_numbers.load()
  assert {n.paper for n in numbers} == set(paper_numbers.PAPERS)
  kinds = set(registry.list_kernels())
  keys = set()
  for n in numbers:
    assert 0.0 < n.accuracy < 100.0 and n.table.startswith('Table')
    assert not n.kind or n.kind in kinds, n
    if n.kind:
      key = (n.paper, n.kind, n.task)
      assert key not in keys, key  # one printed number per kernel and task
      keys.add(key)
  # Spot checks against the printed tables.
  assert paper_numbers.lookup('skyformer', 'skyformer', 'text').accuracy == 64.70
  assert paper_numbers.lookup('skyformer', 'gaussian', 'pathfinder').accuracy == 70.73
  assert paper_numbers.lookup('kernel_learning', 'fastfood-prf', 'retrieval').accuracy == 67.90
  assert paper_numbers.lookup('spectraformer', 'posrf-mm', 'listops').accuracy == 38.05
  assert paper_numbers.lookup('spectraformer', 'softmax', 'image') is None
  # Which kernel each printed number came from: a registered name wherever the model is implemented.
  for n in numbers:
    assert bool(n.source_kernel) == bool(n.kind), n
    assert not n.source_kernel or n.source_kernel in kinds, n
  # The kernel-learning paper's Performer numbers are LRA's runs: LRA's Performer, not FAVOR+ ...
  kl = {n.task: n for n in paper_numbers.for_paper('kernel_learning') if n.model == 'Performer'}
  assert {t: (n.kind, n.source_kernel, n.accuracy) for t, n in kl.items()} == {
      'listops': ('performer-lra-listops', 'performer-lra-listops', 36.00),
      'text': ('performer-relu-det', 'performer-relu-det', 65.40),
      'retrieval': ('performer-relu-det', 'performer-relu-det', 53.82),
      'image': ('performer-relu-det', 'performer-relu-det', 42.77)}
  # ... Skyformer's Performer rows are its own code's Performer (fixed draw, its scaling) ...
  sky = [n for n in paper_numbers.for_paper('skyformer') if n.model == 'Performer']
  assert len(sky) == 5 and {(n.kind, n.source_kernel) for n in sky} == {
      ('performer-skyformer', 'performer-skyformer')}
  assert paper_numbers.lookup('skyformer', 'performer-skyformer', 'listops').accuracy == 38.02
  assert paper_numbers.lookup('skyformer', 'posrf-orf', 'listops') is None
  # ... while the paper that ran FAVOR+ keeps posrf-orf.
  assert paper_numbers.lookup('spectraformer', 'posrf-orf', 'text').source_kernel == 'posrf-orf'
  # Each paper's Table rows: the sweep of that name covers every implemented kind it printed.
  from kernelformer.reproduce import sweeps  # pylint: disable=g-import-not-at-top
  for paper in paper_numbers.PAPERS:
    swept = {p.get(sweeps.KIND_KEY) for p in sweeps.load_sweep(paper).points}
    printed = {n.kind for n in paper_numbers.for_paper(paper) if n.kind}
    assert printed <= swept, (paper, printed - swept)


def _results_dir(root, name, *, steps, seed, kind='posrf-orf', acc=0.3, preset=None, options=None):
  """A finished run as the trainer leaves it (no sweep.json): results.json with its whole config."""
  config = {'seed': seed, 'num_train_steps': steps, 'progress': False,
            'data': {'task': 'listops', 'max_length': 64},
            'model': {'num_layers': 2, 'attention': {'kind': kind, 'num_features': 64, **(options or {})}}}
  os.makedirs(root / name)
  (root / name / 'results.json').write_text(json.dumps(
      {'task': 'listops', 'attention': registry.canonical_name(kind), 'test_accuracy': acc,
       'best_val_accuracy': acc, 'best_step': steps, 'steps_per_sec': 5.0, 'config': config}))
  if preset:
    (root / name / 'sweep_point.json').write_text(json.dumps({'identity': {'preset': preset}}))


def test_runs_differing_in_more_than_the_seed_are_never_averaged(tmp_path):
  mixed = tmp_path / 'mixed'
  # One folder of ad-hoc runs: 2000, 400 and 120 steps of one kernel (the first two over two seeds,
  # one of them named by an alias), plus runs that differ only in the seed and logging.
  _results_dir(mixed, 'a', steps=2000, seed=0, acc=0.40)
  _results_dir(mixed, 'b', steps=2000, seed=1, kind='performer', acc=0.38)
  _results_dir(mixed, 'c', steps=400, seed=0, acc=0.20)
  _results_dir(mixed, 'd', steps=400, seed=1, acc=0.22)
  _results_dir(mixed, 'e', steps=120, seed=0, acc=0.10)
  rep = report_lib.build(str(mixed))
  assert sorted(rep.labels) == ['posrf-orf [num_train_steps=120]', 'posrf-orf [num_train_steps=2000]',
                                'posrf-orf [num_train_steps=400]']
  long_ = rep.cells[('posrf-orf [num_train_steps=2000]', 'listops')]
  assert long_.finished == 2 and abs(long_.mean - 39.0) < 1e-9        # alias and canonical averaged
  assert rep.cells[('posrf-orf [num_train_steps=400]', 'listops')].finished == 2
  assert rep.cells[('posrf-orf [num_train_steps=120]', 'listops')].text() == '10.00 (1/1)'
  assert len(rep.warnings) == 1 and 'num_train_steps' in rep.warnings[0] and '3 separate rows' in rep.warnings[0]
  md = report_lib.markdown(rep)
  assert '**Warning:**' in md and '| `posrf-orf [num_train_steps=400]` | 21.00 ± 1.41 (2/2) |' in md

  # An option or the preset splits too; the seed and logging fields never do.
  other = tmp_path / 'other'
  _results_dir(other, 'a', steps=400, seed=0, options={'redraw_every': 10})
  _results_dir(other, 'b', steps=400, seed=0, preset='quick')
  _results_dir(other, 'c', steps=400, seed=0, preset='tiny')
  assert len(report_lib.build(str(other)).labels) == 3
  same = tmp_path / 'same'
  _results_dir(same, 'a', steps=400, seed=0, acc=0.3)
  _results_dir(same, 'b', steps=400, seed=1, acc=0.5)
  (same / 'b' / 'results.json').write_text((same / 'b' / 'results.json').read_text().replace(
      '"progress": false', '"progress": true'))
  rep = report_lib.build(str(same))
  assert rep.labels == ['posrf-orf'] and not rep.warnings
  assert rep.cells[('posrf-orf', 'listops')].text() == '40.00 ± 14.14 (2/2)'
  # A run resumed under other code still averages (same config) but is named in a warning.
  path = same / 'b' / 'results.json'
  r = json.loads(path.read_text())
  r['code_versions'] = [{'from_step': 0, 'code_version': {'git_commit': 'a' * 40}},
                        {'from_step': 200, 'code_version': {'git_commit': 'b' * 40}}]
  path.write_text(json.dumps(r))
  rep = report_lib.build(str(same))
  assert rep.labels == ['posrf-orf'] and rep.cells[('posrf-orf', 'listops')].finished == 2
  assert len(rep.warnings) == 1 and 'b was trained by 2 code versions (from steps 0, 200' in rep.warnings[0]

  # The command prints the warning on stderr and the separate rows.
  proc = subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'report.py'), str(mixed),
                         '--out', str(tmp_path / 'rep')], capture_output=True, text=True,
                        env={**os.environ, 'MPLBACKEND': 'Agg'}, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert 'warning:' in proc.stderr and proc.stdout.count('| `posrf-orf [num_train_steps=') >= 3


def test_report_prints_the_kernel_each_paper_number_came_from(tmp_path):
  """A kernel-learning sweep's 'performer (LRA)' row: LRA's two Performers, each printed with its number."""
  root = tmp_path / 'kl'
  kinds = {'listops': 'performer-lra-listops', 'text': 'performer-relu-det'}
  runs = []
  for task, kind in kinds.items():
    workdir = f'{task}-kernel_learning/kind={kind}__seed=0'
    runs.append({'workdir': workdir, 'label': 'performer (LRA)', 'kind': kind, 'task': task, 'seed': 0})
    runs.append({'workdir': f'{task}-kernel_learning/kind=softmax__seed=0', 'label': 'softmax',
                 'kind': 'softmax', 'task': task, 'seed': 0})
    os.makedirs(root / workdir)
    (root / workdir / 'results.json').write_text(json.dumps(
        {'task': task, 'attention': kind, 'test_accuracy': 0.3, 'config': {'seed': 0}}))
  (root / 'sweep.json').write_text(json.dumps({'name': 'kl', 'paper': 'kernel_learning', 'runs': runs}))
  rep = report_lib.build(str(root))
  md = report_lib.markdown(rep)
  row = [l for l in md.splitlines() if l.startswith('| `performer (LRA)`')][0].split(' | ')
  assert row[2] == '36.00 [performer-lra-listops]' and row[4] == '65.40 [performer-relu-det]'
  soft = [l for l in md.split('## Which kernel')[0].splitlines() if l.startswith('| `softmax`')][0]
  assert '36.38 |' in soft and '[' not in soft           # the row's own kernel: no annotation
  section = md.split('## Which kernel each paper number came from')[1].split('\n## ')[0]
  assert ('| `performer (LRA)` | listops | Performer | `performer-lra-listops` | '
          '`performer-lra-listops` |') in section
  assert '| `performer (LRA)` | text | Performer | `performer-relu-det` | `performer-relu-det` |' in section
  assert '| `softmax` | text | Softmax Trans. | `softmax` | `softmax` |' in section
  out = tmp_path / 'cells.csv'
  report_lib.write_csv(rep, str(out))
  with open(out, encoding='utf-8') as f:
    cells = {(c['kernel'], c['task']): c for c in csv.DictReader(f)}
  assert cells['performer (LRA)', 'listops']['paper_kernel'] == 'performer-lra-listops'
  assert cells['performer (LRA)', 'text']['paper_kernel'] == 'performer-relu-det'


def test_report_and_workdir_share_one_fingerprint(tmp_path, monkeypatch):
  """The report groups seeds with the workdir's definition of "the same run"
  (kernelformer.training.fingerprint.config_fields): a field it excludes never splits a row, a nested
  field it keeps always does."""
  from kernelformer.training import fingerprint as fp  # pylint: disable=g-import-not-at-top

  def rows(name, edit_a, edit_b):
    root = tmp_path / name
    _results_dir(root, 'a', steps=400, seed=0, acc=0.3)
    _results_dir(root, 'b', steps=400, seed=1, acc=0.5)
    for run, edit in (('a', edit_a), ('b', edit_b)):
      path = root / run / 'results.json'
      r = json.loads(path.read_text())
      edit(r['config'])
      path.write_text(json.dumps(r))
    return report_lib.build(str(root)).labels

  def setter(dotted, value):
    def edit(config):
      node = config
      *parents, leaf = dotted.split('.')
      for p in parents:
        node = node.setdefault(p, {})
      node[leaf] = value
    return edit

  # Every field the workdir ignores is ignored by the report (one row, two seeds averaged).
  for field in fp.EXCLUDED:
    assert rows(f'ex-{field}', setter(field, 1), setter(field, 2)) == ['posrf-orf'], field
  # Nested fields that change the run split rows, at every depth.
  for field in ('model.attention.num_features', 'model.num_layers', 'data.max_length'):
    labels = rows(f'in-{field}', setter(field, 16), setter(field, 32))
    assert len(labels) == 2 and all(field.rsplit('.', 1)[1] in l for l in labels), (field, labels)
  # A run from before a field was added (fp.ADDED_FIELDS) had its known value, as in the workdir.
  for field, value in fp.ADDED_FIELDS.items():
    assert rows(f'added-{field}', setter(field, value), lambda c: None) == ['posrf-orf'], field
  # The report calls that one function (not a copy of it).
  calls = []
  real = fp.config_fields
  monkeypatch.setattr(fp, 'config_fields', lambda *a, **k: calls.append(k) or real(*a, **k))
  rows('spy', setter('log_every', 1), setter('log_every', 2))
  assert calls and all(k.get('without') == ('seed',) for k in calls)


def test_workdir_fingerprint_ignores_aliases_like_the_report(tmp_path):
  from kernelformer.training import fingerprint as fp  # pylint: disable=g-import-not-at-top
  a = fp.config_fields({'seed': 0, 'model': {'attention': {'kind': 'performer', 'impl': 'xla'}}})
  b = fp.config_fields({'seed': 0, 'model': {'attention': {'kind': 'posrf-orf', 'impl': 'pallas'}}})
  assert a == b and fp.differences(a, b) == []
  # A record written with the alias (before kinds were canonicalised) is not "another config".
  assert fp.differences({'model.attention.kind': 'performer', 'seed': 0}, b) == []


def test_paper_numbers_name_the_preset_of_their_publication_commit():
  from kernelformer.reproduce import presets  # pylint: disable=g-import-not-at-top
  # LRA's README table at 211e07d: ListOps was lra_paper's file, Pathfinder lra_pre_ee6649e's.
  assert paper_numbers.lookup('lra', 'softmax', 'listops').accuracy == 36.37
  assert paper_numbers.lookup('lra', 'softmax', 'listops').preset == 'lra_paper'
  assert paper_numbers.lookup('lra', 'softmax', 'pathfinder').accuracy == 71.40
  assert paper_numbers.lookup('lra', 'softmax', 'pathfinder').preset == 'lra_pre_ee6649e'
  assert paper_numbers.lookup('lra', 'softmax', 'image').preset == ''
  assert paper_numbers.lookup('kernel_learning', 'softmax', 'listops').preset == 'lra_paper'
  assert paper_numbers.lookup('kernel_learning', 'gmm-rks', 'text').preset == 'kernel_learning'
  assert paper_numbers.lookup('skyformer', 'skyformer', 'image').preset == 'skyformer'
  for n in paper_numbers.load():
    if n.preset:
      assert n.preset in presets.task_module(n.task).PRESETS, n


def test_an_unreadable_results_json_is_named_and_not_finished(tmp_path):
  """A half-written results.json (a run killed while writing it, a full disk) is never skipped in
  silence nor counted as finished: the report names it and counts its run as not finished."""
  alone = tmp_path / 'alone'
  _results_dir(alone, 'run', steps=10, seed=0)
  (alone / 'run' / 'results.json').write_text('{"task": "listops", "test_accur')
  proc = subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'report.py'), str(alone)],
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1, proc.stderr
  assert str(alone / 'run' / 'results.json') in proc.stderr and 'no finished run' in proc.stderr
  assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr

  beside = tmp_path / 'beside'
  _results_dir(beside, 'good', steps=10, seed=0)
  _results_dir(beside, 'torn', steps=10, seed=1)
  torn = json.loads((beside / 'torn' / 'results.json').read_text())
  (beside / 'torn' / 'config.json').write_text(json.dumps(torn['config']))   # written at its start
  (beside / 'torn' / 'results.json').write_text('{"task": "listops", "test_accur')
  rep = report_lib.build(str(beside))
  assert rep.unreadable and str(beside / 'torn' / 'results.json') in rep.unreadable[0]
  cell, = [c for c in rep.cells.values() if c.runs]
  assert len(cell.runs) == 2 and cell.finished == 1
  assert 'unreadable results.json' in [r for r in cell.runs if r.results is None][0].error
  _results_dir(beside, 'folder', steps=10, seed=2)   # a results.json that is a directory
  folder = json.loads((beside / 'folder' / 'results.json').read_text())
  (beside / 'folder' / 'config.json').write_text(json.dumps(folder['config']))
  (beside / 'folder' / 'results.json').unlink()
  (beside / 'folder' / 'results.json').mkdir()
  proc = subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'report.py'), str(beside)],
                        capture_output=True, text=True, timeout=300, env={**os.environ,
                                                                          'MPLBACKEND': 'Agg'})
  assert proc.returncode == 0 and str(beside / 'torn' / 'results.json') in proc.stderr, proc.stderr
  assert f"{beside / 'folder' / 'results.json'} is a directory" in proc.stderr, proc.stderr
  assert '(1/3, 2 failed)' in proc.stdout, proc.stdout


def test_linked_run_directories_are_read_once(tmp_path):
  """A sweep directory assembled from runs kept elsewhere (links, as ``kernelformer sweep`` finds them):
  each linked run is read; a link back up the tree neither loops nor counts a run twice."""
  elsewhere, sweep = tmp_path / 'runs', tmp_path / 'sweep'
  _results_dir(elsewhere, 'a', steps=400, seed=0, acc=0.3)
  _results_dir(elsewhere, 'b', steps=400, seed=1, acc=0.5)
  os.makedirs(sweep)
  os.symlink(elsewhere / 'a', sweep / 'a')
  os.symlink(elsewhere / 'b', sweep / 'b')
  os.symlink(sweep, sweep / 'loop')
  rep = report_lib.build(str(sweep))
  assert rep.cells[('posrf-orf', 'listops')].text() == '40.00 ± 14.14 (2/2)'


def test_runs_table_gives_steps_early_stops_and_wall_time(tmp_path):
  """Each run's steps, "(val > 0.99)" where an accuracy threshold ended it, and its wall time."""
  root = tmp_path / 'runs'
  _results_dir(root, 'stopped', steps=12544, seed=0, acc=0.99)
  _results_dir(root, 'full', steps=12544, seed=1, acc=0.98)
  for name, extra in (('stopped', {'final_step': 2352, 'wall_time_s': 1320.0, 'stopped_early': {
      'step': 2352, 'val_accuracy': 0.9914, 'threshold': 0.99}}),
                      ('full', {'final_step': 12544, 'wall_time_s': 6600.0, 'stopped_early': None})):
    path = root / name / 'results.json'
    path.write_text(json.dumps({**json.loads(path.read_text()), **extra}))
  rep = report_lib.build(str(root))
  rows = {line.split(' | ')[0][3:-1]: line.split(' | ') for line in report_lib.markdown(rep).splitlines()
          if line.startswith('| `stopped`') or line.startswith('| `full`')}
  assert rows['stopped'][6:8] == ['2352 (val > 0.99)', '22.0'] and rows['full'][6:8] == ['12544', '110.0']
  report_lib.write_csv(rep, str(tmp_path / 'rep.csv'))
  with open(tmp_path / 'rep_runs.csv', encoding='utf-8') as f:
    runs = {r['workdir']: r for r in csv.DictReader(f)}
  assert runs['stopped']['stopped_early_step'] == '2352' and runs['full']['stopped_early_step'] == ''
  assert runs['full']['final_step'] == '12544' and runs['full']['wall_time_s'] == '6600.0'
