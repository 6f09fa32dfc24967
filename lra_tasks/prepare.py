"""Getting every LRA task's data to where its config looks, verified: the library behind
``scripts/prepare_data.py``.

A ``Request`` is one task with the ``data`` part of one config (plus command-line overrides). For a
list of requests:

* ``prepare`` makes what is missing (ListOps by our seeded generator or from the release; Text and Image
  with TFDS' ``download_and_prepare``; the release tasks extracted in one streaming pass,
  ``lra_tasks.archive``), then writes a manifest per directory (``lra_tasks.manifest``) and builds the
  caches the loaders read (``lra_tasks.cache``); docs/data.md, "What a run does".
* ``check`` reports per request what is present, what is missing (the task's own ``check()`` lines,
  the same the trainer stops with), whether the files still match their manifest, whether a cache is
  there, and the one command that prepares it. A request is OK iff nothing is missing or differs.

Nothing here downloads except ``prepare_tfds`` (TFDS' builder), which tests replace by a fake.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import re
import time
from typing import Any, Callable, Sequence

from lra_tasks import archive
from lra_tasks import cache
from lra_tasks import common
from lra_tasks import listops
from lra_tasks import manifest
from lra_tasks import pathfinder
from lra_tasks import retrieval

TASKS = ('listops', 'text', 'retrieval', 'image', 'pathfinder')
SOURCE_HINT = '<lra_release.gz or its extracted folder>'
PATHFINDER_FILES = r'metadata/[^/]+\.npy|imgs/[^/]+/[^/]+\.png'
LISTOPS_FILES = r'basic_(?:train|val|test)\.tsv|generator\.json'
LISTOPS_RELEASE_DIR = 'listops-1000'

Log = Callable[[str], None]


@dataclasses.dataclass
class Request:
  """One task as one config sees it.

  Attributes:
    task: the task name.
    data: the config's ``data`` (with overrides applied); never shared with the caller's config.
    args: command-line arguments that select this config (``--config``, ``--resolution``, ...), so
      the command we print prepares exactly this.
    listops_release: ListOps from the release's ``listops-1000/basic_*.tsv`` instead of generated.
  """

  task: str
  data: Any
  args: tuple[str, ...] = ()
  listops_release: bool = False

  @property
  def label(self) -> str:
    extra = ''
    if self.task == 'pathfinder':
      res = int(self.data.resolution)
      extra = f' {res}x{res} {self.data.difficulty} (pathfinder{res}/{pathfinder.curv_dir(self.data)})'
    elif self.task in ('text', 'retrieval'):
      extra = f' max_length={int(self.data.max_length)}'
    config = next((a.split(' ', 1)[1] for a in self.args if a.startswith('--config ')), '')
    return f'{self.task}{extra}' + (f' ({config})' if config else '')

  def command(self) -> str:
    """The one command that prepares this request's data."""
    from kernelformer import data_location  # pylint: disable=g-import-not-at-top
    parts = ['python scripts/prepare_data.py', f'--task {self.task}', *self.args]
    if os.path.abspath(os.path.expanduser(str(self.data.data_dir))) != data_location.default_data_dir():
      parts.append(f'--data_dir {self.data.data_dir}')
    if self.task in ('text', 'image') and self.data.tfds_data_dir:
      parts.append(f'--tfds_data_dir {self.data.tfds_data_dir}')
    if self.needs_release():
      parts.append(f'--source {SOURCE_HINT}')
    if self.task == 'listops' and self.listops_release:
      parts.append('--listops release')
    return ' '.join(parts)

  def needs_release(self) -> bool:
    return self.task in ('retrieval', 'pathfinder') or (self.task == 'listops'
                                                        and self.listops_release)


