"""Streaming extraction from LRA's release: the selected tree only, resumable, crash-safe, clear errors.

Every test builds a small release in the real layout (``lra_release/tsv_data/``,
``lra_release/pathfinder32/<curv dir>/{imgs,metadata}``, ``lra_release/listops-1000/``) with our own
fixture writers and packs it deterministically (fixed member times, gzip mtime 0), so a corrupted
byte lands in the same place on every run.
"""
from __future__ import annotations

import gzip
import io
import os
import re
import signal
import subprocess
import sys
import tarfile

import pytest

from lra_tasks import archive
from lra_tasks import common
from lra_tasks import fixtures
from lra_tasks import listops

MTIME = 1_600_000_000
HARD = 'pathfinder32/curv_contour_length_14'
EASY = 'pathfinder32/curv_baseline'
RETRIEVAL = archive.Selection(label='retrieval', anchor='tsv_data', dest='retrieval',
                              files=('new_aan_pairs.train.tsv', 'new_aan_pairs.eval.tsv',
                                     'new_aan_pairs.test.tsv'))
PATHFINDER = archive.Selection(label=HARD, anchor=HARD, dest=HARD,
                               pattern=r'metadata/[^/]+\.npy|imgs/[^/]+/[^/]+\.png')


def build_release(root: str, prefix: str = 'lra_release') -> dict[str, bytes]:
  """Writes a small release under ``root/prefix``; returns ``{member path: bytes}``."""
  base = os.path.join(root, prefix)
  scratch = os.path.join(root, 'scratch')
  fixtures.write_retrieval_fixture(scratch, n_per_split=3, seed=0)
  for name in RETRIEVAL.files:
    os.makedirs(os.path.join(base, 'tsv_data'), exist_ok=True)
    os.replace(os.path.join(scratch, 'retrieval', name), os.path.join(base, 'tsv_data', name))
  fixtures.write_pathfinder_fixture(base, 32, 'hard', 8, seed=0)
  fixtures.write_pathfinder_fixture(base, 32, 'easy', 5, seed=1)
  for split, name in listops.SPLIT_FILES.items():
    listops.write_tsv(os.path.join(base, 'listops-1000', name), [('( ( [MAX 2 ) 3 ) ] )', 3)])
  common.atomic_write_text(os.path.join(base, 'README'), 'not needed by any task\n')
  members = {}
  for directory, _, files in os.walk(os.path.join(root, prefix.split('/')[0])):
    for file in files:
      path = os.path.join(directory, file)
      os.utime(path, (MTIME, MTIME))
      with open(path, 'rb') as f:
        members[os.path.relpath(path, root).replace(os.sep, '/')] = f.read()
  return members


def pack(members: dict[str, bytes], path: str, extra: list[tarfile.TarInfo] = ()) -> bytes:
  """A deterministic tar.gz of ``members`` (sorted, fixed times); returns its bytes."""
  raw = io.BytesIO()
  with tarfile.open(fileobj=raw, mode='w', format=tarfile.PAX_FORMAT) as tar:
    for name in sorted(members):
      info = tarfile.TarInfo(name)
      info.size, info.mtime, info.mode = len(members[name]), MTIME, 0o644
      tar.addfile(info, io.BytesIO(members[name]))
    for info in extra:
      tar.addfile(info, io.BytesIO(b'x' * info.size) if info.isfile() else None)
  blob = io.BytesIO()
  with gzip.GzipFile(fileobj=blob, mode='wb', mtime=0) as gz:
    gz.write(raw.getvalue())
  with open(path, 'wb') as f:
    f.write(blob.getvalue())
  return blob.getvalue()


def expected_tree(members: dict[str, bytes], selections) -> dict[str, bytes]:
  out = {}
  for name, content in members.items():
    for sel in selections:
      rest = sel.below_anchor(name)
      if rest is not None:
        out[f'{sel.dest}/{rest}'] = content
  return out


def tree(data_dir: str) -> dict[str, bytes]:
  out = {}
  for directory, _, files in os.walk(data_dir):
    for file in files:
      if file == archive.LOCK_NAME:
        continue
      path = os.path.join(directory, file)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, data_dir).replace(os.sep, '/')] = f.read()
  return out


