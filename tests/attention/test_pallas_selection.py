"""RandomFeatureAttention's ``impl`` switch: the fused Pallas path (interpret mode on CPU) equals XLA."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernelformer import registry


@pytest.mark.parametrize('kind', ['posrf-orf', 'linear-elu'])
def test_pallas_impl_matches_xla(kind):
  causal = False
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


def test_pallas_refuses_causal_in_one_line():
  """The kernels have no causal form with the XLA path's per-row running-max shift: impl='pallas'
  with causal=True is refused by the module, the kernels and the config check, never computed."""
  import ml_collections
  from configs import mqar as mqar_config
  from kernelformer import pallas
  from kernelformer.training import validate
  q = jnp.ones((1, 16, 1, 8))
  rngs = {'features': jax.random.key(0)}
  module = registry.build({'kind': 'posrf-orf', 'num_features': 16, 'impl': 'pallas'})
  with pytest.raises(ValueError, match='bidirectional only'):
    module.init(rngs, q, q, q, causal=True)
  with pytest.raises(ValueError, match='bidirectional only'):
    pallas.feature_attention(q, q, q, jnp.ones((16, 8)), causal=True)
  c = ml_collections.ConfigDict(mqar_config.get_config('tiny').to_dict())
  c.model.attention.kind, c.model.attention.impl = 'posrf-orf', 'pallas'
  with pytest.raises(validate.ConfigError, match='bidirectional only') as e:
    validate.validate_config(c)
  assert '\n' not in str(e.value)


# ------------------------------------------------------------------------------------------------
# impl='auto' on a (simulated) GPU: Pallas only where kernelformer/pallas/validated.json says so.
# ------------------------------------------------------------------------------------------------

DEVICE = 'NVIDIA H100 80GB HBM3'


def _simulated_gpu(monkeypatch, tmp_path, entries, kernels_fit=True):
  """Pretend the default backend is a GPU of kind DEVICE, with ``entries`` as the validation table.

  ``kernels_fit``: every case counts as fitting the hardware (``feature_attention.fits``, the offline
  resource table); False leaves the committed resources.json in charge. The kernels themselves still
  run in interpret mode (this is a CPU); calls are recorded.
  """
  import importlib
  import json
  import logging

  from kernelformer import pallas
  from kernelformer.pallas import validated

  table = tmp_path / 'validated.json'
  table.write_text(json.dumps({'entries': entries}))
  monkeypatch.setattr(validated, 'TABLE_PATH', str(table))
  monkeypatch.setattr(validated, 'current_device_kind', lambda: DEVICE)
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  if kernels_fit:
    fa_module = importlib.import_module('kernelformer.pallas.feature_attention')
    monkeypatch.setattr(fa_module, 'fits', lambda *a, **k: True)
  validated._reset_log_for_tests()
  calls = []
  real = pallas.feature_attention

  def spy(*args, **kwargs):
    calls.append(kwargs.get('causal', False))
    return real(*args, **{**kwargs, 'interpret': True})

  monkeypatch.setattr(pallas, 'feature_attention', spy)
  logging.getLogger(validated.__name__).setLevel(logging.INFO)
  return calls


def _entry(feature, mode, dtype='float32'):
  from kernelformer.pallas import validated
  return {'backend': 'gpu', 'device_kind': DEVICE, 'jax': validated.jax_minor(), 'feature': feature,
          'mode': mode, 'dtype': dtype, 'source': 'test'}


def _apply_auto(kind, causal, times=1):
  rng = np.random.default_rng(1)
  q, k, v = (jnp.asarray(rng.normal(size=(1, 16, 2, 8)), jnp.float32) for _ in range(3))
  rngs = {'features': jax.random.key(3)}
  module = registry.build({'kind': kind, 'num_features': 16, 'impl': 'auto', 'chunk_size': 16})
  variables = module.init(rngs, q, k, v, causal=causal)
  outs = [module.apply(variables, q, k, v, causal=causal, rngs=rngs) for _ in range(times)]
  xla = registry.build({'kind': kind, 'num_features': 16, 'impl': 'xla', 'chunk_size': 16})
  return outs[-1], xla.apply(variables, q, k, v, causal=causal, rngs=rngs)


def test_auto_on_gpu_with_empty_table_takes_xla_and_logs_once(monkeypatch, tmp_path, caplog):
  calls = _simulated_gpu(monkeypatch, tmp_path, [])
  with caplog.at_level('INFO', logger='kernelformer.pallas.validated'):
    out, ref = _apply_auto('posrf-orf', False, times=3)
  assert calls == []
  np.testing.assert_array_equal(out, ref)
  lines = [r.getMessage() for r in caplog.records if 'impl=auto' in r.getMessage()]
  assert len(lines) == 1 and 'XLA path' in lines[0] and 'posrf' not in lines[0], lines


def test_auto_on_gpu_takes_pallas_only_for_validated_entries(monkeypatch, tmp_path):
  # posrf (exp) validated bidirectional only; elu validated causal only (a stale entry: causal
  # attention never takes the kernels, whatever the table says).
  calls = _simulated_gpu(monkeypatch, tmp_path, [_entry('exp', 'bidirectional'),
                                                 _entry('elu', 'causal')])
  def took_pallas(kind, causal):
    calls.clear()
    out, ref = _apply_auto(kind, causal)          # init + apply + the XLA reference
    assert set(calls) <= {causal}
    if calls:
      np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-5)
    return bool(calls)

  assert took_pallas('posrf-orf', False)
  assert not took_pallas('posrf-orf', True)       # causal exp: not validated -> XLA
  assert not took_pallas('linear-elu', True)      # causal: XLA even where validated
  assert not took_pallas('linear-elu', False)     # bidirectional elu: not validated


def test_auto_on_gpu_takes_xla_where_the_kernels_do_not_fit(monkeypatch, tmp_path):
  """Validated on the device, but the offline resource table has no fitting entry: XLA path."""
  import importlib
  resources = importlib.import_module('kernelformer.pallas.resources')
  table = tmp_path / 'resources.json'
  table.write_text('{"entries": []}')
  monkeypatch.setattr(resources, 'TABLE_PATH', str(table))
  calls = _simulated_gpu(monkeypatch, tmp_path, [_entry('exp', 'bidirectional')], kernels_fit=False)
  out, ref = _apply_auto('posrf-orf', False)
  assert calls == []
  np.testing.assert_array_equal(out, ref)


def test_validation_entries_need_other_device_jax_and_dtype(monkeypatch, tmp_path):
  from kernelformer.pallas import validated
  base = _entry('exp', 'causal', 'bfloat16')
  ok = lambda **kw: validated.select('exp', causal=True, dtype='bfloat16', backend='gpu',
                                     device_kind=DEVICE, entries=[{**base, **kw}])[0]
  assert ok()
  assert not ok(device_kind='NVIDIA A100-SXM4-40GB')
  assert not ok(jax='0.0')
  assert not ok(dtype='float32')
  assert not validated.select('exp', causal=None, dtype='bfloat16', backend='gpu',
                              device_kind=DEVICE, entries=[base])[0]   # unknown mode: both needed
  # Entries come only from compiled GPU cases that all passed.
  case = {'feature': 'exp', 'mode': 'causal', 'dtype': 'bfloat16', 'passed': True, 'interpret': False}
  made = lambda cases, backend='gpu', speed=None: validated.entries_from_results(
      cases, backend=backend, device_kind=DEVICE, jax_version='0.11.2', source='x', speed=speed)
  assert [e['mode'] for e in made([case])] == ['causal']
  assert made([case], backend='cpu') == []
  assert made([case, {**case, 'passed': False}]) == []
  assert made([{**case, 'interpret': True}]) == []
  assert made([case], speed={('exp', 'causal'): False}) == []
  path = tmp_path / 't.json'
  validated.merge(made([case]), str(path))
  validated.merge(made([case]), str(path))
  assert len(validated.load(str(path))) == 1
