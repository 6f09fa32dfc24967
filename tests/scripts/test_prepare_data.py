"""scripts/prepare_data.py: --check names every missing path and the command; prepare, verify, resume.

The release is built with our fixture writers in its real layout (tests/lra_tasks/test_archive.py);
TFDS is exercised with a fake builder and ``tfds.testing.mock_data``: nothing touches the network.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import tensorflow_datasets as tfds

from configs import text as text_config
from lra_tasks import common
from lra_tasks import listops
from lra_tasks import manifest
from lra_tasks import prepare
from lra_tasks import text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, 'scripts', 'prepare_data.py')


def _load(name, path):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


prepare_data = _load('prepare_data_script', SCRIPT)
release_helpers = _load('release_helpers', os.path.join(ROOT, 'tests', 'lra_tasks', 'test_archive.py'))


def run(capsys, *argv):
  rc = prepare_data.main(list(argv))
  out, err = capsys.readouterr()
  return rc, out, err


@pytest.fixture(name='archive_path')
def fixture_archive_path(tmp_path):
  members = release_helpers.build_release(str(tmp_path / 'src'))
  path = str(tmp_path / 'lra_release.gz')
  release_helpers.pack(members, path)
  return path


def test_check_lists_every_missing_path_and_the_command(tmp_path, capsys):
  data_dir = str(tmp_path / 'data')
  rc, out, _ = run(capsys, '--task', 'all', '--data_dir', data_dir, '--check')
  assert rc == 1
  # ListOps is generated from its seed: not missing, made on first use.
  assert f'[listops] will be generated on first use (seeded generator) into {data_dir}/listops' in out
  assert f'  to generate it now: python scripts/prepare_data.py --task listops --data_dir {data_dir}' in out
  expected = [os.path.join(data_dir, 'retrieval', f'new_aan_pairs.{s}.tsv')
               for s in ('train', 'eval', 'test')]
  expected += [os.path.join(data_dir, 'imdb_reviews', 'plain_text', '1.0.0'),
               os.path.join(data_dir, 'cifar10', '3.0.2'),
               os.path.join(data_dir, 'pathfinder32', 'curv_contour_length_14', 'metadata')]
  missing = [line for line in out.splitlines() if line.startswith('  missing: ')]
  for path in expected:
    assert sum(path in line for line in missing) == 1, path
  commands = [line.split('to prepare: ', 1)[1] for line in out.splitlines() if 'to prepare: ' in line]
  assert commands == [
      f'python scripts/prepare_data.py --task text --data_dir {data_dir}',
      f'python scripts/prepare_data.py --task retrieval --data_dir {data_dir} --source '
      f'{prepare.SOURCE_HINT}',
      f'python scripts/prepare_data.py --task image --data_dir {data_dir}',
      f'python scripts/prepare_data.py --task pathfinder --resolution 32 --difficulty hard '
      f'--data_dir {data_dir} --source {prepare.SOURCE_HINT}']
  assert not os.path.exists(data_dir)   # checking creates nothing
  # Missing release data without --source: one line with the command, no extraction attempted.
  rc, _, err = run(capsys, '--task', 'retrieval', '--data_dir', data_dir)
  assert rc == 1 and err.count('\n') == 1 and '--source' in err and 'retrieval' in err


def test_prepare_from_the_archive_then_check_and_detect_damage(tmp_path, capsys, archive_path):
  data_dir = str(tmp_path / 'data')
  common_args = ['--config', os.path.join(ROOT, 'configs', 'retrieval.py') + ':tiny',
                 '--config', os.path.join(ROOT, 'configs', 'pathfinder.py') + ':tiny',
                 '--data_dir', data_dir]
  # Once as a user runs it: a separate process, started from another directory.
  done = subprocess.run([sys.executable, SCRIPT, *common_args, '--source', archive_path],
                        capture_output=True, text=True, cwd=str(tmp_path), timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'all present' in done.stdout
  for directory in ('retrieval', 'pathfinder32/curv_contour_length_14'):
    with open(os.path.join(data_dir, directory, manifest.NAME)) as f:
      m = json.load(f)
    assert m['source'] == archive_path and m['count'] == {'retrieval': 3}.get(directory, 10)
  assert len(os.listdir(os.path.join(data_dir, 'cache'))) == 4   # 3 retrieval splits + pathfinder
  rc, out, _ = run(capsys, *common_args, '--check')
  assert rc == 0, out
  assert out.count('verified (sizes and sha256)') == 2
  assert out.count('cache ') == 4 and 'absent' not in out
  # Same size, one byte changed: only the checksum can tell.
  tsv = os.path.join(data_dir, 'retrieval', 'new_aan_pairs.eval.tsv')
  with open(tsv, 'r+b') as f:
    first = f.read(1)
    f.seek(0)
    f.write(b'1' if first == b'0' else b'0')
  png = os.path.join(data_dir, 'pathfinder32', 'curv_contour_length_14', 'imgs', '0', 'sample_0.png')
  os.remove(png)
  rc, out, _ = run(capsys, *common_args, '--check')
  assert rc == 1
  assert f'differs: {tsv} has another sha256' in out
  # The image is named in the metadata (the loader would stop there) and listed in the manifest.
  assert f'missing: 1 image(s) named in the metadata are missing (first: {png})' in out
  os.remove(os.path.join(data_dir, 'pathfinder32', 'curv_contour_length_14', manifest.NAME))
  rc, out, _ = run(capsys, *common_args, '--check', '--no_checksums')
  assert rc == 1 and f'first: {png}' in out and 'not verified' not in out
  # Preparing again restores both from the archive: the edit changed the TSV's modification time,
  # so it no longer counts as the complete member.
  rc, _, err = run(capsys, *common_args, '--source', archive_path)
  assert rc == 0, err
  assert run(capsys, *common_args, '--check')[0] == 0


def test_listops_generated_or_from_the_release(tmp_path, capsys, archive_path):
  tiny = os.path.join(ROOT, 'configs', 'listops.py') + ':tiny'
  data_dir = str(tmp_path / 'gen')
  rc, out, _ = run(capsys, '--config', tiny, '--data_dir', data_dir)
  assert rc == 0, out
  (directory,) = [d for d in os.listdir(os.path.join(data_dir, 'listops')) if d.startswith('gen-')]
  written = manifest.read(os.path.join(data_dir, 'listops', directory))
  assert written['count'] == 4 and written['source'] == 'generated'
  assert run(capsys, '--config', tiny, '--data_dir', data_dir, '--check')[0] == 0
  # LRA's released files, for the default (LRA) settings, go where generated LRA-size files would.
  release_dir = str(tmp_path / 'release')
  # A generator.json from an earlier generation there would claim the released files as ours.
  common.atomic_write_text(os.path.join(release_dir, 'listops', listops.GENERATOR_JSON), '{}')
  rc, out, err = run(capsys, '--task', 'listops', '--data_dir', release_dir, '--source', archive_path)
  assert rc == 0, err
  assert not os.path.exists(os.path.join(release_dir, 'listops', listops.GENERATOR_JSON))
  for split in common.SPLITS:
    assert os.path.isfile(os.path.join(release_dir, 'listops', f'basic_{split}.tsv'))
  assert manifest.read(os.path.join(release_dir, 'listops'))['source'] == archive_path
  rc, _, err = run(capsys, '--config', tiny, '--data_dir', release_dir, '--source', archive_path,
                   '--listops', 'release')
  assert rc == 1 and "LRA's generator settings" in err


class FakeBuilder:
  """Stands in for ``tfds.builder``: writes the layout TFDS' array_record preparation leaves."""

  calls: list = []

  def __init__(self, name, data_dir):
    self.name, self.data_dir = name, data_dir

  def download_and_prepare(self, file_format=None, download_config=None):
    FakeBuilder.calls.append((self.name, file_format, download_config))
    base, version = self.name.split(':')
    directory = os.path.join(self.data_dir, *base.split('/'), version)
    os.makedirs(directory)
    with open(os.path.join(directory, 'dataset_info.json'), 'w') as f:
      f.write('{}')
    for split in ('train', 'test'):
      with open(os.path.join(directory, f'{base.split("/")[0]}-{split}.{file_format}-00000-of-00001'),
                'wb') as f:
        f.write(split.encode())


