"""The progress bar (metrics.Progress): nothing drawn while compiling, then a bar that starts at the first
finished step and shows the final line's steps/s (timed steps / their seconds, the first excluded)."""
from __future__ import annotations

import io

from kernelformer.training import metrics


def test_bar_starts_after_compilation_and_shows_the_timed_rate():
  out = io.StringIO()
  p = metrics.Progress(total=10, initial=0, enabled=True, file=out)
  assert out.getvalue() == ''                     # compiling: no bar, no rate yet
  p.update(1, seconds=7.0)                        # compile + the first step: not timed
  assert p._bar.format_dict['initial'] == 1       # the bar's elapsed time and ETA start here
  assert p.rate() is None
  p.update(2, seconds=0.25)
  p.update(3, {'loss': 1.5, 'accuracy': 0.25}, seconds=0.25)
  assert p.rate() == 4.0                          # 2 timed steps in 0.5 s, as results.json counts
  p.close()
  lines = [l for l in out.getvalue().replace('\r', '\n').strip().splitlines() if l.strip()]
  first, last = lines[0], lines[-1]
  assert first.startswith('compile+step 1 ') and '1/10' in first     # the compile phase, once
  assert 'compile' not in last and '3/10' in last                    # not a label of later steps
  assert '4.0 steps/s, loss=1.500, acc=0.250]' in last, last


def test_disabled_bar_draws_nothing_but_still_counts():
  out = io.StringIO()
  p = metrics.Progress(total=4, initial=2, enabled=False, file=out)
  for step in (3, 4):
    p.update(step, seconds=0.5)
  p.close()
  assert out.getvalue() == '' and p.rate() == 2.0   # step 3 (after resuming) warms up; step 4 timed
