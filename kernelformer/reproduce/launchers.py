"""Sweeps that leave the machine: SLURM through submitit, and Cloud TPU pod slices through gcloud.

A sweep's points, directories and report are the same whichever launcher trains them
(``kernelformer.reproduce.sweeps``); a launcher only decides *where* each point's
``python -m kernelformer train ...`` runs.

SLURM (``kernelformer sweep --launcher slurm``). One SLURM job per unfinished point, submitted with
submitit (``submitit.AutoExecutor``). Each job runs :class:`TrainPoint`, which starts the point's train
command as a child process (so JAX state and signals stay per run) and returns its exit code. The
bookkeeping lives in ``SWEEP_DIR/.slurm/``: submitit's own folder per job (the pickled call, stdout and
stderr) and ``jobs.json`` (point -> job id, submission time, command). The rules:

* re-running the same command submits only the points that are neither finished (``results.json``) nor
  queued/running in the scheduler (``squeue``), so it is the way to re-submit what failed, was cancelled
  or was lost; every re-submitted point resumes from its own checkpoint (the trainer resumes by itself);
* preemption and time-outs: the job is submitted with ``--signal=USR2@<signal_delay_s>``; submitit calls
  :meth:`TrainPoint.checkpoint`, which forwards SIGTERM to the child (the trainer saves a checkpoint and
  exits 143) and requeues the same call, which resumes;
* a multi-node point (``--nodes N``) runs one task per node; each task's child inherits SLURM's
  environment (``SLURM_JOB_ID``, ``SLURM_NTASKS`` > 1), from which the trainer's CLI starts
  ``jax.distributed`` with JAX's own SLURM cluster detection;
* ``--status`` reports, per point: finished (with its test accuracy), queued / running (job id, from
  ``squeue``), stopped (no job in the queue, a checkpoint at step N: re-running resumes it), failed
  (job gone, no checkpoint, last line of its log), or not submitted. It needs no accounting database
  (``sacct``), which small clusters often lack.

TPU pod slices (``--launcher tpu-pod``). ``gcloud compute tpus tpu-vm ssh NAME --zone Z --worker=all
--command ...`` runs one command on every host of the slice at once; a point is one such command with
``--distributed`` (``jax.distributed.initialize()`` reads the slice's topology from the TPU VM
metadata). :func:`tpu_pod_commands` writes the install step and one command per unfinished point, with
the work directory on a filesystem every host mounts (``--tpu_sweep_dir``); ``--submit`` runs them in
order. docs/reproduce.md ("Sweeps on clusters") shows the commands.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Optional, Sequence

from kernelformer.reproduce import sweeps

SLURM_DIR = '.slurm'
JOBS_FILE = 'jobs.json'
TRAIN_LOG = 'train.log'
# squeue's state codes that mean "the scheduler still has it" (not to be submitted again).
_ACTIVE = {'PD': 'queued', 'CF': 'queued', 'R': 'running', 'CG': 'running', 'RQ': 'queued',
           'RS': 'queued', 'RH': 'queued', 'S': 'running', 'ST': 'running', 'SI': 'running',
           'SO': 'running', 'RD': 'queued'}


class LauncherError(sweeps.SweepError):
  """A launcher that cannot do what was asked (no scheduler, bad option); one line for the user."""


# ----------------------------------------------------------------------------------------------------
# The job body.


class TrainPoint:
  """What one SLURM job runs: the point's train command as a child process, resumable.

  Submitit pickles this object, runs ``__call__`` on the node and, on SIGUSR2 (preemption or the time
  limit approaching), calls :meth:`checkpoint` and requeues what it returns. It subclasses
  ``submitit.helpers.Checkpointable`` only by duck typing (``checkpoint`` returning a
  ``DelayedSubmission``), so importing this module does not import submitit.
  """

  def __init__(self, command: Sequence[str], workdir: str, cwd: str, env: dict[str, str]):
    self.command = list(command)
    self.workdir = workdir
    self.cwd = cwd
    self.env = dict(env)
    self._proc: Optional[subprocess.Popen] = None

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if k != '_proc'}

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._proc = None

  def __call__(self) -> int:
    os.makedirs(self.workdir, exist_ok=True)
    env = {**os.environ, **self.env}   # SLURM_* of this task reach the trainer (multi-node detection)
    with open(os.path.join(self.workdir, TRAIN_LOG), 'a', encoding='utf-8') as log:
      log.write(f'# {datetime.datetime.now().isoformat(timespec="seconds")} SLURM job '
                f'{os.environ.get("SLURM_JOB_ID", "?")} task {os.environ.get("SLURM_PROCID", "0")}: '
                f'{shlex.join(self.command)}\n')
      log.flush()
      self._proc = subprocess.Popen(self.command, cwd=self.cwd, env=env, stdout=log,
                                    stderr=subprocess.STDOUT)
      # scancel (and a node's shutdown) send SIGTERM to this process, which submitit ignores; pass it
      # on, so the trainer saves a checkpoint and exits (143) instead of outliving its job.
      signal.signal(signal.SIGTERM, self._forward_sigterm)
      # Poll rather than block in wait(): submitit's SIGUSR2 handler runs checkpoint() in this thread,
      # and a wait() interrupted here would hold the lock checkpoint()'s own wait() needs.
      while (rc := self._proc.poll()) is None:
        time.sleep(0.2)
    if rc != 0:
      raise RuntimeError(f'{shlex.join(self.command[:4])} ... exited with code {rc} '
                         f'(log: {os.path.join(self.workdir, TRAIN_LOG)})')
    return rc

  def _forward_sigterm(self, signum, frame):  # pylint: disable=unused-argument
    if self._proc is not None and self._proc.poll() is None:
      self._proc.send_signal(signal.SIGTERM)

  def checkpoint(self, *args: Any, **kwargs: Any):
    """Preempted or out of time: let the trainer save (SIGTERM, it exits 143), then requeue."""
    import submitit  # pylint: disable=g-import-not-at-top
    proc = self._proc
    if proc is not None and proc.poll() is None:
      proc.send_signal(signal.SIGTERM)
      try:
        proc.wait(timeout=float(os.environ.get('KERNELFORMER_SLURM_SAVE_WAIT_S', '300')))
      except subprocess.TimeoutExpired:
        proc.kill()
    return submitit.helpers.DelayedSubmission(TrainPoint(self.command, self.workdir, self.cwd, self.env))


# ----------------------------------------------------------------------------------------------------
# SLURM.


@dataclasses.dataclass
class SlurmOptions:
  partition: str = ''
  nodes: int = 1
  gpus_per_node: int = 0
  cpus_per_task: int = 1
  time_min: int = 60 * 24
  mem_gb: float = 0.0
  signal_delay_s: int = 120          # SIGUSR2 this long before the time limit (the trainer saves)
  extra: tuple[tuple[str, str], ...] = ()   # --slurm_args KEY=VALUE: any other sbatch option

  @staticmethod
  def parse_extra(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
      for part in filter(None, (p.strip() for p in item.split(','))):
        key, sep, value = part.partition('=')
        key = key.strip().lstrip('-').replace('-', '_')
        if not key or not sep:
          raise LauncherError(f'--slurm_args expects KEY=VALUE (sbatch option without dashes), '
                              f'got {part!r}')
        out.append((key, value.strip()))
    return tuple(out)

  def validate(self) -> None:
    for name in ('nodes', 'cpus_per_task', 'time_min'):
      if getattr(self, name) < 1:
        raise LauncherError(f'--{name} must be at least 1, got {getattr(self, name)}')
    if self.gpus_per_node < 0:
      raise LauncherError(f'--gpus_per_node must be >= 0, got {self.gpus_per_node}')

  def executor_parameters(self) -> dict[str, Any]:
    params: dict[str, Any] = dict(nodes=self.nodes, tasks_per_node=1, cpus_per_task=self.cpus_per_task,
                                  timeout_min=self.time_min, slurm_signal_delay_s=self.signal_delay_s)
    if self.partition:
      params['slurm_partition'] = self.partition
    if self.gpus_per_node:
      params['gpus_per_node'] = self.gpus_per_node
    if self.mem_gb:
      params['mem_gb'] = self.mem_gb
    if self.extra:
      params['slurm_additional_parameters'] = dict(self.extra)
    return params


def slurm_available() -> Optional[str]:
  """None if ``sbatch`` and ``squeue`` answer, else why not (one line)."""
  for tool in ('sbatch', 'squeue'):
    if not any(os.access(os.path.join(d, tool), os.X_OK)
               for d in os.environ.get('PATH', '').split(os.pathsep) if d):
      return f'{tool} is not on PATH (no SLURM client on this machine)'
  try:
    out = subprocess.run(['squeue', '-h', '-o', '%i'], capture_output=True, text=True, timeout=20)
  except (OSError, subprocess.TimeoutExpired) as e:
    return f'squeue did not answer ({type(e).__name__})'
  if out.returncode != 0:
    return f'squeue failed: {(out.stderr or out.stdout).strip().splitlines()[-1:] or ["?"]}'
  return None


def queue_states(job_ids: Sequence[str]) -> dict[str, str]:
  """job id -> 'queued' | 'running' for the jobs the scheduler still holds (``squeue``)."""
  ids = [str(j) for j in job_ids if j]
  if not ids:
    return {}
  out = subprocess.run(['squeue', '-h', '-o', '%i %t', '-j', ','.join(ids)], capture_output=True,
                       text=True, timeout=30)
  states = {}
  for line in out.stdout.splitlines():
    parts = line.split()
    if len(parts) == 2 and parts[1] in _ACTIVE:
      states[parts[0].split('_')[0]] = _ACTIVE[parts[1]]
  return states


def _jobs_path(sweep_dir: str) -> str:
  return os.path.join(sweep_dir, SLURM_DIR, JOBS_FILE)


def read_jobs(sweep_dir: str) -> dict[str, dict]:
  path = _jobs_path(sweep_dir)
  if not os.path.isfile(path):
    return {}
  try:
    with open(path, encoding='utf-8') as f:
      jobs = json.load(f)
  except (OSError, ValueError) as e:
    raise LauncherError(f'{path} is unreadable ({type(e).__name__}); move it aside to forget the '
                        f'recorded jobs') from None
  if not isinstance(jobs, dict):
    raise LauncherError(f'{path} is not a JSON object; move it aside to forget the recorded jobs')
  return jobs


def _write_jobs(sweep_dir: str, jobs: dict[str, dict]) -> None:
  path = _jobs_path(sweep_dir)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump(jobs, f, indent=1)
  os.replace(tmp, path)


def _last_line(path: str) -> str:
  try:
    with open(path, 'rb') as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 4096))
      lines = [l.strip() for l in f.read().decode('utf-8', 'replace').splitlines() if l.strip()]
  except OSError:
    return ''
  return lines[-1][:200] if lines else ''


@dataclasses.dataclass
class PointStatus:
  run: sweeps.Run
  state: str                 # finished | queued | running | stopped | failed | not submitted | error
  job_id: str = ''
  detail: str = ''


def slurm_status(runs: Sequence[sweeps.Run], sweep_dir: str,
                 states: Optional[dict[str, str]] = None) -> list[PointStatus]:
  """Each point's state from the run directory and the scheduler (see the module docstring)."""
  jobs = read_jobs(sweep_dir)
  if states is None:
    states = queue_states([j.get('job_id', '') for j in jobs.values()])
  out = []
  for r in runs:
    job = jobs.get(r.name, {})
    job_id = str(job.get('job_id', ''))
    if r.status() == 'done':
      try:
        with open(os.path.join(r.workdir, sweeps.RESULTS_FILE), encoding='utf-8') as f:
          acc = json.load(f).get('test_accuracy')
        detail = f'test accuracy {acc:.4f}' if isinstance(acc, (int, float)) else ''
      except (OSError, ValueError):
        detail = ''
      out.append(PointStatus(r, 'finished', job_id, detail))
    elif r.error:
      out.append(PointStatus(r, 'error', job_id, r.error))
    elif job_id and job_id in states:
      out.append(PointStatus(r, states[job_id], job_id))
    elif sweeps.checkpoint_step(r.workdir) is not None:
      out.append(PointStatus(r, 'stopped', job_id,
                             f'checkpoint at step {sweeps.checkpoint_step(r.workdir)}; re-running the '
                             f'sweep resumes it'))
    elif job_id:
      out.append(PointStatus(r, 'failed', job_id, _last_line(os.path.join(r.workdir, TRAIN_LOG))))
    else:
      out.append(PointStatus(r, 'not submitted'))
  return out


