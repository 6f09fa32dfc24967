"""Shared by the trainer tests: the tiny ListOps config with dotted-key overrides.

Import as ``from tests.training import helpers`` (``tests`` is a namespace package found through
pytest.ini's ``pythonpath = .``).
"""
from __future__ import annotations

from configs import listops


def tiny_config(data_dir, **overrides):
  """``configs/listops.py:tiny`` generating into ``data_dir``, quiet, with ``overrides`` applied.

  Args:
    data_dir: where the ListOps generator writes (and later runs read) the tiny data set.
    **overrides: ``'model.attention.kind'``-style dotted keys (pass them as ``**{...}``) or top-level
      names, set in order after the defaults.

  Returns:
    The (locked) config.
  """
  c = listops.get_config('tiny')
  c.data.data_dir = str(data_dir)
  c.progress = False
  for key, value in overrides.items():
    node = c
    *parents, leaf = key.split('.')
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c
