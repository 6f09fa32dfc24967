"""Tests of the ListOps task: generator rules, labels, LRA serialization and TSV files, vocabulary.

The labels are checked by an evaluator written here over the token stream (not the module's tree
evaluator), the fast sampler against a node-by-node transcription of the original rules, and the
file format against a hand-written file in the released format. Sizes are tiny: the whole file runs
in a few seconds on one core.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from lra_tasks import common
from lra_tasks import listops

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def generate_tree(rng: np.random.Generator, depth: int = 1, max_depth: int = 10, max_args: int = 10,
                  *, max_length: int | None = None):
  """One ListOps tree by the original generator's rules (see ``TreeSampler``): ``(tree, length)``.

  ``length = #digits + 2 * #operators``. With ``max_length``, a tree whose length would reach it is
  abandoned early and ``(None, a lower bound of its length)`` returned. For many trees, make one
  ``TreeSampler`` and call ``sample``: this builds a sampler per call.
  """
  return listops.TreeSampler(rng, max_depth, max_args).sample(depth, max_length)


def parse_source(source: str):
  """The tree whose ``to_source`` is ``source`` (whitespace-normalized); ValueError otherwise.

  The tokens without parentheses are prefix notation with explicit ends, which fixes the tree; the
  parentheses are then checked by re-serializing, so only exact LRA strings parse.
  """
  stack = []
  root = None
  for tok in listops.tokenize(source):
    if root is not None:
      raise ValueError(f'tokens after the end of the expression in {source!r}')
    if tok in listops.OPERATORS:
      stack.append((tok, []))
      continue
    if tok == listops.END_TOKEN:
      if not stack:
        raise ValueError(f'unbalanced "]" in {source!r}')
      op, children = stack.pop()
      if len(children) < 2:
        raise ValueError(f'{op} with {len(children)} argument(s) in {source!r}; needs at least 2')
      node = (op, tuple(children))
    elif tok in listops.DIGITS:
      node = int(tok)
    else:
      raise ValueError(f'unknown token {tok!r} in {source!r}')
    if stack:
      stack[-1][1].append(node)
    else:
      root = node
  if root is None:
    raise ValueError(f'incomplete expression {source!r}')
  if listops.to_source(root) != ' '.join(source.split()):
    raise ValueError(f'parentheses differ from the LRA serialization in {source!r}')
  return root


def make_data(data_dir, **overrides) -> types.SimpleNamespace:
  """A small data config with the field names of configs/listops.py (attributes, like ConfigDict)."""
  fields = dict(task='listops', data_dir=str(data_dir), max_length=64, min_gen_length=10,
                max_gen_length=60, num_train=300, num_val=60, num_test=60, max_depth=10, max_args=10,
                generator_seed=0, generate=True)
  fields.update(overrides)
  return types.SimpleNamespace(**fields)


def lra_data(data_dir, **overrides) -> types.SimpleNamespace:
  """LRA's generator settings (files go to {data_dir}/listops, where the released files go)."""
  return make_data(data_dir, **{**listops.LRA_DEFAULTS, 'max_length': 2000, **overrides})


@pytest.fixture(scope='module')
def splits(tmp_path_factory):
  return listops.generate_splits(make_data(tmp_path_factory.mktemp('unused')))


# ------------------------------------------------------------------------------------------------
# Independent references.


def stack_value(tokens: list[str]) -> int:
  """Evaluates the model's token stream ([OP ... X) with a stack, independently of listops.evaluate."""
  stack: list = []
  for tok in tokens:
    if tok.startswith('['):
      stack.append(tok)
    elif tok == 'X':
      args = []
      while not isinstance(stack[-1], str):
        args.append(stack.pop())
      op = stack.pop()
      value = {'[MIN': min(args), '[MAX': max(args), '[MED': int(np.median(args)),
               '[SM': sum(args) % 10}[op]
      stack.append(value)
    else:
      stack.append(int(tok))
  assert len(stack) == 1
  return stack[0]


def token_stats(tokens: list[str]) -> tuple[int, list[int]]:
  """Deepest operator nesting and every operator's argument count, read off the token stream."""
  depth, deepest, counts = 0, 0, []
  open_args: list[int] = []
  for tok in tokens:
    if tok.startswith('['):
      if open_args:
        open_args[-1] += 1
      open_args.append(0)
      depth += 1
      deepest = max(deepest, depth)
    elif tok == 'X':
      counts.append(open_args.pop())
      depth -= 1
    else:
      open_args[-1] += 1
  return deepest, counts


