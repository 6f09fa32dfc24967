"""A sweep directory as tables: kernels x tasks, mean +- std over seeds, the paper's number beside ours.

Reads what the runs left behind and nothing else: ``SWEEP_DIR/sweep.json`` (every planned run, so a
run that never finished still gets its row and its "—" cell), each run's ``results.json`` (test
accuracy of the best-validation checkpoint, ``steps_per_sec``, ``compiled_memory_bytes``) and
``sweep_point.json``, and ``failures.jsonl``. Writes

* ``<out>.md``: the accuracy table (``mean ± std (finished/planned)`` per cell, sample std over seeds,
  the paper's printed number in the next column), speed and compiled memory per cell, the paper's rows
  for models this repository does not implement, and one line per run;
* ``<out>.csv`` (one row per kernel x task cell) and ``<out>_runs.csv`` (one row per run);
* ``<out>.png``: the LRA-style plot, test accuracy against training speed (steps/s), point area
  proportional to compiled memory, one panel per task.

Runs are grouped by their config fingerprint (``kernelformer.training.fingerprint.config_fields`` less
the seed; docs/architecture.md): a cell averages only runs of one fingerprint, runs of one row and task
that differ in anything else become separate rows named by what differs, and ``Report.warnings`` says
so, as it names a run trained by more than one code version (results.json ``code_versions``).

"Compiled memory" is XLA's ``argument + temp`` bytes of the compiled train step: the state and batch it
reads plus its scratch (its outputs alias the donated state, so they are not added). It is what the
compiler planned for one device, not a measured peak.
"""
from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import math
import os
from typing import Any, Optional

from kernelformer.reproduce import paper_numbers
from kernelformer.reproduce import sweeps
from kernelformer.training import fingerprint as fp

TASK_ORDER = ('listops', 'text', 'retrieval', 'pathfinder', 'image')
TASK_TITLES = {'listops': 'ListOps', 'text': 'Text', 'retrieval': 'Retrieval',
               'pathfinder': 'Pathfinder', 'image': 'Image'}
MISSING = '—'
# Runs differing only in the seed (and in fingerprint.EXCLUDED, what cannot change a run's numbers)
# average.
FINGERPRINT_IGNORES = ('seed',)


@dataclasses.dataclass
class RunRecord:
  workdir: str                      # relative to the sweep directory
  label: str
  kind: str
  task: str
  seed: Optional[int]
  results: Optional[dict] = None    # results.json, None while unfinished
  error: str = ''                   # latest failure, if unfinished and it failed
  preset: Optional[str] = None      # from sweep.json / sweep_point.json, when a sweep made the run

  @property
  def fingerprint(self) -> Optional[tuple]:
    """Everything that made this run except the seed (None: unfinished, or no config recorded)."""
    config = (self.results or {}).get('config')
    if not isinstance(config, dict):
      return None
    flat = fp.config_fields(config, without=FINGERPRINT_IGNORES)
    for k, v in fp.ADDED_FIELDS.items():   # a run from before the field existed had its known value
      flat.setdefault(k, v)
    if self.preset is not None:
      flat['(preset)'] = self.preset
    return tuple(sorted((k, json.dumps(v, sort_keys=True, default=str)) for k, v in flat.items()))

  @property
  def accuracy(self) -> Optional[float]:
    return None if self.results is None else 100.0 * float(self.results['test_accuracy'])

  @property
  def steps_per_sec(self) -> Optional[float]:
    v = None if self.results is None else self.results.get('steps_per_sec')
    return float(v) if v else None

  @property
  def memory_bytes(self) -> Optional[int]:
    m = None if self.results is None else self.results.get('compiled_memory_bytes')
    if not m:
      return None
    return int(m.get('argument_size_in_bytes', 0)) + int(m.get('temp_size_in_bytes', 0))


