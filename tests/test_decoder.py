"""The decoder-only LM (kernelformer/decoder.py).

* Step-by-step (incremental) logits equal the full causal forward for EVERY causal registry kind: the
  recurrent state of linear kinds, the feature cache under RPE, the KV cache of softmax/Gaussian. Same
  random-feature draw (same ``features`` key; the step draws W under the same module path). The length
  (5) spans two chunks of the chunked causal core at chunk 3 (its inter- and intra-chunk parts) and one
  at chunk 64; keys scaled x1, x10, x30.
* A sequence run as blocks that carry the decoder state (stateful evaluation) equals the full forward.
* Kinds with no causal form are refused with one line.
* The compiled memory of one decode step does not grow with the number of tokens it can generate for a
  linear kind (recurrent state), and does for softmax (KV cache).
* Greedy generation agrees with the full forward, and the next-token loss ignores target 0.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import decoder, registry

VOCAB, LENGTH = 7, 5
# num_features 9: SGQ needs >= 2 * head_dim + 1 rows (head dim 4); chunk 3 < LENGTH.
OPTIONS = {'num_features': 9, 'chunk_size': 3, 'num_mixture_components': 2}
CAUSAL = decoder.causal_kinds()


def _model(kind, *, layers=1, max_length=LENGTH, **attention):
  return decoder.Decoder(vocab_size=VOCAB, emb_dim=8, num_layers=layers, num_heads=2, qkv_dim=8,
                         mlp_dim=16, attention={'kind': kind, **OPTIONS, **attention},
                         max_length=max_length)


def _full_and_steps(model, seed=0):
  tokens = jax.random.randint(jax.random.key(seed), (2, LENGTH), 1, VOCAB)
  fkey = jax.random.key(seed + 7)
  params = model.init({'params': jax.random.key(seed + 1), 'features': fkey}, tokens)['params']
  # Perturb every parameter (zero-initialized RPE biases, unit LayerNorm scales) so nothing is trivial.
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed + 2), len(leaves))
  params = jax.tree.unflatten(tree, [p + 0.3 * jax.random.normal(k, p.shape)
                                     for p, k in zip(leaves, keys)])

  @jax.jit
  def both(p, t):
    full = model.apply({'params': p}, t, rngs={'features': fkey})
    steps = decoder.teacher_forced_logits(model, p, t, features_key=fkey)
    return full, steps

  return both(params, tokens)


def test_every_kind_is_classified():
  refused = {s.name for s in registry.specs()} - set(CAUSAL)
  # The mechanisms whose own modules raise for causal=True, and the sequence-statistic components.
  assert {'nystromformer', 'linformer', 'skyformer', 'oprf-orf', 'saderf-orf'} <= refused
  assert {'softmax', 'gaussian', 'nprf-rpe', 'posrf-orf', 'linear-elu', 'gmm-rks'} <= set(CAUSAL)


@pytest.mark.parametrize('kind,rpe', [('posrf-orf', True), ('softmax', True), ('trigrf-iid', False)])
def test_incremental_equals_full_forward_two_layers(kind, rpe):
  full, steps = _full_and_steps(_model(kind, layers=2, rpe=rpe), seed=3)
  np.testing.assert_allclose(np.asarray(steps), np.asarray(full), rtol=2e-4, atol=2e-4)


KEY_SCALES = (1.0, 10.0, 30.0)


def _scale_keys(params, scale):
  """Every key projection (``.../attention/key/...``) multiplied by ``scale``."""
  def one(path, x):
    return x * scale if any(getattr(p, 'key', None) == 'key' for p in path) else x
  return jax.tree_util.tree_map_with_path(one, params)


@pytest.mark.parametrize('kind', [s.name for s in registry.specs()])
def test_incremental_equals_full_forward(kind):
  """Step-by-step logits equal the full causal forward, with keys x1, x10 and x30.

  Against the forward with chunk 3 < LENGTH (its inter- and intra-chunk parts) and with chunk 64 (one
  chunk holding every row). The key shift of every row is the running max over the keys up to it, in
  the forward at any chunk size as in a step. With the step's features unshifted trigrf overflowed and
  posrf differed at x10; with a shift per chunk (which includes the chunk's later keys) the forward at
  chunk 3 was 0.71 (posrf-orf) and 2.61 (trigrf-iid) from the steps at x10.
  Every kind of the registry: kinds with no causal form are skipped with their one-line reason.
  """
  problem = decoder.causal_problem(kind)
  if problem is not None:
    assert 'causal' in problem and '\n' not in problem and kind in problem, problem
    pytest.skip(problem)
  chunked, one_chunk = _model(kind), _model(kind, chunk_size=64)
  tokens = jax.random.randint(jax.random.key(0), (2, LENGTH), 1, VOCAB)
  fkey = jax.random.key(7)
  params = chunked.init({'params': jax.random.key(1), 'features': fkey}, tokens)['params']
  # Perturb every parameter (zero-initialized RPE biases, unit LayerNorm scales) so nothing is trivial.
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(2), len(leaves))
  params = jax.tree.unflatten(tree, [p + 0.3 * jax.random.normal(k, p.shape)
                                     for p, k in zip(leaves, keys)])

  @jax.jit
  def run(p, t):
    def at(scale):
      ps = _scale_keys(p, scale)
      return (chunked.apply({'params': ps}, t, rngs={'features': fkey}),
              one_chunk.apply({'params': ps}, t, rngs={'features': fkey}),
              decoder.teacher_forced_logits(chunked, ps, t, features_key=fkey))
    return jax.lax.map(at, jnp.asarray(KEY_SCALES))

  full3, full64, steps = (np.asarray(x) for x in run(params, tokens))
  assert steps.shape == (len(KEY_SCALES), 2, LENGTH, VOCAB)
  assert np.isfinite(full3).all() and np.isfinite(full64).all() and np.isfinite(steps).all()
  for i, scale in enumerate(KEY_SCALES):
    for c, full in ((3, full3[i]), (64, full64[i])):
      np.testing.assert_allclose(steps[i], full, rtol=2e-4, atol=2e-4 * max(1.0, np.abs(full).max()),
                                 err_msg=f'{kind} with keys x{scale}, chunk {c}')


def _blocks(model, params, tokens, sizes, fkey):
  """Logits of ``tokens`` fed to the decode path as consecutive blocks of ``sizes`` (state carried)."""
  cache = decoder.init_cache(model, tokens.shape[0])
  dec = model.clone(decode=True)
  out, start = [], 0
  for n in sizes:
    logits, new = dec.apply({'params': params, 'cache': cache}, tokens[:, start:start + n],
                            rngs={'features': fkey}, mutable=['cache'])
    cache, start = new['cache'], start + n
    out.append(logits)
  return jnp.concatenate(out, axis=1)


@pytest.mark.parametrize('kind', ['posrf-orf', 'trigrf-iid', 'hyperbolic-sgq', 'linear-elu'])
def test_blocks_with_carried_state_equal_full_forward(kind):
  """Stateful evaluation's path: blocks of a sequence, each continuing the previous block's state.

  Blocks at chunk boundaries (6 + 6, chunk 3) and across one (5 + 7) have the full forward's per-row
  shifts, so they agree with keys x30 too.
  """
  length = 12
  model = _model(kind, max_length=length)
  tokens = jax.random.randint(jax.random.key(3), (2, length), 1, VOCAB)
  fkey = jax.random.key(4)
  params = model.init({'params': jax.random.key(5), 'features': fkey}, tokens)['params']
  forward = jax.jit(lambda ps: model.apply({'params': ps}, tokens, rngs={'features': fkey}))
  in_blocks = {sizes: jax.jit(lambda ps, sizes=sizes: _blocks(model, ps, tokens, sizes, fkey))
               for sizes in ((5, 7), (6, 6))}
  for scale, sizes in ((1.0, (5, 7)), (1.0, (6, 6)), (30.0, (6, 6)), (30.0, (5, 7))):
    ps = _scale_keys(params, scale)
    full = forward(ps)
    blocks = in_blocks[sizes](ps)
    assert np.isfinite(np.asarray(blocks)).all()
    np.testing.assert_allclose(np.asarray(blocks), np.asarray(full), rtol=2e-4,
                               atol=2e-4 * max(1.0, float(jnp.abs(full).max())),
                               err_msg=f'{kind}, keys x{scale}, blocks {sizes}')


def test_future_tokens_do_not_change_past_logits():
  model = _model('posrf-orf', layers=2)
  t1 = jnp.array([[1, 2, 3, 4, 5]])
  t2 = jnp.array([[1, 2, 3, 6, 6]])
  fkey = jax.random.key(0)
  params = model.init({'params': jax.random.key(1), 'features': fkey}, t1)['params']
  l1 = model.apply({'params': params}, t1, rngs={'features': fkey})
  l2 = model.apply({'params': params}, t2, rngs={'features': fkey})
  np.testing.assert_allclose(l1[:, :3], l2[:, :3], rtol=1e-5, atol=1e-5)
  assert not np.allclose(l1[:, 3:], l2[:, 3:])


@pytest.mark.parametrize('kind', ['nystromformer', 'linformer', 'skyformer', 'oprf-orf', 'saderf-iid'])
def test_non_causal_kinds_refused_in_one_line(kind):
  with pytest.raises(decoder.CausalKindError) as e:
    _model(kind).init({'params': jax.random.key(0), 'features': jax.random.key(0)},
                      jnp.ones((1, LENGTH), jnp.int32))
  msg = str(e.value)
  assert '\n' not in msg and kind in msg and 'causal' in msg


def _step_memory(kind, max_length):
  model = _model(kind, max_length=max_length)
  tokens = jnp.ones((2, 1), jnp.int32)
  fkey = jax.random.key(0)
  params = jax.eval_shape(lambda: model.init({'params': jax.random.key(0), 'features': fkey},
                                             tokens)['params'])
  cache = jax.eval_shape(lambda: decoder.init_cache(model, 2))
  step = jax.jit(lambda p, c, t: decoder.decode_step(model, p, c, t, features_key=fkey))
  m = step.lower(params, cache, tokens).compile().memory_analysis()
  return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes


def test_decode_step_memory_constant_for_linear_state_and_growing_for_kv_cache():
  short, long = _step_memory('posrf-orf', 16), _step_memory('posrf-orf', 4096)
  assert short == long, (short, long)
  kv_short, kv_long = _step_memory('softmax', 16), _step_memory('softmax', 4096)
  # The KV cache holds keys and values for every position: 2 * B * L * qkv_dim floats.
  assert kv_long - kv_short >= 2 * 2 * (4096 - 16) * 8 * 4


def test_greedy_generation_matches_full_forward():
  model = _model('linear-elu', max_length=8)
  fkey = jax.random.key(0)
  prompt = jnp.array([[1, 2, 3], [4, 5, 6]])
  params = model.init({'params': jax.random.key(4), 'features': fkey}, prompt)['params']
  out = decoder.generate(model, params, prompt, 4, features_key=fkey)
  seq = jnp.concatenate([prompt, out], axis=1)
  logits = model.apply({'params': params}, seq, rngs={'features': fkey})
  np.testing.assert_array_equal(np.asarray(out), np.asarray(jnp.argmax(logits[:, 2:-1], -1)))


def test_next_token_loss_ignores_zero_targets_and_untied_head():
  model = decoder.Decoder(
      vocab_size=VOCAB, emb_dim=8, num_layers=1, num_heads=2, qkv_dim=8, mlp_dim=16,
      attention={'kind': 'softmax'}, max_length=LENGTH, tie_embeddings=False)
  tokens = jnp.array([[1, 2, 3, 4, 5]])
  params = model.init({'params': jax.random.key(0)}, tokens)['params']
  assert 'lm_head' in params
  logits = model.apply({'params': params}, tokens)
  targets = jnp.array([[0, 3, 0, 5, 0]])
  losses, correct, weights = decoder.next_token_loss(logits, targets)
  np.testing.assert_array_equal(np.asarray(weights), [[0, 1, 0, 1, 0]])
  assert float(losses[0, 0]) == 0.0 and float(losses[0, 1]) > 0.0
  assert set(np.asarray(correct).ravel()) <= {0.0, 1.0}
