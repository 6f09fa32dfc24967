"""The recall sweep (``configs/sweeps/recall.py``) as a table and a figure: accuracy against M per kernel.

Reads a sweep directory through ``report.collect`` (every planned run, finished or not) and writes

* ``<out>.md``: one table per number of key-value pairs, a row per kernel, a column per configured
  feature count M (``—``: planned but not finished), plus the state each kernel decodes with: ``M'``,
  the feature dimension of ``phi`` (``trigrf`` has ``2M``: sin and cos), and the per-head state of
  a decode step, ``M' x d_head`` for linear attention (Katharopoulos et al. 2020 eq. 9's
  ``S = sum_j phi(k_j) v_j^T``), a cache that grows with the length for softmax and nprf-rpe;
* ``<out>.png``: test accuracy (query positions) against ``M'`` (log scale), one panel per number of
  pairs, a line per feature kernel, linear-elu as one point at ``M' = d_head``, softmax as a horizontal
  line (its state is not fixed).

``M'`` is read from the decoder's own decode cache (``decoder.init_cache`` shapes), so it is what the
model keeps, not what the config asked for.

  python -m kernelformer.reproduce.recall_plot runs/sweeps/recall --out docs/recall

``--best_of KEY`` (Zoology's figure 2, ``configs/sweeps/zoology_fig2.py``): one table, a row per kernel,
a column per ``--column`` value (default ``model.emb_dim``), each cell the best test accuracy over the
values of ``KEY`` (e.g. ``optim.learning_rate``) with the winning value, and a second table with every
run; the figure plots the best accuracy against the column, a line per kernel, as Zoology's figure 2.

  python -m kernelformer.reproduce.recall_plot runs/sweeps/zoology_fig2 --out docs/recall/zoology_fig2 \
      --best_of optim.learning_rate

``--vs_state`` (Based's figure 3, ``configs/sweeps/based_fig3.py``): per (length, pairs) a row per (feature
map, state size) with the best test accuracy over the learning rates, each run's accuracy and wall time,
and the maps ranked; the figure plots it against the state in Based's unit, **bytes** (4 x the element
count of ``based_state_size``: Zoology's ``state_size`` returns ``state_size * 4``), one panel per
(length, pairs), after a first panel with Based's own plotted values (``BASED_FIG3``) on the same axis;
``<out>.csv`` lists every run.

  python -m kernelformer.reproduce.recall_plot runs/sweeps/based_fig3 --out docs/recall/based_fig3_runs \
      --vs_state
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Optional

from kernelformer.bench import output
from kernelformer.reproduce import report

MISSING = report.MISSING


def _get(config: dict, dotted: str):
  for part in dotted.split('.'):
    config = (config or {}).get(part)
  return config


@functools.lru_cache(maxsize=None)
def state_features(kind: str, num_features: int, head_dim: int, num_heads: int,
                   map_dim: int = 0) -> tuple[int, str]:
  """``(M', state)``: the feature dimension of the decode state and its per-head description."""
  import jax  # pylint: disable=g-import-not-at-top
  from kernelformer import decoder  # pylint: disable=g-import-not-at-top
  attention = {'kind': kind, 'num_features': num_features}
  if map_dim:
    attention['map_dim'] = map_dim
  model = decoder.Decoder(vocab_size=8, emb_dim=head_dim * num_heads, num_layers=1,
                          num_heads=num_heads, qkv_dim=head_dim * num_heads, mlp_dim=8,
                          attention=attention, max_length=4)
  cache = decoder.init_cache(model, 1)
  flat = {'/'.join(str(getattr(k, 'key', k)) for k in path): v.shape
          for path, v in jax.tree_util.tree_flatten_with_path(cache)[0]}
  for name, shape in flat.items():
    if name.endswith('attention/state'):          # [B, H, M', Dv]: fixed-size recurrent state
      return int(shape[2]), f"{shape[2]} x {shape[3]}"
    if name.endswith('attention/phi_k'):          # [B, Lmax, H, M']: feature cache (RPE)
      return int(shape[3]), f'L x ({shape[3]} + {head_dim}) (feature cache)'
  return 0, f'L x 2 x {head_dim} (KV cache)'


def current_plan(name: str) -> Optional[set[str]]:
  """Work directories (relative) of the named sweep's current definition; None if it cannot load."""
  from kernelformer.reproduce import sweeps  # pylint: disable=g-import-not-at-top
  try:
    sweep = sweeps.load_sweep(name, validate=False)
  except Exception:  # pylint: disable=broad-except  (no such named sweep: keep every planned run)
    return None
  return {sweeps.point_dirname(p) for p in sweep.points}


def collect(sweep_dir: str, plan: Optional[set[str]] = None) -> list[dict]:
  """One dict per run: kind, M, pairs, steps, accuracy (None if unfinished), M', state, seconds.

  Every finished run is kept. An unfinished run is kept (as missing) when ``plan`` is None or names
  it, so points an earlier definition planned but the current one dropped are not shown as missing.
  Rows get ``label`` = the kind, plus the step count when the kept runs differ in steps.
  """
  meta, runs = report.collect(sweep_dir)
  planned = {e['workdir']: e for e in meta.get('runs', [])}
  rows = []
  for r in runs:
    res = r.results or {}
    if r.results is None and plan is not None and r.workdir not in plan:
      continue
    cfg = res.get('config') or {}
    entry = planned.get(r.workdir, {})
    over = dict(entry.get('overrides') or {})
    steps = over.get('num_train_steps', (entry.get('common') or {}).get('num_train_steps'))
    if cfg:
      steps = cfg.get('num_train_steps', steps)
    pairs = _get(cfg, 'data.num_pairs') or over.get('data.num_pairs')
    m = over.get('model.attention.num_features', _get(cfg, 'model.attention.num_features'))
    row = dict(kind=r.kind, label=r.kind, pairs=pairs, m=m, steps=steps, accuracy=r.accuracy,
               workdir=r.workdir, seconds=res.get('wall_time_s'), mprime=None, state='')
    if cfg:
      heads = int(_get(cfg, 'model.num_heads'))
      head_dim = int(_get(cfg, 'model.qkv_dim')) // heads
      row['mprime'], row['state'] = state_features(r.kind, int(m or 0) or 1, head_dim, heads)
      row['head_dim'] = head_dim
    if r.kind in ('softmax', 'linear-elu'):
      row['m'] = None
    rows.append(row)
  if len({r['steps'] for r in rows}) > 1:
    for r in rows:
      r['label'] = f"{r['kind']}, {r['steps'] if r['steps'] is not None else 'preset'} steps"
  return rows


def _kinds(rows):
  """Row labels in first-seen order."""
  order = []
  for r in rows:
    if r['label'] not in order:
      order.append(r['label'])
  return order


def markdown(rows: list[dict]) -> str:
  ms = sorted({r['m'] for r in rows if r['m'] is not None})
  lines = []
  for pairs in sorted({r['pairs'] for r in rows if r['pairs'] is not None}):
    sub = [r for r in rows if r['pairs'] == pairs]
    lines += [f'**{pairs} pairs** — test accuracy (%) on the query positions', '',
              '| kernel | ' + ' | '.join(f'M = {m}' for m in ms) + " | decode state per head (M' x d) |",
              '|---|' + '---|' * len(ms) + '---|']
    for kind in _kinds(sub):
      cells, states = [], []
      for m in ms:
        hit = [r for r in sub if r['label'] == kind and r['m'] == m]
        cells.append(_cell(hit[0]) if hit else '')
        states += [r['state'] for r in hit if r['state']]
      plain = [r for r in sub if r['label'] == kind and r['m'] is None]
      if plain:
        cells = [_cell(plain[0]) + ' (no M)'] + [''] * (len(ms) - 1)
        states = [plain[0]['state']]
      states = list(dict.fromkeys(states))
      lines.append(f'| {kind} | ' + ' | '.join(cells) + f" | {', '.join(states) or MISSING} |")
    lines.append('')
  return '\n'.join(lines)


def _cell(row: dict) -> str:
  return MISSING if row['accuracy'] is None else f"{row['accuracy']:.1f}"


def plot(rows: list[dict], path: str) -> bool:
  """The figure (module docstring); False when nothing finished."""
  done = [r for r in rows if r['accuracy'] is not None]
  if not done:
    return False
  plt = output.pyplot()
  pairs_list = sorted({r['pairs'] for r in done})
  fig, axes = plt.subplots(1, len(pairs_list), figsize=(6 * len(pairs_list), 4.6), squeeze=False,
                           sharey=True)
  kinds = [k for k in dict.fromkeys(r['kind'] for r in done) if k not in ('softmax', 'linear-elu')]
  colors = {k: f'C{i}' for i, k in enumerate(kinds)}            # one colour per kernel in every panel
  styles = ('-', '--', ':', '-.')                                # one line style per step count
  steps = list(dict.fromkeys(r['steps'] for r in done))
  xs = [r['mprime'] for r in done if r['mprime']]
  for ax, pairs in zip(axes[0], pairs_list):
    sub = [r for r in done if r['pairs'] == pairs]
    for label in _kinds(sub):
      mine = [r for r in sub if r['label'] == label]
      kind, ls = mine[0]['kind'], styles[steps.index(mine[0]['steps']) % len(styles)]
      pts = sorted((r['mprime'], r['accuracy']) for r in mine)
      if kind == 'softmax':
        ax.axhline(pts[0][1], color='k', ls=ls, lw=1.2, label=f'{label} (KV cache)')
      elif kind == 'linear-elu':
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker='*', color='0.4', ls='none',
                ms=13 - 4 * steps.index(mine[0]['steps']), label=f"{label} (M' = d)")
      else:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker='o', color=colors[kind], ls=ls,
                label=label)
    ax.set_xscale('log', base=2)
    if xs:
      ax.set_xlim(min(xs) / 1.4, max(xs) * 1.4)
    ax.set_xlabel("feature dimension M' of the state (state per head = M' x d_head)")
    ax.set_title(f'MQAR, {pairs} key-value pairs')
    ax.set_ylim(0, 104)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc='center right')
  axes[0][0].set_ylabel('test accuracy on queries (%)')
  output.save_figure(fig, path)
  return True


