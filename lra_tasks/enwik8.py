"""Byte-level enwik8 (Hutter Prize; Mahoney): next-byte prediction, reported in bits per byte.

Format: ``{data_dir}/enwik8/enwik8``, the raw first 10^8 bytes of the English Wikipedia dump of 2006-03-03,
as extracted from ``enwik8.zip`` (http://mattmahoney.net/dc/enwik8.zip, one member ``enwik8``). The
standard split (Al-Rfou et al. 2019; Dai et al. 2019 "Transformer-XL") is the first 90M bytes for
training, the next 5M for validation, the last 5M for test. (Luo et al. 2021 run their language-model
setting, §4.2 and appendix A.2, on WikiText-103, not on enwik8; configs/enwik8.py's ``luo`` preset
applies their sizes to bytes.)
``data.num_bytes`` (10^8) sets the split sizes as 90% / 5% / 5% of it, so a small fixture file
(``write_fixture``) runs the same code.

Examples (``WindowSource``): windows of ``L + 1`` bytes (``L = data.max_length``); example i is
``inputs = w[:L]``, ``targets = w[1:]``, tokens = byte + 1 (0 stays padding, vocabulary 257). Training:
full windows at stride L; validation the same plus a zero-padded last window; test: the windows of
``data.eval_context`` (``eval_scheme``: 'disjoint', 'sliding' at ``data.eval_stride`` or 'stateful';
docs/causal.md tabulates them). Every byte of a split but the first is scored exactly once. The file
is memory-mapped. ``prepare_data`` downloads the zip once (``data.url``), extracts it under a temporary
name and renames it, and writes and verifies ``MANIFEST.json``.
"""
from __future__ import annotations

import os
import shutil
import urllib.request
import zipfile
from typing import Any, Callable

import numpy as np

from lra_tasks import common
from lra_tasks import manifest
from lra_tasks.mqar import LMTaskInfo

URL = 'http://mattmahoney.net/dc/enwik8.zip'
NUM_BYTES = 10 ** 8
FILE = 'enwik8'
VOCAB_SIZE = 257      # bytes + 1, 0 = padding


def directory(data: Any) -> str:
  return os.path.join(os.path.expanduser(str(data.data_dir)), 'enwik8')


def path(data: Any) -> str:
  return os.path.join(directory(data), FILE)


def prepare_command(data: Any) -> str:
  return f'python scripts/prepare_data.py --task enwik8 --data_dir {data.data_dir}'


def split_bounds(num_bytes: int) -> dict[str, tuple[int, int]]:
  """Byte ranges of the 90/5/5 split of the first ``num_bytes`` (90M/5M/5M for 10^8)."""
  train = num_bytes * 9 // 10
  val = num_bytes // 20
  return {'train': (0, train), 'val': (train, train + val), 'test': (train + val, num_bytes)}