@dataclasses.dataclass
class Cell:
  label: str
  kind: str
  task: str
  runs: list[RunRecord]
  paper: Optional[paper_numbers.PaperNumber] = None

  @property
  def accuracies(self) -> list[float]:
    return [r.accuracy for r in self.runs if r.accuracy is not None]

  @property
  def finished(self) -> int:
    return len(self.accuracies)

  @property
  def failed(self) -> int:
    return sum(1 for r in self.runs if r.results is None and r.error)

  @property
  def mean(self) -> Optional[float]:
    a = self.accuracies
    return sum(a) / len(a) if a else None

  @property
  def std(self) -> Optional[float]:
    a = self.accuracies
    if len(a) < 2:
      return None
    m = sum(a) / len(a)
    return math.sqrt(sum((x - m) ** 2 for x in a) / (len(a) - 1))

  def _mean_of(self, attr: str) -> Optional[float]:
    v = [getattr(r, attr) for r in self.runs if getattr(r, attr) is not None]
    return sum(v) / len(v) if v else None

  @property
  def steps_per_sec(self) -> Optional[float]:
    return self._mean_of('steps_per_sec')

  @property
  def memory_bytes(self) -> Optional[float]:
    return self._mean_of('memory_bytes')

  def text(self) -> str:
    """``mean ± std (finished/planned)``; "—" when nothing finished."""
    n, planned = self.finished, len(self.runs)
    tail = f'{n}/{planned}' + (f', {self.failed} failed' if self.failed else '')
    if not n:
      return f'{MISSING} ({tail})'
    spread = f' ± {self.std:.2f}' if self.std is not None else ''
    return f'{self.mean:.2f}{spread} ({tail})'


@dataclasses.dataclass
class Report:
  name: str
  description: str
  paper: str
  labels: list[str]
  tasks: list[str]
  cells: dict[tuple[str, str], Cell]
  runs: list[RunRecord]
  paper_only: list[tuple[str, str, dict[str, float]]]   # (model, citation, task -> accuracy)
  warnings: list[str] = dataclasses.field(default_factory=list)   # runs split by fingerprint
  # '<path> <reason>' for each results.json that cannot be read (its run counts as not finished)
  unreadable: list[str] = dataclasses.field(default_factory=list)


def read_json(path: str) -> Optional[Any]:
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def collect(sweep_dir: str, unreadable: Optional[list] = None) -> tuple[dict, list[RunRecord]]:
  """The sweep's metadata and every run: planned ones (sweep.json) and any finished one found.

  A results.json that cannot be read (half-written, damaged) is appended to ``unreadable`` as
  '<path> <reason>', and its run counts as not finished (with that reason as its error).
  """
  meta = read_json(os.path.join(sweep_dir, sweeps.SWEEP_FILE)) or {}
  records: dict[str, RunRecord] = {}
  for e in meta.get('runs', []):
    records[e['workdir']] = RunRecord(e['workdir'], e.get('label') or e.get('kind', ''),
                                      fp.canonical_kind(e.get('kind', '')), e.get('task', ''),
                                      e.get('seed'), preset=e.get('preset'))
  # Linked run directories count (a sweep directory assembled from runs kept elsewhere, as the sweep
  # itself finds them); a link back up the tree is entered once.
  seen = set()
  for root, dirs, files in os.walk(sweep_dir, followlinks=True):
    real = os.path.realpath(root)
    if real in seen:
      dirs[:] = []
      continue
    seen.add(real)
    dirs.sort()
    if not {sweeps.RESULTS_FILE, sweeps.RECORD_NEXT} & {*files, *dirs}:   # a directory too: unreadable
      continue
    dirs[:] = []  # a run directory holds no other runs
    rel = os.path.relpath(root, sweep_dir).replace(os.sep, '/')
    results, reason = sweeps.read_results(root)   # the trainer's reader
    point = read_json(os.path.join(root, sweeps.POINT_FILE)) or {}
    rec = records.get(rel)
    if rec is None:
      # Unreadable results: the run's own config.json (written when it started) names it.
      about = results or {'config': read_json(os.path.join(root, 'config.json')) or {}}
      config = about.get('config') if isinstance(about.get('config'), dict) else {}
      kind = fp.canonical_kind(point.get('kind') or about.get('attention') or
                               (config.get('model') or {}).get('attention', {}).get('kind') or '')
      seed = point.get('seed', config.get('seed'))
      rec = records[rel] = RunRecord(rel, point.get('label') or kind or rel, kind,
                                     point.get('task') or about.get('task') or
                                     (config.get('data') or {}).get('task', ''), seed,
                                     preset=(point.get('identity') or {}).get('preset'))
    if results is None:
      path = os.path.join(root, sweeps.RESULTS_FILE)
      if unreadable is not None:
        unreadable.append(f'{path} {reason}')
      rec.error = f'unreadable {sweeps.RESULTS_FILE} ({reason})'
      continue
    rec.results = results
  failures = os.path.join(sweep_dir, sweeps.FAILURES_FILE)
  if os.path.isfile(failures):
    with open(failures, encoding='utf-8') as f:
      for line in f:
        line = line.strip()
        if not line:
          continue
        e = json.loads(line)
        rec = records.get(e.get('workdir'))
        if rec is not None and rec.results is None and not rec.error.startswith('unreadable'):
          rec.error = e.get('error', 'failed')   # the latest failure wins
  return meta, list(records.values())