def pair_serialize(tree) -> str:
  """The original LRA script's serialization: nested binary pairs, each printed as '( a b )'."""
  def to_pairs(t):
    if isinstance(t, int):
      return t
    op, children = t
    pair = (op, to_pairs(children[0]))
    for c in children[1:]:
      pair = (pair, to_pairs(c))
    return (pair, ']')

  def show(p):
    if isinstance(p, (int, str)):
      return str(p)
    return '( ' + show(p[0]) + ' ' + show(p[1]) + ' )'

  return show(to_pairs(tree))


def naive_tree(rng: np.random.Generator, depth: int, max_depth: int, max_args: int):
  """The original generator's recursion, node by node: children first, then the operator."""
  if depth < max_depth and rng.random() <= 0.25:  # the original keeps a digit iff r > 0.25
    k = int(rng.integers(2, max_args + 1))
    children = tuple(naive_tree(rng, depth + 1, max_depth, max_args) for _ in range(k))
    return (listops.OPERATORS[int(rng.integers(4))], children)
  return int(rng.integers(10))


def tree_depth(tree) -> int:
  return 0 if isinstance(tree, int) else 1 + max(tree_depth(c) for c in tree[1])


# ------------------------------------------------------------------------------------------------
# Generator.


def test_deterministic_for_a_seed_and_seed_dependent(tmp_path, splits):
  again = listops.generate_splits(make_data(tmp_path))
  assert again == splits
  other = listops.generate_splits(make_data(tmp_path, generator_seed=1))
  assert other['train'] != splits['train']
  assert {len(v) for v in other.values()} == {300, 60}


def test_labels_are_the_true_values(splits):
  for split, rows in splits.items():
    for source, target in rows:
      assert stack_value(listops.tokenize(source)) == target, (split, source)
      tree = parse_source(source)
      assert listops.to_source(tree) == source
      assert listops.evaluate(tree) == target


def test_length_bounds_tokens_depth_and_arguments(splits):
  allowed = set(listops.OPERATORS) | {'X'} | set(listops.DIGITS)
  lengths = []
  for rows in splits.values():
    for source, _ in rows:
      tokens = listops.tokenize(source)
      assert 10 < len(tokens) < 60
      assert set(tokens) <= allowed
      deepest, counts = token_stats(tokens)
      assert 1 <= deepest <= 9
      assert all(2 <= c <= 10 for c in counts)
      lengths.append(len(tokens))
  assert min(lengths) == 11 and max(lengths) == 59  # the strict bounds are reached, not overshot


def test_depth_limit_and_argument_range_are_reached(tmp_path):
  # max_depth=3: operators nest at most 2 deep; with 500 trees both limits are hit.
  data = make_data(tmp_path, max_depth=3, max_args=4, min_gen_length=4, max_gen_length=40,
                   num_train=500, num_val=0, num_test=0)
  deepest, counts = set(), set()
  for source, _ in listops.generate_splits(data)['train']:
    d, c = token_stats(listops.tokenize(source))
    deepest.add(d)
    counts.update(c)
  assert deepest == {1, 2}
  assert counts == {2, 3, 4}


def test_no_duplicates_within_or_across_splits(splits):
  sources = [s for rows in splits.values() for s, _ in rows]
  assert len(sources) == 420
  assert len(set(sources)) == len(sources)


