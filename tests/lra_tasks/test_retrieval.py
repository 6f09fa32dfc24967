"""LRA Retrieval loader on release-format TSVs, its error messages, and the dual encoder's independence."""
from __future__ import annotations

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import retrieval as retrieval_config
from kernelformer import run_config
from kernelformer.encoder import Encoder
from kernelformer.training import steps as steps_lib
from lra_tasks import common
from lra_tasks import fixtures
from lra_tasks import retrieval
from tests.lra_tasks import helpers


tiny_data = functools.partial(helpers.tiny_data, retrieval_config)


def write_tsv(path, text):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'wb') as f:
    f.write(text)


def test_splits_match_the_fixture_rows(tmp_path):
  rows = fixtures.write_retrieval_fixture(str(tmp_path), n_per_split=6, seed=0)
  data = tiny_data(tmp_path)
  length = data.max_length
  truncated = padded = 0
  for split in common.SPLITS:
    arrays = retrieval.build_arrays(data, split)
    assert set(arrays) == {'inputs1', 'inputs2', 'targets'}
    expected = rows[split]
    for name, field in (('inputs1', 'text1'), ('inputs2', 'text2')):
      inputs = arrays[name]
      assert inputs.shape == (6, length) and inputs.dtype == np.int32
      np.testing.assert_array_equal(
          inputs, np.stack([helpers.naive_bytes(getattr(r, field), length) for r in expected]))
      real = inputs != 0
      assert np.all(real[:, :-1] >= real[:, 1:])  # right padding
      truncated += int(real[:, -1].sum())
      padded += int((~real[:, -1]).sum())
    np.testing.assert_array_equal(arrays['targets'], [r.label for r in expected])
    assert set(arrays['targets'].tolist()) == {0, 1}
  assert truncated and padded  # the fixture exercises both
  info = retrieval.TASK.info(data)
  assert info == common.TaskInfo(num_classes=2, vocab_size=257, max_length=length, dual=True)
  src = retrieval.TASK.source(data, 'val')
  assert len(src) == 6 and set(src[0]) == {'inputs1', 'inputs2', 'targets'}
  # Our val is the release's eval file.
  assert rows['val'][0].id1 in open(retrieval.split_path(data, 'val')).read()


def test_release_details_float_labels_quotes_and_raw_bytes(tmp_path):
  data = tiny_data(tmp_path, max_length=16)
  path = retrieval.split_path(data, 'train')
  write_tsv(path, b'1.0\ta\tb\t"quoted\tb\'x\'\n'
                  b'0.0\ta\tb\t\xff\xfe raw\tq"\n'
                  b'\n'
                  b'1\ta\tb\tplain\tz\r\n')
  arrays = retrieval.build_arrays(data, 'train')
  np.testing.assert_array_equal(arrays['targets'], [1, 0, 1])
  # Quote characters are data (QUOTE_NONE), bytes that are not UTF-8 survive unchanged.
  assert arrays['inputs1'][0, :7].tolist() == [b + 1 for b in b'"quoted']
  assert arrays['inputs1'][1, :6].tolist() == [0xff + 1, 0xfe + 1] + [b + 1 for b in b' raw']
  assert arrays['inputs2'][1, :3].tolist() == [ord('q') + 1, ord('"') + 1, 0]
  assert arrays['inputs1'][2, :6].tolist() == [b + 1 for b in b'plain'] + [0]


@pytest.mark.parametrize('line, message', [
    (b'1\ta\tb\tonly four fields\n', r'expected 5 tab-separated fields'),
    (b'2\ta\tb\tx\ty\n', r'label must be 0 or 1'),
    (b'yes\ta\tb\tx\ty\n', r'label must be 0 or 1'),
])
def test_malformed_row_names_file_and_line(tmp_path, line, message):
  data = tiny_data(tmp_path)
  path = retrieval.split_path(data, 'test')
  write_tsv(path, b'0\ta\tb\tx\ty\n' + line)
  with pytest.raises(common.DataError, match=re.escape(f'{path}:2: ') + message):
    retrieval.build_arrays(data, 'test')