def build(sweep_dir: str, paper: Optional[str] = None) -> Report:
  """Groups the runs of ``sweep_dir`` into cells; ``paper`` overrides the sweep's own ('none': no paper)."""
  unreadable: list[str] = []
  meta, runs = collect(sweep_dir, unreadable)
  warnings = split_by_fingerprint(runs) + mixed_code_warnings(runs)
  paper = meta.get('paper', '') if paper is None else ('' if paper == 'none' else paper)
  if paper and paper not in paper_numbers.PAPERS:
    raise ValueError(f'unknown paper {paper!r}; valid: {", ".join(sorted(paper_numbers.PAPERS))}')
  labels: list[str] = []
  tasks_seen: list[str] = []
  cells: dict[tuple[str, str], Cell] = {}
  for r in runs:
    if r.label not in labels:
      labels.append(r.label)
    if r.task not in tasks_seen:
      tasks_seen.append(r.task)
    cell = cells.setdefault((r.label, r.task), Cell(r.label, r.kind, r.task, []))
    cell.runs.append(r)
  tasks = [t for t in TASK_ORDER if t in tasks_seen] + [t for t in tasks_seen if t not in TASK_ORDER]
  for label in labels:  # every row gets every column, finished or not
    kind = next((c.kind for (l, _), c in cells.items() if l == label), '')
    for t in tasks:
      cells.setdefault((label, t), Cell(label, kind, t, []))
  paper_only = []
  if paper:
    for cell in cells.values():
      cell.paper = paper_numbers.lookup(paper, cell.kind, cell.task)
    our_kinds = {c.kind for c in cells.values()}
    models: dict[str, tuple[str, dict[str, float]]] = {}
    for n in paper_numbers.for_paper(paper):
      if n.kind in our_kinds and n.kind:
        continue
      models.setdefault(n.model, (n.cite(), {}))[1][n.task] = n.accuracy
    paper_only = [(m, c, v) for m, (c, v) in models.items()]
  return Report(name=meta.get('name') or os.path.basename(os.path.abspath(sweep_dir)),
                description=meta.get('description', ''), paper=paper, labels=labels, tasks=tasks,
                cells=cells, runs=runs, paper_only=paper_only, warnings=warnings,
                unreadable=unreadable)


def _short(key: str) -> str:
  return key if key == '(preset)' else key.rsplit('.', 1)[-1]


def mixed_code_warnings(runs: list[RunRecord]) -> list[str]:
  """A warning per finished run that was resumed under other code (results.json ``code_versions``)."""
  out = []
  for r in runs:
    segments = (r.results or {}).get('code_versions')
    if isinstance(segments, list) and len(segments) > 1:
      steps = ', '.join(str(s.get('from_step')) for s in segments if isinstance(s, dict))
      out.append(f'{r.workdir} was trained by {len(segments)} code versions (from steps {steps}; '
                 f'results.json code_versions)')
  return out