def _train_command(run: sweeps.Run) -> list[str]:
  return run.command(launcher=(sys.executable, '-m', 'kernelformer'),
                     config_path=sweeps.resolve_config_path(run.point.config))


def submit_slurm(sweep: sweeps.Sweep, sweep_dir: str, options: SlurmOptions, *, dry_run: bool = False,
                 log: Callable[[str], None] = print, pack: int = 0,
                 executor_factory: Optional[Callable[[str], Any]] = None) -> dict[str, int]:
  """Submits one job per point (``pack``: per population, ``sweeps.packed``) that is neither finished
  nor queued/running; returns counts (``submitted``: jobs)."""
  options.validate()
  if not dry_run:
    why = slurm_available()
    if why:
      raise LauncherError(f'--launcher slurm: {why}')
  runs = sweeps.plan(sweep, sweep_dir)
  # A dry run on a machine without SLURM still lists what it would submit (nothing is queued there).
  queue_ok = (not dry_run) or slurm_available() is None
  statuses = slurm_status(runs, sweep_dir, states=None if queue_ok else {})
  todo = [s for s in statuses if s.state in ('stopped', 'failed', 'not submitted')]
  counts = {'finished': sum(s.state == 'finished' for s in statuses),
            'active': sum(s.state in ('queued', 'running') for s in statuses),
            'error': sum(s.state == 'error' for s in statuses), 'submitted': 0}
  log(f'sweep {sweep.name}: {len(runs)} points, {counts["finished"]} finished, {counts["active"]} '
      f'queued or running, {len(todo)} to submit' +
      (f', {counts["error"]} cannot start' if counts['error'] else ''))
  for s in statuses:
    if s.state == 'error':
      log(f'  cannot start {s.run.name}: {s.detail}')
  params = options.executor_parameters()
  state = {s.run.name: s for s in todo}
  why = {n: s.state + (f': {s.detail}' if s.detail else '') for n, s in state.items()}
  jobs_todo = [s.run for s in todo]
  jobs_todo = sweeps.packed(jobs_todo, pack, sweep, sweep_dir) if pack else jobs_todo
  if dry_run:
    log('sbatch options: ' + ', '.join(f'{k}={v}' for k, v in params.items()))
    for r in jobs_todo:
      log(f'would submit ({", ".join(why[m.name] for m in r.members)}) {r.name}: '
          f'{shlex.join(_train_command(r))}')
    counts['submitted'] = 0
    counts['would_submit'] = len(jobs_todo)
    return counts
  if not todo:
    return counts
  sweeps.write_sweep_file(sweep, sweep_dir, runs)
  if executor_factory is None:
    import submitit  # pylint: disable=g-import-not-at-top

    def executor_factory(folder):
      return submitit.AutoExecutor(folder=folder, cluster='slurm')
  executor = executor_factory(os.path.join(sweep_dir, SLURM_DIR, '%j'))
  pythonpath = os.pathsep.join(p for p in (sweeps.REPO_ROOT, os.environ.get('PYTHONPATH', '')) if p)
  executor.update_parameters(**params, name=f'kf-{sweep.name}'[:64],
                             slurm_setup=[f'export PYTHONPATH={shlex.quote(pythonpath)}'])
  jobs = read_jobs(sweep_dir)
  for r in jobs_todo:
    for m in r.members:
      sweeps.write_point_file(m)
    command = _train_command(r)
    job = executor.submit(TrainPoint(command, r.workdir, os.getcwd(), {'PYTHONPATH': pythonpath}))
    for m in r.members:   # a population's job is each member's (--status reads them per point)
      jobs[m.name] = {'job_id': str(job.job_id), 'submitted': datetime.datetime.now().isoformat(
          timespec='seconds'), 'previous_state': state[m.name].state, 'command': shlex.join(command)}
    _write_jobs(sweep_dir, jobs)
    counts['submitted'] += 1
    log(f'submitted {r.name} as job {job.job_id} ({", ".join(why[m.name] for m in r.members)})')
  return counts


