"""Bits per byte of a tiny trained decoder under each enwik8 test context scheme.

``python -m kernelformer.bench.eval_context --fixture topic``   (or ``--fixture words``)

Writes a 20,000-byte file in enwik8's format to a temporary directory, trains a 1-layer decoder
(emb 32, 2 heads, ``--kind``, no positions) ``--steps`` Adam steps on random training windows of
``--length`` bytes, and prints the test split's bits per byte under ``eval_context`` 'disjoint',
'sliding' (stride L/2) and 'stateful' (``kernelformer/training/lm_eval.py``). Fixtures:

``topic`` (``write_topic_fixture``: documents of 1000 letters, each from its own 10 of a..z, so more
context is worth more) and ``words`` (``lra_tasks.enwik8.write_fixture``: i.i.d. words, only the last
few bytes matter); results: docs/causal.md, "Measured".

Used by ``tests/training/test_lm_eval.py`` (the topic fixture's order disjoint > sliding > stateful).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

import lra_tasks
from kernelformer import decoder
from kernelformer.training import lm_eval
from lra_tasks import enwik8


def write_topic_fixture(data_dir: str, num_bytes: int, doc_bytes: int = 1000, letters: int = 10,
                        seed: int = 0) -> None:
  """``{data_dir}/enwik8/enwik8`` of documents of ``doc_bytes`` letters, each document drawing
  uniformly from its own random ``letters`` of a..z: a byte is predictable only from the document's
  earlier bytes, and the more of them a model sees the better (which letters the document uses)."""
  rng = np.random.default_rng(seed)
  out = bytearray()
  while len(out) < num_bytes:
    alphabet = rng.choice(26, letters, replace=False) + ord('a')
    out += bytes(rng.choice(alphabet, doc_bytes).astype(np.uint8))
  os.makedirs(os.path.join(data_dir, 'enwik8'), exist_ok=True)
  with open(os.path.join(data_dir, 'enwik8', enwik8.FILE), 'wb') as f:
    f.write(bytes(out[:num_bytes]))


def train_tiny(data, kind='linear-elu', steps=300, learning_rate=1e-2, seed=0):
  """A 1-layer decoder trained ``steps`` Adam steps on random training windows of ``data``."""
  length = int(data.max_length)
  model = decoder.Decoder(vocab_size=enwik8.VOCAB_SIZE, emb_dim=32, num_layers=1, num_heads=2,
                          qkv_dim=32, mlp_dim=64, max_length=length, pos_encoding='none',
                          attention={'kind': kind, 'num_features': 16, 'chunk_size': 8})
  fkey = jax.random.key(1)
  params = model.init({'params': jax.random.key(seed), 'features': fkey},
                      jnp.ones((1, length), jnp.int32))['params']
  tx = optax.adam(learning_rate)

  @jax.jit
  def step(params, opt, inputs, targets):
    def loss(p):
      losses, _, w = decoder.next_token_loss(
          model.apply({'params': p}, inputs, rngs={'features': fkey}), targets)
      return jnp.sum(losses) / jnp.sum(w)
    grads = jax.grad(loss)(params)
    updates, opt = tx.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt

  train = lra_tasks.get('enwik8').source(data, 'train')
  rng = np.random.default_rng(seed)
  opt = tx.init(params)
  for _ in range(steps):
    rows = [train[int(i)] for i in rng.integers(0, len(train), 16)]
    params, opt = step(params, opt, np.stack([r['inputs'] for r in rows]),
                       np.stack([r['targets'] for r in rows]))
  return model, {'params': params}, fkey


def bpb_by_scheme(data, model, variables, fkey) -> dict[str, float]:
  """Test bits per byte of a trained model under each scheme (sliding at the default stride L/2)."""
  task, out = lra_tasks.get('enwik8'), {}
  for context in ('disjoint', 'sliding', 'stateful'):
    d = ml_collections.ConfigDict({**data.to_dict(), 'eval_context': context, 'eval_stride': 0})
    evaluate = lm_eval.evaluate_stateful if context == 'stateful' else lm_eval.evaluate_windows
    r = evaluate(model, variables, task.source(d, 'test'), features_key=fkey)
    assert r['examples'] == enwik8.split_bounds(int(data.num_bytes))['test'][1] - \
        enwik8.split_bounds(int(data.num_bytes))['test'][0] - 1
    out[context] = r['loss'] / float(np.log(2.0))
  return out




def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--fixture', choices=('topic', 'words'), default='topic')
  parser.add_argument('--kind', default='linear-elu')
  parser.add_argument('--steps', type=int, default=300)
  parser.add_argument('--length', type=int, default=32)
  parser.add_argument('--learning_rate', type=float, default=1e-2)
  parser.add_argument('--num_bytes', type=int, default=20000)
  args = parser.parse_args(argv)
  t0 = time.time()
  with tempfile.TemporaryDirectory() as tmp:
    if args.fixture == 'topic':
      write_topic_fixture(tmp, args.num_bytes)
    else:
      enwik8.write_fixture(tmp, args.num_bytes)
    data = ml_collections.ConfigDict({'task': 'enwik8', 'data_dir': tmp, 'num_bytes': args.num_bytes,
                                      'max_length': args.length})
    bpb = bpb_by_scheme(data, *train_tiny(data, args.kind, args.steps, args.learning_rate))
  for context, value in bpb.items():
    print(f'{args.fixture}\t{args.kind}\t{context}\t{value:.4f} bits/byte')
  print(f'({time.time() - t0:.0f} s, load average {os.getloadavg()[0]:.1f})', file=sys.stderr)
  return 0


if __name__ == '__main__':
  sys.exit(main())