def split_by_fingerprint(runs: list[RunRecord]) -> list[str]:
  """Relabels runs so that one (label, task) holds one fingerprint; returns a warning per split.

  Runs of a label and task whose finished configs differ in more than the seed get the label
  ``<label> [<field>=<value>, ...]`` (the fields that differ between the groups). Unfinished runs
  (no config yet) stay with the group when there is one, and form their own row otherwise.
  """
  groups: dict[tuple[str, str], list[RunRecord]] = {}
  for r in runs:
    groups.setdefault((r.label, r.task), []).append(r)
  warnings = []
  for (label, task), members in groups.items():
    by_fp: dict[Optional[tuple], list[RunRecord]] = {}
    for r in members:
      by_fp.setdefault(r.fingerprint, []).append(r)
    finished = [fp for fp in by_fp if fp is not None]
    if len(finished) <= 1:
      continue
    dicts = {fp: dict(fp) for fp in finished}
    keys = sorted({k for d in dicts.values() for k in d}
                  - {k for k in dicts[finished[0]]
                     if all(d.get(k) == dicts[finished[0]][k] for d in dicts.values())})
    used = set()
    for fp in finished:
      shown = ', '.join(f'{_short(k)}={json.loads(dicts[fp][k]) if k in dicts[fp] else MISSING}'
                        for k in keys[:3]) + (', …' if len(keys) > 3 else '')
      new = f'{label} [{shown}]'
      while new in used:
        new += "'"
      used.add(new)
      for r in by_fp[fp]:
        r.label = new
    for r in by_fp.get(None, []):
      r.label = f'{label} [not finished]'
    warnings.append(
        f'{sum(len(by_fp[fp]) for fp in finished)} finished runs of {label!r} on {task} differ in '
        f'more than the seed ({", ".join(keys[:6])}{", ..." if len(keys) > 6 else ""}): '
        f'{len(finished)} separate rows, not averaged')
  return warnings


# ----------------------------------------------------------------------------------------------------
# Rendering.


def _title(task: str) -> str:
  return TASK_TITLES.get(task, task)


def _fmt(v: Optional[float], spec: str) -> str:
  return MISSING if v is None else format(v, spec)


def _mib(v: Optional[float]) -> Optional[float]:
  return None if v is None else v / 2 ** 20


def _row_average(report: Report, label: str) -> tuple[Optional[float], Optional[float]]:
  """Mean over tasks of our cell means and of the paper's numbers (None unless every task has one)."""
  cells = [report.cells[(label, t)] for t in report.tasks]
  ours = [c.mean for c in cells]
  theirs = [c.paper.accuracy if c.paper else None for c in cells]
  avg = lambda v: sum(v) / len(v) if v and all(x is not None for x in v) else None  # noqa: E731
  return avg(ours), avg(theirs)


def _paper_text(cell: 'Cell', label: str) -> str:
  """The paper's number, with ``[kernel]`` where the kernel behind it is not the row's name."""
  if not cell.paper:
    return MISSING
  text = f'{cell.paper.accuracy:.2f}'
  if cell.paper.source_kernel and cell.paper.source_kernel != label:
    text += f' [{cell.paper.source_kernel}]'
  return text


