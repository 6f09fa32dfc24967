"""Small Retrieval and Pathfinder data sets written in exactly the LRA release's on-disk formats.

Tests (and anyone without the 7 GB release) use these to run the real loaders end to end: the files
are what the loaders would find after extracting ``lra_release.gz``, only fewer and with random
content. Both writers are deterministic functions of their arguments and return what they wrote, so
a test can compare the loader's arrays with the expected tokens.

``write_retrieval_fixture`` writes ``{root}/retrieval/new_aan_pairs.{train,eval,test}.tsv``,
``write_pathfinder_fixture`` ``{root}/pathfinder{res}/{curv_dir}/`` with one empty image and one that is
not a PNG, as the loader must skip both (formats: docs/data.md).

ListOps needs no fixture: its generator makes the files (``lra_tasks.listops``).
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from lra_tasks import common
from lra_tasks import pathfinder
from lra_tasks import retrieval

# A few words and byte values that exercise the byte tokenizer: quotes (data, not quoting, in the
# release format), backslashes, non-ASCII UTF-8 and control bytes (escaped inside a bytes literal).
_WORDS = ('the', 'attention', 'kernel', 'we', 'propose', 'citation', '"quoted"', "it's", 'caf\u00e9',
          'na\u00efve', 'back\\slash', 'line\nbreak', 'tab\there', '%', '{x}', '\u2014')


@dataclasses.dataclass(frozen=True)
class RetrievalRow:
  label: int
  id1: str
  id2: str
  text1: str      # the field as written: a Python bytes literal, e.g. "b'the kernel'"
  text2: str


def _words(rng: np.random.Generator, min_words: int, max_words: int) -> list[str]:
  n = int(rng.integers(min_words, max_words + 1))
  return [_WORDS[int(i)] for i in rng.integers(0, len(_WORDS), size=n)]


def _literal(words: list[str]) -> str:
  # The release stores each document as str(bytes): a literal with escapes, never a raw tab/newline.
  return str(' '.join(words).encode('utf-8'))


def write_retrieval_fixture(root: str, n_per_split: int, seed: int) -> dict[str, list[RetrievalRow]]:
  """Writes the three AAN TSVs under ``{root}/retrieval``; returns the rows by our split name.

  Labels alternate 0/1 in a seeded order, so every split has both classes; a positive pair shares
  its first words (a learnable signal). Lengths vary from a few bytes to a few hundred, so short
  configs truncate some documents and pad others. Lines end in ``\\n``.
  """
  if n_per_split < 2:
    raise ValueError(f'n_per_split must be >= 2 (both labels in every split), got {n_per_split}')
  rng = np.random.default_rng(seed)
  out: dict[str, list[RetrievalRow]] = {}
  directory = os.path.join(root, 'retrieval')
  for split_index, split in enumerate(common.SPLITS):
    labels = rng.permutation(np.arange(n_per_split) % 2)
    rows = []
    for i, label in enumerate(labels):
      words1 = _words(rng, 2, 60)
      words2 = _words(rng, 2, 60)
      if label:
        words2 = words1[:3] + words2
      rows.append(RetrievalRow(label=int(label), id1=f'P{10 + split_index}-{1000 + i}',
                               id2=f'P{rng.integers(0, 99):02d}-{rng.integers(1000, 9999)}',
                               text1=_literal(words1), text2=_literal(words2)))
    lines = [f'{r.label}\t{r.id1}\t{r.id2}\t{r.text1}\t{r.text2}\n' for r in rows]
    common.atomic_write_text(os.path.join(directory, retrieval.SPLIT_FILES[split]), ''.join(lines))
    out[split] = rows
  return out


@dataclasses.dataclass(frozen=True)
class PathfinderFixture:
  directory: str            # {root}/pathfinder{res}/{curv_dir}
  images: np.ndarray        # uint8 [N, res, res]: the decodable images, in metadata order
  labels: np.ndarray        # int32 [N]
  skipped: tuple[str, ...]  # paths of the empty and the corrupt image


def write_pathfinder_fixture(root: str, resolution: int, difficulty: str, n_images: int,
                             seed: int) -> PathfinderFixture:
  """Writes ``n_images`` metadata lines and images in the release layout; returns what was written.

  Images are spread over two batch folders (``imgs/0``, ``imgs/1``, metadata ``0.npy``, ``1.npy``) like
  the generator's batches. Label-1 images carry a bright vertical bar (a signal a model can learn).
  The second image of batch 0 is an empty file and the last image is garbage bytes: both stay in
  the metadata, as in the release, and the loader must skip them.
  """
  if n_images < 4:
    raise ValueError(f'n_images must be >= 4 (two of them are unreadable), got {n_images}')
  if resolution not in pathfinder.RESOLUTIONS or difficulty not in pathfinder.DIFFICULTIES:
    raise ValueError(f'resolution must be in {pathfinder.RESOLUTIONS} and difficulty in '
                     f'{tuple(pathfinder.DIFFICULTIES)}, got {resolution}, {difficulty!r}')
  from PIL import Image  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  curv = pathfinder.DIFFICULTIES[difficulty]
  directory = os.path.join(root, f'pathfinder{resolution}', curv)
  contour_length = {'easy': 6, 'intermediate': 9, 'hard': 14}[difficulty]
  per_batch = -(-n_images // 2)
  images, labels, skipped = [], [], []
  metadata: dict[int, list[str]] = {}
  for index in range(n_images):
    batch, n = divmod(index, per_batch)
    label = int(rng.integers(0, 2))
    relative_dir = f'imgs/{batch}'
    name = f'sample_{n}.png'
    path = os.path.join(directory, relative_dir, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # The generator's metadata row: subpath, file, index, label, continuity, contour length,
    # distractor length, paddle length, paddle thickness, paddle margin, number of contrasts.
    metadata.setdefault(batch, []).append(
        f'{relative_dir} {name} {n} {label} 1.0 {contour_length} {contour_length // 3} 2 0.5 1 1')
    if index == 1:
      open(path, 'wb').close()
      skipped.append(path)
      continue
    if index == n_images - 1:
      with open(path, 'wb') as f:
        f.write(b'this is not a png\x00\x01')
      skipped.append(path)
      continue
    pixels = rng.integers(0, 64, size=(resolution, resolution)).astype(np.uint8)
    if label:
      pixels[:, resolution // 2] = 255
    Image.fromarray(pixels).save(path, format='PNG')
    images.append(pixels)
    labels.append(label)
  for batch, lines in metadata.items():
    common.atomic_write_text(os.path.join(directory, 'metadata', f'{batch}.npy'),
                             '\n'.join(lines) + '\n')
  return PathfinderFixture(directory=directory, images=np.stack(images),
                           labels=np.asarray(labels, dtype=np.int32), skipped=tuple(skipped))
