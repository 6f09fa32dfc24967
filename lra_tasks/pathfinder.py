"""Pathfinder (LRA "Pathfinder" and "Path-X"; Linsley et al. 2018): are the two dots connected by a path?

Long Range Arena (Tay et al. 2021, section 3.4 "Pathfinder (long-range spatial dependency)") shows a
grayscale image with two marked dots and dashed curves and asks whether one curve joins the dots (2
classes). The image is flattened in raster order; tokens are ``pixel + 1`` (1..256, vocabulary 257, 0
stays padding) with ``data.pixel_padding = 'none'``, or the raw pixel 0..255 (vocabulary 256) with
``'lra'``, where the mask ``inputs != 0`` -- LRA's ``inputs > 0`` (image/input_pipeline.py 186, 205
@ ad0ff01; models/transformer/transformer.py 148 @ b4f9fed) -- drops every black pixel, i.e. the whole
background: attention sees only the lit pixels, as in LRA's and Skyformer's runs
(``lra_tasks.image.pixel_offset``). "Pathfinder" is 32x32 (1024 tokens) at the hard difficulty;
"Path-X" is 128x128 (16384 tokens), also hard. ``data.resolution`` (32, 64, 128, 256) and ``data.difficulty`` pick the set:

    easy -> curv_baseline    intermediate -> curv_contour_length_9    hard -> curv_contour_length_14

Files, as in LRA's release (``lra_release.gz``: ``pathfinder{32,64,128,256}/``), copied to
``{data_dir}/pathfinder{resolution}/{curv_dir}/``: ``imgs/<k>/sample_<n>.png`` and ``metadata/<k>.npy``
(a *text* file despite the suffix; formats, decoding cost and the disk cache: docs/data.md). Reading
follows LRA's builder: every line of every metadata file (files in numeric order of ``<k>``); empty
(0-byte) images are dropped as LRA's ``tf.strings.length(image) > 0`` filter does, and so are images PIL
cannot decode (the count is logged); a missing image, a malformed line or a wrong size is a
``DataError``. The valid examples are split 80/10/10 (LRA's ``[:80%]``, ``[80%:90%]``, ``[90%:]``) after
a permutation seeded by ``data.split_seed`` (LRA's order came from TFDS sharding of a Beam pipeline).
The disk cache (``lra_tasks.cache``, ``scripts/prepare_data.py``) holds the valid images in metadata
order; the split is applied to it as to the decoded images, so ``source()`` reads the same examples.
"""
from __future__ import annotations

import functools
import glob
import logging
import os
import time
from typing import Any

import numpy as np

from lra_tasks import cache
from lra_tasks import common
from lra_tasks import image

NUM_CLASSES = 2
VOCAB_SIZE = 257   # pixel values 0..255 shifted by one, plus padding (pixel_padding 'none'; 'lra': 256)
RESOLUTIONS = (32, 64, 128, 256)
DIFFICULTIES = {'easy': 'curv_baseline', 'intermediate': 'curv_contour_length_9',
                'hard': 'curv_contour_length_14'}
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)
RELEASE_URL = 'https://storage.googleapis.com/long-range-arena/lra_release.gz'
# Bumped whenever decoding changes for the same files, so old caches are not read.
CACHE_VERSION = 1

_log = logging.getLogger(__name__)


def resolution(data: Any) -> int:
  res = int(data.resolution)
  if res not in RESOLUTIONS:
    raise common.DataError(f'pathfinder: data.resolution must be one of '
                           f'{", ".join(map(str, RESOLUTIONS))}, got {res}')
  return res


def curv_dir(data: Any) -> str:
  if data.difficulty not in DIFFICULTIES:
    raise common.DataError(f'pathfinder: data.difficulty must be one of '
                           f'{", ".join(DIFFICULTIES)}, got {data.difficulty!r}')
  return DIFFICULTIES[data.difficulty]


def difficulty_dir(data: Any) -> str:
  """``{data_dir}/pathfinder{resolution}/{curv_dir}``."""
  return os.path.join(os.path.expanduser(str(data.data_dir)), f'pathfinder{resolution(data)}',
                      curv_dir(data))


def metadata_files(directory: str) -> list[str]:
  """``metadata/*.npy`` in numeric order of their stem (``2.npy`` before ``10.npy``)."""
  paths = glob.glob(os.path.join(directory, 'metadata', '*.npy'))

  def key(path):
    stem = os.path.splitext(os.path.basename(path))[0]
    return (0, int(stem), '') if stem.isdigit() else (1, 0, stem)

  return sorted(paths, key=key)


