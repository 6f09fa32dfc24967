"""The package's import graph, read with ``ast``: no circle, and no layer imports a layer above it.

Every ``import`` / ``from ... import`` of ``kernelformer.*`` and ``lra_tasks.*`` counts, at module level
and inside functions alike (an import moved into a function to dodge a circle is still a circle), and so
does ``importlib.import_module(NAME)``: a literal name is that module; an f-string with a constant prefix
(``f'kernelformer.configs.{task}'``) is an import of every module whose name starts with the prefix, as
any of them may be the one loaded at run time (taking only the package the prefix names would miss a
circle closed through one of its modules: ``kernelformer.configs``' ``__init__`` is empty). ``from package import name``
is an edge to the submodule when ``name`` is one, else to the package; a module's own enclosing
packages are not edges (Python initialises them first in any case). ``kernelformer.attention``'s
``__init__`` imports every module of the package (so a mechanism is one file): an import of that package
is an import of each of them.

The task configs live in ``configs/`` and ship as ``kernelformer.configs`` through the link
``kernelformer/configs -> ../configs``; the walk follows links, so they count once, under that name.

The layer order, lowest first, is written once here and in docs/architecture.md ("Layers"). A module
belongs to the layer of the longest prefix below that names it.
"""
from __future__ import annotations

import ast
import os
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ('kernelformer', 'lra_tasks')

LAYERS = (
    ('kernelformer.data_location',),                            # where data lives: no dependency
    ('lra_tasks', 'kernelformer.configs'),                      # tasks: files -> token arrays; configs
    ('kernelformer.features', 'kernelformer.pallas'),           # feature maps, samplers, fused kernels
    ('kernelformer.attention.spec', 'kernelformer.attention.linear',
     'kernelformer.attention.distill'),                         # attention cores and the spec record
    ('kernelformer.attention',),                                # the mechanisms
    ('kernelformer.registry',),                                 # name -> mechanism
    ('kernelformer.plugins',),                                  # a user's kernels
    ('kernelformer.layers', 'kernelformer.encoder', 'kernelformer.decoder',
     'kernelformer.run_config'),                                 # models and the run's record
    ('kernelformer.training',),                                 # trainer, checks, evaluation
    ('kernelformer.bench', 'kernelformer.reproduce'),           # measurements, sweeps, reports
    ('kernelformer.commands', 'kernelformer.cli', 'kernelformer.__main__',
     'kernelformer'),                                           # the command line (and the lazy root)
)

# Packages whose __init__ imports every module of the package (pkgutil).
AUTO_IMPORTING = ('kernelformer.attention',)


def module_index(root: str, packages=PACKAGES) -> dict[str, str]:
  """Module name -> file, for every ``.py`` under ``packages`` (``__init__.py`` is the package)."""
  mods = {}
  for pkg in packages:
    for folder, _, files in os.walk(os.path.join(root, pkg), followlinks=True):
      for f in files:
        if f.endswith('.py'):
          path = os.path.join(folder, f)
          name = os.path.relpath(path, root)[:-3].replace(os.sep, '.')
          mods[name[:-len('.__init__')] if name.endswith('.__init__') else name] = path
  real = [os.path.realpath(p) for p in mods.values()]
  assert len(set(real)) == len(real), 'a source file is reached twice (a link inside a package?)'
  return mods


def _import_module_targets(node: ast.Call, mods) -> list[str]:
  """``import_module('a.b')`` -> ['a.b']; ``import_module(f'a.b.{x}')`` -> every module named a.b.*."""
  if not (node.args and (isinstance(node.func, ast.Attribute) and node.func.attr == 'import_module'
                         or isinstance(node.func, ast.Name) and node.func.id == 'import_module')):
    return []
  arg = node.args[0]
  if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
    return [arg.value]
  if (isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant)
      and arg.values[0].value):
    return [m for m in mods if m.startswith(arg.values[0].value)]
  return []


def _resolve(name: str, mods) -> str:
  while name and name not in mods:
    name = name.rpartition('.')[0]
  return name