def collect_best_of(sweep_dir: str, key: str, column: str) -> list[dict]:
  """One dict per planned run: kind, column value, ``key`` value, accuracy (None if unfinished)."""
  meta, runs = report.collect(sweep_dir)
  planned = {e['workdir']: e for e in meta.get('runs', [])}
  rows = []
  for r in runs:
    res = r.results or {}
    cfg = res.get('config') or {}
    over = dict(planned.get(r.workdir, {}).get('overrides') or {})
    col = _get(cfg, column) if cfg else None
    val = _get(cfg, key) if cfg else None
    rows.append(dict(kind=r.kind, column=over.get(column, col), value=over.get(key, val),
                     accuracy=r.accuracy, seconds=res.get('wall_time_s'), workdir=r.workdir,
                     results=res))
  return rows


def best_of_markdown(rows: list[dict], key: str, column: str) -> str:
  """The best-of table and the every-run table (module docstring)."""
  cols = sorted({r['column'] for r in rows if r['column'] is not None})
  vals = sorted({r['value'] for r in rows if r['value'] is not None})
  short = column.split('.')[-1]
  lines = [f'Best test accuracy (%) over {key} per point (the winning value in brackets; '
           f'{MISSING}: not finished)', '',
           '| kernel | ' + ' | '.join(f'{short} = {c}' for c in cols) + ' |',
           '|---|' + '---|' * len(cols)]
  kinds = list(dict.fromkeys(r['kind'] for r in rows))
  for kind in kinds:
    cells = []
    for c in cols:
      done = [r for r in rows if r['kind'] == kind and r['column'] == c and r['accuracy'] is not None]
      planned = [r for r in rows if r['kind'] == kind and r['column'] == c]
      if not done:
        cells.append(MISSING if planned else '')
        continue
      best = max(done, key=lambda r: r['accuracy'])
      note = f' ({len(done)} of {len(planned)} runs)' if len(done) < len(planned) else ''
      cells.append(f"{best['accuracy']:.1f} [{best['value']:.3g}]{note}")
    lines.append(f'| {kind} | ' + ' | '.join(cells) + ' |')
  lines += ['', f'Every run: test accuracy (%) by {key}', '',
            f'| kernel | {short} | ' + ' | '.join(f'{v:.3g}' for v in vals) + ' |',
            '|---|---|' + '---|' * len(vals)]
  for kind in kinds:
    for c in cols:
      mine = {r['value']: r for r in rows if r['kind'] == kind and r['column'] == c}
      if mine:
        lines.append(f'| {kind} | {c} | ' + ' | '.join(
            _cell(mine[v]) if v in mine else '' for v in vals) + ' |')
  finished = [r for r in rows if r['accuracy'] is not None]
  if finished:
    lines += ['', 'Finished runs: the steps each trained (and the accuracy stop that ended it) and its '
              'wall time', '', f'| kernel | {short} | {key} | test acc | best val acc (step) | steps | '
              'wall min |', '|---|---|---|---|---|---|---|']
    order = {kind: i for i, kind in enumerate(kinds)}
    for r in sorted(finished, key=lambda r: (order[r['kind']], r['column'], -r['value'])):
      res = r['results']
      best = (f"{100 * res['best_val_accuracy']:.2f} ({res.get('best_step')})"
              if 'best_val_accuracy' in res else MISSING)
      minutes = report.wall_minutes(res)
      lines.append(f"| {r['kind']} | {r['column']} | {r['value']:.3g} | {r['accuracy']:.2f} | {best} | "
                   f"{report.steps_text(res)} | {MISSING if minutes is None else f'{minutes:.0f}'} |")
  return '\n'.join(lines) + '\n'


