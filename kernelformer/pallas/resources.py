"""The Pallas kernels' verdict table: which cases the offline resource check found to fit an H100.

``resources.json`` (beside this file) is written by ``kernelformer benchmark pallas-resources
--write_table`` (``resource_check.py``, the offline ptxas check: method and limits there) and read at run
time by ``feature_attention.fits``, which ``impl='auto'`` consults. This module only reads: the table's
path, ``load_table``, and ``kernel_source_hash`` (the hash of the kernel code an entry was measured for;
an entry for other code is not trusted). It imports nothing of the kernels, so the runtime kernel module
and the offline tool both depend on it and not on each other.
"""
from __future__ import annotations

import functools
import json
import os
from typing import Optional

TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'resources.json')
KERNEL_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'feature_attention.py')


@functools.lru_cache(maxsize=8)
def kernel_source_hash(path: Optional[str] = None) -> str:
  """sha256 (16 hex digits) of the kernels' code: feature_attention.py without docstrings and comments.

  resources.json's verdicts hold for the code that was compiled; an entry whose ``kernel_source``
  differs from today's is not trusted by ``feature_attention.fits`` (impl='auto' goes to XLA until the
  check is re-run). Docstrings (their lines, from the AST), comments, trailing spaces and blank lines
  do not count; any change to the code does. Text-based, so the same on every Python version.
  """
  import ast  # pylint: disable=g-import-not-at-top
  import hashlib  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  import tokenize  # pylint: disable=g-import-not-at-top
  with open(path or KERNEL_SOURCE) as f:
    src = f.read()
  lines = src.splitlines()
  drop = set()
  for node in ast.walk(ast.parse(src)):
    body = getattr(node, 'body', None)
    if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
      drop.update(range(body[0].lineno, body[0].end_lineno + 1))
  for tok in tokenize.generate_tokens(io.StringIO(src).readline):
    if tok.type == tokenize.COMMENT:
      row, col = tok.start
      lines[row - 1] = lines[row - 1][:col]
  kept = [line.rstrip() for i, line in enumerate(lines, 1) if i not in drop and line.strip()]
  return hashlib.sha256('\n'.join(kept).encode()).hexdigest()[:16]


def load_table(path: Optional[str] = None) -> list[dict]:
  path = path or TABLE_PATH
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return json.load(f).get('entries', [])