def make_request(task: str, config, args: Sequence[str] = (), *, data_dir: str | None = None,
                 tfds_data_dir: str | None = None, max_length: int | None = None,
                 resolution: int | None = None, difficulty: str | None = None,
                 listops_release: bool = False) -> Request:
  """A request for ``task`` from ``config`` with the command-line overrides applied to a copy."""
  if task not in TASKS:
    raise common.DataError(f'unknown task {task!r}; valid: {", ".join(TASKS)}')
  if config.data.task != task:
    raise common.DataError(f'the config is for task {config.data.task!r}, not {task!r}')
  data = copy.deepcopy(config.data)
  args = list(args)
  if data_dir is not None:
    data.data_dir = data_dir
  if tfds_data_dir is not None and task in ('text', 'image'):
    data.tfds_data_dir = tfds_data_dir
  if max_length is not None and task in ('text', 'retrieval'):
    data.max_length = int(max_length)
    args.append(f'--max_length {int(max_length)}')
  if task == 'pathfinder':
    if resolution is not None:
      data.resolution = int(resolution)
    if difficulty is not None:
      data.difficulty = difficulty
    pathfinder.resolution(data)   # validates
    pathfinder.curv_dir(data)
    args += [f'--resolution {int(data.resolution)}', f'--difficulty {data.difficulty}']
  if task == 'listops' and listops_release:
    params = listops.GeneratorParams.from_data(data)
    if not params.is_lra_default():
      raise common.DataError(
          'listops: the released basic_*.tsv are read only with LRA\'s generator settings (the lra '
          'preset); this config generates its own files instead: drop --listops release')
  return Request(task=task, data=data, args=tuple(args), listops_release=listops_release)


# ----------------------------------------------------------------------------------------------
# Where each request's files are.


def data_directory(request: Request) -> str | None:
  """The directory whose files the request's manifest covers (None: TFDS data not prepared yet)."""
  data = request.data
  if request.task == 'retrieval':
    return retrieval.data_root(data)
  if request.task == 'pathfinder':
    return pathfinder.difficulty_dir(data)
  if request.task == 'listops':
    return listops.split_dir(data)
  return _tfds(request).prepared_dir(data)


def manifest_include(request: Request) -> str:
  if request.task == 'retrieval':
    return '|'.join(re.escape(f) for f in retrieval.SPLIT_FILES.values())
  if request.task == 'pathfinder':
    return PATHFINDER_FILES
  if request.task == 'listops':
    return LISTOPS_FILES
  return r'[^/]+'   # a TFDS version directory is flat


def selection(request: Request) -> archive.Selection:
  """The release members a request needs."""
  data = request.data
  if request.task == 'retrieval':
    return archive.Selection(label='retrieval', anchor='tsv_data', dest='retrieval',
                             files=tuple(retrieval.SPLIT_FILES.values()))
  if request.task == 'pathfinder':
    folder = f'pathfinder{pathfinder.resolution(data)}/{pathfinder.curv_dir(data)}'
    return archive.Selection(label=folder, anchor=folder, dest=folder, pattern=PATHFINDER_FILES)
  if request.task == 'listops' and request.listops_release:
    return archive.Selection(label='listops', anchor=LISTOPS_RELEASE_DIR, dest='listops',
                             files=tuple(listops.SPLIT_FILES.values()))
  raise ValueError(f'{request.task} is not extracted from the release')


def _tfds(request: Request) -> common.TfdsDataset:
  if request.task == 'text':
    from lra_tasks import text  # pylint: disable=g-import-not-at-top
    return text.IMDB
  from lra_tasks import image  # pylint: disable=g-import-not-at-top
  return image.CIFAR10


def _task(request: Request):
  import lra_tasks  # pylint: disable=g-import-not-at-top
  return lra_tasks.get(request.task)


def pathfinder_missing_images(data: Any) -> list[str]:
  """Images the metadata names that are not on disk (the loader would stop at the first)."""
  directory = pathfinder.difficulty_dir(data)
  return [p for p in pathfinder.source_files(directory) if not os.path.isfile(p)]


# ----------------------------------------------------------------------------------------------
# Caches.


