"""Fused Pallas random-feature attention against the XLA path (CPU, Pallas interpret mode).

Every case compiles one function that returns outputs and input gradients (q, k, v, W, feature
weights) of both ``kernelformer.pallas.feature_attention`` and the XLA path (components.py features +
linear.linear_attention, ``kernelformer.bench.pallas_reference``), then feeds it several input sets (same
shapes, so one compile): moderate norms, and norms up to 100.

Tolerances are first-order rounding bounds, not tuned constants. For output row i,

    |out_i - ref_i| <= delta * sum_j sum_r |phi_q,ir| |phi_k,jr| (|v_j| + |out_i|) / |D_i|,

the error of a ratio of two sums whose terms each carry a relative error <= delta, with
``delta = 2 eps (L + M + 8 + 2 d (Zq + Zk))``: nested sums over keys and features (L + M roundings), a
few elementwise roundings, and the exponent ``w.x - |x|^2/2`` (a length-d dot, abs error
<= d eps (|w||x| + |x|^2/2) = d eps Z) whose error is a relative error of exp; the factor 2 because
both implementations round. bf16 adds 4 roundings of 2^-8 (features on both sides, the state or the
in-chunk scores, the output). Gradients: ``|dg| <= 4 delta cond^2 max|g_ref|`` with cond the largest
row ratio ``sum_j |phi_q.phi_k| / |D_i|`` (1 for positive features): the backward divides by D twice.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer.pallas import FEATURES, feature_attention, supported
from kernelformer.bench import pallas_reference as reference

EPS32 = float(np.finfo(np.float32).eps)
BF16_UNIT = float(jnp.finfo(jnp.bfloat16).eps) / 2   # unit roundoff of bfloat16, 2^-8
B, L, H, D, DV, M = 3, 40, 2, 8, 8, 16
VALID = (40, 23, 1)             # keys per batch element: all, some, all but one padded
BLOCK = 16                      # L = 40 is not a multiple: padding is exercised
# Interpret-mode kernels are big while loops: XLA's backend optimizations double their compile time
# and buy nothing at these sizes.
JIT_OPTIONS = {'xla_backend_optimization_level': 0}
_features = jax.jit(reference.features, static_argnames=('feature',), compiler_options=JIT_OPTIONS)


def _mask(lengths, length):
  return jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]


def _uses_w(feature):
  return feature in ('exp', 'trig')


def _inputs(seed, feature, *, lq=L, lk=L, big=False, shared_w=False, dtype=jnp.float32):
  """q, k, v, w, feature weights and a cotangent; ``big``: row norms spread over [0, 100]."""
  ks = jax.random.split(jax.random.PRNGKey(seed), 8)
  scale = 0.25 if feature == 'trig' else 0.5      # trig: a well-conditioned (positive) normalizer
  q = scale * jax.random.normal(ks[0], (B, lq, H, D))
  k = scale * jax.random.normal(ks[1], (B, lk, H, D))
  if big:
    def spread(key, x):
      direction = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
      return direction * jax.random.uniform(key, x.shape[:-1] + (1,), minval=0.0, maxval=100.0)
    q, k = spread(ks[2], q), spread(ks[3], k)
  v = jax.random.normal(ks[4], (B, lk, H, DV))
  g = jax.random.normal(ks[5], (B, lq, H, DV))
  w = fw = None
  if _uses_w(feature):
    w = jax.random.normal(ks[6], (M, D) if shared_w else (H, M, D))
    u = jax.random.uniform(ks[7], (H, M), minval=-1.0, maxval=1.0)
    # exp: positive, uneven weights [M]; trig: signed weights per head (sparse-grid-like).
    fw = (1.0 + 0.5 * u[0]) / M if feature == 'exp' else (1.0 + 1.5 * u) / M
  cast = lambda x: x.astype(dtype)
  return cast(q), cast(k), cast(v), w, fw, cast(g)


@functools.lru_cache(maxsize=None)
def _pair(feature, causal, lq, lk, masked, dtype_name, blocks=(BLOCK, BLOCK), splits=2):
  """One jitted function: (out, grads) of the kernels and of the XLA path for one configuration."""
  del lq, lk, dtype_name  # part of the cache key only (jit retraces on new shapes anyway)
  uses_w = _uses_w(feature)

  def run(fn, q, k, v, w, fw, mask, g):
    def f(q, k, v, w, fw):
      return fn(q, k, v, w, fw, mask)
    args = (q, k, v, w, fw) if uses_w else (q, k, v)
    out, vjp = jax.vjp(f if uses_w else (lambda q, k, v: f(q, k, v, None, None)), *args)
    return out, vjp(g)

  def kernel(q, k, v, w, fw, mask):
    return feature_attention(q, k, v, w, feature=feature, feature_weights=fw,
                             mask=mask if masked else None, causal=causal, block_q=blocks[0],
                             block_k=blocks[1], num_splits=splits)

  def xla(q, k, v, w, fw, mask):
    f32 = lambda x: x.astype(jnp.float32)
    return reference.xla_feature_attention(f32(q), f32(k), f32(v), w, feature=feature,
                                           feature_weights=fw, mask=mask if masked else None,
                                           causal=causal, chunk_size=BLOCK)

  @functools.partial(jax.jit, compiler_options=JIT_OPTIONS)
  def both(q, k, v, w, fw, mask, g):
    return run(kernel, q, k, v, w, fw, mask, g), run(xla, q, k, v, w, fw, mask, g.astype(jnp.float32))

  return both


def _abs_features(phi, feature):
  """|phi| per feature; for trig the magnitude of each (cos, sin) pair (cos error is absolute)."""
  phi = np.abs(np.asarray(phi, np.float64))
  if feature == 'trig':
    half = phi.shape[-1] // 2
    mag = np.hypot(phi[..., :half], phi[..., half:])
    phi = np.concatenate([mag, mag], axis=-1)
  return phi


def _delta(feature, q, k, w, lk):
  """The relative error per term of the module docstring, from the data's exponent magnitudes."""
  q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
  wn = 0.0 if w is None else float(np.max(np.linalg.norm(np.asarray(w, np.float64), axis=-1)))
  z = lambda x: float(np.max(wn * np.linalg.norm(x, axis=-1) + 0.5 * np.sum(x * x, axis=-1)))
  m_feat = {'exp': M, 'trig': 2 * M}.get(feature, D)
  return 2 * EPS32 * (lk + m_feat + 8 + 2 * D * (z(q) + z(k)))


