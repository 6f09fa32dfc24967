"""RandomFeatureAttention's ``impl`` switch: the fused Pallas path (interpret mode on CPU) equals XLA."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import registry


@pytest.mark.parametrize('kind,causal', [('posrf-orf', False), ('linear-elu', True)])
def test_pallas_impl_matches_xla(kind, causal):
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(1, 20, 2, 8)), jnp.float32) for _ in range(3))
  mask = jnp.asarray(np.arange(20)[None] < 17)
  rngs = {'features': jax.random.key(3)}
  outs = {}
  for impl in ('xla', 'pallas'):
    module = registry.build({'kind': kind, 'num_features': 16, 'impl': impl,
                             'chunk_size': 16})
    variables = module.init(rngs, q, k, v, mask=mask, causal=causal)
    outs[impl] = module.apply(variables, q, k, v, mask=mask, causal=causal, rngs=rngs)
  np.testing.assert_allclose(outs['pallas'], outs['xla'], rtol=2e-4, atol=2e-5)


def test_auto_uses_xla_on_cpu_and_pallas_rejects_unsupported():
  q = jnp.ones((1, 4, 1, 8))
  rngs = {'features': jax.random.key(0)}
  module = registry.build({'kind': 'saderf-orf', 'num_features': 16, 'impl': 'pallas'})
  with pytest.raises(ValueError, match='impl=pallas supports components'):
    module.init(rngs, q, q, q)
  module = registry.build({'kind': 'saderf-orf', 'num_features': 16, 'impl': 'auto'})
  assert module.apply(module.init(rngs, q, q, q), q, q, q, rngs=rngs).shape == q.shape