def plot_best_of(rows: list[dict], path: str, column: str) -> bool:
  """Best accuracy against the column, a line per kernel; False when nothing finished."""
  done = [r for r in rows if r['accuracy'] is not None]
  if not done:
    return False
  plt = output.pyplot()
  fig, ax = plt.subplots(figsize=(5, 4))
  for kind in dict.fromkeys(r['kind'] for r in done):
    cols = sorted({r['column'] for r in done if r['kind'] == kind})
    best = [max(r['accuracy'] for r in done if r['kind'] == kind and r['column'] == c) for c in cols]
    ax.plot(cols, best, marker='o', label=kind)
  ax.set_xscale('log', base=2)
  ax.set_xlabel(column)
  ax.set_ylabel('test accuracy on queries (%), best learning rate')
  ax.set_ylim(0, 104)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  output.save_figure(fig, path)
  return True


# ----------------------------------------------------------------------------------------------------
# Based's figure 3 (configs/sweeps/based_fig3.py): accuracy against recurrent state size per feature map.

CONV_TAPS = 3   # Based's BaseConv kernel_size (arxiv24_based_figure3/configs.py line 54)
# Based's state axis is in bytes: Zoology's model ``state_size`` returns the summed element count times 4
# (float32), HazyResearch/zoology ``zoology/model.py`` line 291 @ d88d6f5 (``_compute_state_size``) and
# ``states/model.py`` line 406 @ 325964b, the commit holding the figure's plot. The figure's own x values
# confirm it (``BASED_FIG3``: ReLU at d_model 64 sits at 17,408 = 4 x 4,352).
BYTES_PER_ELEMENT = 4