def format_status(statuses: Sequence[PointStatus]) -> list[str]:
  width = max((len(s.run.name) for s in statuses), default=10)
  lines = [f'{"point":{width}s}  {"state":13s} {"job":>8s}  detail']
  for s in statuses:
    lines.append(f'{s.run.name:{width}s}  {s.state:13s} {s.job_id or "-":>8s}  {s.detail}')
  counts: dict[str, int] = {}
  for s in statuses:
    counts[s.state] = counts.get(s.state, 0) + 1
  lines.append(f'{len(statuses)} points: ' + ', '.join(f'{v} {k}' for k, v in sorted(counts.items())))
  return lines


# ----------------------------------------------------------------------------------------------------
# Cloud TPU pod slices.


@dataclasses.dataclass
class TpuPodOptions:
  tpu_name: str
  zone: str
  project: str = ''
  sweep_dir: str = ''            # the sweep directory as every TPU host sees it (a shared mount)
  code_dir: str = '~/kernelformer'
  jax_version: str = '0.10.2'

  def validate(self) -> None:
    missing = [f for f in ('tpu_name', 'zone') if not getattr(self, f)]
    if missing:
      raise LauncherError('--launcher tpu-pod needs ' + ' and '.join(f'--{m}' for m in missing))

  def ssh(self, command: str) -> list[str]:
    args = ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', self.tpu_name, f'--zone={self.zone}']
    if self.project:
      args.append(f'--project={self.project}')
    return args + ['--worker=all', f'--command={command}']


