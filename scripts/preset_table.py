"""Rewrite the preset table of docs/reproduce.md from the task configs.

  python scripts/preset_table.py            # rewrites the table between the markers in docs/reproduce.md
  python scripts/preset_table.py --check    # exit 1 if the committed table differs from the configs

The work is kernelformer.reproduce.presets; tests/configs/test_presets_table.py runs the check.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402

_DOC = flags.DEFINE_string('doc', os.path.join(ROOT, 'docs', 'reproduce.md'),
                           'Markdown file holding the table markers.')
_CHECK = flags.DEFINE_bool('check', False, 'Only compare; exit 1 if the table is out of date.')


def main(argv):
  if len(argv) != 1:
    raise app.UsageError('usage: scripts/preset_table.py [--doc FILE] [--check]')
  from kernelformer.reproduce import presets  # pylint: disable=g-import-not-at-top
  if not os.path.isfile(_DOC.value):
    print(f'error: {_DOC.value} does not exist', file=sys.stderr)
    sys.exit(2)
  try:
    with open(_DOC.value, encoding='utf-8') as f:
      current = presets.committed(f.read())
    if _CHECK.value:
      if current != presets.render():
        print(f'error: the preset table in {_DOC.value} is out of date; run '
              'python scripts/preset_table.py', file=sys.stderr)
        sys.exit(1)
      print(f'{_DOC.value}: preset table up to date')
      return
    changed = presets.update(_DOC.value)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  print(f'{_DOC.value}: preset table {"rewritten" if changed else "already up to date"}')


if __name__ == '__main__':
  app.run(main)
