"""Approximation-quality experiments of the papers, on the library's own feature maps and modules.

Four experiments, each a pure function of its sizes and a seed returning plain rows (dicts); setups and
results: docs/benchmarks.md, "Approximation quality".

* ``performer_mse``: the Performer note's experiment (``performers-kernel-trick-random-fourier-features``):
  attention-output MSE against exact softmax vs the number of random features R, i.i.d. vs orthogonal
  W, trigonometric (Performer Lemma 1) vs positive features (FAVOR+), 15 draws of W for one input.
* ``luo_prf_error``: Luo et al. 2021 fig. 1b: ``||A - A_hat||_1`` of one softmax attention row and its
  PRF estimate (their eq. 5) vs the norm R of query and keys (Theorem 3: ``exp(2 R^2) / sqrt(m)``).
* ``spectraformer_grid``: the Spectraformer component x weight-matrix grid (their eq. 11):
  ``||K_hat - K||_F / ||K||_F`` of every component with every sampler, unstabilized (unbiased) features.
* ``skyformer_spectral``: Skyformer fig. 1 (§4.5): ``||O_hat - O||_2`` vs the number of features /
  landmarks for Skyformer (against its eq. 3), Nyströmformer, Performer and Linformer (against softmax),
  random-initialized Q/K/V projections of random inputs.

q and k are scaled by d^-1/4 before the feature map, as the attention modules do.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Iterable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from kernelformer import registry
from kernelformer.attention import gaussian, linear, softmax
from kernelformer.attention.random_features import FIXED_SAMPLERS, RF_COMPONENTS
from kernelformer.features import catalog, components, weights

Array = jax.Array
Log = Callable[[str], None]


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
  values = [float(v) for v in values]
  return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _over_draws(fn: Callable[[Array], Any], keys: Array):
  """``fn`` for each key, compiled once: ``lax.map`` (a loop) rather than ``vmap``.

  ``vmap`` would batch the samplers' ``jax.random`` calls into rank-3 threefry computations, which XLA on
  CPU compiles about twice as slowly (measured here); the draws are small, so a loop costs nothing.
  """
  return jax.jit(lambda ks: jax.lax.map(fn, ks))(keys)


def _features(component: str, sampler: str, key: Array, num_features: int, q: Array, k: Array, *,
              stabilize: bool = True) -> tuple[Array, Array]:
  """``phi(q), phi(k)`` of one draw of W (``[..., L, M']``)."""
  proj = weights.SAMPLERS[sampler](key, num_features, q.shape[-1])
  return catalog.get(component).fn(q, k, proj, stabilize=stabilize)


# ---------------------------------------------------------------------------------------------------
# Performer note: attention MSE vs number of features.
# ---------------------------------------------------------------------------------------------------

PERFORMER_VARIANTS = (('trigrf', 'iid'), ('trigrf', 'orf'), ('posrf', 'iid'), ('posrf', 'orf'))


def performer_mse(*, length: int = 1024, dim: int = 16,
                  num_features: Sequence[int] = (16, 32, 64, 128, 256, 512), draws: int = 15,
                  input_stds: Sequence[float] = (1.0, 0.5), seed: int = 0,
                  log: Log = print) -> list[dict[str, Any]]:
  """Rows ``{input_std, component, sampler, num_features, mse_mean, mse_std, mse_median, draws}``.

  For each input scale one fixed input ``q, k, v ~ N(0, input_std^2 I)`` ``[L, d]`` (v always N(0, I));
  the draws differ only in W (one compiled loop over keys). The estimate is the library's linear attention
  (Spectraformer eq. 7) on the features of ``q d^-1/4`` and ``k d^-1/4``; the reference is exact softmax
  attention ``softmax(q k^T / sqrt(d)) v``. Two scales because the note does not state its inputs and
  the PRF variance grows like ``exp(|q + k|^2)`` (Luo et al. eq. 14): at std 1 and d = 16 the scaled
  ``|q + k|^2`` is about 8 (``e^8 ~ 3000`` features before the variance is small), at std 0.5 about 2.
  """
  kq, kk, kv, kw = jax.random.split(jax.random.PRNGKey(seed), 4)
  shape = (1, length, 1, dim)                        # [B, L, H, d], the attention layout
  v = jax.random.normal(kv, shape)
  scale = dim ** -0.25
  keys = jax.random.split(kw, draws)
  rows = []
  for std in input_stds:
    q, k = (std * jax.random.normal(x, shape) for x in (kq, kk))
    exact = softmax.softmax_attention(q, k, v, implementation='xla')
    for component, sampler in PERFORMER_VARIANTS:
      for m in num_features:

        def one(key, component=component, sampler=sampler, m=m, q=q, k=k, exact=exact):
          phi_q, phi_k = _features(component, sampler, key, m, q[0, :, 0] * scale, k[0, :, 0] * scale)
          est = linear.linear_attention(phi_q[None, :, None], phi_k[None, :, None], v)
          return jnp.mean((est - exact) ** 2)

        mse = np.asarray(_over_draws(one, keys))
        mean, std_ = _mean_std(mse)
        rows.append({'input_std': float(std), 'component': component, 'sampler': sampler,
                     'num_features': m, 'mse_mean': mean, 'mse_std': std_,
                     'mse_median': float(np.median(mse)), 'draws': draws})
        log(f'performer MSE (input std {std:g}) {component}-{sampler} R={m}: {mean:.3g} +- {std_:.3g}')
  return rows


def performer_orderings(rows: Sequence[dict[str, Any]]) -> list[tuple[float, str, int, bool, str]]:
  """The note's orderings at each input scale and R: ORF < i.i.d. (per component), positive < trig.

  Returns ``(input_std, ordering, R, holds, numbers)`` tuples, comparing mean MSE over the draws.
  """
  by = {(r['input_std'], r['component'], r['sampler'], r['num_features']): r['mse_mean'] for r in rows}
  out = []
  for std in sorted({r['input_std'] for r in rows}, reverse=True):
    for m in sorted({r['num_features'] for r in rows}):
      for comp in ('trigrf', 'posrf'):
        a, b = by.get((std, comp, 'orf', m)), by.get((std, comp, 'iid', m))
        if a is not None and b is not None:
          out.append((std, f'{comp}: orf < iid', m, a < b, f'{a:.3g} vs {b:.3g}'))
      for samp in ('iid', 'orf'):
        a, b = by.get((std, 'posrf', samp, m)), by.get((std, 'trigrf', samp, m))
        if a is not None and b is not None:
          out.append((std, f'{samp}: positive < trig', m, a < b, f'{a:.3g} vs {b:.3g}'))
  return out


# ---------------------------------------------------------------------------------------------------
# Luo et al. fig. 1b: ||A - A_hat||_1 vs query/key norm R.
# ---------------------------------------------------------------------------------------------------


def _unit_sphere(key: Array, shape) -> Array:
  x = jax.random.normal(key, shape)
  return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def luo_prf_error(*, dim: int = 64, num_keys: int = 1024, radii: Sequence[float] = (1, 2, 3, 4, 5),
                  num_features: Sequence[int] = (4, 16, 64, 256, 1024), draws: int = 20, seed: int = 0,
                  log: Log = print) -> list[dict[str, Any]]:
  """Rows ``{radius, num_features, l1_mean, l1_std, draws}`` (Luo et al. §3.3, fig. 1b).

  Each draw: one query and ``num_keys`` keys uniform on the unit sphere, scaled by R, and one i.i.d.
  Gaussian W (eq. 5). ``A_j = exp(q.k_j) / sum exp(q.k)`` exactly; ``A_hat_j = phi(q).phi(k_j) / sum``
  with positive random features. ``||A - A_hat||_1`` is at most 2.
  """
  rows = []
  base = jax.random.PRNGKey(seed)
  for radius in radii:
    for m in num_features:

      def one(key, radius=radius, m=m):
        kq, kk, kw = jax.random.split(key, 3)
        q = radius * _unit_sphere(kq, (1, dim))
        k = radius * _unit_sphere(kk, (num_keys, dim))
        a = jax.nn.softmax(q @ k.T, axis=-1)
        phi_q, phi_k = _features('posrf', 'iid', kw, m, q, k)
        scores = phi_q @ phi_k.T
        a_hat = scores / jnp.sum(scores, axis=-1, keepdims=True)
        return jnp.sum(jnp.abs(a - a_hat))

      keys = jax.random.split(jax.random.fold_in(base, int(round(radius * 1000))), draws)
      err = np.asarray(_over_draws(one, keys))
      mean, std = _mean_std(err)
      rows.append({'radius': float(radius), 'num_features': m, 'l1_mean': mean, 'l1_std': std,
                   'draws': draws})
      log(f'luo fig1b R={radius} m={m}: |A - A_hat|_1 = {mean:.3g} +- {std:.3g}')
  return rows


# ---------------------------------------------------------------------------------------------------
# Spectraformer grid: kernel-estimate error of every component x weight matrix.
# ---------------------------------------------------------------------------------------------------


def spectraformer_grid(*, length: int = 256, dim: int = 16,
                       component_names: Sequence[str] = RF_COMPONENTS,
                       sampler_names: Sequence[str] = FIXED_SAMPLERS,
                       num_features: Sequence[int] = (64, 128, 256), draws: int = 8,
                       input_std: float = 0.5, seed: int = 0,
                       log: Log = print) -> list[dict[str, Any]]:
  """Rows ``{component, sampler, num_features, target, rel_error_mean, rel_error_std, rel_error_median,
  draws, note}``.

  ``q, k ~ N(0, input_std^2 I_d)`` ``[L, d]`` scaled by d^-1/4 (the attention modules' scale); the
  default 0.5 at d = 16 gives scaled norms ``|q|^2 ~ 1``, the regime of Luo et al.'s R = 1 where the
  estimators differ (at std 1 every exp-feature's variance ``e^{|q+k|^2} ~ e^8`` swamps M <= 256
  and the grid would show only noise). The estimate is
  ``phi(q) phi(k)^T`` with unstabilized (unbiased) features; the error is ``||K_hat - K||_F / ||K||_F``
  against ``components.exact_kernel`` of the component's target. A combination that cannot be built
  (e.g. SGQ with M < 2d + 1) gets an empty error and the reason in ``note``.
  """
  kq, kk, kw = jax.random.split(jax.random.PRNGKey(seed), 3)
  scale = dim ** -0.25
  q = jax.random.normal(kq, (length, dim)) * (input_std * scale)
  k = jax.random.normal(kk, (length, dim)) * (input_std * scale)
  exact = {t: components.exact_kernel(t, q, k) for t in ('softmax', 'gaussian')}
  keys = jax.random.split(kw, draws)
  rows = []
  for m in num_features:
    for comp in component_names:
      target = catalog.get(comp).target_kernel
      ref = exact[target]
      for samp in sampler_names:
        row = {'component': comp, 'sampler': samp, 'num_features': m, 'target': target,
               'input_std': input_std, 'draws': draws, 'note': ''}

        def one(key, comp=comp, samp=samp, m=m, ref=ref):
          phi_q, phi_k = _features(comp, samp, key, m, q, k, stabilize=False)
          est = phi_q @ phi_k.T
          return jnp.linalg.norm(est - ref) / jnp.linalg.norm(ref)

        try:
          err = np.asarray(_over_draws(one, keys))
        except ValueError as e:
          row['note'] = str(e).split(';')[0][:120]
          rows.append(row)
          log(f'grid {comp}-{samp} M={m}: n/a ({row["note"]})')
          continue
        row['rel_error_mean'], row['rel_error_std'] = _mean_std(err)
        row['rel_error_median'] = float(np.median(err))
        rows.append(row)
        log(f'grid {comp}-{samp} M={m}: {row["rel_error_mean"]:.3g} +- {row["rel_error_std"]:.3g}')
  return rows


# ---------------------------------------------------------------------------------------------------
# Skyformer fig. 1: spectral-norm error of the attention output vs number of features.
# ---------------------------------------------------------------------------------------------------

# method -> (registry kind, reference: the exact attention it approximates)
SKYFORMER_METHODS = {'skyformer': ('skyformer', 'gaussian'),
                     'nystromformer': ('nystromformer', 'softmax'),
                     'performer (posrf-orf)': ('posrf-orf', 'softmax'),
                     'linformer': ('linformer', 'softmax')}


def _random_qkv(key: Array, length: int, model_dim: int, head_dim: int,
                init_std: float) -> tuple[Array, Array, Array]:
  """``X W_Q, X W_K, X W_V`` ``[1, L, 1, head_dim]``: ``X ~ N(0, 1)`` (a layer-normed embedding) and
  ``W ~ N(0, init_std^2)`` (BERT's initializer, ``initializer_range = 0.02``)."""
  kx, kq, kk, kv = jax.random.split(key, 4)
  x = jax.random.normal(kx, (length, model_dim))
  proj = lambda kk_: x @ (init_std * jax.random.normal(kk_, (model_dim, head_dim)))
  return tuple(proj(kk_)[None, :, None, :] for kk_ in (kq, kk, kv))


def skyformer_spectral(*, lengths: Sequence[int] = (512, 1024), model_dim: int = 768,
                       head_dim: int = 64, init_std: float = 0.02,
                       num_features: Sequence[int] = (16, 32, 64, 128, 256),
                       methods: Optional[Iterable[str]] = None, draws: int = 5, seed: int = 0,
                       log: Log = print) -> list[dict[str, Any]]:
  """Rows ``{method, kind, reference, length, num_features, spectral_mean, spectral_std, rel_mean,
  rel_std, draws}``: ``||O_hat - O||_2`` and ``||O_hat - O||_2 / ||O||_2`` over ``draws`` draws of
  inputs, projections, features / landmarks and (Linformer) E, F.

  Defaults mimic the paper's "initialized bert-base" setting: model width 768, head dim 64, Q/K/V
  weights ``N(0, 0.02^2)``, so q and k entries have variance ``768 * 0.02^2 ~ 0.31``.
  """
  methods = list(SKYFORMER_METHODS) if methods is None else list(methods)
  rows = []
  exact_fns = {
      'softmax': lambda q, k, v: softmax.softmax_attention(q, k, v, implementation='xla'),
      'gaussian': gaussian.gaussian_attention,
  }
  for length in lengths:
    for method in methods:
      kind, reference = SKYFORMER_METHODS[method]
      for m in num_features:
        module = registry.build({'kind': kind, 'num_features': m, 'num_landmarks': m,
                                 'linformer_k': m, 'max_length': length})

        def one(key, module=module, reference=reference, length=length):
          k_in, k_par, k_feat = jax.random.split(key, 3)
          q, k, v = _random_qkv(k_in, length, model_dim, head_dim, init_std)
          rngs = {'params': k_par, 'features': k_feat}
          variables = module.init(rngs, q, k, v)
          est = module.apply(variables, q, k, v, rngs={'features': k_feat})
          exact = exact_fns[reference](q, k, v)
          diff = (est - exact)[0, :, 0].astype(jnp.float32)
          spectral = jnp.linalg.norm(diff, ord=2)
          return spectral, spectral / jnp.linalg.norm(exact[0, :, 0].astype(jnp.float32), ord=2)

        keys = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), length), draws)
        spec, rel = (np.asarray(x) for x in _over_draws(one, keys))
        s_mean, s_std = _mean_std(spec)
        r_mean, r_std = _mean_std(rel)
        rows.append({'method': method, 'kind': kind, 'reference': reference, 'length': length,
                     'num_features': m, 'spectral_mean': s_mean, 'spectral_std': s_std,
                     'rel_mean': r_mean, 'rel_std': r_std, 'draws': draws})
        log(f'skyformer fig1 {method} L={length} d={m}: ||O_hat - O||_2 = {s_mean:.3g} +- {s_std:.3g} '
            f'(relative {r_mean:.3g})')
  return rows


