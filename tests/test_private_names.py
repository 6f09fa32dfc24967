"""No ``_``-private name of one module is used by another module of the package source (``ast``).

A use is ``alias._name`` where ``alias`` is an imported ``kernelformer.*`` / ``lra_tasks.*`` module, or
``from module import _name``. Dunder names are public. Tests may reach into privates; the source may not:
what another module needs is a public name of its owner.
"""
from __future__ import annotations

import ast
import os
import textwrap

from tests.test_import_graph import module_index

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ('kernelformer', 'lra_tasks')
SOURCE = ('kernelformer',)     # the modules checked (they may not use privates of either package)

# (owner module, private name) pairs another module may still use: none.
ALLOWED = frozenset()


def _private(name: str) -> bool:
  return name.startswith('_') and not (name.startswith('__') and name.endswith('__'))


def private_uses(root: str, source=SOURCE) -> list[tuple[str, int, str, str]]:
  """``(module, line, owner module, name)`` for every cross-module use of a private name."""
  mods = module_index(root)
  found = []
  for mod, path in sorted(mods.items()):
    if mod.split('.')[0] not in source:
      continue
    with open(path, encoding='utf-8') as f:
      tree = ast.parse(f.read(), path)
    aliases = {}          # local name -> module it stands for
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        for a in node.names:
          if a.name.split('.')[0] in PACKAGES:
            aliases[a.asname or a.name.split('.')[0]] = a.name if a.asname else a.name.split('.')[0]
      elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        if node.module.split('.')[0] not in PACKAGES:
          continue
        for a in node.names:
          sub = f'{node.module}.{a.name}'
          if sub in mods:
            aliases[a.asname or a.name] = sub
          elif _private(a.name) and node.module != mod:
            found.append((mod, node.lineno, node.module, a.name))
    for node in ast.walk(tree):
      if isinstance(node, ast.Attribute) and _private(node.attr):
        chain, base = [], node.value
        while isinstance(base, ast.Attribute):
          chain.append(base.attr)
          base = base.value
        if isinstance(base, ast.Name) and base.id in aliases:
          owner = '.'.join([aliases[base.id], *reversed(chain)])
          if owner in mods and owner != mod:
            found.append((mod, node.lineno, owner, node.attr))
  return found


def test_no_private_name_used_across_modules():
  bad = [f'{m}:{line} uses {owner}.{name}' for m, line, owner, name in private_uses(ROOT)
         if (owner, name) not in ALLOWED]
  assert not bad, '\n'.join(bad)


def test_the_allow_list_is_still_needed():
  used = {(owner, name) for _, _, owner, name in private_uses(ROOT)}
  assert ALLOWED <= used, f'no longer used across modules, remove from ALLOWED: {sorted(ALLOWED - used)}'


def test_checker_finds_planted_uses(tmp_path):
  files = {
      'kernelformer/__init__.py': '',
      'kernelformer/a.py': '_hidden = 1\n__version__ = 2\n',
      'kernelformer/b.py': '''
          from kernelformer import a
          from kernelformer.a import _hidden
          import kernelformer.a as alias
          x = a._hidden + alias._hidden + a.__version__
          ''',
  }
  for name, text in files.items():
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
  got = sorted((m, line, owner, name) for m, line, owner, name in private_uses(str(tmp_path)))
  assert got == [('kernelformer.b', 3, 'kernelformer.a', '_hidden'),
                 ('kernelformer.b', 5, 'kernelformer.a', '_hidden'),
                 ('kernelformer.b', 5, 'kernelformer.a', '_hidden')]