def _reference_scores(feature, q, k, w, fw, mask, causal):
  """``(|phi_q| |phi_k| summed over features, phi_q . phi_k)``, both ``[B, H, L, S]`` in float64."""
  phi_q, phi_k = _features(q.astype(jnp.float32), k.astype(jnp.float32), w, feature=feature,
                            feature_weights=fw, mask=mask)
  aq, ak = _abs_features(phi_q, feature), _abs_features(phi_k, feature)
  pq, pk = np.asarray(phi_q, np.float64), np.asarray(phi_k, np.float64)
  keep = np.asarray(mask)[:, None, None, :]
  if causal:
    keep = keep & np.tril(np.ones((q.shape[1], k.shape[1]), bool))
  a_abs = np.where(keep, np.einsum('bihr,bjhr->bhij', aq, ak), 0.0)
  return a_abs, np.where(keep, np.einsum('bihr,bjhr->bhij', pq, pk), 0.0)


def _normalizer(feature, q, k, w, fw, mask, causal):
  """|D| of the XLA path, ``[B, L, H]``."""
  _, a = _reference_scores(feature, q, k, w, fw, mask, causal)
  return np.transpose(np.abs(a.sum(-1)), (0, 2, 1))


def _away_from_guard(g, den, eps=1e-6):
  """Zero the cotangent of rows whose normalizer is below 10 eps (relu rows with D = 0, say).

  There ``safe_normalizer`` makes the backward's intermediates ``|g| / eps`` ~ 1e6 (with exactly
  cancelling contributions), so both implementations' rounding, ~ulp(1e6), swamps other rows'
  gradients; and near |D| = eps the guard's discontinuity lets two correct roundings take different
  branches. The forward of those rows is still compared.
  """
  return jnp.where(jnp.asarray(den < 10 * eps)[..., None], jnp.zeros_like(g), g)