def caches(request: Request) -> list[tuple[str, Callable[[], Any], Callable[[], str]]]:
  """``(label, load, build)`` per cache the request's loader reads (none for ListOps and Image)."""
  data = request.data
  if request.task == 'retrieval':
    return [(f'retrieval {split}', (lambda s=split: retrieval.cached_arrays(data, s)),
             (lambda s=split: retrieval.build_cache(data, s))) for split in common.SPLITS]
  if request.task == 'pathfinder':
    return [('pathfinder images', lambda: pathfinder.cached_examples(data),
             lambda: pathfinder.build_cache(data))]
  if request.task == 'text':
    from lra_tasks import text  # pylint: disable=g-import-not-at-top
    return [(f'text {split}', (lambda s=split: text.cached_split(data, s)),
             (lambda s=split: text.build_cache(data, s))) for split in text.IMDB.splits]
  return []


# ----------------------------------------------------------------------------------------------
# Preparing.


class ExtractionProgress:
  """Prints one line every ``every`` seconds while extracting: files, bytes, the current member."""

  def __init__(self, log: Log, every: float = 5.0):
    self._log = log
    self._every = every
    self._last = time.perf_counter()
    self._files = 0
    self._bytes = 0

  def __call__(self, name: str, done: int, size: int) -> None:
    if done == size:
      self._files += 1
      self._bytes += size
    now = time.perf_counter()
    if now - self._last >= self._every:
      self._last = now
      self._log(f'  ... {self._files} files ({manifest.format_bytes(self._bytes)}) written; '
                f'at {name}')


def prepare_tfds(dataset: common.TfdsDataset, data: Any, builder_factory: Callable | None = None,
                 log: Log = print) -> tuple[str, bool]:
  """Prepares ``dataset`` as ``array_record`` under its TFDS root; ``(directory, prepared now)``.

  ``builder_factory(name, data_dir=...)`` defaults to ``tfds.builder``; its ``download_and_prepare``
  downloads the upstream files (imdb: ai.stanford.edu, cifar10: cs.toronto.edu) and writes the
  shards without TensorFlow. GCS copies are not used: they are TFRecord, which ``tfds.data_source``
  cannot read. TFRecord shards that ``tfds.load`` left in the version directory are moved aside to
  ``<version>.tfrecord`` (kept, not deleted) so that the array_record version can take its place.
  """
  existing = dataset.prepared_dir(data)
  if existing is not None:
    return existing, False
  expected = dataset.expected_dir(data)
  if dataset.holds_tfrecord(expected):
    aside = expected + '.tfrecord'
    if os.path.exists(aside):
      raise common.DataError(f'{dataset.task}: {expected} holds TFRecord shards and {aside} exists '
                             'too; move one of them away and run again')
    os.replace(expected, aside)
    log(f'{dataset.task}: moved the TFRecord version {expected} to {aside}')
  download_config = None
  if builder_factory is None:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    builder_factory = tfds.builder
    download_config = tfds.download.DownloadConfig(try_download_gcs=False)
  log(f'{dataset.task}: preparing {dataset.full_name} as array_record under {dataset.root(data)} '
      '(downloads it)')
  start = time.perf_counter()
  builder = builder_factory(dataset.full_name, data_dir=dataset.root(data))
  builder.download_and_prepare(file_format='array_record', download_config=download_config)
  prepared = dataset.prepared_dir(data)
  if prepared is None:
    raise common.DataError(f'{dataset.task}: TFDS finished but {expected} has no array_record '
                           f'shards for {", ".join(dataset.splits)}; see the TFDS log above')
  log(f'{dataset.task}: prepared {prepared} in {time.perf_counter() - start:.1f} s')
  return prepared, True


def _write_manifest(request: Request, source: str, log: Log) -> None:
  directory = data_directory(request)
  start = time.perf_counter()
  m = manifest.write(directory, manifest_include(request), request.task, source)
  log(f'{request.label}: wrote {manifest.path(directory)} ({manifest.summary(m)}, '
      f'{time.perf_counter() - start:.1f} s)')


