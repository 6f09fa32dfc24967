"""kernelformer kernels: every attention kernel the registry knows, with what a user can set.

usage:
  kernelformer kernels [NAME ...] [--family FAMILY|COMPONENT] [--names] [--aliases] [--plugin FILE.py]

Kernels are grouped by family, the common ones first: baselines (softmax, ...), random features
<component>-<sampler> by component (posrf-orf is FAVOR+), learnable, deterministic, beyond random
features. --family keeps one family (baselines, random-features, learnable, deterministic, beyond-rf)
or one component's random features (posrf, oprf, ...). --names prints only the names, one per line.

For each kernel (or the NAMEs given; aliases accepted): its aliases, the paper and equation it
implements, the kernel it computes or estimates, its cost, learnable parameters, whether it accepts
Luo et al.'s relative-position bias (--config.model.attention.rpe=True), and its options with their
defaults (set with --config.model.attention.OPTION=VALUE). --plugin (a flag of every kernelformer
command) imports a module that registers kernels of its own first (docs/extending.md).
"""
from __future__ import annotations

import dataclasses
import sys

from absl import app, flags

from kernelformer.commands import _common

_NAMES = flags.DEFINE_bool('names', False, 'Only the canonical names, one per line.')
_ALIASES = flags.DEFINE_bool('aliases', False, 'With --names: the aliases too, as "alias -> name".')
_FAMILY = flags.DEFINE_string('family', None, 'Only this family (baselines, random-features, '
                              'learnable, deterministic, beyond-rf) or component (posrf, oprf, ...).')


def options(spec) -> list[tuple[str, str]]:
  """(option, default) pairs of a mechanism: its module's fields that the spec does not fix."""
  out = []
  for f in dataclasses.fields(spec.module):
    if f.name in ('parent', 'name') or f.name in spec.fixed:
      continue
    if f.default is not dataclasses.MISSING:
      default = repr(f.default)
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
      default = repr(f.default_factory())  # type: ignore[misc]
    else:
      default = '(required)'
    out.append((f.name, default))
  return sorted(out)


def feature_map_line(component: str) -> str:
  """What the catalog's record says of a feature map, in one line."""
  from kernelformer.features import catalog  # pylint: disable=g-import-not-at-top
  r = catalog.get(component)
  width = (f"M' = {r.parts} x M" if r.parts and r.feature_dim is None
           else "M' = d" if not r.parts and r.feature_dim is None else "M' per the map")
  causal = (f'no causal form ({r.non_causal})' if r.non_causal
            else 'causal: no decoder (whole-sequence statistics)' if r.sequence_statistics
            else 'causal: running key shift' if r.causal_shift else 'causal: yes')
  traits = ['positive' if r.positive else 'may be 0 or negative', width, causal]
  if r.positional:
    traits.append('positional')
  if r.pallas_feature:
    traits.append(f'fused Pallas: {r.pallas_feature}')
  return f'{r.name} ({"; ".join(traits)})'


def describe(spec) -> str:
  lines = [spec.name + (f'  (aliases: {", ".join(spec.aliases)})' if spec.aliases else '')]
  if spec.paper:
    lines.append(f'  paper: {spec.paper}')
  if spec.approximates:
    lines.append(f'  computes: {spec.approximates}')
  if spec.complexity:
    lines.append(f'  cost: {spec.complexity}')
  if spec.learnable and spec.learnable != '-':
    lines.append(f'  learnable: {spec.learnable}')
  if 'component' in spec.fixed:
    lines.append(f'  feature map: {feature_map_line(spec.fixed["component"])}')
  rpe = 'required' if spec.requires_position_bias else ('yes' if spec.supports_position_bias else 'no')
  module = f'{spec.module.__module__}.{spec.module.__qualname__}'
  fixed = ', '.join(f'{k}={v!r}' for k, v in spec.fixed.items())
  lines.append(f'  module: {module}' + (f' ({fixed})' if fixed else '') + f'; relative positions: {rpe}')
  lines.append(_common.wrap('options: ' + ', '.join(f'{k}={v}' for k, v in options(spec)), '  '))
  return '\n'.join(lines)


def _selected(registry) -> list:
  """Every spec in family order, or those of ``--family``; a one-line error for an unknown family."""
  specs = registry.grouped_specs()
  if _FAMILY.value is None:
    return specs
  want = _FAMILY.value.strip().lower()
  components = list(dict.fromkeys(registry.component_of(s) for s in specs if registry.component_of(s)))
  if want in registry.FAMILIES:
    return [s for s in specs if registry.family(s) == want]
  if want in components:
    return [s for s in specs if registry.component_of(s) == want]
  raise _common.UserError(f'--family {_FAMILY.value!r} is neither a family ({", ".join(registry.FAMILIES)}) '
                          f'nor a component ({", ".join(components)})')


def _heading(registry, spec) -> str:
  fam = registry.family(spec)
  if fam == 'random-features':
    return f'== random features, component {registry.component_of(spec)} =='
  return f'== {registry.FAMILIES[fam]} =='


def _main(argv):
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    specs = [registry.get(n) for n in argv[1:]]
  else:
    specs = _selected(registry)
  if _NAMES.value:
    names = [s.name for s in specs]
    if _ALIASES.value:
      names += [f'{a} -> {s.name}' for s in specs for a in s.aliases]
    print('\n'.join(names))
    return
  if len(argv) > 1:
    print('\n\n'.join(describe(s) for s in specs))
    return
  blocks, heading = [], None
  for s in specs:
    h = _heading(registry, s)
    if h != heading:
      blocks.append(h)
      heading = h
    blocks.append(describe(s))
  print('\n\n'.join(blocks))
  print(f'\n{len(specs)} kernels; set one with --config.model.attention.kind=NAME; --names for the names '
        'only, --family to keep one family. docs/kernels.md has the table, docs/extending.md how to add '
        'your own.')


def _clean(main):
  from kernelformer import registry  # pylint: disable=g-import-not-at-top
  try:
    app.run(main)
  except (registry.UnknownKernelError, _common.UserError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


def help_text() -> str:
  return _common.absl_help(sys.modules[__name__], extra=_common.kernels_text)


def run(args) -> int:
  return _common.run_absl(sys.modules[__name__], 'kernelformer kernels', args, _main, help_text,
                          runner=_clean)