def _row_bounds(feature, q, k, v, w, fw, mask, causal, ref_out, delta):
  """Per-element output bound, the worst row condition number and |D| ``[B, L, H]`` (XLA path)."""
  a_abs, a = _reference_scores(feature, q, k, w, fw, mask, causal)
  den = np.transpose(np.abs(a.sum(-1)), (0, 2, 1))                 # [B, L, H]
  guarded = np.maximum(den, 1e-6)                                   # the eps guard
  va = np.abs(np.asarray(v, np.float64))
  oa = np.abs(np.asarray(ref_out, np.float64))
  t = np.einsum('bhij,bjhd->bihd', a_abs, va) + np.einsum('bhij->bih', a_abs)[..., None] * oa
  bound = delta * t / guarded[..., None]
  cond = float(np.max(np.transpose(a_abs.sum(-1), (0, 2, 1)) / guarded))
  return bound, cond, den


def _assert_within(x, ref, bound, what):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  err = np.abs(x - ref)
  worst = np.unravel_index(np.argmax(err - bound), err.shape)
  assert np.all(err <= bound), (f'{what}: |err| {err[worst]:.3g} > bound {bound[worst]:.3g} '
                                f'at {worst}; max err {err.max():.3g}')


def _assert_grads(grads, ref_grads, tol, names):
  for name, gk, gr in zip(names, grads, ref_grads):
    gk, gr = np.asarray(gk, np.float64), np.asarray(gr, np.float64)
    assert np.all(np.isfinite(gk)), f'grad {name} not finite'
    scale = np.max(np.abs(gr))
    err = np.max(np.abs(gk - gr))
    assert err <= tol * scale, f'grad {name}: max err {err:.3g} > {tol:.3g} * {scale:.3g}'


def _exact_exp_attention(q, k, v, w, fw, mask, causal):
  """float64 posrf attention with the exact per-row shift max_{j,r}(l_q + l_k): ``(out, T/D)``."""
  q, k, v, w = (np.asarray(x, np.float64) for x in (q, k, v, w))
  c = np.asarray(fw, np.float64)
  lq = np.einsum('bihd,hrd->bihr', q, w) - 0.5 * np.sum(q * q, -1)[..., None]
  lk = np.einsum('bjhd,hrd->bjhr', k, w) - 0.5 * np.sum(k * k, -1)[..., None]
  e = lq.transpose(0, 2, 1, 3)[:, :, :, None, :] + lk.transpose(0, 2, 1, 3)[:, :, None, :, :]
  keep = np.asarray(mask)[:, None, :, None]
  if causal:
    keep = keep & np.tril(np.ones((q.shape[1], k.shape[1]), bool))[None, :, :, None]
  keep = np.broadcast_to(keep[:, None], e.shape)
  e = np.where(keep, e, -np.inf)
  e = np.exp(e - e.max(axis=(3, 4), keepdims=True))
  a = np.einsum('bhijr,r->bhij', e, c)
  den = a.sum(-1)
  out = np.einsum('bhij,bjhd->bihd', a, v) / den.transpose(0, 2, 1)[..., None]
  t = (np.einsum('bhij,bjhd->bihd', a, np.abs(v))
       + den.transpose(0, 2, 1)[..., None] * np.abs(out))
  return out, t / den.transpose(0, 2, 1)[..., None]


def _grad_names(feature):
  return ('q', 'k', 'v', 'w', 'feature_weights') if _uses_w(feature) else ('q', 'k', 'v')


