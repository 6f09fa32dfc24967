"""``data.pixel_padding``: a black pixel is masked exactly when it is 'lra' (Image and Pathfinder).

LRA feeds raw pixels 0..255 and masks ``inputs > 0`` (vocabulary 256); 'none' shifts pixels by one and
masks nothing. Checked on the tokens (decoded images, the disk cache, CIFAR-10 under mock data) and on
the model: with 'lra' the encoder's output equals the encoder run on the lit pixels alone, which is
what masking means; with 'none' the black pixels change it.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds

from configs import image as image_config
from configs import pathfinder as pathfinder_config
from kernelformer.encoder import Encoder
from lra_tasks import common
from lra_tasks import fixtures
from lra_tasks import image
from lra_tasks import pathfinder
from tests.lra_tasks import helpers

tiny_pathfinder = functools.partial(helpers.tiny_data, pathfinder_config)


def _pixels(written):
  return {img.tobytes(): img.reshape(-1).astype(np.int32) for img in written.images}


@pytest.mark.parametrize('cached', [False, True])
def test_pathfinder_tokens_and_mask(tmp_path, cached):
  written = fixtures.write_pathfinder_fixture(str(tmp_path), 32, 'hard', 8, seed=0)
  pixels = _pixels(written)
  assert any((p == 0).any() for p in pixels.values()) and any((p > 0).any() for p in pixels.values())
  for padding, offset, vocab in (('none', 1, 257), ('lra', 0, 256)):
    data = tiny_pathfinder(tmp_path, pixel_padding=padding)
    pathfinder._cached_examples.cache_clear()
    if cached:
      pathfinder.build_cache(data)
    assert pathfinder.TASK.info(data).vocab_size == vocab
    for split in common.SPLITS:
      src = pathfinder.TASK.source(data, split)
      assert isinstance(src, common.IndexedSource) == cached
      for i in range(len(src)):
        tokens = src[i]['inputs']
        raw = pixels[(tokens - offset).astype(np.uint8).tobytes()]
        np.testing.assert_array_equal(tokens, raw + offset)
        # The model's padding mask is ``inputs != 0`` (kernelformer/encoder.py).
        np.testing.assert_array_equal(tokens == 0, (raw == 0) if padding == 'lra' else False)


def test_image_tokens_and_mask(tmp_path):
  base = helpers.tiny_data(image_config, tmp_path / 'data', tfds_check=False)
  lra = helpers.tiny_data(image_config, tmp_path / 'data', tfds_check=False, pixel_padding='lra')
  with tfds.testing.mock_data(num_examples=12):
    for split in common.SPLITS:
      shifted, raw = image.build_arrays(base, split)['inputs'], image.build_arrays(lra, split)['inputs']
      np.testing.assert_array_equal(raw, shifted - 1)
      assert raw.min() >= 0 and raw.max() <= 255 and not (shifted == 0).any()   # 'none' masks nothing
  assert image.TASK.info(base).vocab_size == 257 and image.TASK.info(lra).vocab_size == 256
  with pytest.raises(common.DataError, match='pixel_padding'):
    image.TASK.info(helpers.tiny_data(image_config, tmp_path / 'data', pixel_padding='LRA'))


def test_lra_tokens_leave_the_decoded_tokens_alone(tmp_path):
  """'lra' tokens are made from the pixel + 1 tokens a process keeps (CIFAR-10's split arrays, the
  decoded Pathfinder images) without writing to them: 'none' read afterwards is still pixel + 1."""
  base = helpers.tiny_data(image_config, tmp_path / 'data', tfds_check=False)
  lra = helpers.tiny_data(image_config, tmp_path / 'data', tfds_check=False, pixel_padding='lra')
  with tfds.testing.mock_data(num_examples=12):
    for split in common.SPLITS:
      before = image.build_arrays(base, split)['inputs'].copy()
      image.build_arrays(lra, split)
      np.testing.assert_array_equal(image.build_arrays(base, split)['inputs'], before)
  fixtures.write_pathfinder_fixture(str(tmp_path / 'pf'), 32, 'hard', 8, seed=0)
  pathfinder._cached_examples.cache_clear()
  none, raw = (tiny_pathfinder(tmp_path / 'pf', pixel_padding=p) for p in ('none', 'lra'))
  for split in common.SPLITS:
    before = common.source_arrays(pathfinder.TASK.source(none, split))['inputs']
    np.testing.assert_array_equal(common.source_arrays(pathfinder.TASK.source(raw, split))['inputs'],
                                  before - 1)
    np.testing.assert_array_equal(common.source_arrays(pathfinder.TASK.source(none, split))['inputs'],
                                  before)


def test_masked_black_pixels_do_not_reach_the_encoder():
  """Softmax attention, no positions, mean pooling: with 'lra' tokens the output is that of the lit
  pixels alone; with 'none' tokens (the same pixels + 1) it is not."""
  rng = np.random.default_rng(0)
  raw = rng.integers(1, 256, size=(2, 16)).astype(np.int32)
  raw[0, [1, 4, 5, 11]] = 0
  raw[1, [0, 15]] = 0
  enc = Encoder(vocab_size=257, emb_dim=8, num_layers=2, num_heads=2, qkv_dim=8, mlp_dim=16,
                attention={'kind': 'softmax'}, max_length=16, dropout_rate=0.0, pos_encoding='none',
                pooling='mean')
  params = enc.init(jax.random.key(0), jnp.asarray(raw))
  out = {p: np.asarray(enc.apply(params, jnp.asarray(raw + o))) for p, o in (('lra', 0), ('none', 1))}
  for row in range(2):
    lit = raw[row][raw[row] > 0]
    alone = np.asarray(enc.apply(params, jnp.asarray(lit[None])))[0]
    np.testing.assert_allclose(out['lra'][row], alone, rtol=1e-5, atol=1e-6)
    alone_none = np.asarray(enc.apply(params, jnp.asarray(lit[None] + 1)))[0]
    assert np.abs(out['none'][row] - alone_none).max() > 1e-3