def test_text_prepared_as_array_record_with_manifest_and_cache(tmp_path):
  c = text_config.get_config('tiny')
  request = prepare.make_request('text', c, data_dir=str(tmp_path / 'data'))
  version = os.path.join(str(tmp_path / 'data'), 'imdb_reviews', 'plain_text', '1.0.0')
  # A TFRecord preparation (tfds.load's default) is moved aside, not deleted.
  os.makedirs(version)
  with open(os.path.join(version, 'imdb_reviews-train.tfrecord-00000-of-00001'), 'wb') as f:
    f.write(b'tf')
  assert 'TFRecord' in prepare.check_request(request).missing[0]
  FakeBuilder.calls.clear()
  log = []
  with tfds.testing.mock_data(num_examples=12):
    prepare.prepare([request], tfds_builder=FakeBuilder, log=log.append)
  assert FakeBuilder.calls == [('imdb_reviews/plain_text:1.0.0', 'array_record', None)]
  assert os.path.isfile(os.path.join(version + '.tfrecord', 'imdb_reviews-train.tfrecord-00000-of-00001'))
  status = prepare.check_request(request)
  assert status.ok and status.missing == [] and status.problems == []
  assert manifest.read(version)['count'] == 3
  assert sum('cache text' in n and 'present' in n for n in status.notes) == 2
  assert len(text.TASK.source(request.data, 'val')) == 3   # from the cache: no TFDS needed
  # Prepared data is not prepared again.
  with tfds.testing.mock_data(num_examples=12):
    prepare.prepare([request], tfds_builder=FakeBuilder, log=log.append)
  assert len(FakeBuilder.calls) == 1