# ---------------------------------------------------------------------------------------------------
# Plots.
# ---------------------------------------------------------------------------------------------------


def plot_performer(rows, path: str) -> str:
  from kernelformer.bench import output  # pylint: disable=g-import-not-at-top
  plt = output.pyplot()
  stds = sorted({r['input_std'] for r in rows}, reverse=True)
  fig, axes = plt.subplots(len(stds), 2, figsize=(12, 4.2 * len(stds)), squeeze=False)
  panels = (('i.i.d. vs orthogonal', PERFORMER_VARIANTS),
            ('trig vs positive, orthogonal W', (('trigrf', 'orf'), ('posrf', 'orf'))))
  for row_axes, std in zip(axes, stds):
    for ax, (title, variants) in zip(row_axes, panels):
      for comp, samp in variants:
        pts = sorted((r['num_features'], r['mse_mean'], r['mse_std']) for r in rows
                     if r['component'] == comp and r['sampler'] == samp and r['input_std'] == std)
        if pts:
          _band(ax, pts, f'{comp}-{samp}', alpha=0.2)
      _log_axes(ax, 'number of random features R', 'attention output MSE vs softmax',
                f'{title}; q, k ~ N(0, {std:g}^2)')
  return output.save_figure(fig, path)


def _band(ax, pts, label: str, floor: float = 1e-3, alpha: float = 0.15) -> None:
  """``pts`` = sorted (x, mean, std): the mean with markers and a band of +-std (cut at ``floor`` x mean)."""
  xs, mean, sd = (np.asarray(t) for t in zip(*pts))
  line, = ax.plot(xs, mean, marker='o', label=label)
  ax.fill_between(xs, np.maximum(mean - sd, mean * floor), mean + sd, color=line.get_color(), alpha=alpha)