@pytest.mark.parametrize('feature', FEATURES)
def test_matches_xla_path_with_padding_and_large_norms(feature):
  causal = False
  shared_w = feature == 'exp'       # also covers one W for all heads ([M, d])
  both = _pair(feature, causal, L, L, True, 'float32')
  mask = _mask(VALID, L)

  # Moderate norms: outputs within the rounding bound, gradients within 4 delta cond^2.
  q, k, v, w, fw, g = _inputs(0, feature, shared_w=shared_w)
  g = _away_from_guard(g, _normalizer(feature, q, k, w, fw, mask, causal))
  (out, grads), (ref, ref_grads) = both(q, k, v, w, fw, mask, g)
  delta = _delta(feature, q, k, w, L)
  bound, cond, _ = _row_bounds(feature, q, k, v, w, fw, mask, causal, ref, delta)
  _assert_within(out, ref, bound, f'{feature} output')
  _assert_grads(grads, ref_grads, 4 * delta * max(cond, 1.0) ** 2, _grad_names(feature))
  # The all-but-one-padded batch element attends to key 0 only: every output row is v_0 (relu
  # features may be all zero, and the eps guard then gives 0 in both paths).
  if feature != 'relu':
      np.testing.assert_allclose(out[2], np.broadcast_to(v[2, :1], out[2].shape),
                               rtol=8 * delta, atol=8 * delta)

  # Row norms up to 100: finite everywhere; equal to the XLA path on every row where that path's
  # normalizer is healthy (>= 1e-4: the kernels' normalizer is never smaller than the XLA path's, see
  # the kernel docstring), and -- bidirectional exp -- equal to the exact float64 result on every row.
  q, k, v, w, fw, g = _inputs(1, feature, shared_w=shared_w, big=True)
  (out, grads), (ref, _) = both(q, k, v, w, fw, mask, g)
  assert np.all(np.isfinite(np.asarray(out)))
  for name, gk in zip(_grad_names(feature), grads):
    assert np.all(np.isfinite(np.asarray(gk))), f'grad {name} not finite at norm 100'
  delta = _delta(feature, q, k, w, L)
  bound, _, den = _row_bounds(feature, q, k, v, w, fw, mask, causal, ref, delta)
  healthy = np.broadcast_to((den >= 1e-4)[..., None], bound.shape)
  assert healthy.any()
  _assert_within(np.asarray(out)[healthy], np.asarray(ref)[healthy], bound[healthy],
                 f'{feature} output at norm 100')
  if feature == 'exp' and not causal:
    # Here the XLA path's single key shift underflows whole normalizers; the kernels' per-feature
    # shift cannot, so every row is compared with the exact float64 result.
    w3 = np.broadcast_to(np.asarray(w), (H, M, D))
    exact, t_over_d = _exact_exp_attention(q, k, v, w3, fw, mask, causal)
    _assert_within(out, exact, delta * t_over_d, 'exp output at norm 100 vs float64')


def test_cross_attention_block_multiples_without_mask():
  """Bidirectional, Lq = 32 != Lk = 48 (block multiples: no padding), mask None, a single split."""
  lq, lk = 32, 48
  both = _pair('exp', False, lq, lk, False, 'float32', blocks=(32, 16), splits=1)
  q, k, v, w, fw, g = _inputs(2, 'exp', lq=lq, lk=lk)
  mask = jnp.ones((B, lk), bool)
  g = _away_from_guard(g, _normalizer('exp', q, k, w, fw, mask, False))
  (out, grads), (ref, ref_grads) = both(q, k, v, w, fw, mask, g)
  delta = _delta('exp', q, k, w, lk)
  bound, cond, _ = _row_bounds('exp', q, k, v, w, fw, mask, False, ref, delta)
  _assert_within(out, ref, bound, 'exp output')
  _assert_grads(grads, ref_grads, 4 * delta * max(cond, 1.0) ** 2, _grad_names('exp'))