# Based's figure 3 as plotted: map -> ((state in bytes, accuracy), ...) for d_model 64, 128, ..., 512
# (Taylor: feature_dim 24), the accuracy being ``valid/num_kv_pairs/accuracy-256`` (the 256-pair test
# at length 1,024) at the best of the four learning rates. Read from the vector coordinates of
# ``states/experiments/arxiv24_based_figure3/outputs/results_state_size.pdf`` at HazyResearch/zoology
# 325964b (committed with ``results_state_size.png`` and reverted by b603008 the same day): exact to the
# 3 decimals kept; the PNG beside it shows the same curves.
BASED_FIG3 = {
    'Taylor': ((85268, 0.803), (169236, 0.938), (253204, 0.976), (337172, 0.987), (421140, 0.988),
               (505108, 0.989), (589076, 0.991), (673044, 0.992)),
    'PosELU': ((17408, 0.246), (67584, 0.820), (150528, 0.937), (266240, 0.944), (414720, 0.951),
               (595968, 0.963), (809984, 0.967), (1056768, 0.959)),
    'ReLU': ((17408, 0.238), (67584, 0.913), (150528, 0.945), (266240, 0.965), (414720, 0.975),
             (595968, 0.983), (809984, 0.979), (1056768, 0.977)),
    'All Poly': ((17408, 0.076), (67584, 0.743), (150528, 0.923), (266240, 0.949), (414720, 0.942),
                 (595968, 0.953), (809984, 0.944), (1056768, 0.946)),
    'Square': ((17408, 0.044), (67584, 0.408), (150528, 0.693), (266240, 0.867), (414720, 0.914),
               (595968, 0.943), (809984, 0.938), (1056768, 0.939)),
    'CosFormer': ((34048, 0.163), (133632, 0.604), (298752, 0.764), (529408, 0.805), (825600, 0.859),
                  (1187328, 0.877), (1614592, 0.895), (2107392, 0.914)),
    'Identity': ((17408, 0.001), (67584, 0.001), (150528, 0.248), (266240, 0.681), (414720, 0.628),
                 (595968, 0.646), (809984, 0.574), (1056768, 0.689)),
    'Performer': ((17408, 0.001), (67584, 0.008), (150528, 0.009), (266240, 0.012), (414720, 0.010),
                  (595968, 0.026), (809984, 0.025), (1056768, 0.031)),
}
BASED_D_MODELS = (64, 128, 192, 256, 320, 384, 448, 512)   # arxiv24_based_figure3/configs.py 60-69
# Our kind for each map of Based's figure (AllPoly is not implemented here).
BASED_KINDS = {'Taylor': 'taylor', 'PosELU': 'linear-elu', 'ReLU': 'relu', 'Square': 'square',
               'CosFormer': 'cosformer', 'Identity': 'identity', 'Performer': 'performer-zoology'}