def test_sampler_law_matches_the_original_recursion():
  """Fast sampler (geometric gaps, early abort, operator root) vs the node-by-node rules.

  Compares means of several statistics, unfiltered and after a length filter, within 5 standard
  errors of the difference estimated from the samples.
  """
  n = 4000
  max_depth, max_args = 4, 5
  fast = listops.TreeSampler(np.random.default_rng(1), max_depth, max_args)
  naive_rng = np.random.default_rng(2)
  naive = [naive_tree(naive_rng, 1, max_depth, max_args) for _ in range(n)]
  quick = [fast.sample(1)[0] for _ in range(n)]

  def stats(trees):
    return np.array([[not isinstance(t, int), listops.tree_length(t), tree_depth(t),
                      listops.evaluate(t)] for t in trees], dtype=np.float64)

  def close(a, b):
    se = np.sqrt(a.var(0, ddof=1) / len(a) + b.var(0, ddof=1) / len(b))
    assert np.all(np.abs(a.mean(0) - b.mean(0)) <= 5 * se + 1e-12), (a.mean(0), b.mean(0), se)

  close(stats(naive), stats(quick))
  # Kept trees: the filter 8 < length < 30 applied to the naive ones; the fast one conditions on an
  # operator root and abandons a tree once it reaches 30.
  lo, hi = 8, 30
  kept_naive = [t for t in naive if lo < listops.tree_length(t) < hi]
  kept_fast = []
  while len(kept_fast) < len(kept_naive):
    tree, length = fast.sample(1, hi, root_is_operator=True)
    if tree is not None and length > lo:
      assert length == listops.tree_length(tree)
      kept_fast.append(tree)
  assert len(kept_naive) > 300
  close(stats(kept_naive), stats(kept_fast))


def test_sampler_node_frequencies_match_the_rules():
  """Pooled over all nodes: P(operator) = 0.25 below max_depth (root and inner nodes apart), argument
  counts uniform in {2..max_args}, digits and operators uniform; within 5 binomial standard errors."""
  max_depth, max_args = 5, 6
  sampler = listops.TreeSampler(np.random.default_rng(4), max_depth, max_args)
  roots, inner, arities, digits, operators = [], [], [], [], []

  def walk(t, depth):
    is_op = not isinstance(t, int)
    if depth < max_depth:
      (roots if depth == 1 else inner).append(is_op)
    if is_op:
      assert depth < max_depth
      operators.append(listops.OPERATORS.index(t[0]))
      arities.append(len(t[1]))
      for c in t[1]:
        walk(c, depth + 1)
    else:
      digits.append(t)

  for _ in range(3000):
    walk(sampler.sample(1)[0], 1)

  def frequency_ok(hits, p):
    hits = np.asarray(hits, dtype=np.float64)
    assert abs(hits.mean() - p) <= 5 * np.sqrt(p * (1 - p) / len(hits)), (hits.mean(), p, len(hits))

  frequency_ok(roots, 0.25)
  frequency_ok(inner, 0.25)
  assert len(inner) > 5000
  for k in range(2, max_args + 1):
    frequency_ok(np.equal(arities, k), 1 / (max_args - 1))
  for d in range(10):
    frequency_ok(np.equal(digits, d), 0.1)
  for o in range(4):
    frequency_ok(np.equal(operators, o), 0.25)


def test_generate_tree_respects_depth_and_abort():
  rng = np.random.default_rng(0)
  for _ in range(200):
    tree, length = generate_tree(rng, 1, 3, 4)
    assert tree_depth(tree) <= 2 and length == listops.tree_length(tree)
  tree, length = generate_tree(rng, 5, 5, 4)  # a root at max_depth is a digit
  assert isinstance(tree, int) and length == 1
  aborted = 0
  for _ in range(200):
    tree, length = generate_tree(rng, 1, 10, 10, max_length=20)
    if tree is None:
      aborted += 1
      assert length >= 20
    else:
      assert length < 20
  assert aborted > 0


# ------------------------------------------------------------------------------------------------
# Semantics and serialization.


def test_operator_semantics():
  assert listops.evaluate(('[MED', (0, 9))) == 4  # int(np.median) rounds the middle mean down
  assert listops.evaluate(('[MED', (3, 8, 1))) == 3
  assert listops.evaluate(('[MED', (1, 2, 2, 9))) == 2
  assert listops.evaluate(('[SM', (7, 8, 9))) == 4  # 24 mod 10
  assert listops.evaluate(('[MIN', (5, ('[MAX', (2, 9)), 6))) == 5
  rng = np.random.default_rng(0)
  for _ in range(300):
    args = rng.integers(0, 10, size=int(rng.integers(2, 11))).tolist()
    assert listops.apply_operator('[MED', args) == int(np.median(args))