class WindowSource:
  """Windows of ``L`` inputs (``L + 1`` bytes) of ``mm[start:stop]`` at stride ``S`` as LM examples.

  Window i starts at byte ``a_i = start + i S``: ``inputs = bytes[a_i, a_i + L)``,
  ``targets = bytes[a_i + 1, a_i + L]`` (tokens = byte + 1). Window 0 scores all its L targets; window
  i > 0 only its last S (the others were scored by window i - 1): the unscored targets are written as 0,
  which every loss weights 0. So each target byte is scored exactly once, by the first window that
  reaches it, and with ``S <= L/2`` it sees at least ``L - S >= L/2`` bytes of context (window 0's
  bytes: all bytes of the split before them). ``S = L`` gives non-overlapping windows.

  ``pad_tail``: a last window padded with 0 past ``stop`` so the split's final bytes are scored too
  (every byte but the first, exactly once); without it only full windows are made (training).

  ``read_batch(indices)`` answers a batch with one gather of the windows' bytes (equal to stacking
  ``src[i]``).
  """

  def __init__(self, mm: np.ndarray, start: int, stop: int, length: int, stride: int | None = None,
               pad_tail: bool = False):
    stride = length if stride is None else int(stride)
    if not 1 <= stride <= length:
      raise ValueError(f'window stride {stride} must lie in [1, {length}]')
    self._mm, self._start, self._stop = mm, start, stop
    self._length, self._stride = length, stride
    targets = max(0, stop - start - 1)          # bytes start+1 .. stop-1 are predicted
    if targets == 0:
      self._n = 0
    elif pad_tail:
      self._n = 1 + -(-max(0, targets - length) // stride)
    else:
      self._n = 0 if targets < length else 1 + (targets - length) // stride
    # Row r: the L + 1 bytes from start + r, for every window that ends by ``stop`` (a strided view of
    # the map, nothing read).
    span = np.asarray(mm[start:stop])
    self._full = (np.lib.stride_tricks.sliding_window_view(span, length + 1)
                  if len(span) > length else span[:0].reshape(0, length + 1))

  @property
  def stride(self) -> int:
    return self._stride

  def __len__(self) -> int:
    return self._n

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    if not 0 <= int(i) < self._n:
      raise IndexError(i)
    a = self._start + int(i) * self._stride
    w = np.zeros(self._length + 1, np.int32)
    real = self._mm[a:min(a + self._length + 1, self._stop)].astype(np.int32) + 1
    w[:len(real)] = real
    targets = w[1:].copy()
    if int(i) > 0:
      targets[:self._length - self._stride] = 0   # scored by the previous window
    return {'inputs': w[:-1], 'targets': targets}

  def read_batch(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    """Windows ``indices`` as one batch, ``{'inputs', 'targets'}: int32[B, L]``: the stacked ``src[i]``.

    One fancy-indexed gather of the windows' bytes from the map; only a window that runs past
    ``stop`` (``pad_tail``'s last) is read as ``src[i]``."""
    idx = np.asarray(indices, dtype=np.int64)
    bad = idx[(idx < 0) | (idx >= self._n)]
    if len(bad):
      raise IndexError(f'window index {bad[0]} out of range [0, {self._n})')
    rows = idx * self._stride
    full = rows < len(self._full)
    windows = self._full[np.where(full, rows, 0)] if len(self._full) else (
        np.zeros((len(idx), self._length + 1), np.uint8))
    inputs = windows[:, :-1].astype(np.int32)
    inputs += 1
    targets = windows[:, 1:].astype(np.int32)
    targets += 1
    targets[idx > 0, :self._length - self._stride] = 0   # scored by the previous window
    for j in np.flatnonzero(~full):
      ex = self[int(idx[j])]
      inputs[j], targets[j] = ex['inputs'], ex['targets']
    return {'inputs': inputs, 'targets': targets}


class Enwik8Task:
  name = 'enwik8'

  def info(self, data: Any) -> LMTaskInfo:
    eval_scheme(data)   # a bad eval_context / eval_stride is reported with the other data fields
    length = common.positive_max_length(data, 'enwik8')
    window = length + 1
    for split, (start, stop) in split_bounds(int(data.num_bytes)).items():
      if stop - start < window:
        raise common.DataError(
            f'enwik8: data.num_bytes={int(data.num_bytes)} gives a {split} split of {stop - start} '
            f'bytes, shorter than one window (max_length + 1 = {window} bytes); raise '
            f'data.num_bytes to at least {20 * window} (the splits are 90/5/5 %) or lower '
            f'data.max_length')
    return LMTaskInfo(num_classes=VOCAB_SIZE, vocab_size=VOCAB_SIZE, max_length=length,
                      metric='bits_per_byte')

  def check(self, data: Any) -> list[str]:
    p = path(data)
    need = int(data.num_bytes)
    if not os.path.isfile(p):
      return [f'{p} is missing (enwik8, {need} bytes): run {prepare_command(data)}']
    size = os.path.getsize(p)
    if size < need:
      return [f'{p} holds {size} bytes, data.num_bytes asks for {need}: run {prepare_command(data)}']
    return []

  def prepare(self, data: Any) -> None:
    del data   # downloading is explicit: scripts/prepare_data.py --task enwik8

  def source(self, data: Any, split: str) -> WindowSource:
    """Training: full non-overlapping windows. Validation: non-overlapping windows plus a padded last
    one. Test: the windows of ``data.eval_context`` (``kernelformer/training/lm_eval.py``): stride
    ``data.eval_stride`` for 'sliding', non-overlapping for 'disjoint' and 'stateful' (the latter runs
    them in order carrying the decoder's state)."""
    common.require(self, data)
    if split not in common.SPLITS:
      raise ValueError(f'unknown split {split!r}')
    mm = np.memmap(path(data), dtype=np.uint8, mode='r')
    start, stop = split_bounds(int(data.num_bytes))[split]
    length = common.positive_max_length(data, 'enwik8')
    if split == 'train':
      return WindowSource(mm, start, stop, length)
    stride = eval_scheme(data)[1] if split == 'test' else length
    return WindowSource(mm, start, stop, length, stride, pad_tail=True)


TASK = Enwik8Task()

EVAL_CONTEXTS = ('disjoint', 'sliding', 'stateful')


def eval_scheme(data: Any) -> tuple[str, int]:
  """``(data.eval_context, stride)`` of the test evaluation; configs without the fields: disjoint.

  'disjoint': non-overlapping windows, stride L (a byte sees 0 to L - 1 bytes of context, L/2 on
  average). 'sliding': stride ``data.eval_stride`` (0 = L // 2), each window scores its last S
  targets, so every byte sees at least L - S bytes. 'stateful': the disjoint windows in order with the
  decoder's recurrent state carried across them (every byte sees the whole test text before it).
  """
  context = data.get('eval_context', 'disjoint') if hasattr(data, 'get') else 'disjoint'
  length = common.positive_max_length(data, 'enwik8')
  if context not in EVAL_CONTEXTS:
    raise common.DataError(f'data.eval_context={context!r} is invalid: must be one of '
                           f"{', '.join(repr(c) for c in EVAL_CONTEXTS)}")
  if context != 'sliding':
    return context, length
  stride = data.get('eval_stride', 0)
  if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or not 0 <= stride <= length:
    raise common.DataError(f'data.eval_stride={stride!r} is invalid: must be an integer in [1, '
                           f'data.max_length={length}] (0 = max_length // 2)')
  return context, int(stride) or max(1, length // 2)


def write_fixture(data_dir: str, num_bytes: int, seed: int = 0) -> bytes:
  """A small ``{data_dir}/enwik8/enwik8`` in the real format (raw bytes of wiki-like XML text),
  deterministic in ``seed``; returns what it wrote."""
  rng = np.random.default_rng(seed)
  words = [b'<page>', b'<title>', b'Anarchism', b'</title>', b'the', b'of', b'[[link]]', b'{{cite}}',
           b'caf\xc3\xa9', b'&amp;', b'\n', b'1984', b'kernel', b'attention']
  out = bytearray()
  while len(out) < num_bytes:
    out += words[int(rng.integers(len(words)))] + b' '
  blob = bytes(out[:num_bytes])
  os.makedirs(os.path.join(data_dir, 'enwik8'), exist_ok=True)
  with open(os.path.join(data_dir, 'enwik8', FILE), 'wb') as f:
    f.write(blob)
  return blob


def extract(zip_path: str, data: Any) -> str:
  """Extracts the ``enwik8`` member of ``zip_path`` to ``path(data)`` atomically; writes the manifest."""
  dest = path(data)
  os.makedirs(os.path.dirname(dest), exist_ok=True)
  with zipfile.ZipFile(zip_path) as z:
    if FILE not in z.namelist():
      raise common.DataError(f'{zip_path} has no member {FILE!r} (members: {z.namelist()[:5]})')
    tmp = f'{dest}.tmp.{os.getpid()}'
    with z.open(FILE) as src, open(tmp, 'wb') as dst:
      shutil.copyfileobj(src, dst, 1 << 20)
  os.replace(tmp, dest)
  manifest.write(directory(data), FILE, 'enwik8', zip_path)
  return dest


def prepare_data(data: Any, *, url: str = URL, zip_path: str | None = None,
                 log: Callable[[str], None] = print) -> str:
  """Downloads ``enwik8.zip`` once (kept next to the file), extracts, writes and checks the manifest.

  ``zip_path``: an already downloaded zip (no network). Returns the path of the extracted file.
  """
  if not TASK.check(data) and os.path.isfile(os.path.join(directory(data), manifest.NAME)):
    log(f'enwik8: {path(data)} present')
    return path(data)
  if zip_path is None:
    zip_path = os.path.join(directory(data), 'enwik8.zip')
    if not os.path.isfile(zip_path):
      os.makedirs(directory(data), exist_ok=True)
      log(f'enwik8: downloading {url} -> {zip_path}')
      tmp = f'{zip_path}.tmp.{os.getpid()}'
      with urllib.request.urlopen(url) as r, open(tmp, 'wb') as f:   # noqa: S310 (fixed http URL)
        shutil.copyfileobj(r, f, 1 << 20)
      os.replace(tmp, zip_path)
  dest = extract(zip_path, data)
  problems = verify(data)
  if problems:
    raise common.DataError('enwik8: ' + '; '.join(problems))
  log(f'enwik8: wrote {dest} ({os.path.getsize(dest)} bytes) and {manifest.NAME}')
  return dest


def verify(data: Any, checksums: bool = True) -> list[str]:
  """``check`` plus the manifest (size and sha256 of the file): [] when all is well."""
  missing = TASK.check(data)
  if missing:
    return missing
  recorded = manifest.read(directory(data))
  if recorded is None:
    return [f'{manifest.path(directory(data))} is missing: run {prepare_command(data)}']
  return manifest.verify(directory(data), recorded, checksums=checksums)