def tpu_pod_commands(runs: Sequence[sweeps.Run], sweep_dir: str, options: TpuPodOptions) -> list[list[str]]:
  """The install step, then one ``gcloud ... --worker=all`` command per unfinished point.

  The code is expected at ``options.code_dir`` on every host (copy it with
  ``gcloud compute tpus tpu-vm scp --recurse --worker=all``, or clone it there); each point's work
  directory is ``<tpu sweep_dir>/<point>``, on a filesystem all hosts mount, so the report reads the
  same tree.
  """
  options.validate()
  remote_dir = options.sweep_dir or sweep_dir
  code = options.code_dir
  install = (f'cd {code} && python3 -m venv .venv && . .venv/bin/activate && '
             f'pip install -q -e . "jax[tpu]=={options.jax_version}"')
  commands = [options.ssh(install)]
  for r in runs:
    if r.status() == 'done' or r.error:
      continue
    train = r.command(launcher=('python', '-m', 'kernelformer'), sweep_dir=remote_dir) + ['--distributed']
    commands.append(options.ssh(f'cd {code} && . .venv/bin/activate && {shlex.join(train)}'))
  return commands


def run_commands(commands: Sequence[Sequence[str]], log: Callable[[str], None] = print) -> int:
  """Runs each command in order, stopping at the first failure; returns its exit code (0 if none)."""
  for i, cmd in enumerate(commands):
    log(f'[{i + 1}/{len(commands)}] {shlex.join(cmd)}')
    try:
      rc = subprocess.call(list(cmd))
    except OSError as e:
      raise LauncherError(f'cannot run {cmd[0]}: {e.strerror}') from None
    if rc != 0:
      log(f'command {i + 1} exited with code {rc}; fix it and run the same sweep command again '
          f'(finished points are skipped)')
      return rc
  return 0