def test_serialization_is_the_exact_lra_string():
  assert listops.to_source(('[MAX', (2, 3))) == '( ( ( [MAX 2 ) 3 ) ] )'
  tree = ('[MAX', (2, ('[MIN', (4, 7)), 0))
  expected = '( ( ( ( [MAX 2 ) ( ( ( [MIN 4 ) 7 ) ] ) ) 0 ) ] )'
  assert listops.to_source(tree) == expected
  assert parse_source(expected) == tree
  assert listops.tokenize(expected) == ['[MAX', '2', '[MIN', '4', '7', 'X', '0', 'X']
  assert listops.evaluate(tree) == 4
  rng = np.random.default_rng(3)
  for _ in range(200):
    t, _ = generate_tree(rng, 1, 5, 6)
    assert listops.to_source(t) == pair_serialize(t)
  with pytest.raises(ValueError, match='parentheses'):
    parse_source('( [MAX 2 3 ] )')
  with pytest.raises(ValueError, match='unknown token'):
    parse_source('( ( ( [FIRST 2 ) 3 ) ] )')


# ------------------------------------------------------------------------------------------------
# Files.

RELEASED = ('Source\tTarget\r\n'
            '( ( ( [MAX 2 ) 3 ) ] )\t3\r\n'
            '( ( ( ( [SM 8 ) ( ( ( [MED 0 ) 9 ) ] ) ) 9 ) ] )\t1\r\n')


def test_tsv_round_trip_header_and_crlf(tmp_path, splits):
  path = str(tmp_path / 'x' / 'basic_train.tsv')
  listops.write_tsv(path, splits['train'])
  raw = open(path, 'rb').read()
  lines = raw.split(b'\r\n')
  assert lines[0] == b'Source\tTarget' and lines[-1] == b''
  assert len(lines) == len(splits['train']) + 2
  assert b'\n' not in raw.replace(b'\r\n', b'')
  sources, targets = listops.read_tsv(path)
  assert list(zip(sources, targets)) == splits['train']
  assert not [f for f in os.listdir(tmp_path / 'x') if '.tmp.' in f]


def test_released_format_loads(tmp_path):
  data = lra_data(tmp_path, generate=False, max_length=12)
  root = tmp_path / 'listops'
  root.mkdir()
  for split in common.SPLITS:
    (root / f'basic_{split}.tsv').write_bytes(RELEASED.encode())
  assert listops.TASK.check(data) == []
  src = listops.TASK.source(data, 'val')
  assert len(src) == 2
  ids = listops.TOKEN_IDS
  first = [ids['[MAX'], ids['2'], ids['3'], ids['X']]
  np.testing.assert_array_equal(src[0]['inputs'], first + [0] * 8)
  second = ['[SM', '8', '[MED', '0', '9', 'X', '9', 'X']
  np.testing.assert_array_equal(src[1]['inputs'], [ids[t] for t in second] + [0] * 4)
  np.testing.assert_array_equal(src.arrays['targets'], [3, 1])
  assert src.arrays['inputs'].dtype == np.int32 and src.arrays['targets'].dtype == np.int32
  # Labels in the file agree with the independent evaluator.
  for source, target in zip(*listops.read_tsv(str(root / 'basic_val.tsv'))):
    assert stack_value(listops.tokenize(source)) == target


@pytest.mark.parametrize('body, line, what', [
    ('Source\tTarget\r\n( ( ( [MAX 2 ) 3 ) ] )\t3\r\n( ( ( [MAX 2 ) 3 ) ] )\r\n', 3, 'fields'),
    ('Source\tTarget\r\n( ( ( [MAX 2 ) 3 ) ] )\tx\r\n', 2, 'digit'),
    ('Source\tTarget\r\n( ( ( [MAX 2 ) 3 ) ] )\t3\r\n( ( ( [MAX 2 ) 3 ) ] )\t10\r\n', 3, 'digit'),
    ('Source\tTarget\r\n( ( ( [MAX 2 ) 3 ) ] )\t3\t4\r\n', 2, 'fields'),
    ('Source\tTarget\r\n( ( ( [FIRST 2 ) 3 ) ] )\t2\r\n', 2, 'unknown token'),
    ('Source\tTarget\r\n\t2\r\n', 2, 'empty'),
    ('Input\tLabel\r\n( ( ( [MAX 2 ) 3 ) ] )\t3\r\n', 1, 'header'),
])
def test_malformed_file_names_file_and_line(tmp_path, body, line, what):
  path = tmp_path / 'basic_train.tsv'
  path.write_bytes(body.encode())
  with pytest.raises(common.DataError, match=what) as err:
    listops.read_tsv(str(path))
  message = str(err.value)
  assert f'{path}:{line}:' in message and '\n' not in message
  # The task's loader reports the same way.
  data = lra_data(tmp_path, generate=False, max_length=16)
  (tmp_path / 'listops').mkdir()
  for split in common.SPLITS:
    (tmp_path / 'listops' / f'basic_{split}.tsv').write_bytes(body.encode())
  with pytest.raises(common.DataError, match=f'basic_test.tsv:{line}:'):
    listops.TASK.source(data, 'test')


