"""Where a run reports: TensorBoard event files, a JSON-lines log, a progress bar, results.json.

Only process 0 writes (``enabled``), so multi-host runs produce one set of files.
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Optional

import numpy as np

from kernelformer.training import record as record_lib
from kernelformer.training import workdir as workdir_lib


class MetricsWriter:
  """Appends events to ``metrics.jsonl`` and TensorBoard, and writes ``config.json`` / ``results.json``.

  A failed write (full disk, a file-size limit, I/O error) raises ``workdir.RunError`` with one line
  naming the file; results.json and config.json are replaced atomically, so the earlier one stays.
  """

  def __init__(self, workdir: str, enabled: bool = True, root: Optional[str] = None):
    """``root``: where the files go (default ``workdir``; the end of a run: its staged record)."""
    self.workdir = workdir
    self.root = root or workdir
    self.enabled = enabled
    self._tb = None
    self._jsonl = None
    if enabled:
      # TensorBoard events are written here, in this thread (tensorboardX's EventsWriter), not by
      # SummaryWriter's background thread: a write that fails there (a full disk) kills that thread
      # with a traceback and the next event blocks forever on its full queue.
      from tensorboardX.event_file_writer import EventsWriter  # pylint: disable=g-import-not-at-top
      path = os.path.join(self.root, 'metrics.jsonl')
      tb_dir = os.path.join(self.root, 'tensorboard')
      try:
        os.makedirs(tb_dir, exist_ok=True)
        self._tb = EventsWriter(os.path.join(tb_dir, 'events'))
        self._tb_path = self._tb._file_name  # pylint: disable=protected-access
      except OSError as e:
        raise workdir_lib.write_error(tb_dir, e, workdir) from None
      try:
        self._jsonl = open(path, 'a', encoding='utf-8')
      except OSError as e:
        raise workdir_lib.write_error(path, e, workdir) from None

  def write(self, split: str, step: int, values: dict[str, Any]) -> None:
    if not self.enabled:
      return
    from tensorboardX import summary as tb_summary  # pylint: disable=g-import-not-at-top
    from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
    now = time.time()
    try:
      for k, v in values.items():
        if isinstance(v, (int, float, np.floating, np.integer)):
          self._tb.write_event(event_pb2.Event(wall_time=now, step=int(step),
                                               summary=tb_summary.scalar(f'{split}/{k}', float(v))))
      self._tb.flush()
    except OSError as e:
      raise workdir_lib.write_error(self._tb_path, e, self.workdir) from None
    line = json.dumps(strict_json({'split': split, 'step': int(step), 'time': now,
                                   **{k: _plain(v) for k, v in values.items()}}),
                      allow_nan=False) + '\n'
    try:
      self._jsonl.write(line)
      self._jsonl.flush()
    except OSError as e:
      raise workdir_lib.write_error(self._jsonl.name, e, self.workdir) from None

  def write_config(self, config) -> None:
    if self.enabled:
      record_lib.atomic_write_json(os.path.join(self.root, 'config.json'), config.to_dict())

  def write_results(self, results: dict) -> None:
    if self.enabled:  # a results.json that exists is complete (sweeps rely on it)
      record_lib.atomic_write_json(os.path.join(self.root, 'results.json'), strict_json(results))

  def close(self) -> None:
    if self.enabled:
      for f in (self._tb, self._jsonl):
        try:
          f.close()
        except OSError:
          pass  # every event was flushed when written; a failed one has raised already


def strict_json(record: dict) -> dict:
  """``record`` with every non-finite float (NaN, inf) at the top level or nested as ``None``, and
  ``'nonfinite'``: the dotted names of those fields, so strict JSON readers accept the file."""
  bad = []

  def clean(v, path):
    if isinstance(v, (float, np.floating)) and not math.isfinite(float(v)):
      bad.append(path)
      return None
    if isinstance(v, dict):
      return {k: clean(x, f'{path}.{k}' if path else str(k)) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
      return [clean(x, f'{path}[{i}]') for i, x in enumerate(v)]
    return v

  out = clean(record, '')
  if bad:
    out['nonfinite'] = bad
  return out


def _plain(v):
  if isinstance(v, (np.floating, np.integer)):
    return v.item()
  return v


class Progress:
  """tqdm progress bar whose rate is the final line's steps/s and whose ETA ignores compilation.

  Compilation is its own phase: nothing is drawn until the first step is done (compile + step 1);
  the bar then starts at that step, labelled with the time the phase took (``compile+step 1 5.6s``), so
  tqdm's elapsed time and ETA count only the steps after it (evaluations included: the ETA is wall
  time). The steps/s shown is ``timed steps / their seconds`` when the trainer passes each step's
  ``seconds`` (the first step of a segment excluded, as in results.json's ``steps_per_sec``), else
  tqdm's wall rate since the bar started.
  """

  def __init__(self, total: int, initial: int, enabled: bool = True, file: Any = None):
    self._enabled = enabled
    self._total = total
    self._last = initial
    self._file = file
    self._bar = None
    self._t_start = time.perf_counter()
    self._steps_seen = 0
    self._timed_steps = 0
    self._timed_seconds = 0.0
    self._postfix = ''

  def rate(self) -> Optional[float]:
    """Steps per second of the timed steps so far (None before the second step of the segment)."""
    return self._timed_steps / self._timed_seconds if self._timed_seconds > 0 else None

  def update(self, step: int, summary: Optional[dict] = None,
             seconds: Optional[float] = None) -> None:
    if seconds is not None:
      if self._steps_seen:   # the segment's first step warms up: not timed (as the trainer does)
        self._timed_steps += step - self._last
        self._timed_seconds += seconds
      self._steps_seen += 1
    if not self._enabled:
      self._last = step
      return
    if summary:
      self._postfix = f"loss={summary['loss']:.3f}, acc={summary['accuracy']:.3f}"
    if self._bar is None:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top
      # No monitor thread: the bar is redrawn by update() (a thread of tqdm's own would outlive the run).
      tqdm.monitor_interval = 0
      warmup = time.perf_counter() - self._t_start
      self._bar = tqdm(total=self._total, initial=step, unit='step', dynamic_ncols=True,
                       smoothing=0.1, mininterval=1.0, file=self._file,
                       desc=f'compile+step 1 {warmup:.1f}s',
                       bar_format='{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} '
                                  '[{elapsed}<{remaining}{postfix}]')
      self._last = step
    elif self._bar.desc:
      # The compile phase labels the bar's first line only; the lines after it are the steps'.
      self._bar.set_description_str('', refresh=False)
    # The postfix first, so that whatever the bar draws next carries this step's numbers.
    rate = self.rate()
    if rate is None:
      fd = self._bar.format_dict
      rate = (fd['n'] - fd['initial']) / fd['elapsed'] if fd['elapsed'] > 0 else None
    shown = ([f'{rate:.1f} steps/s'] if rate else []) + ([self._postfix] if self._postfix else [])
    self._bar.set_postfix_str(', '.join(shown), refresh=False)
    self._bar.update(step - self._last)
    self._last = step

  def timed(self, steps: int, seconds: float) -> None:
    """The trainer's own timed totals (``results.json``'s steps_per_sec is steps / seconds): the bar's
    rate from now on. The trainer reads its clock only at boundaries, so it calls this there."""
    self._timed_steps, self._timed_seconds = int(steps), float(seconds)
    self._steps_seen = max(self._steps_seen, 1)
    if self._enabled and self._bar is not None and self._timed_seconds > 0:
      shown = [f'{self.rate():.1f} steps/s'] + ([self._postfix] if self._postfix else [])
      self._bar.set_postfix_str(', '.join(shown), refresh=True)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()


class StepTimer:
  """Steps per second, excluding the first step (compilation)."""

  def __init__(self):
    self._t0 = None
    self._s0 = None
    self._t = None
    self._s = None

  def tick(self, step: int) -> None:
    now = time.perf_counter()
    if self._t0 is None:
      self._t0, self._s0 = now, step
    self._t, self._s = now, step

  def rate(self) -> float:
    if self._t0 is None or self._s == self._s0:
      return 0.0
    return (self._s - self._s0) / (self._t - self._t0)


def memory_of(compiled, total: bool = False):
  """XLA's memory analysis of a compiled executable (bytes), or None where the backend has none;
  ``total``: temp + argument + output bytes, what the executable needs while it runs."""
  try:
    analysis = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except  (some backends do not implement it)
    return None
  if analysis is None:
    return None
  fields = ('temp_size_in_bytes', 'argument_size_in_bytes', 'output_size_in_bytes',
            'generated_code_size_in_bytes')
  m = {f: int(getattr(analysis, f, 0)) for f in fields}
  return sum(m[f] for f in fields[:3]) if total else m
