"""Get each LRA task's data where its config looks for it, verified; or check what is there.

  python scripts/prepare_data.py --task listops                 # seeded generator (LRA sizes)
  python scripts/prepare_data.py --task text                    # TFDS imdb_reviews, array_record
  python scripts/prepare_data.py --task image                   # TFDS cifar10, array_record
  python scripts/prepare_data.py --task retrieval --source lra_release.gz
  python scripts/prepare_data.py --task pathfinder --source lra_release.gz \\
      --resolution 32,128 --difficulty hard                     # Pathfinder and Path-X
  python scripts/prepare_data.py --task all --source lra_release.gz
  python scripts/prepare_data.py --check                        # every task; exit 0 iff all is there

The files go to the data directory every config reads by default: $KERNELFORMER_DATA if set, else
~/.cache/kernelformer/data ($XDG_CACHE_HOME/kernelformer/data); --data_dir DIR picks another.

``--source`` is LRA's release archive (``lra_release.gz``, streamed: only the needed members are
written) or the folder it was extracted to. ``--config FILE.py[:PRESET]`` (repeatable) prepares what
that config needs (e.g. ``configs/text.py:kernel_learning`` caches 4000-byte tokens); ``--task`` alone
uses the task's default config. An interrupted run is resumed by running the same command.

What a run leaves: the files, a ``MANIFEST.json`` (sizes, sha256) next to them, and caches under
``{data_dir}/cache`` that the loaders read instead of the raw files. ``--check`` prints, per task,
the files present, the exact paths missing, differences from the manifest, the caches, and the one
command that prepares what is missing; it exits 0 only if nothing is missing or differs. The trainer
runs the same per-task check before compiling anything.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys
import time


from lra_tasks import common  # noqa: E402
from lra_tasks import pathfinder  # noqa: E402
from lra_tasks import prepare  # noqa: E402


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog='kernelformer prepare-data', description=__doc__,
      formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--task', default='',
                 help='listops, text, retrieval, image, pathfinder or all; a comma-separated list works')
  p.add_argument('--config', action='append', default=[], metavar='FILE.py[:PRESET]',
                 help='prepare what this config needs (repeatable); its data.task is the task')
  p.add_argument('--data_dir', default=None,
                 help="root of every task's files (default: the config's: $KERNELFORMER_DATA, else "
                      '~/.cache/kernelformer/data)')
  p.add_argument('--tfds_data_dir', default=None,
                 help='TFDS data dir for text/image (default: the config\'s, else --data_dir)')
  p.add_argument('--source', default=None,
                 help='lra_release.gz or the folder it was extracted to (retrieval, pathfinder, '
                      'released listops)')
  p.add_argument('--resolution', default=None,
                 help='pathfinder resolutions, comma-separated (32, 64, 128, 256)')
  p.add_argument('--difficulty', default=None,
                 help='pathfinder difficulties, comma-separated (easy, intermediate, hard) or all')
  p.add_argument('--max_length', type=int, default=None,
                 help='bytes per document for the text/retrieval caches (default: the config\'s)')
  p.add_argument('--listops', choices=('generate', 'release'), default=None,
                 help='generate ListOps (default) or extract the release\'s basic_*.tsv (the '
                      'default when --task listops comes with --source)')
  p.add_argument('--check', action='store_true', help='only report; exit 0 iff everything is there')
  p.add_argument('--no_checksums', action='store_true',
                 help='--check compares file sizes with the manifest, not sha256')
  p.add_argument('--no_cache', action='store_true', help='do not build the loader caches')
  return p


def _split(value: str | None) -> list[str]:
  return [v.strip() for v in value.split(',') if v.strip()] if value else []


def load_config(spec: str):
  """``FILE.py[:PRESET]`` -> that file's ``get_config(PRESET)`` (as ``--config`` of train.py)."""
  path, _, preset = spec.partition(':')
  if not os.path.isfile(path):
    raise common.DataError(f'--config {spec}: no file {path}')
  module_spec = importlib.util.spec_from_file_location(
      f'_prepare_config_{abs(hash(os.path.abspath(path)))}', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  try:
    return module.get_config(preset) if preset else module.get_config()
  except ValueError as e:
    raise common.DataError(f'--config {spec}: {e}') from e


def build_requests(args: argparse.Namespace) -> list[prepare.Request]:
  """One request per (task, config, pathfinder set), in task order."""
  tasks = _split(args.task)
  if 'all' in tasks:
    tasks = list(prepare.TASKS)
  unknown = [t for t in tasks if t not in prepare.TASKS]
  if unknown:
    raise common.DataError(f'unknown task(s) {", ".join(unknown)}; valid: '
                           f'{", ".join(prepare.TASKS)}, all')
  configs = [(spec, load_config(spec)) for spec in args.config]
  if not tasks and not configs and args.check:
    tasks = list(prepare.TASKS)   # --check alone: every task's default config
  if not tasks and not configs:
    raise common.DataError('say what to prepare: --task (or --config FILE.py[:PRESET])')
  covered = {c.data.task for _, c in configs}
  configs += [(None, importlib.import_module(f'kernelformer.configs.{t}').get_config())  # the default
              for t in tasks if t not in covered]
  release_listops = args.listops == 'release' or (
      args.listops is None and args.source is not None and tasks == ['listops'])
  difficulties = _split(args.difficulty)
  if difficulties == ['all']:
    difficulties = list(pathfinder.DIFFICULTIES)
  resolutions = [int(r) for r in _split(args.resolution)]
  requests = []
  for spec, config in sorted(configs, key=lambda sc: prepare.TASKS.index(sc[1].data.task)):
    task = config.data.task
    base = (f'--config {spec}',) if spec else ()
    common_kwargs = dict(data_dir=args.data_dir, tfds_data_dir=args.tfds_data_dir,
                         max_length=args.max_length, listops_release=release_listops)
    if task == 'pathfinder':
      for res in resolutions or [None]:
        for difficulty in difficulties or [None]:
          requests.append(prepare.make_request(task, config, base, resolution=res,
                                               difficulty=difficulty, **common_kwargs))
    else:
      requests.append(prepare.make_request(task, config, base, **common_kwargs))
  return requests


def main(argv: list[str]) -> int:
  args = _parser().parse_args(argv)
  logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(name)s: %(message)s')
  if _split(args.task) == ['enwik8']:
    return _enwik8(args)
  try:
    requests = build_requests(args)
    if not args.check:
      start = time.perf_counter()
      prepare.prepare(requests, source=args.source, build_caches=not args.no_cache)
      print(f'prepared in {time.perf_counter() - start:.1f} s')
    # After preparing, the manifests were just written from these files: sizes suffice.
    checksums = args.check and not args.no_checksums
    statuses = prepare.check(requests, checksums=checksums)
  except common.DataError as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  except OSError as e:   # a read-only or unwritable data directory: one line, not a traceback
    line = _unwritable(e, args)
    if line is None:
      raise
    print(f'error: {line}', file=sys.stderr)
    return 1
  from kernelformer import data_location  # pylint: disable=g-import-not-at-top
  for data_dir in dict.fromkeys(str(s.request.data.data_dir) for s in statuses):
    print(data_location.describe(data_dir))
  for status in statuses:
    print('\n'.join(prepare.format_status(status)))
  oks = [s.ok for s in statuses]
  if args.check and not args.task and not args.config:   # every task: the byte-level LM's too
    oks.append(_enwik8(args, summary=False) == 0)
  ok = all(oks)
  print('all present' if ok else f'{oks.count(False)} of {len(oks)} not ready (see above)')
  return 0 if ok else 1


def _unwritable(error: OSError, args) -> str | None:
  from kernelformer import data_location  # pylint: disable=g-import-not-at-top
  from kernelformer.training import workdir  # pylint: disable=g-import-not-at-top
  return workdir.unwritable_data(error, args.data_dir or data_location.default_data_dir())


def _enwik8(args, summary: bool = True) -> int:
  """``--task enwik8``: download enwik8.zip once (or ``--source`` a local zip), extract, manifest;
  ``--check`` verifies the file against its manifest. See lra_tasks/enwik8.py."""
  from lra_tasks import enwik8  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  from kernelformer import data_location  # pylint: disable=g-import-not-at-top
  data = ml_collections.ConfigDict({'data_dir': args.data_dir or data_location.default_data_dir(),
                                    'num_bytes': enwik8.NUM_BYTES})
  try:
    if not args.check:
      enwik8.prepare_data(data, zip_path=args.source)
    problems = enwik8.verify(data, checksums=not args.no_checksums)
  except (common.DataError, OSError) as e:
    line = _unwritable(e, args) if isinstance(e, OSError) else None
    print(f'error: enwik8: {line or e}', file=sys.stderr)
    return 1
  print(f'[enwik8] {"MISSING" if problems else "OK"}')
  for line in problems:
    print(f'  {line}')
  if summary:
    print('all present' if not problems else 'enwik8 not ready (see above)')
  return 0 if not problems else 1


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))


def run(args) -> int:
  """``kernelformer prepare-data``: ``--config`` values resolve like train's (packaged names work)."""
  from kernelformer.commands import _common  # pylint: disable=g-import-not-at-top
  args = list(args)
  if not _common.wants_help(args):
    args = _common.resolve_config_args(args)
  return main(args)