def import_graph(root: str, packages=PACKAGES, auto_importing=AUTO_IMPORTING) -> dict[str, set[str]]:
  """Module -> the package modules it imports (anywhere in its source)."""
  mods = module_index(root, packages)
  graph = {m: set() for m in mods}
  for mod, path in mods.items():
    is_pkg = path.endswith('__init__.py')
    with open(path, encoding='utf-8') as f:
      tree = ast.parse(f.read(), path)
    targets = []
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        targets += [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ''
        if node.level:
          parts = mod.split('.') if is_pkg else mod.split('.')[:-1]
          parts = parts[:len(parts) - node.level + 1]
          base = '.'.join(parts + ([node.module] if node.module else []))
        for a in node.names:
          sub = f'{base}.{a.name}'
          targets.append(sub if sub in mods else base)
      elif isinstance(node, ast.Call):
        targets += _import_module_targets(node, mods)
    for t in targets:
      if t.split('.')[0] not in packages:
        continue
      r = _resolve(t, mods)
      if r and r != mod and not mod.startswith(r + '.'):
        graph[mod].add(r)
  for pkg in auto_importing:
    if pkg in graph:
      graph[pkg] |= {m for m in mods if m.startswith(pkg + '.') and m.count('.') == pkg.count('.') + 1}
  return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components with more than one module (Tarjan), each sorted."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def layer_of(module: str, layers=LAYERS) -> int:
  best, best_len = None, -1
  for i, prefixes in enumerate(layers):
    for p in prefixes:
      if (module == p or module.startswith(p + '.')) and len(p) > best_len:
        best, best_len = i, len(p)
  if best is None:
    raise AssertionError(f'module {module} is in no layer of LAYERS')
  return best


def upward_imports(graph, layers=LAYERS) -> list[str]:
  return [f'{m} (layer {layer_of(m, layers)}) imports {t} (layer {layer_of(t, layers)})'
          for m in sorted(graph) for t in sorted(graph[m]) if layer_of(t, layers) > layer_of(m, layers)]


def test_no_import_circle():
  found = cycles(import_graph(ROOT))
  assert not found, 'import circles: ' + '; '.join(' <-> '.join(c) for c in found)


def test_no_layer_imports_a_higher_one():
  bad = upward_imports(import_graph(ROOT))
  assert not bad, '\n'.join(bad)


def test_auto_importing_packages_really_import_every_module():
  for pkg in AUTO_IMPORTING:
    with open(os.path.join(ROOT, *pkg.split('.'), '__init__.py'), encoding='utf-8') as f:
      assert 'iter_modules' in f.read(), pkg


def test_the_layer_order_is_the_documented_one():
  """docs/architecture.md lists the same layers in the same order."""
  with open(os.path.join(ROOT, 'docs', 'architecture.md'), encoding='utf-8') as f:
    doc = f.read()
  section = doc.split('## Layers', 1)[1].split('\n## ', 1)[0]
  rows = [line for line in section.splitlines() if line.startswith('| ') and line[2:3].isdigit()]
  assert len(rows) == len(LAYERS), rows
  for row, prefixes in zip(rows, LAYERS):
    for p in prefixes:
      assert f'`{p}`' in row, (p, row)


def _write(root, files: dict[str, str]) -> None:
  for name, text in files.items():
    path = os.path.join(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w', encoding='utf-8') as f:
      f.write(textwrap.dedent(text))


def test_checker_finds_a_planted_circle_and_an_upward_import(tmp_path):
  """The checker itself: a circle through a function-local import and an upward import are found."""
  _write(str(tmp_path), {
      'kernelformer/__init__.py': '',
      'kernelformer/low.py': 'def f():\n  from kernelformer import high\n',
      'kernelformer/high.py': 'from kernelformer import low\n',
      'kernelformer/pkg/__init__.py': '',
      'kernelformer/pkg/a.py': 'from . import b\n',
      'kernelformer/pkg/b.py': 'import importlib\nimportlib.import_module("kernelformer.pkg.a")\n',
  })
  graph = import_graph(str(tmp_path), packages=('kernelformer',), auto_importing=())
  assert graph['kernelformer.low'] == {'kernelformer.high'}
  assert sorted(cycles(graph)) == [['kernelformer.high', 'kernelformer.low'],
                                   ['kernelformer.pkg.a', 'kernelformer.pkg.b']]
  layers = (('kernelformer.low', 'kernelformer.pkg'), ('kernelformer.high', 'kernelformer'))
  assert upward_imports(graph, layers) == [
      'kernelformer.low (layer 0) imports kernelformer.high (layer 1)']


def test_checker_reads_configs_through_the_link_and_f_string_imports(tmp_path):
  """A circle closed through a linked config file, and one through an f-string ``import_module``."""
  _write(str(tmp_path), {
      'kernelformer/__init__.py': '',
      'kernelformer/registry.py': 'import importlib\nimportlib.import_module(f"kernelformer.configs.{t}")\n',
      'kernelformer/low.py': 'import importlib\ndef f(t):\n  return importlib.import_module(f"kernelformer.up.{t}")\n',
      'kernelformer/up/__init__.py': '',
      'kernelformer/up/a.py': 'from kernelformer import low\n',
      'configs/__init__.py': '',
      'configs/task.py': 'def get_config():\n  from kernelformer import registry\n',
  })
  os.symlink('../configs', str(tmp_path / 'kernelformer' / 'configs'))
  graph = import_graph(str(tmp_path), packages=('kernelformer',), auto_importing=())
  assert 'kernelformer.configs.task' in graph and not any(m.startswith('configs') for m in graph)
  assert graph['kernelformer.low'] == {'kernelformer.up.a'}
  assert sorted(cycles(graph)) == [['kernelformer.configs.task', 'kernelformer.registry'],
                                   ['kernelformer.low', 'kernelformer.up.a']]


def test_the_real_graph_reads_configs_and_f_string_imports():
  graph = import_graph(ROOT)
  assert 'kernelformer.configs.common' in graph and 'kernelformer.configs.sweeps.mini' in graph
  assert 'kernelformer.commands.train' in graph['kernelformer.cli']   # f'kernelformer.commands.{...}'


def test_features_are_pure_math_without_flax():
  """features/ holds no Flax module (the learned samplers live in attention/); its records may be
  ``flax.struct`` pytree dataclasses, which hold no parameters."""
  for mod, path in module_index(ROOT).items():
    if mod.startswith('kernelformer.features'):
      with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
      names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
      names += [n.module or '' for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
      assert not [n for n in names if n.split('.')[0] == 'flax' and n != 'flax.struct'], (mod, names)
