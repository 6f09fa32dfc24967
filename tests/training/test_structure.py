"""The training package keeps its state in plain sight (``ast``): every attribute of a class is created in
its ``__init__`` (or declared in the class body, as a dataclass field), never first assigned by another
method -- so what a method may read does not depend on which methods ran before it.
"""
from __future__ import annotations

import ast
import os
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, 'kernelformer', 'training')


def _self_targets(fn: ast.AST):
  """``(name, line)`` of every ``self.name`` assigned in ``fn`` (plain, annotated, augmented, tuple
  and starred targets; a ``with ... as self.x`` and ``for self.x in`` too)."""
  for node in ast.walk(fn):
    if isinstance(node, ast.Assign):
      targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
      targets = [node.target]
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
      targets = [node.optional_vars]
    else:
      continue
    stack = list(targets)
    while stack:   # tuple, list and starred targets hold targets; ``self.x[i]``, ``self.x.y`` do not
      e = stack.pop()
      if isinstance(e, (ast.Tuple, ast.List)):
        stack += e.elts
      elif isinstance(e, ast.Starred):
        stack.append(e.value)
      elif isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == 'self':
        yield e.attr, e.lineno


def late_attributes(source: str, path: str = '<source>') -> list[tuple[str, int, str, str]]:
  """``(path, line, class, attribute)`` for every attribute first assigned outside ``__init__``."""
  found = []
  for cls in ast.walk(ast.parse(source, path)):
    if not isinstance(cls, ast.ClassDef):
      continue
    declared = {n.target.id for n in cls.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    declared |= {t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets
                 if isinstance(t, ast.Name)}
    methods = [f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for f in methods:
      if f.name == '__init__':
        declared |= {name for name, _ in _self_targets(f)}
    for f in methods:
      if f.name != '__init__':
        found += [(path, line, cls.name, name) for name, line in _self_targets(f)
                  if name not in declared]
  return sorted(set(found))


def test_no_attribute_of_the_training_package_is_created_outside_init():
  late = []
  for name in sorted(os.listdir(PACKAGE)):
    if name.endswith('.py'):
      path = os.path.join(PACKAGE, name)
      with open(path, encoding='utf-8') as f:
        late += late_attributes(f.read(), os.path.relpath(path, ROOT))
  assert not late, '\n'.join(f'{p}:{line} {cls}.{attr} first assigned outside __init__'
                             for p, line, cls, attr in late)


def test_checker_finds_an_attribute_created_by_a_later_phase():
  """A blackboard class: phases that create the attributes the next
  phase reads. Each first assignment outside ``__init__`` is found, in every assignment form; what
  ``__init__`` or the class body declares is not."""
  source = textwrap.dedent('''
      import dataclasses

      class Run:
        limit: float = 0.0

        def __init__(self, config):
          self.config = config
          self.count = 0

        def build(self):
          self.model = object()                  # late
          self.count += 1                        # declared in __init__
          self.limit = 2.0                       # declared in the class body

        def restore(self):
          self.state, self.meta = None, {}       # two late ones
          self.meta['step'] = 3                  # an item, not an attribute
          self.config.seed = 1                   # an attribute of another object

        def train(self):
          self.steps += 1                        # late (augmented)
          for self.batch in []:                  # late (loop target)
            pass

      @dataclasses.dataclass
      class Record:
        step: int = 0

        def advance(self):
          self.step += 1                         # a field
      ''')
  got = [(line, cls, attr) for _, line, cls, attr in late_attributes(source)]
  assert got == [(12, 'Run', 'model'), (17, 'Run', 'meta'), (17, 'Run', 'state'),
                 (22, 'Run', 'steps'), (23, 'Run', 'batch')]