def prepare(requests: Sequence[Request], *, source: str | None = None, build_caches: bool = True,
            tfds_builder: Callable | None = None, log: Log = print,
            progress: archive.Progress | None = None) -> None:
  """Makes every request's data present, with its manifest and caches; a DataError says what failed."""
  written: set[int] = set()   # requests whose files changed in this run (their manifest is rewritten)
  for i, request in enumerate(requests):
    data = request.data
    if request.task == 'listops' and not request.listops_release:
      missing = [s for s in common.SPLITS if not os.path.isfile(listops.split_path(data, s))]
      if missing:
        data.generate = True
        start = time.perf_counter()
        listops.TASK.prepare(data)
        log(f'{request.label}: generated {", ".join(missing)} in {time.perf_counter() - start:.1f} s '
            f'-> {listops.split_dir(data)}')
        written.add(i)
    elif request.task in ('text', 'image'):
      _, now = prepare_tfds(_tfds(request), data, tfds_builder, log)
      if now:
        written.add(i)

  from_release = [i for i, r in enumerate(requests) if r.needs_release()]
  if from_release and source is None:
    lacking = [requests[i] for i in from_release if _task(requests[i]).check(requests[i].data)]
    if lacking:
      raise common.DataError(
          f'{", ".join(r.label for r in lacking)}: data missing and no --source given: run '
          f'{lacking[0].command()} (download {retrieval.RELEASE_URL})')
  if from_release and source is not None:
    by_dir: dict[str, list[archive.Selection]] = {}
    for i in from_release:
      root = os.path.expanduser(str(requests[i].data.data_dir))
      sel = selection(requests[i])
      if all(s.label != sel.label for s in by_dir.setdefault(root, [])):
        by_dir[root].append(sel)
    for root, sels in by_dir.items():
      log(f'extracting {", ".join(s.label for s in sels)} from {source} into {root}')
      result = archive.extract(source, sels, root,
                               progress=progress or ExtractionProgress(log))
      for sel in sels:
        log(f'  {sel.label}: {result.written[sel.label]} files written, {result.kept[sel.label]} '
            'already complete')
      log(f'  {manifest.format_bytes(result.bytes_written)} in {result.seconds:.1f} s')
      changed = {s.label for s in sels if result.written[s.label]}
      if 'listops' in changed:
        # The split files are LRA's now: a generator.json left from generating would claim otherwise
        # (and let ListOps' prepare() regenerate a deleted split with our generator, mixing the two).
        stale = os.path.join(root, 'listops', listops.GENERATOR_JSON)
        if os.path.isfile(stale):
          os.remove(stale)
      written.update(i for i in from_release
                     if os.path.expanduser(str(requests[i].data.data_dir)) == root
                     and selection(requests[i]).label in changed)

  for i, request in enumerate(requests):
    missing = _task(request).check(request.data)
    if missing:
      raise common.DataError(f'{request.label}: still missing after preparing: ' + '; '.join(missing))
    if request.task == 'pathfinder':
      absent = pathfinder_missing_images(request.data)
      if absent:
        raise common.DataError(
            f'{request.label}: {len(absent)} image(s) named in the metadata are missing (first: '
            f'{absent[0]}); extract the set again from the complete release')
    directory = data_directory(request)
    if i in written or manifest.read(directory) is None:
      how = source if (request.needs_release() and source) else (
          'generated' if request.task == 'listops' else
          'tfds' if request.task in ('text', 'image') else 'present before (copied by hand)')
      _write_manifest(request, how, log)
    if build_caches:
      for label, load, build in caches(request):
        if load() is None:
          start = time.perf_counter()
          where = build()
          log(f'{request.label}: built cache {label} -> {where} ({time.perf_counter() - start:.1f} s, '
              f'{manifest.format_bytes(cache.disk_bytes(where))})')


# ----------------------------------------------------------------------------------------------
# Checking.


@dataclasses.dataclass
class Status:
  request: Request
  missing: list[str]      # the task's check() lines: what the trainer would stop with
  present: list[str]
  problems: list[str]     # differences from the manifest
  notes: list[str]
  # Generated data (ListOps from its seed) that is absent: the loader makes it on first use.
  on_first_use: str = ''

  @property
  def ok(self) -> bool:
    return not self.missing and not self.problems