def markdown(report: Report, sweep_dir: str = '') -> str:
  lines = [f'# Sweep `{report.name}`: test accuracy (%)', '']
  if report.warnings:
    lines += [f'**Warning:** {w}.' for w in report.warnings] + ['']
  if report.description:
    lines += [report.description + '.', '']
  lines += [f'Generated by `scripts/report.py {sweep_dir}` on '
            f'{datetime.date.today().isoformat()}. Cells: mean ± sample std over seeds '
            f'(finished/planned runs); {MISSING} = no finished run. Test accuracy of the checkpoint '
            "each run's eval.test_checkpoint names (results.json tested_checkpoint; 'best' by "
            'default: the best validation accuracy).', '']
  if report.paper:
    lines += [f'"paper": the number printed in {paper_numbers.PAPERS[report.paper]} '
              '(kernelformer/reproduce/paper_numbers.csv), with [the kernel it came from] where that is '
              'not the row\'s name; every one is listed under "Which kernel each paper number came '
              'from".', '']
  multi = len(report.tasks) > 1
  head = ['kernel']
  for t in report.tasks:
    head += [_title(t)] + (['paper'] if report.paper else [])
  if multi:
    head += ['avg'] + (['paper avg'] if report.paper else [])
  lines += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for label in report.labels:
    row = [f'`{label}`']
    for t in report.tasks:
      c = report.cells[(label, t)]
      row.append(c.text())
      if report.paper:
        row.append(_paper_text(c, label))
    if multi:
      ours, theirs = _row_average(report, label)
      row.append(_fmt(ours, '.2f'))
      if report.paper:
        row.append(_fmt(theirs, '.2f'))
    lines.append('| ' + ' | '.join(row) + ' |')

  if report.paper:
    lines += ['', '## Which kernel each paper number came from', '',
              'The kernel behind each printed number (`source_kernel` in paper_numbers.csv), beside the '
              'kernel this sweep ran for that cell.', '']
    head = ['row', 'task', 'paper model', 'paper kernel', 'ran here', 'where']
    lines += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for label in report.labels:
      for t in report.tasks:
        c = report.cells[(label, t)]
        if c.paper:
          lines.append('| ' + ' | '.join([
              f'`{label}`', t, c.paper.model, f'`{c.paper.source_kernel}`', f'`{c.kind}`',
              f'{c.paper.cite()}; {c.paper.where}' +
              (f'; preset `{c.paper.preset}`' if c.paper.preset else '')]) + ' |')

  lines += ['', '## Training speed and compiled memory', '',
            'Mean over finished runs: training steps/s (excluding the compiling first step) and XLA\'s '
            'argument + temp bytes of the compiled train step, in MiB.', '']
  head = ['kernel'] + [f'{_title(t)} {what}' for t in report.tasks for what in ('steps/s', 'MiB')]
  lines += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for label in report.labels:
    row = [f'`{label}`']
    for t in report.tasks:
      c = report.cells[(label, t)]
      row += [_fmt(c.steps_per_sec, '.2f'), _fmt(_mib(c.memory_bytes), '.1f')]
    lines.append('| ' + ' | '.join(row) + ' |')

  if report.paper_only:
    lines += ['', '## Paper rows without a run here', '',
              'Models the paper reports that this sweep did not train (not implemented in this '
              'repository, or not part of the sweep).', '']
    head = ['model (paper)', 'where'] + [_title(t) for t in report.tasks]
    lines += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for model, cite, values in report.paper_only:
      lines.append('| ' + ' | '.join([model, cite] + [_fmt(values.get(t), '.2f')
                                                      for t in report.tasks]) + ' |')

  lines += ['', '## Runs', '']
  head = ['run', 'task', 'kernel', 'seed', 'test acc', 'best val acc (step)', 'steps', 'wall min',
          'steps/s', 'MiB', 'status']
  lines += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for r in sorted(report.runs, key=lambda r: (report.tasks.index(r.task) if r.task in report.tasks
                                              else 99, report.labels.index(r.label), str(r.seed))):
    res = r.results or {}
    best = (f'{100 * res["best_val_accuracy"]:.2f} ({res.get("best_step")})'
            if 'best_val_accuracy' in res else MISSING)
    status = 'finished' if r.results else (f'failed: {r.error}' if r.error else 'not finished')
    lines.append('| ' + ' | '.join([
        f'`{r.workdir}`', r.task, f'`{r.label}`', str(r.seed), _fmt(r.accuracy, '.2f'), best,
        steps_text(res), _fmt(wall_minutes(res), '.1f'), _fmt(r.steps_per_sec, '.2f'), _fmt(_mib(r.memory_bytes), '.1f'),
        status.replace('|', '/')]) + ' |')
  return '\n'.join(lines) + '\n'


def steps_text(results: dict) -> str:
  """The steps a finished run trained, and why it ended there when an accuracy threshold stopped it."""
  if 'final_step' not in results:
    return MISSING
  stop = results.get('stopped_early')
  if isinstance(stop, dict) and 'threshold' in stop:
    return f'{results["final_step"]} (val > {stop["threshold"]:g})'
  return str(results['final_step'])


def wall_minutes(results: dict) -> Optional[float]:
  """The run's wall time in minutes (results.json ``wall_time_s``: every stretch of it, compiling,
  evaluation and the test included; time between stretches not)."""
  seconds = results.get('wall_time_s')
  return None if seconds is None else seconds / 60.0


CELL_FIELDS = ('kernel', 'kind', 'task', 'finished', 'planned', 'failed', 'accuracy_mean',
               'accuracy_std', 'accuracies', 'paper_accuracy', 'paper_kernel', 'paper_table',
               'steps_per_sec', 'compiled_memory_bytes')
RUN_FIELDS = ('workdir', 'kernel', 'kind', 'task', 'seed', 'test_accuracy', 'best_val_accuracy',
              'best_step', 'final_step', 'stopped_early_step', 'wall_time_s', 'steps_per_sec',
              'compiled_memory_bytes', 'num_devices', 'backend', 'status', 'error')


def _blank(v: Any) -> Any:
  return '' if v is None else v


