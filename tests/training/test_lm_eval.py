"""enwik8's test context schemes (kernelformer/training/lm_eval.py, lra_tasks/enwik8.py).

* Every byte of a split but the first is scored exactly once in each scheme (counted), and with a
  sliding stride S every byte after the first window sees at least L - S bytes of context.
* Sliding with stride L equals disjoint; stateful on a text shorter than one window equals disjoint.
* Stateful evaluation equals one full forward over the whole text (the state is carried exactly).
* A trained tiny model: bits per byte under each scheme, ordered as the data's context dependence
  says (see ``test_trained_model_bpb_by_scheme``).
* Refusals: stateful for kinds without a recurrent state, a bad eval_context/eval_stride: one line.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import lra_tasks
from kernelformer import decoder
from kernelformer.training import lm_eval
from kernelformer.training import validate
from lra_tasks import enwik8
from configs import enwik8 as enwik8_config
from kernelformer.bench import eval_context

L = 16


def _data(tmp_path, num_bytes, context='disjoint', stride=0, max_length=L):
  return ml_collections.ConfigDict({'task': 'enwik8', 'data_dir': str(tmp_path), 'num_bytes': num_bytes,
                                    'max_length': max_length, 'eval_context': context,
                                    'eval_stride': stride})


def _counts(source, start, stop):
  """How often each byte of [start, stop) is scored, and the context each scored byte saw."""
  counts = np.zeros(stop - start, int)
  contexts = []
  for i in range(len(source)):
    ex = source[i]
    a = start + i * source.stride
    for p in np.nonzero(ex['targets'])[0]:
      counts[a + p + 1 - start] += 1
      contexts.append((i, p))          # target p is predicted from inputs 0..p: p + 1 bytes
  return counts, contexts


@pytest.mark.parametrize('context,stride', [('disjoint', 0), ('sliding', 0), ('sliding', 5),
                                            ('sliding', 1), ('sliding', L), ('stateful', 0)])
@pytest.mark.parametrize('split_bytes', [L - 3, L + 1, 5 * L + 7])
def test_every_byte_scored_exactly_once(tmp_path, context, stride, split_bytes):
  num_bytes = 20 * split_bytes                  # test split = the last 5 %
  blob = enwik8.write_fixture(str(tmp_path), num_bytes)
  data = _data(tmp_path, num_bytes, context, stride)
  src = lra_tasks.get('enwik8').source(data, 'test')
  start, stop = enwik8.split_bounds(num_bytes)['test']
  counts, contexts = _counts(src, start, stop)
  assert counts[0] == 0 and (counts[1:] == 1).all(), counts
  s = enwik8.eval_scheme(data)[1]
  assert src.stride == s == (stride or L // 2 if context == 'sliding' else L)
  # Scored targets are the real next bytes; after the first window each sees >= L - S bytes.
  raw = np.frombuffer(blob, np.uint8).astype(np.int32) + 1
  for i, p in contexts:
    a = start + i * s
    assert src[i]['targets'][p] == raw[a + p + 1]
    if i > 0:
      assert p + 1 >= L - s + 1 - 1 and p >= L - s


def test_sliding_with_stride_l_equals_disjoint(tmp_path):
  enwik8.write_fixture(str(tmp_path), 4000)
  task = lra_tasks.get('enwik8')
  a = task.source(_data(tmp_path, 4000, 'disjoint'), 'test')
  b = task.source(_data(tmp_path, 4000, 'sliding', L), 'test')
  assert len(a) == len(b) > 3
  for i in range(len(a)):
    for k in ('inputs', 'targets'):
      np.testing.assert_array_equal(a[i][k], b[i][k])


def test_bad_eval_context_or_stride_one_line(tmp_path):
  enwik8.write_fixture(str(tmp_path), 2000)
  task = lra_tasks.get('enwik8')
  for data, field in ((_data(tmp_path, 2000, 'overlap'), 'eval_context'),
                      (_data(tmp_path, 2000, 'sliding', L + 1), 'eval_stride'),
                      (_data(tmp_path, 2000, 'sliding', -1), 'eval_stride')):
    with pytest.raises(lra_tasks.DataError) as e:
      task.info(data)
    assert field in str(e.value) and '\n' not in str(e.value)


@pytest.mark.parametrize('kind,rpe,pos,word', [('softmax', False, 'none', 'KV cache'),
                                               ('nprf-rpe', False, 'none', 'relative-position'),
                                               ('posrf-orf', True, 'none', 'relative-position'),
                                               ('posrf-orf', False, 'learned', 'learned')])
def test_stateful_refused_in_one_line_before_training(kind, rpe, pos, word):
  c = enwik8_config.get_config('tiny')
  c.unlock()
  c.data.eval_context = 'stateful'
  c.model.attention.kind = kind
  c.model.attention.rpe = rpe
  c.model.pos_encoding = pos
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_config(c)
  msg = str(e.value)
  assert '\n' not in msg and 'stateful' in msg and word in msg, msg
  c.data.eval_context = 'sliding'
  validate.validate_config(c)       # the same model with a sliding window is fine


# ----------------------------------------------------------------------------------------------
# A model: exactness of the schemes, and a trained model's bits per byte.

def _model(kind='posrf-orf', max_length=L):
  return decoder.Decoder(vocab_size=enwik8.VOCAB_SIZE, emb_dim=16, num_layers=2, num_heads=2,
                         qkv_dim=16, mlp_dim=32, max_length=max_length, pos_encoding='none',
                         attention={'kind': kind, 'num_features': 8, 'chunk_size': 4})


def test_stateful_equals_full_forward_over_the_whole_text_and_disjoint_within_one_window(tmp_path):
  num_bytes = 20 * (3 * L + 1)                  # test split: 3 windows exactly
  blob = enwik8.write_fixture(str(tmp_path), num_bytes)
  start, stop = enwik8.split_bounds(num_bytes)['test']
  raw = jnp.asarray(np.frombuffer(blob, np.uint8).astype(np.int32) + 1)
  fkey = jax.random.key(1)
  long = _model(max_length=3 * L)
  params = long.init({'params': jax.random.key(0), 'features': fkey}, raw[None, :3 * L])['params']
  variables = {'params': params}
  # One forward over the whole test text (3 L tokens) vs three windows with the state carried.
  logits = long.apply(variables, raw[None, start:stop - 1], rngs={'features': fkey})
  losses, _, w = decoder.next_token_loss(logits, raw[None, start + 1:stop])
  task = lra_tasks.get('enwik8')
  stateful = lm_eval.evaluate_stateful(_model(), variables,
                                       task.source(_data(tmp_path, num_bytes, 'stateful'), 'test'),
                                       features_key=fkey)
  assert stateful['examples'] == int(w.sum()) == 3 * L
  np.testing.assert_allclose(stateful['loss'], float(losses.sum() / w.sum()), rtol=1e-5)
  disjoint = lm_eval.evaluate_windows(_model(), variables,
                                      task.source(_data(tmp_path, num_bytes, 'disjoint'), 'test'),
                                      features_key=fkey)
  assert abs(disjoint['loss'] - stateful['loss']) > 1e-4   # windows 2 and 3 lose their context

  # A test split shorter than one window: stateful and disjoint score the same bytes identically.
  short = 20 * (L - 3)
  enwik8.write_fixture(str(tmp_path), short)
  results = [fn(_model(), variables, task.source(_data(tmp_path, short, ctx), 'test'), features_key=fkey)
             for fn, ctx in ((lm_eval.evaluate_windows, 'disjoint'),
                             (lm_eval.evaluate_stateful, 'stateful'))]
  assert results[0]['examples'] == results[1]['examples'] == L - 4
  np.testing.assert_allclose(results[0]['loss'], results[1]['loss'], rtol=1e-6)


def test_trained_model_bpb_improves_disjoint_sliding_stateful(tmp_path):
  """On text whose bytes depend on everything before them in their document (``bench.eval_context.write_topic_fixture``;
  the test split is one document), a trained tiny linear-attention model scores better the more
  context each byte gets: disjoint > sliding (L/2) > stateful bits per byte.

  (On ``enwik8.write_fixture``'s text, i.i.d. words, the order is reversed for such a model: a
  position-free linear attention averages its whole prefix, so a longer prefix dilutes the last few
  bytes that matter -- docs/causal.md gives the numbers. The order is a property of model and text; the
  schemes only decide how much context each byte gets.)"""
  num_bytes = 20000
  eval_context.write_topic_fixture(str(tmp_path), num_bytes)
  data = _data(tmp_path, num_bytes, max_length=32)
  bpb = eval_context.bpb_by_scheme(data, *eval_context.train_tiny(data))
  assert bpb['disjoint'] > bpb['sliding'] + 0.02 and bpb['sliding'] > bpb['stateful'] + 0.02, bpb


def test_trainer_stateful_test_evaluation_named_in_results(tmp_path, monkeypatch):
  """train_and_evaluate with eval_context='stateful': the test split goes through
  ``lm_eval.evaluate_stateful`` (its result is what results.json reports), and results.json names the
  scheme."""
  from kernelformer.training import trainer  # pylint: disable=g-import-not-at-top
  calls = []
  real = lm_eval.evaluate_stateful

  def spy(*args, **kwargs):
    calls.append(real(*args, **kwargs))
    return calls[-1]

  monkeypatch.setattr(lm_eval, 'evaluate_stateful', spy)
  enwik8.write_fixture(str(tmp_path / 'data'), 20000)
  c = enwik8_config.get_config('tiny')
  c.unlock()
  c.data.data_dir = str(tmp_path / 'data')
  c.data.eval_context = 'stateful'
  c.model.attention.kind = 'posrf-orf'
  c.progress = False
  results = trainer.train_and_evaluate(c, str(tmp_path / 'run'))
  assert results['eval_context'] == 'stateful' and results['eval_stride'] == 32
  assert results['test_examples'] == 1000 - 1
  assert len(calls) == 1 and results['test_loss'] == calls[0]['loss']
  assert np.isfinite(results['test_bits_per_byte']) and 0 < results['test_bits_per_byte'] < 12


def test_runs_recorded_before_eval_context_were_disjoint():
  """A workdir recorded before the fields existed scored its test with disjoint windows: resuming it
  with the preset's 'sliding' is a config difference, with 'disjoint' it is not."""
  from kernelformer.training import fingerprint  # pylint: disable=g-import-not-at-top
  old = {'data.task': 'enwik8'}
  assert fingerprint.differences(old, {**old, 'data.eval_context': 'sliding', 'data.eval_stride': 0}) \
      == ['data.eval_context: disjoint -> sliding']
  assert fingerprint.differences(old, {**old, 'data.eval_context': 'disjoint', 'data.eval_stride': 0}) == []