def read_metadata(path: str) -> list[tuple[int, str, int]]:
  """``[(line, image path relative to the difficulty dir, label)]`` of one metadata text file."""
  fix = 'copy the metadata folder again from the LRA release'
  try:
    with open(path, 'rb') as f:
      content = f.read().decode('utf-8')
  except UnicodeDecodeError as e:
    raise common.DataError(f'{path}:1: not a text metadata file ({e.reason}); the LRA release '
                           f'writes one text line per image; {fix}') from e
  rows = []
  for number, line in enumerate(content.splitlines(), start=1):
    fields = line.split()
    if not fields:
      continue
    if len(fields) < 4:
      raise common.DataError(f'{path}:{number}: expected at least 4 space-separated fields '
                             f'(directory, file, index, label), got {len(fields)}; {fix}')
    if fields[3] not in ('0', '1'):
      raise common.DataError(f'{path}:{number}: label (4th field) must be 0 or 1, got '
                             f'{fields[3]!r}; {fix}')
    rows.append((number, os.path.join(fields[0], fields[1]), int(fields[3])))
  return rows


def decode_png(path: str, res: int) -> np.ndarray | None:
  """uint8 ``[res, res]`` pixels, or None for an empty or undecodable file (skipped, as in LRA)."""
  from PIL import Image, UnidentifiedImageError  # pylint: disable=g-import-not-at-top
  if os.path.getsize(path) == 0:
    return None
  try:
    with Image.open(path) as image:
      # The release's PNGs are 8-bit grayscale ('L'), read as they are; anything else is converted.
      pixels = np.asarray(image if image.mode == 'L' else image.convert('L'), dtype=np.uint8)
  except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
    return None
  if pixels.shape != (res, res):
    raise common.DataError(f'{path}: image is {pixels.shape[1]}x{pixels.shape[0]}, expected '
                           f'{res}x{res}; is it under the right pathfinder{res} folder?')
  return pixels


def iter_examples(directory: str, res: int, skipped: list[str]):
  """Yields ``(pixels uint8[res, res], label)`` of every valid image, in metadata order.

  Empty or undecodable images are appended to ``skipped``; a metadata line naming a missing image is
  a ``DataError``.
  """
  for meta in metadata_files(directory):
    for number, relative, label in read_metadata(meta):
      path = os.path.join(directory, relative)
      if not os.path.isfile(path):
        raise common.DataError(f'{meta}:{number}: image {path} is missing; copy '
                               f'{os.path.basename(os.path.dirname(directory))}/'
                               f'{os.path.basename(directory)} again from the LRA release')
      pixels = decode_png(path, res)
      if pixels is None:
        skipped.append(path)
        continue
      yield pixels, label


def _log_skipped(directory: str, skipped: list[str]) -> None:
  if skipped:
    _log.warning('pathfinder: skipped %d empty or unreadable image(s) in %s (first: %s)',
                 len(skipped), directory, skipped[0])