def based_expanded_size(kind: str, head_dim: int, *, num_features: int = 0, map_dim: int = 0,
                        ) -> Optional[int]:
  """E, the feature dimension Based's ``state_size`` counts per value column; None for softmax.

  HazyResearch/zoology d88d6f5: ``TaylorExp.expanded_size`` = r(r+1)/2 + r + 1 (``mixers/feature_maps/
  taylor.py`` lines 40-41: the symmetric x x^T counted once; this repository's ``taylor`` holds all
  r^2 products, M' = 1 + r + r^2), ``CosFormerFeatureMap`` 2 d (``cosformer.py`` lines 57-58), PosELU /
  ReLU / Identity / Square d (``base.py`` lines 31-32), and ``PerformerFeatureMap`` d as well
  (``performer-zoology``): it computes ``expanded_dim`` = 256 features (``performer.py`` lines 78-93) but
  inherits ``expanded_size`` = d from ``FeatureMap``, so Based counts, and plots, d (the figure's
  Performer points sit at ReLU's x). Maps not in Based's figure: hedgehog 2d, dpfp 2 nu d, t2r M, the
  random-feature kinds M (the sweep's posrf-orf has M = d). ``map_dim`` > 0: Taylor's projected
  dimension r (else r = ``head_dim``).
  """
  from kernelformer.features import maps  # pylint: disable=g-import-not-at-top
  d = head_dim
  if kind == 'softmax':
    return None
  if kind == 'taylor':
    r = map_dim or d
    return r * (r + 1) // 2 + r + 1
  if kind == 'cosformer':
    return 2 * d
  if kind == 'hedgehog':
    return 2 * d
  if kind.startswith('dpfp'):
    nu = int(kind[len('dpfp-nu'):]) if kind.startswith('dpfp-nu') else 1
    return 2 * nu * d
  if kind in ('linear-elu', 'relu', 'performer-zoology') or kind.replace('-', '_') in maps.ELEMENTWISE:
    return d
  return num_features            # t2r and the random-feature kinds: M rows of W, one feature each


def based_state_size(kind: str, d_model: int, head_dim: int, length: int, *, num_heads: int = 1,
                     num_features: int = 0, map_dim: int = 0, conv_taps: int = CONV_TAPS) -> int:
  """The element count behind Based's state axis, for our 2-layer layout (BaseConv layer, then the
  mixer layer); ``based_state_bytes`` is what the figure plots.

  Zoology's ``_compute_state_size`` (``zoology/model.py`` lines 266-291) sums each layer's mixer
  ``state_size``: the BaseConv layer's short convolution holds ``d_model x kernel_size``
  (``mixers/convolution.py`` lines 64-65; ``base_conv.py`` lines 65-66), the Based mixer
  ``num_kv_heads x head_dim x E + num_kv_heads x E`` (``mixers/based.py`` lines 228-231: S = sum
  phi(k) v^T and the normalizer z = sum phi(k)), softmax attention ``2 x d_model x length`` (its KV
  cache, ``mixers/attention.py`` lines 70-71; Zoology takes the longest test length, here the run's).
  """
  conv = conv_taps * d_model
  e = based_expanded_size(kind, head_dim, num_features=num_features, map_dim=map_dim)
  if e is None:
    return conv + 2 * d_model * length
  return conv + num_heads * (head_dim + 1) * e