def _log_axes(ax, xlabel: str, ylabel: str, title: str, ylog: bool = True, **legend) -> None:
  ax.set_xscale('log', base=2)
  if ylog:
    ax.set_yscale('log')
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.grid(True, which='both', alpha=0.3)
  ax.legend(**legend)


def plot_luo(rows, path: str) -> str:
  from kernelformer.bench import output  # pylint: disable=g-import-not-at-top
  plt = output.pyplot()
  fig, ax = plt.subplots(figsize=(6.5, 4.5))
  for radius in sorted({r['radius'] for r in rows}):
    pts = sorted((r['num_features'], r['l1_mean'], r['l1_std']) for r in rows if r['radius'] == radius)
    _band(ax, pts, f'R = {radius:g}', floor=0.0)
  _log_axes(ax, 'feature map dimension m', '||A - A_hat||_1 (PRF)',
            'Luo et al. fig. 1b: PRF error vs query/key norm R', ylog=False)
  return output.save_figure(fig, path)


def plot_grid(rows, path: str) -> str:
  """One heat map per M: components (rows) x samplers (columns), log10 relative kernel error."""
  from kernelformer.bench import output  # pylint: disable=g-import-not-at-top
  plt = output.pyplot()
  ms = sorted({r['num_features'] for r in rows})
  comps = list(dict.fromkeys(r['component'] for r in rows))
  samps = list(dict.fromkeys(r['sampler'] for r in rows))
  fig, axes = plt.subplots(1, len(ms), figsize=(1.0 + 0.9 * len(samps) * len(ms), 0.6 * len(comps) + 1.8),
                           squeeze=False)
  values = [r.get('rel_error_mean') for r in rows if r.get('rel_error_mean') is not None]
  vmin = math.log10(max(min(values), 1e-6)) if values else -3
  vmax = math.log10(max(values)) if values else 0
  image = None
  for ax, m in zip(axes[0], ms):
    grid = np.full((len(comps), len(samps)), np.nan)
    for r in rows:
      if r['num_features'] == m and r.get('rel_error_mean') is not None:
        grid[comps.index(r['component']), samps.index(r['sampler'])] = math.log10(r['rel_error_mean'])
    image = ax.imshow(grid, cmap='viridis_r', vmin=vmin, vmax=vmax, aspect='auto')
    for i in range(len(comps)):
      for j in range(len(samps)):
        txt = 'n/a' if np.isnan(grid[i, j]) else f'{10 ** grid[i, j]:.2g}'
        ax.text(j, i, txt, ha='center', va='center', fontsize=7,
                color='white' if not np.isnan(grid[i, j]) and grid[i, j] > (vmin + vmax) / 2 else 'black')
    ax.set_xticks(range(len(samps)), samps, rotation=45)
    ax.set_yticks(range(len(comps)), comps)
    ax.set_title(f'M = {m}')
  if image is not None:
    fig.colorbar(image, ax=list(axes[0]), label='log10 ||K_hat - K||_F / ||K||_F', shrink=0.8)
  fig.suptitle('Spectraformer grid: relative kernel-estimate error (component x weight matrix)', y=1.04)
  fig.savefig(path, dpi=110, bbox_inches='tight')
  plt.close(fig)
  return path


def plot_skyformer(rows, path: str) -> str:
  from kernelformer.bench import output  # pylint: disable=g-import-not-at-top
  plt = output.pyplot()
  lengths = sorted({r['length'] for r in rows})
  fig, axes = plt.subplots(1, len(lengths), figsize=(6 * len(lengths), 4.5), squeeze=False)
  for ax, length in zip(axes[0], lengths):
    for method in dict.fromkeys(r['method'] for r in rows):
      pts = sorted((r['num_features'], r['rel_mean'], r['rel_std']) for r in rows
                   if r['method'] == method and r['length'] == length)
      _band(ax, pts, method)
    _log_axes(ax, 'number of features / landmarks / projected length', '||O_hat - O||_2 / ||O||_2',
              f'Skyformer fig. 1 setting, L = {length}', fontsize=8)
  return output.save_figure(fig, path)
