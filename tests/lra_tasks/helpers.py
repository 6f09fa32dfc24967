"""Shared by the LRA loader tests: tiny data configs, byte tokens by hand, and split digests.

The digests compare token ids across processes: a loader whose ids depend on something per-process
(``hash()`` of a string under a different PYTHONHASHSEED, dict or set order) gives another digest in
a second interpreter. Import as ``from tests.lra_tasks import helpers`` (``tests`` is a namespace
package found through pytest.ini's ``pythonpath = .``; the second process finds it from the repository
root, its working directory).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_data(config_module, data_dir, **overrides):
  """``config_module.get_config('tiny').data`` reading ``data_dir``, with ``overrides`` set last."""
  c = config_module.get_config('tiny')
  c.data.data_dir = str(data_dir)
  for key, value in overrides.items():
    c.data[key] = value
  return c.data


def naive_bytes(textual, length):
  """Byte + 1 per UTF-8 byte (str) or raw byte (bytes), cut or right-padded with 0 to ``length``."""
  raw = textual.encode('utf-8') if isinstance(textual, str) else textual
  ids = [b + 1 for b in raw][:length]
  return np.array(ids + [0] * (length - len(ids)), dtype=np.int32)


def digest(arrays):
  """SHA-256 over the named arrays' names and bytes, in name order."""
  h = hashlib.sha256()
  for name in sorted(arrays):
    h.update(name.encode())
    h.update(np.ascontiguousarray(arrays[name]).tobytes())
  return h.hexdigest()


def split_digests(build_arrays, data, splits):
  """``{split: digest(build_arrays(data, split))}``."""
  return {s: digest(build_arrays(data, s)) for s in splits}


def split_digests_in_subprocess(script, hash_seed):
  """Runs ``script`` in a fresh interpreter under PYTHONHASHSEED=``hash_seed``; returns its last line as JSON.

  The script starts with ``json``, ``digest`` and ``split_digests`` (this module's) imported, and
  prints ``json.dumps(...)`` of its split digests last.
  """
  prelude = 'import json\nfrom tests.lra_tasks.helpers import digest, split_digests\n'
  out = subprocess.run([sys.executable, '-c', prelude + script], capture_output=True, text=True,
                       check=True, cwd=REPO_ROOT, env={**os.environ, 'PYTHONHASHSEED': str(hash_seed)})
  return json.loads(out.stdout.strip().splitlines()[-1])