@pytest.fixture(name='release')
def fixture_release(tmp_path):
  members = build_release(str(tmp_path / 'src'))
  archive_path = str(tmp_path / 'lra_release.gz')
  blob = pack(members, archive_path)
  return members, archive_path, blob


@pytest.mark.parametrize('kind', ['archive', 'folder', 'nested_folder'])
def test_extraction_yields_exactly_the_selected_tree(tmp_path, release, kind):
  members, archive_path, _ = release
  if kind == 'archive':
    source = archive_path
  elif kind == 'folder':
    source = str(tmp_path / 'src')
  else:  # the archive nests lra_release/ twice in some copies
    source = str(tmp_path / 'nested')
    build_release(source, prefix='lra_release/lra_release')
  data_dir = str(tmp_path / 'data')
  result = archive.extract(source, [RETRIEVAL, PATHFINDER], data_dir)
  expected = expected_tree(members, [RETRIEVAL, PATHFINDER])
  assert len(expected) == 3 + 8 + 2   # 3 TSVs, 8 images (one empty, one corrupt), 2 metadata files
  assert tree(data_dir) == expected   # nothing else: no easy set, no ListOps, no README, no .partial
  assert result.written == {'retrieval': 3, HARD: 10} and result.kept == {'retrieval': 0, HARD: 0}
  # Member modification times are kept, so a re-extraction gives identical files and cache keys.
  assert os.stat(os.path.join(data_dir, 'retrieval', 'new_aan_pairs.eval.tsv')).st_mtime == MTIME
  again = archive.extract(source, [RETRIEVAL, PATHFINDER], data_dir)
  assert again.written == {'retrieval': 0, HARD: 0} and again.kept == {'retrieval': 3, HARD: 10}


def test_interrupted_extraction_resumes_to_identical_files(tmp_path, release):
  members, archive_path, _ = release
  data_dir = str(tmp_path / 'data')
  expected = expected_tree(members, [RETRIEVAL, PATHFINDER])
  finished = []

  class Interrupt(Exception):
    pass

  def interrupt_mid_file(name, done, size):
    if done == size:
      finished.append(name)
    elif len(finished) >= 3 and done > 0:
      raise Interrupt(name)   # in the middle of the 4th file (chunks are 64 bytes here)

  with pytest.raises(Interrupt) as stopped:
    archive.extract(archive_path, [RETRIEVAL, PATHFINDER], data_dir, progress=interrupt_mid_file,
                    chunk=64)
  partial = tree(data_dir)
  # Every file under its real name is whole; the interrupted one is absent, and no .partial is left.
  assert len(partial) == 3
  assert all(expected[name] == content for name, content in partial.items())
  interrupted = str(stopped.value)
  assert not any(interrupted.endswith(name.split('/', 1)[1]) for name in partial)
  result = archive.extract(archive_path, [RETRIEVAL, PATHFINDER], data_dir, chunk=64)
  assert tree(data_dir) == expected
  assert sum(result.kept.values()) == len(partial)   # finished files were not written again
  assert sum(result.written.values()) == len(expected) - len(partial)


def test_killed_process_leaves_no_half_file_and_rerun_completes(tmp_path, release):
  members, archive_path, _ = release
  data_dir = str(tmp_path / 'data')
  script = f"""
import os, signal
from lra_tasks import archive
finished = []
def kill_mid_file(name, done, size):
  if done == size:
    finished.append(name)
  elif len(finished) >= 3 and done > 0:
    os.kill(os.getpid(), signal.SIGKILL)   # no cleanup runs: as if the machine went away
selections = [archive.Selection(**{RETRIEVAL.__dict__!r}), archive.Selection(**{PATHFINDER.__dict__!r})]
archive.extract({archive_path!r}, selections, {data_dir!r}, progress=kill_mid_file, chunk=64)
"""
  proc = subprocess.run([sys.executable, '-c', script], cwd=os.getcwd(), capture_output=True,
                        timeout=120)
  assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
  expected = expected_tree(members, [RETRIEVAL, PATHFINDER])
  left = tree(data_dir)
  partials = [name for name in left if name.endswith(archive.PARTIAL)]
  assert len(partials) == 1   # the file being written when the process died
  assert len(left) == 4
  whole = {k: v for k, v in left.items() if not k.endswith(archive.PARTIAL)}
  assert all(expected[name] == content for name, content in whole.items())
  assert partials[0][:-len(archive.PARTIAL)] not in whole
  archive.extract(archive_path, [RETRIEVAL, PATHFINDER], data_dir)
  assert tree(data_dir) == expected