def load_examples(directory: str, res: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
  """All valid examples in metadata order: ``(tokens int32[N, res*res], labels int32[N], skipped)``."""
  start = time.perf_counter()
  rows, labels, skipped = [], [], []
  for pixels, label in iter_examples(directory, res, skipped):
    rows.append(pixels.reshape(-1))
    labels.append(label)
  _log_skipped(directory, skipped)
  tokens = (np.stack(rows).astype(np.int32) + 1) if rows else np.zeros((0, res * res), np.int32)
  labels_arr = np.asarray(labels, dtype=np.int32).reshape(len(labels))
  tokens.setflags(write=False)
  labels_arr.setflags(write=False)
  _log.info('pathfinder: read %d images of %s in %.1f s', len(rows), directory,
            time.perf_counter() - start)
  return tokens, labels_arr, skipped


def source_files(directory: str) -> list[str]:
  """The metadata files and every image they name: what the decoded examples depend on."""
  files = metadata_files(directory)
  images = [os.path.join(directory, relative)
            for meta in files for _, relative, _ in read_metadata(meta)]
  return files + images


def examples_cache(data: Any) -> cache.Cache:
  """The cache of the decoded images of ``data``'s set (resolution and difficulty)."""
  res = resolution(data)
  return cache.Cache(cache.root(data.data_dir), 'pathfinder', f'pathfinder{res}/{curv_dir(data)}',
                     {'resolution': res, 'version': CACHE_VERSION})


def cached_examples(data: Any) -> dict[str, np.ndarray] | None:
  """``{'pixels': uint8[N, res*res], 'labels': int32[N]}`` memory maps, if a current cache exists."""
  directory = difficulty_dir(data)
  return examples_cache(data).load(directory, lambda: source_files(directory))


def build_cache(data: Any) -> str:
  """Decodes the set once into a new cache (streaming, one image at a time); returns its directory."""
  directory = difficulty_dir(data)
  res = resolution(data)
  if not metadata_files(directory):
    raise common.DataError('pathfinder: data missing: ' + '; '.join(TASK.check(data)))
  c = examples_cache(data)
  key = c.key(cache.fingerprint(directory, source_files(directory)))
  skipped: list[str] = []
  with c.writer(key, {'pixels': (np.uint8, (res * res,)), 'labels': (np.int32, ())}) as w:
    for pixels, label in iter_examples(directory, res, skipped):
      w.append(pixels=pixels.reshape(-1), labels=label)
    if c.key(cache.fingerprint(directory, source_files(directory))) != key:
      raise common.DataError(f'pathfinder: {directory} changed while it was being cached; run again')
  _log_skipped(directory, skipped)
  return c.directory(key)


@functools.lru_cache(maxsize=2)
def _cached_examples(directory: str, res: int, stamp: tuple) -> tuple[np.ndarray, np.ndarray]:
  del stamp  # cache key only: changed metadata files are read again
  tokens, labels, _ = load_examples(directory, res)
  return tokens, labels


def forget_decoded() -> None:
  """Drops the decoded examples this process holds (so the next read decodes again, as a new process)."""
  _cached_examples.cache_clear()


def _stamp(directory: str) -> tuple:
  return tuple((p, os.stat(p).st_mtime_ns, os.stat(p).st_size) for p in metadata_files(directory))


def _check_length(data: Any) -> int:
  pixels = resolution(data) ** 2
  if int(data.max_length) not in (0, pixels):
    raise common.DataError(f'pathfinder: data.max_length must be resolution**2 = {pixels} or 0, '
                           f'got {data.max_length}')
  return pixels


def _split_source(data: Any, split: str) -> common.ArraySource | common.IndexedSource:
  """The examples of the seeded 80/10/10 ``split``: cached rows if a current cache exists, else decoded."""
  if split not in common.SPLITS:
    raise ValueError(f'unknown split {split!r}; valid: {", ".join(common.SPLITS)}')
  _check_length(data)
  directory = difficulty_dir(data)
  if not metadata_files(directory):
    raise common.DataError('pathfinder: data missing: ' + '; '.join(TASK.check(data)))
  stored = cached_examples(data)
  if stored is not None:
    n = len(stored['labels'])
  else:
    tokens, labels = _cached_examples(directory, resolution(data), _stamp(directory))
    n = len(labels)
  parts = dict(zip(common.SPLITS, common.split_indices(n, SPLIT_FRACTIONS, data.split_seed)))
  idx = parts[split]
  offset = image.pixel_offset(data)
  if stored is not None:
    # Pixels are stored as decoded (uint8); tokens are pixel + offset, as below.
    src = common.IndexedSource(idx, {'inputs': offset}, inputs=stored['pixels'],
                               targets=stored['labels'])
  else:
    # tokens[idx] is a copy: load_examples' tokens (pixel + 1) stay as they are.
    src = common.ArraySource(inputs=image.offset_tokens(tokens[idx], data, in_place=True),
                             targets=labels[idx])
  common.check_nonempty('pathfinder', {'targets': idx}, split,
                        f'{directory} has {n} valid images, too few for an 80/10/10 split')
  return src


def build_arrays(data: Any, split: str) -> dict[str, np.ndarray]:
  """``{'inputs': int32[N, resolution**2], 'targets': int32[N]}`` for the seeded 80/10/10 ``split``."""
  return common.source_arrays(_split_source(data, split))


class PathfinderTask:
  """``common.Task`` for LRA Pathfinder / Path-X (PNG pixels as tokens)."""

  name = 'pathfinder'

  def info(self, data: Any) -> common.TaskInfo:
    return common.TaskInfo(num_classes=NUM_CLASSES, vocab_size=image.pixel_vocab_size(data),
                           max_length=_check_length(data))

  def check(self, data: Any) -> list[str]:
    directory = difficulty_dir(data)
    if metadata_files(directory):
      return []
    folder = f'pathfinder{resolution(data)}'
    release = f'{folder}/{curv_dir(data)}'
    root = os.path.expanduser(str(data.data_dir))
    # The archive unpacks to lra_release/ (or lra_release/lra_release/): a copy left there is misplaced.
    for nested in ('lra_release', 'lra_release/lra_release'):
      if metadata_files(os.path.join(root, nested, release)):
        return [f'{directory} is missing, but {os.path.join(root, nested, release)} exists: move '
                f'{os.path.join(root, nested, folder)} to {os.path.join(root, folder)}']
    return [f'{os.path.join(directory, "metadata")}/*.npy is missing (with {directory}/imgs/): run: '
            f'python scripts/prepare_data.py --task pathfinder --data_dir {data.data_dir} '
            f'--resolution {resolution(data)} --difficulty {data.difficulty} --source <lra_release.gz '
            f'or its extracted folder>, or download {RELEASE_URL}, extract it and copy {release} '
            '(metadata/ and imgs/) there']

  def prepare(self, data: Any) -> None:
    """Nothing to make locally: the images come from the LRA release."""
    del data

  def source(self, data: Any, split: str) -> common.ArraySource | common.IndexedSource:
    return _split_source(data, split)


TASK = PathfinderTask()