def _present(request: Request) -> list[str]:
  data = request.data
  out = []
  if request.task in ('retrieval', 'listops'):
    module = retrieval if request.task == 'retrieval' else listops
    for split in common.SPLITS:
      path = module.split_path(data, split)
      if os.path.isfile(path):
        out.append(f'{path} ({manifest.format_bytes(os.path.getsize(path))})')
  elif request.task == 'pathfinder':
    directory = pathfinder.difficulty_dir(data)
    metas = pathfinder.metadata_files(directory)
    if metas:
      try:
        images = sum(len(pathfinder.read_metadata(m)) for m in metas)
      except common.DataError as e:
        return [f'{directory}/metadata/ ({len(metas)} files; unreadable: {e})']
      out.append(f'{directory}/metadata/ ({len(metas)} files naming {images} images under imgs/)')
  else:
    dataset = _tfds(request)
    directory = dataset.prepared_dir(data)
    if directory is not None:
      shards = sum(len(dataset.shards(directory, s)) for s in dataset.splits)
      out.append(f'{directory} (dataset_info.json + {shards} array_record shards)')
  return out


def check_request(request: Request, checksums: bool = True) -> Status:
  status = Status(request, missing=list(_task(request).check(request.data)),
                  present=_present(request), problems=[], notes=[])
  if (status.missing and request.task == 'listops' and not request.listops_release
      and bool(request.data.get('generate', False)) and not status.present):
    # Nothing there and a seeded generator: the first run (or prepare) writes the three splits.
    status.missing = []
    status.on_first_use = listops.split_dir(request.data)
    return status
  if not status.missing and request.task == 'pathfinder':
    # The task's check() looks for the metadata only; an interrupted copy can lack images it names.
    try:
      absent = pathfinder_missing_images(request.data)
    except common.DataError as e:
      absent, status.missing = [], [str(e)]
    if absent:
      status.missing.append(f'{len(absent)} image(s) named in the metadata are missing (first: '
                            f'{absent[0]})')
  if status.missing:
    return status
  directory = data_directory(request)
  try:
    m = manifest.read(directory) if directory else None
  except common.DataError as e:
    status.problems.append(str(e))
    return status
  if m is None:
    status.notes.append(f'no {manifest.NAME} in {directory} (not prepared by this script): not '
                        'verified; the command below writes one')
  else:
    status.problems = manifest.verify(directory, m, checksums=checksums)
    if not status.problems:
      status.notes.append(f'{manifest.path(directory)}: {manifest.summary(m)} verified '
                          f'({"sizes and sha256" if checksums else "sizes only"})')
  for label, load, _ in caches(request):
    try:
      arrays = load()
    except common.DataError:
      arrays = None
    if arrays is None:
      status.notes.append(f'cache {label}: absent (the loader reads the raw files)')
    else:
      size = sum(a.nbytes for a in arrays.values())
      status.notes.append(f'cache {label}: present ({manifest.format_bytes(size)})')
  return status


def check(requests: Sequence[Request], checksums: bool = True) -> list[Status]:
  return [check_request(r, checksums) for r in requests]


def format_status(status: Status) -> list[str]:
  if status.on_first_use:
    return [f'[{status.request.label}] will be generated on first use (seeded generator) into '
            f'{status.on_first_use}', f'  to generate it now: {status.request.command()}']
  state = 'OK' if status.ok else ('MISSING' if status.missing else 'DIFFERS FROM MANIFEST')
  lines = [f'[{status.request.label}] {state}']
  lines += [f'  present: {p}' for p in status.present]
  lines += [f'  missing: {m}' for m in status.missing]
  lines += [f'  differs: {p}' for p in status.problems]
  lines += [f'  note: {n}' for n in status.notes]
  if not status.ok or any('absent' in n or 'not verified' in n for n in status.notes):
    lines.append(f'  to prepare: {status.request.command()}')
  return lines