def test_bfloat16_inputs():
  """bf16 q, k, v against the float32 XLA path on the same (bf16-representable) values."""
  causal, length = False, L
  both = _pair('exp', causal, length, length, True, 'bfloat16')
  mask = _mask((length, 23, 1), length)
  q, k, v, w, fw, g = _inputs(3, 'exp', lq=length, lk=length, dtype=jnp.bfloat16)
  g = _away_from_guard(g, _normalizer('exp', q, k, w, fw, mask, causal))
  (out, grads), (ref, ref_grads) = both(q, k, v, w, fw, mask, g)
  assert out.dtype == jnp.bfloat16 and grads[0].dtype == jnp.bfloat16
  delta = 4 * BF16_UNIT + _delta('exp', q, k, w, length)
  bound, cond, _ = _row_bounds('exp', q, k, v, w, fw, mask, causal, ref, delta)
  bound = bound + BF16_UNIT * np.abs(np.asarray(ref, np.float64))     # the output's own rounding
  _assert_within(out.astype(jnp.float32), ref, bound, 'bf16 output')
  # bf16 gradients are themselves rounded (one more unit) on top of the operand roundings.
  _assert_grads(grads, ref_grads, 4 * (delta + BF16_UNIT) * max(cond, 1.0) ** 2,
                _grad_names('exp'))


def test_forward_and_backward_lower_to_triton():
  """Every kernel of the forward and backward lowers to Triton IR (jax.export for 'cuda', no GPU)."""
  mask = _mask((16, 9), 24)
  for feature in FEATURES:
    q = jnp.ones((2, 24, 2, D), jnp.bfloat16)
    v = jnp.ones((2, 24, 2, DV), jnp.bfloat16)
    w = jnp.ones((H, M, D)) if _uses_w(feature) else None

    def loss(q, k, v, w, feature=feature):
      out = feature_attention(q, k, v, w, feature=feature, mask=mask, block_q=16, block_k=16,
                              num_splits=2, interpret=False)
      return jnp.sum(out.astype(jnp.float32))

    fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3) if w is not None else (0, 1, 2)))
    exported = jax.export.export(
        fn, platforms=('cuda',),
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call('__gpu$xla.gpu.triton')])(
            q, q, v, w)
    # Forward 2 kernels + backward 2.
    assert exported.mlir_module().count('@__gpu$xla.gpu.triton') == 4, feature


def test_argument_checks_and_supported():
  q = jnp.zeros((1, 8, 2, 4))
  w = jnp.zeros((2, 16, 4))
  with pytest.raises(ValueError, match='unknown feature'):
    feature_attention(q, q, q, w, feature='cosh')
  with pytest.raises(ValueError, match='needs the projection'):
    feature_attention(q, q, q, None, feature='exp')
  with pytest.raises(ValueError, match='takes no projection'):
    feature_attention(q, q, q, w, feature='elu')
  with pytest.raises(ValueError, match='power of two'):
    feature_attention(q, q, q, w, block_k=24)
  with pytest.raises(ValueError, match='bidirectional only'):
    feature_attention(q, q, q, w, causal=True)
  with pytest.raises(ValueError, match='w must be'):
    feature_attention(q, q, q, jnp.zeros((3, 16, 4)))
  shape_only = dict(check_fit=False)
  assert supported('exp', (2, 1024, 8, 64), jnp.bfloat16, 'gpu', **shape_only)
  assert not supported('exp', (2, 1024, 8, 64), jnp.bfloat16, 'cpu', **shape_only)
  assert not supported('exp', (2, 1024, 8, 64), jnp.bfloat16, 'tpu', **shape_only)
  assert not supported('hyperbolic', (2, 1024, 8, 64), jnp.float32, 'gpu', **shape_only)
  assert not supported('exp', (2, 1024, 8, 512), jnp.float32, 'gpu', **shape_only)