@pytest.mark.parametrize('source', [
    '( ( ( [MAX 2 ) 3 ) ] )',
    '[MAX 2   [SM 9 9 ]  3 ]',          # no parentheses, uneven spacing: same tokens
    '( ( ( [MED 0 ) 9 ) X )',            # a literal X is the end token, as in the LRA pipeline
    '( ( ( [MIN 2 ) 3 ) ]\x0b)',         # other whitespace splits as str.split does
    '7',
])
def test_encoding_matches_the_lra_token_pipeline(source):
  ids = listops._encode('f.tsv', 2, source)
  assert ids.dtype == np.int32
  np.testing.assert_array_equal(ids, [listops.TOKEN_IDS[t] for t in listops.tokenize(source)])


@pytest.mark.parametrize('source, bad', [
    ('( ( ( [MAX 23 ) 3 ) ] )', '23'),
    ('( ( ( [MAX 2)3 ] )', '23'),        # deleted parentheses join their neighbours
    ('[MIN2 3 ]', '[MIN2'),
    ('a 2 ]', 'a'),                     # a stand-in byte of the fast path is still unknown
    ('MIN 2 3 ]', 'MIN'),
    ('[MAX 2 é ]', 'é'),
    ('[ MAX 2 3 ]', '['),
    ('[MAX 2 S ]', 'S'),                # a lone alphabet letter is a byte but no token
])
def test_encoding_rejects_unknown_tokens(source, bad):
  with pytest.raises(common.DataError, match='f.tsv:5: unknown token') as err:
    listops._encode('f.tsv', 5, source)
  assert repr(bad) in str(err.value)


def test_missing_files_are_listed_with_exact_paths(tmp_path):
  data = lra_data(tmp_path, generate=False)
  listops.TASK.prepare(data)  # generate=False: nothing is made
  missing = listops.TASK.check(data)
  assert len(missing) == 3
  for split, line in zip(common.SPLITS, missing):
    path = os.path.join(str(tmp_path), 'listops', f'basic_{split}.tsv')
    assert line.startswith(path + ' ')
    assert 'scripts/prepare_data.py --task listops' in line and 'data.generate=True' in line
    assert f'lra_release/listops-1000/basic_{split}.tsv' in line
  with pytest.raises(common.DataError, match='basic_train.tsv'):
    listops.TASK.source(data, 'train')
  with pytest.raises(common.DataError, match='listops: data missing'):
    common.require(listops.TASK, data)


def test_partial_released_files_are_not_mixed_with_generated_ones(tmp_path):
  data = lra_data(tmp_path, generate=True)
  (tmp_path / 'listops').mkdir()
  (tmp_path / 'listops' / 'basic_train.tsv').write_bytes(RELEASED.encode())
  with pytest.raises(common.DataError, match='basic_val.tsv'):
    listops.TASK.prepare(data)


def test_prepare_writes_cache_keyed_by_generator_fields(tmp_path):
  data = make_data(tmp_path, num_train=40, num_val=10, num_test=10)
  directory = listops.split_dir(data)
  assert os.path.dirname(directory) == os.path.join(str(tmp_path), 'listops')
  assert os.path.basename(directory).startswith('gen-')
  assert listops.split_dir(lra_data(tmp_path)) == os.path.join(str(tmp_path), 'listops')
  # Every generator field is part of the key; the model's max_length and data.generate are not.
  small = dict(num_train=40, num_val=10, num_test=10)
  others = {listops.split_dir(make_data(tmp_path, **{**small, field: value}))
            for field, value in [('min_gen_length', 11), ('max_gen_length', 61), ('num_train', 41),
                                 ('num_val', 11), ('num_test', 11), ('max_depth', 9),
                                 ('max_args', 9), ('generator_seed', 1)]}
  assert len(others) == 8 and directory not in others
  assert listops.split_dir(make_data(tmp_path, num_train=40, num_val=10, num_test=10,
                                     max_length=7, generate=False)) == directory

  listops.TASK.prepare(data)
  assert listops.TASK.check(data) == []
  with open(os.path.join(directory, 'generator.json')) as f:
    params = json.load(f)
  assert params['num_train'] == 40 and params['generator_seed'] == 0
  train = os.path.join(directory, 'basic_train.tsv')
  stamp = os.stat(train).st_mtime_ns
  listops.TASK.prepare(data)  # present: not regenerated
  assert os.stat(train).st_mtime_ns == stamp

  changed = make_data(tmp_path, num_train=40, num_val=10, num_test=10, generator_seed=5)
  listops.TASK.prepare(changed)
  assert listops.TASK.check(changed) == []
  assert os.stat(train).st_mtime_ns == stamp  # the first variant is untouched
  assert listops.read_tsv(train) != listops.read_tsv(listops.split_path(changed, 'train'))


