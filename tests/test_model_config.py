"""``layers.ModelConfig``: the one record of the fields the encoder and the decoder share, read from
``config.model`` in one place (where ``model.dtype`` is checked)."""
from __future__ import annotations

import dataclasses
import types

import jax.numpy as jnp
import pytest

from kernelformer import decoder, encoder, run_config
from kernelformer.layers import ModelConfig
from kernelformer.training import steps as steps_lib
from tests.training import helpers


def _own_fields(cls) -> set:
  """The fields a class declares itself (not inherited)."""
  return set(vars(cls).get('__annotations__', {}))


def test_encoder_and_decoder_declare_the_shared_fields_once():
  shared = set(ModelConfig.names())
  assert {'vocab_size', 'emb_dim', 'num_layers', 'num_heads', 'qkv_dim', 'mlp_dim', 'attention',
          'max_length', 'dropout_rate', 'pos_encoding', 'dtype'} == shared
  for cls in (encoder.Encoder, decoder.Decoder):
    assert shared <= {f.name for f in dataclasses.fields(cls)}, cls
  assert not _own_fields(encoder.Encoder) & shared
  assert _own_fields(decoder.Decoder) & shared == {'dropout_rate'}   # its default only: no dropout
  assert decoder.Decoder.dropout_rate == 0.0 and encoder.Encoder.dropout_rate == 0.1


def test_the_trainer_builds_both_models_from_the_record(tmp_path):
  c = helpers.tiny_config(tmp_path, **{'model.dtype': 'bfloat16'})
  info = types.SimpleNamespace(vocab_size=21, max_length=17, num_classes=3, dual=False)
  shared = ModelConfig.of(run_config.of(c).model, info)
  assert shared['dtype'] == jnp.bfloat16 and shared['max_length'] == 17
  run = run_config.of(c)
  enc = steps_lib.build_model(run, info).encoder
  assert {k: enc[k] for k in shared if k != 'attention'} == {k: v for k, v in shared.items()
                                                             if k != 'attention'}
  lm = types.SimpleNamespace(vocab_size=21, max_length=17, language_model=True)
  dec = steps_lib.build_model(run, lm)
  assert isinstance(dec, decoder.Decoder)
  assert {k: getattr(dec, k) for k in shared} == shared


@pytest.mark.parametrize('language_model', [False, True])
def test_a_bad_dtype_is_the_same_line_for_encoder_and_decoder(tmp_path, language_model):
  c = helpers.tiny_config(tmp_path, **{'model.dtype': 'float64'})
  info = types.SimpleNamespace(vocab_size=21, max_length=17, num_classes=3, dual=False,
                               language_model=language_model)
  with pytest.raises(ValueError, match=r"^model.dtype must be one of float32, bfloat16, float16, got 'float64'$"):
    run = run_config.of(c)
    steps_lib.build_model(run, info)