def based_state_bytes(kind: str, d_model: int, head_dim: int, length: int, **kwargs) -> int:
  """Based's x axis: ``BYTES_PER_ELEMENT`` x ``based_state_size`` (Zoology returns ``state_size * 4``)."""
  return BYTES_PER_ELEMENT * based_state_size(kind, d_model, head_dim, length, **kwargs)


def map_label(kind: str, map_dim: int = 0, redraw_every: Optional[int] = None) -> str:
  """The figure's line for a run: Taylor by its r, the random-feature kinds by fixed draw / redraws."""
  if kind == 'taylor':
    return f'taylor r={map_dim}' if map_dim else 'taylor (r = d)'
  if redraw_every is not None:
    return f'{kind} fixed' if int(redraw_every) == 0 else f'{kind} redraw/{int(redraw_every)}'
  return kind


def legend_label(name: str, kind: str) -> str:
  """A map's line in the figure, with the name Based's figure gives it (or "not in Based")."""
  based = {v: k for k, v in BASED_KINDS.items()}.get(kind)
  if based:
    return f"{name} (Based's {based})"
  if kind == 'softmax':
    return name
  return f'{name} (not in Based; FAVOR+)' if kind == 'posrf-orf' else f'{name} (not in Based)'


def collect_state(sweep_dir: str, plan: Optional[set[str]] = None) -> list[dict]:
  """One dict per run of a based_fig3-style sweep: map, setting, d_model, lr, state, accuracy.

  ``state`` is in Based's unit, bytes (``based_state_bytes``); ``state_elements`` the element count.

  Every finished run is kept; an unfinished one only when ``plan`` is None or names it (as ``collect``).
  """
  meta, runs = report.collect(sweep_dir)
  planned = {e['workdir']: e for e in meta.get('runs', [])}
  rows = []
  for r in runs:
    if r.results is None and plan is not None and r.workdir not in plan:
      continue
    res = r.results or {}
    cfg = res.get('config') or {}
    over = dict(planned.get(r.workdir, {}).get('overrides') or {})

    def val(key, default=None):
      v = _get(cfg, key) if cfg else None
      return over.get(key, default) if v is None else v
    heads = int(val('model.num_heads', 1))
    d = int(val('model.emb_dim', 64))
    head_dim = int(val('model.qkv_dim', d)) // heads
    length = int(val('data.max_length', 0) or 0)
    m = int(val('model.attention.num_features', 0) or 0)
    r_dim = int(val('model.attention.map_dim', 0) or 0)
    redraw = val('model.attention.redraw_every')
    kind = r.kind
    if kind not in ('posrf-orf',) and not kind.endswith('-orf'):
      redraw = None
    elif redraw is None:
      redraw = 100                 # the random-feature kinds' default (attention/random_features.py)
    rows.append(dict(
        map=map_label(kind, r_dim, redraw), kind=kind, length=length,
        pairs=val('data.num_pairs'), d=d, lr=val('optim.learning_rate'), seed=val('seed', 0),
        state=based_state_bytes(kind, d, head_dim, length, num_heads=heads, num_features=m,
                                map_dim=r_dim),
        state_elements=based_state_size(kind, d, head_dim, length, num_heads=heads, num_features=m,
                                        map_dim=r_dim),
        mprime=(None if kind == 'softmax' else
                state_features(kind, m or 1, head_dim, heads, r_dim)[0]),
        accuracy=r.accuracy, seconds=res.get('wall_time_s'), workdir=r.workdir))
  return rows


def _best(rows: list[dict]) -> Optional[dict]:
  done = [r for r in rows if r['accuracy'] is not None]
  return max(done, key=lambda r: r['accuracy']) if done else None


def _points(rows: list[dict]) -> dict:
  """(length, pairs) -> map -> state -> its runs (every learning rate and seed)."""
  out: dict = {}
  for r in rows:
    out.setdefault((r['length'], r['pairs']), {}).setdefault(r['map'], {}).setdefault(
        r['state'], []).append(r)
  return out