def test_source_arrays_padding_truncation_and_cache(tmp_path):
  data = make_data(tmp_path, num_train=40, num_val=10, num_test=10)
  listops.TASK.prepare(data)
  sources, targets = listops.read_tsv(listops.split_path(data, 'train'))
  src = listops.TASK.source(data, 'train')
  inputs = src.arrays['inputs']
  assert inputs.shape == (40, 64) and inputs.dtype == np.int32
  np.testing.assert_array_equal(src.arrays['targets'], targets)
  for row, source in zip(inputs, sources):
    ids = [listops.TOKEN_IDS[t] for t in listops.tokenize(source)]
    np.testing.assert_array_equal(row[:len(ids)], ids)
    assert not row[len(ids):].any() and row[:len(ids)].all()
  # The trainer asks again: the same cached arrays, read-only.
  assert listops.TASK.source(data, 'train').arrays['inputs'] is inputs
  assert not inputs.flags.writeable
  # A shorter model input truncates.
  short = listops.TASK.source(make_data(tmp_path, num_train=40, num_val=10, num_test=10,
                                        max_length=8), 'train')
  np.testing.assert_array_equal(short.arrays['inputs'], inputs[:, :8])
  with pytest.raises(ValueError, match='unknown split'):
    listops.TASK.source(data, 'dev')


# ------------------------------------------------------------------------------------------------
# Vocabulary and task info.


def test_vocabulary_is_fixed_and_identical_in_another_process(tmp_path):
  assert listops.VOCAB[2:] == ('[MIN', '[MAX', '[MED', '[SM', 'X', *'0123456789')
  assert listops.TOKEN_IDS['[MIN'] == 2 and listops.TOKEN_IDS['9'] == 16
  info = listops.TASK.info(make_data(tmp_path))
  assert info == common.TaskInfo(num_classes=10, vocab_size=17, max_length=64, dual=False)
  code = ('import json; from lra_tasks import listops; '
          'print(json.dumps([listops.VOCAB, listops.TOKEN_IDS, listops.VOCAB_SIZE]))')
  env = {**os.environ, 'PYTHONPATH': REPO_ROOT, 'PYTHONHASHSEED': '12345'}
  out = subprocess.run([sys.executable, '-c', code], cwd=REPO_ROOT, env=env, check=True,
                       capture_output=True, text=True).stdout
  vocab, ids, size = json.loads(out)
  assert tuple(vocab) == listops.VOCAB and ids == listops.TOKEN_IDS and size == 17


def test_registered_task_and_impossible_settings(tmp_path, monkeypatch):
  import lra_tasks
  assert lra_tasks.get('listops') is listops.TASK and listops.TASK.name == 'listops'
  with pytest.raises(common.DataError, match='widen'):
    listops.GeneratorParams.from_data(make_data(tmp_path, max_depth=2, max_args=3,
                                                min_gen_length=5, max_gen_length=50))
  monkeypatch.setattr(listops, '_MAX_DUPLICATES_IN_A_ROW', 2000)  # give up sooner in the test
  with pytest.raises(common.DataError, match='distinct'):
    # Lengths 4..5 with two arguments at most: only 4 * 10 * 10 distinct trees.
    listops.generate_splits(make_data(tmp_path, max_args=2, min_gen_length=3, max_gen_length=5,
                                      num_train=401, num_val=0, num_test=0))
