"""CSV, markdown and PNG writers shared by the benchmark and the approximation experiments.

Rows are plain dicts (one per measurement), so the same rows feed the CSV, the markdown table and the
plots without a second representation. Plots use matplotlib's Agg backend (no display on CI machines);
matplotlib is imported lazily so that the measurement code does not need it.
"""
from __future__ import annotations

import csv
import math
import os
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence


def write_csv(rows: Sequence[Mapping[str, Any]], path: str,
              fields: Optional[Sequence[str]] = None) -> str:
  """Writes ``rows`` to ``path`` (columns: ``fields``, or every key in first-seen order)."""
  if fields is None:
    fields = []
    for row in rows:
      fields.extend(k for k in row if k not in fields)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(fields), extrasaction='ignore')
    writer.writeheader()
    for row in rows:
      writer.writerow({k: _csv_value(row.get(k)) for k in fields})
  return path


def _csv_value(x):
  if x is None:
    return ''
  if isinstance(x, float):
    return '' if math.isnan(x) else repr(x)
  return x


def read_csv(path: str) -> list[dict[str, str]]:
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def fmt(x: Any, spec: str = '.3g') -> str:
  """A table cell: '-' for missing / NaN, ``format(x, spec)`` for numbers, ``str`` otherwise."""
  if x is None or x == '':
    return '-'
  if isinstance(x, float) and math.isnan(x):
    return '-'
  if isinstance(x, (int, float)):
    return format(x, spec)
  return str(x)


def num(x: Any) -> str:
  """A readable number: thousands separators from 100 up (no exponent), 3 significant digits below."""
  if x is None or x == '' or (isinstance(x, float) and math.isnan(x)):
    return '-'
  x = float(x)
  return f'{x:,.0f}' if abs(x) >= 100 else f'{x:.3g}'


def markdown_table(rows: Iterable[Mapping[str, Any]],
                   columns: Sequence[tuple[str, str, Callable[[Any], str] | str]]) -> str:
  """A GitHub markdown table; ``columns`` are ``(header, key, format spec or function)``."""
  lines = ['| ' + ' | '.join(h for h, _, _ in columns) + ' |',
           '|' + '|'.join('---' for _ in columns) + '|']
  for row in rows:
    cells = []
    for _, key, f in columns:
      value = row.get(key)
      cells.append(f(value) if callable(f) else fmt(value, f))
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def pyplot():
  """matplotlib.pyplot on the Agg backend (headless)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def save_figure(fig, path: str) -> str:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  pyplot().close(fig)
  return path
