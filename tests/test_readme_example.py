"""README's "Use as a library" example runs as printed, so it cannot drift from the API."""
from __future__ import annotations

import pathlib
import re

import jax
import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / 'README.md'
SECTION = '## Use as a library'


def library_example() -> str:
  """The one ```python block of README's library section, verbatim."""
  text = README.read_text(encoding='utf-8')
  start = text.index(SECTION)
  end = text.find('\n## ', start + len(SECTION))
  blocks = re.findall(r'```python\n(.*?)```', text[start:end if end >= 0 else None], flags=re.S)
  assert len(blocks) == 1, f'README section {SECTION!r} must hold exactly one python block, has {len(blocks)}'
  return blocks[0]


def test_readme_library_example_runs_a_kernelformer_kernel():
  code = library_example()
  assert len(code.strip().splitlines()) <= 20, 'the README example should stay short'
  namespace: dict = {'__name__': 'readme_example'}
  exec(compile(code, str(README), 'exec'), namespace)  # pylint: disable=exec-used
  tokens, logits, variables = namespace['tokens'], namespace['logits'], namespace['variables']
  assert logits.shape == (tokens.shape[0], 10)
  assert np.isfinite(np.asarray(logits)).all()
  # The model ran kernelformer's random-feature mechanism: its cached projection draw sits in the
  # 'features' collection, one W [heads, features, head_dim] per head (4 heads of 64 / 4 dims).
  draws = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(variables.get('features', {}))
           if 'RandomFeatureAttention' in jax.tree_util.keystr(path) and leaf.ndim == 3]
  assert draws, f'no random-feature draw in the example model: {jax.tree.map(np.shape, dict(variables))}'
  assert all(d.shape[0] == 4 and d.shape[2] == 16 for d in draws)


def test_readme_build_attention_gives_the_bare_mechanism():
  # README: "`kernelformer.build_attention(options)` gives the bare mechanism, [batch, length, heads,
  # head_dim] in and out".
  import kernelformer  # pylint: disable=g-import-not-at-top
  module = kernelformer.build_attention({'kind': 'posrf-orf', 'num_features': 8})
  q = jax.random.normal(jax.random.key(0), (2, 12, 3, 4))
  out, _ = module.init_with_output({'params': jax.random.key(1), 'features': jax.random.key(2)}, q, q, q)
  assert out.shape == q.shape
  assert type(module).__name__ == 'RandomFeatureAttention'