def state_markdown(rows: list[dict]) -> str:
  """Per (length, pairs): a row per (map, state size): the best accuracy over the learning rates (the
  winner in brackets), each run's accuracy by learning rate, wall time; then the maps ranked."""
  lrs = sorted({r['lr'] for r in rows if r['lr'] is not None})
  lines = []
  total = sum(r['seconds'] or 0 for r in rows)
  for (length, pairs), by_map in sorted(_points(rows).items()):
    lines += [f'**Length {length}, {pairs} key-value pairs** — test accuracy (%) on the queries; '
              f'chance {100 / pairs:g} % guessing among the example\'s {pairs} values, '
              f'{100 * 2 / 8192:.3f} % uniform over the 4,096 values', '',
              "| map | d_model | state, bytes (Based's axis) | M' held here | best [lr] | "
              + ' | '.join(f'lr {v:.3g}' for v in lrs) + ' | wall (s) |',
              '|---|---|---|---|---|' + '---|' * len(lrs) + '---|']
    ranking = []
    for name, by_state in by_map.items():
      for state, runs in sorted(by_state.items()):
        best = _best(runs)
        cells = []
        for v in lrs:
          hit = [r for r in runs if r['lr'] == v]
          cells.append(', '.join(_cell(r) for r in hit) if hit else '')
        secs = sum(r['seconds'] or 0 for r in runs)
        bcell = MISSING if best is None else f"{best['accuracy']:.1f} [{best['lr']:.3g}]"
        lines.append(f"| {name} | {runs[0]['d']} | {state:,} | {runs[0]['mprime'] or 'KV cache'} | "
                     f"{bcell} | " + ' | '.join(cells) + f' | {secs:.0f} |')
        if best is not None:
          ranking.append((best['accuracy'], name, state))
    ranking.sort(key=lambda t: -t[0])
    lines += ['', 'Ranked: ' + ' > '.join(f'{n} ({a:.1f} @ {s:,})' for a, n, s in ranking), '']
  lines.append(f'Total wall time of the finished runs: {total:.0f} s ({total / 60:.1f} min).')
  return '\n'.join(lines) + '\n'


def plot_state(rows: list[dict], path: str) -> bool:
  """One panel per (length, pairs): best accuracy over lr against Based's state size, a line per map
  (softmax: one point at its KV cache, and a dotted line at its accuracy); False when nothing finished."""
  done = [r for r in rows if r['accuracy'] is not None]
  if not done:
    return False
  plt = output.pyplot()
  points = _points(done)
  settings = sorted(points)
  # One colour per kind in every panel, Based's panel included (AllPoly, not run here: black, dotted).
  kinds_all = list(dict.fromkeys([*BASED_KINDS.values(),
                                  *(r['kind'] for r in done if r['kind'] != 'softmax')]))
  colors = {k: f'C{i % 10}' for i, k in enumerate(kinds_all)}
  fig, axes = plt.subplots(1, 1 + len(settings), figsize=(5.2 * (1 + len(settings)), 4.4),
                           squeeze=False, sharey=True, sharex=True)
  ref = axes[0][0]                          # Based's own values, on the same axes
  for name, pts in BASED_FIG3.items():
    kind = BASED_KINDS.get(name)
    ref.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker='o', ms=3, lw=1,
             color=colors.get(kind, 'k'), ls='-' if kind else ':',
             label=f'{name} ({kind or "not run here"})')
  ref.set_xscale('log', base=2)
  ref.set_xlabel("state size, bytes (Based's axis)")
  ref.set_title("Based's figure 3 (325964b): 256-pair test,\nd_model 64-512, 32 epochs", fontsize=9)
  ref.set_ylim(-2, 102)
  ref.grid(alpha=0.3)
  ref.legend(fontsize=6, loc='lower right')
  for ax, setting in zip(axes[0][1:], settings):
    for name, by_state in points[setting].items():
      xs = sorted(by_state)
      ys = [_best(by_state[x])['accuracy'] for x in xs]
      if name == 'softmax':
        ax.plot(xs, ys, marker='s', color='k', ls='none', label='softmax (KV cache)')
        ax.axhline(max(ys), color='k', ls=':', lw=1)
      else:
        kind = by_state[xs[0]][0]['kind']
        style = '--' if 'redraw' in name else '-'
        marker = 'v' if name == 'taylor r=8' else '^' if 'redraw' in name else 'o'
        ax.plot(xs, ys, marker=marker, ls=style, color=colors[kind], label=legend_label(name, kind))
    ax.axhline(100 / setting[1], color='0.6', ls='--', lw=0.8, label='chance: guess among the values')
    ax.set_xscale('log', base=2)
    ax.set_xlabel("state size, bytes (Based's axis: 4 x (3 d + (d_v + 1) E))")
    ax.set_title(f'MQAR, length {setting[0]}, {setting[1]} pairs')
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel('test accuracy on queries (%), best lr')
  legend = {}
  for ax in axes[0][1:]:                   # every map once, whichever panels it reached
    for h, lab in zip(*ax.get_legend_handles_labels()):
      legend.setdefault(lab, h)
  fig.tight_layout()
  fig.legend(list(legend.values()), list(legend), fontsize=8, loc='center left',
             bbox_to_anchor=(1.0, 0.5))
  fig.savefig(path, dpi=110, bbox_inches='tight')
  plt.close(fig)
  return True