def write_csv(report: Report, path: str) -> None:
  """One row per cell (``path``) and one per run (``<path stem>_runs.csv``)."""
  with open(path, 'w', encoding='utf-8', newline='') as f:
    w = csv.writer(f, lineterminator='\n')
    w.writerow(CELL_FIELDS)
    for label in report.labels:
      for t in report.tasks:
        c = report.cells[(label, t)]
        w.writerow([label, c.kind, t, c.finished, len(c.runs), c.failed, _blank(c.mean),
                    _blank(c.std), ' '.join(f'{a:.4f}' for a in c.accuracies),
                    _blank(c.paper.accuracy if c.paper else None),
                    c.paper.source_kernel if c.paper else '', c.paper.cite() if c.paper else '', _blank(c.steps_per_sec),
                    _blank(None if c.memory_bytes is None else int(c.memory_bytes))])
  runs_path = os.path.splitext(path)[0] + '_runs.csv'
  with open(runs_path, 'w', encoding='utf-8', newline='') as f:
    w = csv.writer(f, lineterminator='\n')
    w.writerow(RUN_FIELDS)
    for r in report.runs:
      res = r.results or {}
      w.writerow([r.workdir, r.label, r.kind, r.task, _blank(r.seed), _blank(r.accuracy),
                  _blank(100 * res['best_val_accuracy'] if 'best_val_accuracy' in res else None),
                  _blank(res.get('best_step')), _blank(res.get('final_step')),
                  _blank((res.get('stopped_early') or {}).get('step')
                         if isinstance(res.get('stopped_early'), dict) else None),
                  _blank(res.get('wall_time_s')), _blank(r.steps_per_sec), _blank(r.memory_bytes),
                  _blank(res.get('num_devices')), _blank(res.get('backend')),
                  'finished' if r.results else ('failed' if r.error else 'not finished'), r.error])


def plot(report: Report, path: str) -> bool:
  """The accuracy-vs-speed PNG; False (nothing written) when no run has finished."""
  from kernelformer.bench import output  # pylint: disable=g-import-not-at-top
  plt = output.pyplot()
  panels = [t for t in report.tasks
            if any(report.cells[(l, t)].finished and report.cells[(l, t)].steps_per_sec
                   for l in report.labels)]
  if not panels:
    return False
  mems = [c.memory_bytes for c in report.cells.values() if c.finished and c.memory_bytes]
  biggest = max(mems) if mems else 1.0
  fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
  cmap = plt.get_cmap('tab10')
  for ax, task in zip(axes[0], panels):
    for i, label in enumerate(report.labels):
      c = report.cells[(label, task)]
      if not c.finished or not c.steps_per_sec:
        continue
      size = 60 + 900 * (c.memory_bytes / biggest if c.memory_bytes else 0.0)
      ax.scatter([c.steps_per_sec], [c.mean], s=size, alpha=0.55, color=cmap(i % 10),
                 edgecolors='black', linewidths=0.6)
      if c.std is not None:
        ax.errorbar([c.steps_per_sec], [c.mean], yerr=[c.std], color='black', lw=0.8, capsize=3)
      ax.annotate(label, (c.steps_per_sec, c.mean), textcoords='offset points', xytext=(8, 6),
                  fontsize=8)
    ax.set_title(f'{_title(task)} (point area ∝ compiled memory)', fontsize=10)
    ax.set_xlabel('training speed (steps/s)')
    ax.set_ylabel('test accuracy (%)')
    ax.grid(alpha=0.3)
    ax.margins(0.25)
  fig.suptitle(f'sweep {report.name}: accuracy vs speed, mean ± std over seeds', fontsize=11)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


def write(report: Report, out: str, sweep_dir: str = '') -> dict[str, str]:
  """Writes ``<out>.md``, ``<out>.csv``, ``<out>_runs.csv`` and ``<out>.png``; returns their paths."""
  parent = os.path.dirname(os.path.abspath(out))
  os.makedirs(parent, exist_ok=True)
  paths = {'md': out + '.md', 'csv': out + '.csv', 'runs_csv': out + '_runs.csv', 'png': out + '.png'}
  with open(paths['md'], 'w', encoding='utf-8') as f:
    f.write(markdown(report, sweep_dir))
  write_csv(report, paths['csv'])
  if not plot(report, paths['png']):
    del paths['png']
  return paths