def test_truncated_archive_names_file_and_member(tmp_path, release):
  members, _, blob = release
  expected = expected_tree(members, [RETRIEVAL, PATHFINDER])
  for cut, where in ((len(blob) // 2, r'(reading member|reading the member after) lra_release/'),
                     (len(blob) - 4, r'its end, after the last member lra_release/')):
    path = str(tmp_path / f'cut{cut}.gz')
    with open(path, 'wb') as f:
      f.write(blob[:cut])
    data_dir = str(tmp_path / f'data{cut}')
    with pytest.raises(common.DataError) as e:
      archive.extract(path, [RETRIEVAL, PATHFINDER], data_dir)
    message = str(e.value)
    assert '\n' not in message
    assert message.startswith(f'{path}: truncated archive: ') and re.search(where, message)
    # What was written before the cut is whole (truncation cannot damage earlier members).
    assert all(expected[name] == content for name, content in tree(data_dir).items())


def test_corrupt_archive_names_file_and_keeps_no_damaged_file(tmp_path, release):
  members, _, blob = release
  expected = expected_tree(members, [RETRIEVAL, PATHFINDER])
  damaged = bytearray(blob)
  damaged[len(blob) * 2 // 3] ^= 0xFF
  path = str(tmp_path / 'corrupt.gz')
  with open(path, 'wb') as f:
    f.write(bytes(damaged))
  data_dir = str(tmp_path / 'data')
  with pytest.raises(common.DataError, match=re.escape(f'{path}: corrupt archive: ') +
                     r'.*member.*lra_release/.*download it again'):
    archive.extract(path, [RETRIEVAL, PATHFINDER], data_dir)
  assert all(expected[name] == content for name, content in tree(data_dir).items())


def test_missing_member_and_unsafe_members(tmp_path, release):
  members, _, _ = release
  incomplete = {k: v for k, v in members.items() if not k.endswith('new_aan_pairs.test.tsv')}
  path = str(tmp_path / 'incomplete.gz')
  evil = tarfile.TarInfo('lra_release/tsv_data/../../../evil.tsv')
  evil.size = 3
  link = tarfile.TarInfo('lra_release/tsv_data/new_aan_pairs.test.tsv')
  link.type, link.linkname = tarfile.SYMTYPE, '/etc/passwd'
  pack(incomplete, path, extra=[evil, link])
  data_dir = str(tmp_path / 'data')
  with pytest.raises(common.DataError, match=re.escape(
      f'{path} has no member */tsv_data/new_aan_pairs.test.tsv (retrieval)')):
    archive.extract(path, [RETRIEVAL], data_dir)
  assert not os.path.exists(tmp_path / 'evil.tsv') and not os.path.exists(tmp_path.parent / 'evil.tsv')
  assert not os.path.lexists(os.path.join(data_dir, 'retrieval', 'new_aan_pairs.test.tsv'))
  assert archive.safe_name('./a/b') == 'a/b'
  assert archive.safe_name('/etc/passwd') is None and archive.safe_name('a/../b') is None
  assert RETRIEVAL.below_anchor('x/old_tsv_data/new_aan_pairs.test.tsv') is None


def test_second_concurrent_run_is_refused(tmp_path, release):
  _, archive_path, _ = release
  data_dir = str(tmp_path / 'data')
  with archive.lock(data_dir):
    with pytest.raises(common.DataError, match='another scripts/prepare_data.py is writing'):
      archive.extract(archive_path, [RETRIEVAL], data_dir)
