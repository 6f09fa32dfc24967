"""ListOps (LRA): a seeded generator following the original rules, LRA TSV files, a fixed vocabulary.

ListOps (Nangia & Bowman 2018; Long Range Arena, Tay et al. 2021, section 3.1 "Long ListOps") asks for
the value of a nested prefix expression over the digits 0-9 with the operators MIN, MAX, MED (median)
and SM (sum modulo 10), e.g. ``[MAX 2 9 [MIN 4 7 ] 0 ]`` = 9. It is a 10-class classification task.

Why a generator of our own: LRA's released files (``lra_release/listops-1000/basic_*.tsv``) are the
output of an unseeded script whose splits follow Python's set order, so they cannot be regenerated.
This module reproduces that script's *rules* exactly (see /work/shared/reference/listops-rules.md,
where they differ from the paper's prose) with a seeded numpy stream, so a run is reproducible from
``data.generator_seed`` alone, and it reads the released files unchanged when they are put in place:

* a node below ``max_depth`` is an operator with probability 0.25 (else a digit); at ``max_depth`` it
  is always a digit, so operators nest at most ``max_depth - 1`` deep;
* an operator has ``k`` ~ uniform{2..max_args} arguments, generated *before* the operator is drawn;
* ``MED = int(numpy.median(args))`` (an even count rounds the middle mean down), ``SM = sum % 10``;
* ``length = #digits + 2 * #operators`` (operator tokens and ``]``; parentheses not counted); a tree
  is kept iff ``min_gen_length < length < max_gen_length``; duplicates are dropped;
* serialization writes ``[OP a1 ... ak ]`` as left-nested binary pairs,
  ``( ( ... ( [OP a1 ) a2 ) ... ak ) ] )``; files are ``Source\\tTarget`` TSVs with ``\\r\\n`` lines.

The model sees the fixed LRA pipeline's tokens: ``]`` becomes ``X``, parentheses are deleted, the rest
is split on whitespace, so an example has exactly ``length`` tokens. Ids (identical in every process):

    PAD=0  UNK=1  [MIN=2  [MAX=3  [MED=4  [SM=5  X=6  0..9=7..16        vocab_size = 17

UNK is reserved for compatibility and never produced: an unknown token in a file is a DataError.

Trees are ``int`` (a digit) or ``(operator, (child, ...))`` with operator one of ``OPERATORS``.
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import io
import json
import logging
import os
import time
from typing import Any, Iterator, Sequence, Union

import numpy as np

from lra_tasks import common

Tree = Union[int, tuple]

OPERATORS = ('[MIN', '[MAX', '[MED', '[SM')
END = ']'
# The LRA pipeline's name for END once tokenized ("]" -> "X").
END_TOKEN = 'X'
DIGITS = tuple(str(d) for d in range(10))

PAD_ID = common.PAD_ID
UNK_ID = 1
# Fixed order, so ids never depend on what a file happens to contain or on hash seeds.
VOCAB: tuple[str, ...] = ('<pad>', '<unk>', *OPERATORS, END_TOKEN, *DIGITS)
TOKEN_IDS: dict[str, int] = {tok: i for i, tok in enumerate(VOCAB) if i > UNK_ID}
VOCAB_SIZE = len(VOCAB)  # 17
NUM_CLASSES = 10

# P(operator) for a node at depth < max_depth (the original's VALUE_P: a digit iff r > 0.25).
OPERATOR_P = 0.25

SPLIT_FILES = {split: f'basic_{split}.tsv' for split in common.SPLITS}
HEADER = ('Source', 'Target')
GENERATOR_JSON = 'generator.json'
# Bumped if the sampling procedure ever changes, so old caches are not mistaken for new ones.
GENERATOR_VERSION = 1

# LRA's generator settings: generated files for exactly these go where the released files go.
LRA_DEFAULTS = {
    'min_gen_length': 500,
    'max_gen_length': 2000,
    'num_train': 96000,
    'num_val': 2000,
    'num_test': 2000,
    'max_depth': 10,
    'max_args': 10,
    'generator_seed': 0,
}

# Length-accepted samples in a row that were all duplicates before generation gives up: the length
# window holds too few distinct trees for the requested split sizes.
_MAX_DUPLICATES_IN_A_ROW = 200_000

_log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------
# Sampling.


class _Draws:
  """One kind of draw from a numpy Generator, fetched in blocks (a numpy call per draw costs ~1 us)."""

  def __init__(self, sample, block: int = 64, max_block: int = 1 << 14):
    self._sample = sample  # size -> numpy array
    self._block = block
    self._max_block = max_block
    self._buf: list[int | float] = []
    self._pos = 0

  def _refill(self, k: int) -> None:
    """Keeps the unread draws and appends at least ``k`` new ones."""
    self._buf = self._buf[self._pos:] + self._sample(max(self._block, k)).tolist()
    self._pos = 0
    # Blocks grow geometrically: a sampler made for one small tree draws little.
    self._block = min(2 * self._block, self._max_block)

  def take(self, k: int) -> list:
    """The next ``k`` draws."""
    if self._pos + k > len(self._buf):
      self._refill(k)
    out = self._buf[self._pos:self._pos + k]
    self._pos += k
    return out

  def next(self) -> int | float:
    """The next draw."""
    if self._pos == len(self._buf):
      self._refill(1)
    v = self._buf[self._pos]
    self._pos += 1
    return v


class TreeSampler:
  """Samples ListOps trees by the original generator's rules, from one seeded numpy Generator.

  The rules (the distribution) are the module docstring's; digits are uniform in 0..9 and an operator
  uniform over MIN, MAX, MED, SM. All these choices are independent, which allows two cheaper steps than
  drawing node by node (the original is unseeded, so there is no draw order to reproduce, only this law):

  1. Shape, in preorder. Below ``max_depth``, the number of digit arguments an operator has before
     its next operator argument is ``Geometric(0.25) - 1``; if that reaches the arguments left, they
     are all digits. So a draw is made per operator, not per node, and the running length
     (``2 * #operators + #digits``, one per argument not yet expanded) is known at each step: a tree
     whose length reaches ``max_length`` is abandoned there, as the length filter would reject it.
  2. Labels, only for a shape that is kept: digits, then each operator after its arguments.

  Abandoning a shape early or skipping labels for it does not change the law of the kept trees: the
  draws for the next tree are independent of the abandoned one.
  """

  def __init__(self, rng: np.random.Generator, max_depth: int = 10, max_args: int = 10):
    self.max_depth = max_depth
    self.max_args = max_args
    self._uniform = _Draws(rng.random)
    self._digits_before_op = _Draws(lambda n: rng.geometric(OPERATOR_P, size=n) - 1)
    self._num_args = _Draws(lambda n: rng.integers(2, max_args + 1, size=n))
    self._digit = _Draws(lambda n: rng.integers(0, 10, size=n))
    self._operator = _Draws(lambda n: rng.integers(0, len(OPERATORS), size=n))

  def shape(self, depth: int = 1, max_length: int | None = None,
            root_is_operator: bool | None = None) -> tuple[list[int] | None, int]:
    """Preorder argument counts (0 = digit) and the length; ``(None, bound)`` once ``>= max_length``.

    ``root_is_operator`` conditions the root (None: draw it). A length filter that rejects a single
    digit may condition on an operator root: that skips the three in four trees it would reject.
    """
    limit = float('inf') if max_length is None else max_length
    if depth >= self.max_depth:
      if root_is_operator:
        raise ValueError(f'no operator at depth {depth} >= max_depth={self.max_depth}')
      root_is_operator = False
    elif root_is_operator is None:
      root_is_operator = self._uniform.next() <= OPERATOR_P
    if not root_is_operator:
      return ([0], 1) if 1 < limit else (None, 1)
    k = self._num_args.next()
    arities = [k]
    length = 2 + k  # the operator and ``]``, plus at least one token per argument
    if length >= limit:
      return None, length
    left = [k]              # per open operator: arguments not yet generated
    child_depth = [depth + 1]
    max_depth = self.max_depth
    next_gap, next_num_args = self._digits_before_op.next, self._num_args.next  # hot loop: locals
    while left:
      r = left[-1]
      if r == 0:
        left.pop()
        child_depth.pop()
        continue
      if child_depth[-1] >= max_depth:
        g = r  # digits only at max_depth
      else:
        g = next_gap()
      if g >= r:
        arities.extend([0] * r)
        left.pop()
        child_depth.pop()
        continue
      arities.extend([0] * g)
      left[-1] = r - g - 1
      k = next_num_args()
      arities.append(k)
      length += 1 + k  # one argument becomes an operator (2 tokens) with k arguments
      if length >= limit:
        return None, length
      left.append(k)
      child_depth.append(child_depth[-1] + 1)
    return arities, length

  def label(self, arities: Sequence[int]) -> Tree:
    """The tree of shape ``arities`` (preorder): digits in order, each operator after its arguments."""
    digits = iter(self._digit.take(arities.count(0)))
    counts = iter(arities)

    def build() -> Tree:
      k = next(counts)
      if k == 0:
        return next(digits)
      children = tuple(build() for _ in range(k))  # depth <= max_depth: recursion is bounded
      return (OPERATORS[self._operator.next()], children)

    return build()

  def sample(self, depth: int = 1, max_length: int | None = None,
             root_is_operator: bool | None = None) -> tuple[Tree | None, int]:
    arities, length = self.shape(depth, max_length, root_is_operator)
    return (None if arities is None else self.label(arities)), length


# ----------------------------------------------------------------------------------------------
# Semantics and serialization.


def _median_floor(args: Sequence[int]) -> int:
  """``int(numpy.median(args))`` for non-negative ints: an even count floors the middle mean."""
  s = sorted(args)
  n = len(s)
  if n % 2:
    return s[n // 2]
  return (s[n // 2 - 1] + s[n // 2]) // 2


def apply_operator(op: str, args: Sequence[int]) -> int:
  """The value of ``op`` (one of ``OPERATORS``) on evaluated arguments."""
  if op == '[MIN':
    return min(args)
  if op == '[MAX':
    return max(args)
  if op == '[MED':
    return _median_floor(args)
  if op == '[SM':
    return sum(args) % 10
  raise ValueError(f'unknown ListOps operator {op!r}; valid: {", ".join(OPERATORS)}')


def evaluate(tree: Tree) -> int:
  """The value (0..9) of a tree; nested operators first (depth is at most ``max_depth``)."""
  if isinstance(tree, int):
    return tree
  op, children = tree
  return apply_operator(op, [evaluate(c) for c in children])


def tree_length(tree: Tree) -> int:
  """``#digits + 2 * #operators``: the number of tokens the model sees."""
  if isinstance(tree, int):
    return 1
  return 2 + sum(tree_length(c) for c in tree[1])


def to_source(tree: Tree) -> str:
  """LRA's serialization: ``[OP a1 .. ak ]`` as left-nested binary pairs.

  The original builds ``t = (op, a1); t = (t, a_i) for i >= 2; t = (t, ']')`` and prints each pair as
  ``( left right )``, so ``[MAX 2 3 ]`` is ``( ( ( [MAX 2 ) 3 ) ] )``: ``k + 1`` opening parentheses,
  then the operator, the arguments each followed by ``)``, and ``] )``.
  """
  if isinstance(tree, int):
    return str(tree)
  op, children = tree
  return ('( ' * (len(children) + 1) + op + ' ' + ' ) '.join(to_source(c) for c in children)
          + ' ) ] )')


def tokenize(source: str) -> list[str]:
  """The fixed LRA pipeline: ``]`` -> ``X``, delete ``(`` and ``)``, split on whitespace."""
  return source.replace(']', END_TOKEN).replace('(', '').replace(')', '').split()


# ----------------------------------------------------------------------------------------------
# Generator parameters, directories, files.


@dataclasses.dataclass(frozen=True)
class GeneratorParams:
  """The ``data`` fields that determine the generated files (and so their cache directory)."""

  min_gen_length: int
  max_gen_length: int
  num_train: int
  num_val: int
  num_test: int
  max_depth: int
  max_args: int
  generator_seed: int

  @classmethod
  def from_data(cls, data: Any) -> GeneratorParams:
    try:
      params = cls(**{f.name: int(getattr(data, f.name)) for f in dataclasses.fields(cls)})
    except AttributeError as e:
      raise common.DataError(f'listops: data config lacks a generator field ({e}); expected '
                             f'{", ".join(f.name for f in dataclasses.fields(cls))}') from e
    params.validate()
    return params

  def as_dict(self) -> dict[str, int]:
    return dataclasses.asdict(self)

  def is_lra_default(self) -> bool:
    return self.as_dict() == LRA_DEFAULTS

  def short_hash(self) -> str:
    blob = json.dumps({**self.as_dict(), 'version': GENERATOR_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode('utf-8')).hexdigest()[:10]

  def split_sizes(self) -> dict[str, int]:
    return {'train': self.num_train, 'val': self.num_val, 'test': self.num_test}

  def validate(self) -> None:
    """Rejects settings that make generation impossible, instead of looping forever."""
    if self.max_depth < 1 or self.max_args < 2:
      raise common.DataError(f'listops: need max_depth >= 1 and max_args >= 2, got {self.max_depth}, '
                             f'{self.max_args}')
    if min(self.num_train, self.num_val, self.num_test) < 0:
      raise common.DataError(f'listops: split sizes must be >= 0, got {self.split_sizes()}')
    # The longest possible tree: operators with max_args arguments down to depth max_depth - 1.
    longest = 1
    for _ in range(self.max_depth - 1):
      longest = 2 + self.max_args * longest
    lo = max(self.min_gen_length + 1, 1)
    hi = min(self.max_gen_length - 1, longest)
    # Achievable lengths: 1 (a digit) or >= 4 (an operator with two digits).
    if not (lo <= hi and (lo == 1 or hi >= 4)):
      raise common.DataError(
          f'listops: no tree has {self.min_gen_length} < length < {self.max_gen_length} with '
          f'max_depth={self.max_depth}, max_args={self.max_args} (longest possible: {longest}); '
          'widen the length window')


def data_root(data: Any) -> str:
  return os.path.join(os.path.expanduser(str(data.data_dir)), 'listops')


def split_dir(data: Any) -> str:
  """``{data_dir}/listops`` for LRA's settings (where released files go), else ``.../gen-<hash>``."""
  params = GeneratorParams.from_data(data)
  if params.is_lra_default():
    return data_root(data)
  return os.path.join(data_root(data), f'gen-{params.short_hash()}')


def split_path(data: Any, split: str) -> str:
  if split not in SPLIT_FILES:
    raise ValueError(f'unknown split {split!r}; valid: {", ".join(common.SPLITS)}')
  return os.path.join(split_dir(data), SPLIT_FILES[split])


def write_tsv(path: str, rows: Sequence[tuple[str, int]]) -> None:
  """Writes ``(source, target)`` rows as LRA does (csv writer, tab, ``\\r\\n``), atomically."""
  buf = io.StringIO(newline='')
  writer = csv.writer(buf, delimiter='\t', lineterminator='\r\n')
  writer.writerow(HEADER)
  writer.writerows((source, int(target)) for source, target in rows)
  common.atomic_write_text(path, buf.getvalue(), newline='')


def _iter_rows(path: str) -> Iterator[tuple[int, str, int]]:
  """Yields ``(line_number, source, target)``; a malformed header or row: a one-line DataError."""
  fix = 'fix or delete the file (prepare() regenerates it when data.generate=True)'
  # surrogateescape: a byte that is not UTF-8 reaches the row check below, which names its line.
  with open(path, 'r', encoding='utf-8', errors='surrogateescape', newline='') as f:
    reader = csv.reader(f, delimiter='\t')
    rows = common.csv_rows(reader, path, fix)
    header = next(rows, None)
    if header is None or tuple(header) != HEADER:
      raise common.DataError(f'{path}:1: header must be "Source<TAB>Target", got {header!r}; {fix}')
    for row in rows:
      line = reader.line_num
      _check_utf8(path, line, row, fix)
      if any(len(field) > MAX_FIELD_CHARS for field in row):
        # csv's own limit, unless another reader raised it for this process (Retrieval does).
        raise common.DataError(f'{path}:{line}: malformed row (field larger than field limit '
                               f'({MAX_FIELD_CHARS})); {fix}')
      if len(row) != 2:
        raise common.DataError(f'{path}:{line}: expected 2 tab-separated fields (Source, Target), '
                               f'got {len(row)}; {fix}')
      source, target = row
      if not (len(target) == 1 and target in DIGITS):
        raise common.DataError(f'{path}:{line}: Target must be one digit 0-9, got {target!r}; {fix}')
      yield line, source, int(target)


# csv's default field size limit; LRA's longest sources are ~10k characters (< 2000 tokens).
MAX_FIELD_CHARS = 131072


def _check_utf8(path: str, line: int, row: Sequence[str], fix: str) -> None:
  for field in row:
    if not field.isascii():
      try:
        field.encode('utf-8')
      except UnicodeEncodeError as e:
        bad = field[e.start].encode('utf-8', 'surrogateescape')
        raise common.DataError(f'{path}:{line}: not UTF-8 text (byte 0x{bad.hex()} at column '
                               f'{e.start + 1}); {fix}') from None


def _tokens_or_error(path: str, line: int, source: str) -> list[str]:
  tokens = tokenize(source)
  if not tokens:
    raise common.DataError(f'{path}:{line}: empty Source; fix or delete the file')
  unknown = set(tokens).difference(TOKEN_IDS)
  if unknown:
    raise common.DataError(f'{path}:{line}: unknown token(s) {sorted(unknown)!r} (vocabulary: '
                           f'{" ".join(VOCAB[2:])}); fix or delete the file')
  return tokens


def read_tsv(path: str) -> tuple[list[str], list[int]]:
  """``(sources, targets)`` of a ListOps TSV (ours or LRA's), every row validated."""
  sources, targets = [], []
  for line, source, target in _iter_rows(path):
    _tokens_or_error(path, line, source)
    sources.append(source)
    targets.append(target)
  return sources, targets


# Fast encoding (a full LRA split is ~100M tokens): each operator becomes a one-byte stand-in, so a
# row maps to ids with bytes methods and numpy instead of a Python object per token. The stand-ins
# are not in the alphabet a source may contain, so they cannot be confused with real input; anything
# unusual goes down the slow path, which names the bad token.
_OP_STAND_INS = {b'[MIN': b'a', b'[MAX': b'b', b'[MED': b'c', b'[SM': b'd'}
_SOURCE_ALPHABET = b' ()[]MINAXEDS0123456789'
_END_AND_NO_PARENS = (bytes.maketrans(b']', END_TOKEN.encode()), b'()')
_CHAR_IDS = np.zeros(256, dtype=np.int32)  # 0 (PAD) marks a byte that is no token
for _op, _ch in _OP_STAND_INS.items():
  _CHAR_IDS[_ch[0]] = TOKEN_IDS[_op.decode()]
for _tok in (END_TOKEN, *DIGITS):
  _CHAR_IDS[ord(_tok)] = TOKEN_IDS[_tok]


def _encode(path: str, line: int, source: str) -> np.ndarray:
  """``[TOKEN_IDS[t] for t in tokenize(source)]`` as int32; a DataError for an unknown token."""
  raw = source.encode('utf-8')
  if raw.isascii() and not raw.translate(None, _SOURCE_ALPHABET):
    text = raw.translate(*_END_AND_NO_PARENS)
    for op, ch in _OP_STAND_INS.items():
      text = text.replace(op, ch)
    chars = np.frombuffer(text, dtype=np.uint8)
    is_token = chars != ord(' ')
    # Known tokens are single bytes now: valid iff no two token bytes touch and each is a token.
    if is_token.any() and not (is_token[1:] & is_token[:-1]).any():
      ids = _CHAR_IDS[chars[is_token]]
      if ids.all():
        return ids
  tokens = _tokens_or_error(path, line, source)  # raises, naming the bad token
  return np.fromiter(map(TOKEN_IDS.__getitem__, tokens), dtype=np.int32, count=len(tokens))


@functools.lru_cache(maxsize=8)
def _load_arrays(path: str, max_length: int, mtime_ns: int, size: int
                 ) -> tuple[np.ndarray, np.ndarray]:
  """Token ids ``int32[N, max_length]`` (right-padded / truncated) and ``int32[N]`` targets.

  Cached per file version (mtime, size in the key) and length: the trainer asks for a split repeatedly.
  The arrays are shared between callers, so they are made read-only.
  """
  del mtime_ns, size  # cache key only
  rows, targets = [], []
  for line, source, target in _iter_rows(path):
    rows.append(_encode(path, line, source)[:max_length])
    targets.append(target)
  inputs = np.full((len(rows), max_length), PAD_ID, dtype=np.int32)
  for i, ids in enumerate(rows):
    inputs[i, :len(ids)] = ids
  targets_arr = np.asarray(targets, dtype=np.int32).reshape(len(targets))
  inputs.setflags(write=False)
  targets_arr.setflags(write=False)
  return inputs, targets_arr


# ----------------------------------------------------------------------------------------------
# Generation of the splits.


def generate_splits(data: Any) -> dict[str, list[tuple[str, int]]]:
  """``{split: [(source, target), ...]}``, a deterministic function of the generator fields.

  One seeded stream of trees; a tree is kept iff ``min_gen_length < length < max_gen_length`` and its
  source string is new; the first ``num_train`` kept go to train, the next ``num_val`` to val, then
  ``num_test`` to test, so no example appears twice in or across splits.
  """
  params = GeneratorParams.from_data(data)
  sampler = TreeSampler(np.random.default_rng(params.generator_seed), params.max_depth,
                        params.max_args)
  total = params.num_train + params.num_val + params.num_test
  seen: set[str] = set()
  kept: list[tuple[str, int]] = []
  lo, hi = params.min_gen_length, params.max_gen_length
  duplicates_in_a_row = 0
  while len(kept) < total:
    # A single digit (length 1) never passes a filter with lo >= 1: start every tree at an operator.
    tree, length = sampler.sample(1, hi, root_is_operator=True if lo >= 1 else None)
    if tree is None or length <= lo:
      continue
    source = to_source(tree)
    if source in seen:
      duplicates_in_a_row += 1
      if duplicates_in_a_row > _MAX_DUPLICATES_IN_A_ROW:
        raise common.DataError(
            f'listops: only {len(kept)} distinct trees found with {lo} < length < {hi}, '
            f'{total} requested; widen the length window or ask for fewer examples')
      continue
    duplicates_in_a_row = 0
    seen.add(source)
    kept.append((source, evaluate(tree)))
  out, start = {}, 0
  for split, n in params.split_sizes().items():
    out[split] = kept[start:start + n]
    start += n
  return out


# ----------------------------------------------------------------------------------------------
# The task.


class ListOpsTask:
  """``common.Task`` for ListOps: generates missing files locally, reads ours or LRA's released ones.

  Stateless: every method reads what it needs from ``data`` (a ConfigDict or any attribute object).
  """

  name = 'listops'

  def info(self, data: Any) -> common.TaskInfo:
    return common.TaskInfo(num_classes=NUM_CLASSES, vocab_size=VOCAB_SIZE,
                           max_length=int(data.max_length), dual=False)

  def _missing(self, data: Any) -> list[str]:
    return [s for s in common.SPLITS if not os.path.isfile(split_path(data, s))]

  def check(self, data: Any) -> list[str]:
    params = GeneratorParams.from_data(data)
    lines = []
    for split in self._missing(data):
      how = [f'run: python scripts/prepare_data.py --task listops --data_dir {data.data_dir}',
             'or set data.generate=True']
      if params.is_lra_default():
        how.append(f'or copy lra_release/listops-1000/{SPLIT_FILES[split]} there')
      lines.append(f'{split_path(data, split)} is missing: ' + ', '.join(how))
    return lines

  def prepare(self, data: Any) -> None:
    """Generates the missing split files if ``data.generate``; otherwise does nothing."""
    missing = self._missing(data)
    not_files = [split_path(data, s) for s in missing if os.path.lexists(split_path(data, s))]
    if not_files:
      raise common.DataError(f'listops: {not_files[0]} exists but is not a file; remove or rename it')
    if not missing or not bool(data.generate):
      return
    directory = split_dir(data)
    params = GeneratorParams.from_data(data)
    present = [s for s in common.SPLITS if s not in missing]
    # Files without our generator.json are someone else's (LRA's release): generating the rest
    # would mix two generators and could repeat examples across splits.
    if present and not os.path.isfile(os.path.join(directory, GENERATOR_JSON)):
      raise common.DataError(
          f'listops: {directory} has {", ".join(SPLIT_FILES[s] for s in present)} but not '
          f'{", ".join(SPLIT_FILES[s] for s in missing)}, and no {GENERATOR_JSON}: copy all three '
          'released files there, or delete them to generate a consistent set')
    start = time.perf_counter()
    splits = generate_splits(data)
    # Parameters first: an interrupted run leaves a directory that is recognisably ours.
    common.atomic_write_text(
        os.path.join(directory, GENERATOR_JSON),
        json.dumps({**params.as_dict(), 'version': GENERATOR_VERSION}, indent=2, sort_keys=True)
        + '\n')
    for split in missing:
      write_tsv(os.path.join(directory, SPLIT_FILES[split]), splits[split])
    _log.info('listops: generated %s in %.1f s (%s) -> %s',
              {s: len(v) for s, v in splits.items()}, time.perf_counter() - start,
              params.as_dict(), directory)

  def source(self, data: Any, split: str) -> common.ArraySource:
    path = split_path(data, split)
    if not os.path.isfile(path):
      raise common.DataError('listops: ' + '; '.join(self.check(data)))
    st = os.stat(path)
    inputs, targets = _load_arrays(path, int(data.max_length), st.st_mtime_ns, st.st_size)
    if not len(targets):
      raise common.DataError(f'{path}: the {split} split holds no examples (a header only); delete '
                             'the file to regenerate it, or copy it again from the LRA release')
    return common.ArraySource(inputs=inputs, targets=targets)


TASK = ListOpsTask()
