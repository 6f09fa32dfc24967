"""Data-file faults are one-line DataErrors naming the file and line: the readers themselves.

End-to-end through the command (exit code, last stderr line, workdir untouched) in
tests/scripts/test_bad_inputs.py.
"""
from __future__ import annotations

import csv
import os

import pytest

from configs import listops as listops_config
from lra_tasks import common, listops, retrieval

GOOD = b'Source\tTarget\r\n' + b'( ( [MAX 2 ) 3 ) ] )\t3\r\n' * 3


def _write(path, content: bytes) -> str:
  with open(path, 'wb') as f:
    f.write(content)
  return str(path)


def test_listops_non_utf8_names_line_and_byte(tmp_path):
  path = _write(tmp_path / 'basic_train.tsv', GOOD + b'( [MAX 2 3 ] )\t3\r\n( [MIN \xe9 ] )\t3\r\n')
  with pytest.raises(common.DataError, match=r'basic_train.tsv:6: not UTF-8 text \(byte 0xe9 at column 8\)'):
    listops.read_tsv(path)


def test_listops_valid_utf8_non_ascii_is_an_unknown_token_not_an_encoding_error(tmp_path):
  path = _write(tmp_path / 'basic_train.tsv', GOOD + '( [MIN é ] )\t3\r\n'.encode())
  with pytest.raises(common.DataError, match=r"basic_train.tsv:5: unknown token\(s\) \['é'\]"):
    listops.read_tsv(path)


@pytest.mark.parametrize('csv_limit', [csv.field_size_limit(), 2**31 - 1])
def test_listops_oversized_field_whatever_the_csv_limit(tmp_path, csv_limit):
  # csv's limit is process-wide and Retrieval raises it: the ListOps reader answers the same either way.
  old = csv.field_size_limit(csv_limit)
  try:
    path = _write(tmp_path / 'basic_val.tsv',
                  GOOD + b'( [MAX ' + b'1 ' * (listops.MAX_FIELD_CHARS // 2 + 1) + b'] )\t3\r\n')
    with pytest.raises(common.DataError, match=r'basic_val.tsv:5: malformed row \(field larger than '
                                               r'field limit'):
      listops.read_tsv(path)
  finally:
    csv.field_size_limit(old)


def _tiny_data(tmp_path):
  c = listops_config.get_config('tiny')
  with c.unlocked():
    c.data.data_dir = str(tmp_path)
  return c.data


def test_listops_header_only_split_is_empty(tmp_path):
  data = _tiny_data(tmp_path)
  directory = listops.split_dir(data)
  os.makedirs(directory)
  for name in listops.SPLIT_FILES.values():
    _write(os.path.join(directory, name), GOOD)
  _write(os.path.join(directory, 'basic_test.tsv'), b'Source\tTarget\r\n')
  assert len(listops.TASK.source(data, 'train')) == 3
  with pytest.raises(common.DataError, match=r'basic_test.tsv: the test split holds no examples'):
    listops.TASK.source(data, 'test')


def test_listops_prepare_refuses_a_directory_where_a_split_file_goes(tmp_path):
  data = _tiny_data(tmp_path)
  os.makedirs(os.path.join(listops.split_dir(data), 'basic_val.tsv'))
  with pytest.raises(common.DataError, match=r'basic_val.tsv exists but is not a file'):
    listops.TASK.prepare(data)
  assert not os.path.exists(os.path.join(listops.split_dir(data), 'basic_train.tsv'))


def test_retrieval_csv_fault_names_line(tmp_path, monkeypatch):
  # A field over the reader's csv limit (made tiny here) is a DataError naming its line.
  monkeypatch.setattr(retrieval, '_FIELD_SIZE_LIMIT', 16)
  old = csv.field_size_limit(16)
  try:
    path = _write(tmp_path / 'new_aan_pairs.train.tsv',
                  b"1\tA\tB\tb'x'\tb'y'\n0\tA\tB\tb'" + b'z' * 40 + b"'\tb'y'\n")
    with pytest.raises(common.DataError, match=r'new_aan_pairs.train.tsv:2: malformed row \(field '
                                               r'larger than field limit'):
      list(retrieval.iter_rows(path))
  finally:
    csv.field_size_limit(old)