def test_missing_files_name_paths_and_sources(tmp_path):
  data = tiny_data(tmp_path / 'nothing')
  lines = retrieval.TASK.check(data)
  assert len(lines) == 3
  for line, name in zip(lines, ('train', 'eval', 'test')):
    assert os.path.join(str(tmp_path / 'nothing'), 'retrieval', f'new_aan_pairs.{name}.tsv') in line
    assert f'lra_release/tsv_data/new_aan_pairs.{name}.tsv' in line
    assert 'python scripts/prepare_data.py --task retrieval' in line
  with pytest.raises(common.DataError, match='new_aan_pairs.train.tsv is missing'):
    retrieval.TASK.source(data, 'train')


def test_file_copied_to_the_wrong_folder_is_named(tmp_path):
  fixtures.write_retrieval_fixture(str(tmp_path), n_per_split=2, seed=0)
  data = tiny_data(tmp_path)
  wrong = os.path.join(str(tmp_path), 'tsv_data', 'new_aan_pairs.eval.tsv')
  os.makedirs(os.path.dirname(wrong))
  os.replace(retrieval.split_path(data, 'val'), wrong)
  (line,) = retrieval.TASK.check(data)
  assert f'{retrieval.split_path(data, "val")} is missing, but {wrong} exists: move it there' in line


def test_second_process_sees_identical_token_ids(tmp_path):
  fixtures.write_retrieval_fixture(str(tmp_path), n_per_split=4, seed=1)
  data = tiny_data(tmp_path)
  here = helpers.split_digests(retrieval.build_arrays, data, common.SPLITS)
  script = f"""
import ml_collections
from lra_tasks import common, retrieval
data = ml_collections.ConfigDict({{'data_dir': {str(tmp_path)!r}, 'max_length': {data.max_length}}})
print(json.dumps(split_digests(retrieval.build_arrays, data, common.SPLITS)))
"""
  assert helpers.split_digests_in_subprocess(script, hash_seed=7) == here


def test_dual_encoder_has_no_cross_attention(tmp_path):
  """Changing document 2 leaves document 1's encoding unchanged (LRA forbids cross-attention)."""
  c = retrieval_config.get_config('tiny')
  info = retrieval.TASK.info(c.data)
  run = run_config.of(c)
  model = steps_lib.build_model(run, info)
  length = info.max_length
  rng = np.random.default_rng(0)
  doc1 = rng.integers(1, 257, size=(2, length)).astype(np.int32)
  doc2 = rng.integers(1, 257, size=(2, length)).astype(np.int32)
  doc2b = doc2.copy()
  doc2b[:, : length // 2] = rng.integers(1, 257, size=(2, length // 2))
  doc2b[1, -5:] = 0  # also a different padding pattern
  # Jitted: one compilation each, much cheaper on CPU than op-by-op dispatch of init.
  variables = jax.jit(model.init)(jax.random.key(0), {'inputs1': doc1, 'inputs2': doc2})

  @jax.jit
  def apply(second):
    logits, state = model.apply(variables, {'inputs1': jnp.asarray(doc1), 'inputs2': second},
                                capture_intermediates=lambda mdl, _: isinstance(mdl, Encoder))
    (both,) = state['intermediates']['encoder']['__call__']   # one call over both documents
    return logits, both[:len(doc1)], both[len(doc1):]

  logits_a, u_a, v_a = map(np.asarray, apply(jnp.asarray(doc2)))
  logits_b, u_b, v_b = map(np.asarray, apply(jnp.asarray(doc2b)))
  np.testing.assert_array_equal(u_a, u_b)
  assert np.abs(v_a - v_b).max() > 1e-4 and np.abs(logits_a - logits_b).max() > 0
  # The pooled vector of document 1 is the shared encoder applied to document 1 alone.
  alone = jax.jit(Encoder(**model.encoder).apply)({'params': variables['params']['encoder']},
                                                  jnp.asarray(doc1))
  np.testing.assert_allclose(u_a, np.asarray(alone), rtol=1e-6, atol=1e-6)