def write_state_csv(rows: list[dict], path: str) -> None:
  import csv  # pylint: disable=g-import-not-at-top
  keys = ('map', 'kind', 'length', 'pairs', 'd', 'lr', 'seed', 'state', 'state_elements', 'mprime',
          'accuracy', 'seconds', 'workdir')
  with open(path, 'w', newline='', encoding='utf-8') as f:
    w = csv.DictWriter(f, fieldnames=keys)
    w.writeheader()
    for r in rows:
      w.writerow({k: r[k] for k in keys})


def main(argv: Optional[list[str]] = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('sweep_dir')
  p.add_argument('--out', required=True, help='output prefix: writes OUT.md and OUT.png')
  p.add_argument('--best_of', default=None,
                 help='config key to take the best over per point (e.g. optim.learning_rate)')
  p.add_argument('--column', default='model.emb_dim', help='with --best_of: the table columns')
  p.add_argument('--vs_state', action='store_true',
                 help="Based's figure 3 (configs/sweeps/based_fig3.py): accuracy against state size "
                      'per feature map, best over the learning rates; also writes OUT.csv')
  a = p.parse_args(argv)
  if not os.path.isdir(a.sweep_dir):
    print(f'error: no sweep directory {a.sweep_dir!r}', file=sys.stderr)
    return 2
  if a.vs_state:
    meta = report.read_json(os.path.join(a.sweep_dir, 'sweep.json')) or {}
    rows = collect_state(a.sweep_dir, current_plan(meta['name']) if meta.get('name') else None)
    os.makedirs(os.path.dirname(a.out) or '.', exist_ok=True)
    with open(a.out + '.md', 'w', encoding='utf-8') as f:
      f.write(state_markdown(rows))
    write_state_csv(rows, a.out + '.csv')
    wrote = plot_state(rows, a.out + '.png')
    print(f"wrote {a.out}.md, {a.out}.csv{' and ' + a.out + '.png' if wrote else ''}")
    return 0
  if a.best_of:
    rows = collect_best_of(a.sweep_dir, a.best_of, a.column)
    os.makedirs(os.path.dirname(a.out) or '.', exist_ok=True)
    with open(a.out + '.md', 'w', encoding='utf-8') as f:
      f.write(best_of_markdown(rows, a.best_of, a.column))
    wrote = plot_best_of(rows, a.out + '.png', a.column)
    print(f"wrote {a.out}.md{' and ' + a.out + '.png' if wrote else ''}")
    return 0
  meta = report.read_json(os.path.join(a.sweep_dir, 'sweep.json')) or {}
  rows = collect(a.sweep_dir, current_plan(meta['name']) if meta.get('name') else None)
  os.makedirs(os.path.dirname(a.out) or '.', exist_ok=True)
  with open(a.out + '.md', 'w', encoding='utf-8') as f:
    f.write(markdown(rows))
  wrote = plot(rows, a.out + '.png')
  print(f"wrote {a.out}.md{' and ' + a.out + '.png' if wrote else ''}")
  return 0


if __name__ == '__main__':
  sys.exit(main())
