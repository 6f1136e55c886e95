"""The Qwen3-VL model's own invariants: the interleaved multimodal RoPE and the learned position grid by hand, the
config's checks, DeepStack, the learner's per-image features equal the sampler's. (What both families keep, text-only
prompts, padding, decoding, sharding and SFT: test_vl.py; parity with transformers: tests/hf/test_qwen3_vl_hf.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from explore_jax import images as images_lib
from explore_jax.models import vision as vision_lib
from explore_jax.models.config import VL_PRESETS, mrope_coordinates, vl_preset
from explore_jax.models.transformer import Model, apply_rope, rope_angles
from explore_jax.models.vl import VLModel
from explore_jax.parallel import DEFAULT_RULES, logical_to_spec
from tests.models.vl_families import CONFIGS, IMG, draw_params, image_batch, pixels

CONFIG = CONFIGS["qwen3-vl"]
TEXT, VISION = CONFIG.text, CONFIG.vision


@pytest.fixture(scope="module")
def params():
  return draw_params(CONFIG)


def test_param_counts_and_axes_cover_every_leaf():
  model = VLModel(CONFIG)
  params = jax.eval_shape(model.init, jax.random.key(0))
  assert CONFIG.num_params() == sum(x.size for x in jax.tree.leaves(params))
  assert set(params["vision"]) == {"patch_embed", "patch_embed_bias", "pos_embed", "layers", "merger", "deepstack"}
  shapes = jax.tree.leaves(model.param_shapes())
  axes = jax.tree.leaves(model.param_axes(), is_leaf=lambda x: isinstance(x, tuple))
  assert len(shapes) == len(axes) and all(len(a) == len(s.shape) for a, s in zip(axes, shapes))
  for a in axes:  # every name has a rule, so the default table places every leaf
    logical_to_spec(a, DEFAULT_RULES)
  tiny = vl_preset("tiny-qwen3-vl")
  assert tiny.num_params() == sum(
      x.size for x in jax.tree.leaves(jax.eval_shape(VLModel(tiny).init, jax.random.key(0))))
  assert 3e6 < tiny.num_params() < 7e6 and tiny.text.vocab_size % 8 == 0
  # Qwen3-VL-2B-Instruct and -4B-Instruct have 2.13e9 and 4.44e9 parameters.
  assert 2.1e9 < VL_PRESETS["qwen3-vl-2b"].num_params() < 2.2e9
  assert 4.4e9 < VL_PRESETS["qwen3-vl-4b"].num_params() < 4.5e9


def test_config_errors_name_the_problem():
  with pytest.raises(ValueError, match="does not fit the interleaved layout"):
    TEXT.replace(head_dim=12, mrope_section=(1, 2, 3))  # six frequencies: width would get only two
  with pytest.raises(ValueError, match="needs mrope_interleaved=True"):
    CONFIG.replace(text=TEXT.replace(mrope_interleaved=False))
  with pytest.raises(ValueError, match="needs mrope_interleaved=False"):
    tiny = VL_PRESETS["tiny-vl"]
    tiny.replace(text=tiny.text.replace(mrope_section=(6, 5, 5), mrope_interleaved=True))
  with pytest.raises(ValueError, match="positive square"):
    VISION.replace(num_position_embeddings=12)
  with pytest.raises(ValueError, match="increasing block indexes"):
    VISION.replace(deepstack_visual_indexes=(2, 0))
  with pytest.raises(ValueError, match="Qwen3-VL's"):
    VL_PRESETS["tiny-vl"].vision.replace(deepstack_visual_indexes=(1,))
  with pytest.raises(ValueError, match="DeepStack features for 1 language layers"):
    CONFIG.replace(text=TEXT.replace(num_layers=1))
  with pytest.raises(ValueError, match="family"):
    VISION.replace(family="qwen4-vl")


def test_repr_shows_the_qwen3_fields_and_leaves_qwen25_configs_as_they_were():
  assert "family='qwen3-vl'" in repr(VISION) and "deepstack_visual_indexes=(0, 2)" in repr(VISION)
  old = ("VisionConfig(depth=4, hidden_size=64, intermediate_size=176, num_heads=4, out_hidden_size=256, "
         "in_channels=3, patch_size=14, temporal_patch_size=2, spatial_merge_size=2, window_size=112, "
         "fullatt_block_indexes=(1, 3), rope_theta=10000.0, param_dtype='float32', dtype='float32')")
  assert repr(VL_PRESETS["tiny-vl"].vision) == old


def test_interleaved_mrope_layout_by_hand():
  """Qwen3-VL's 64 frequencies: height and width take every third from the second and third on, 20 each; the
  temporal coordinate the rest (the first of every three, and the last four)."""
  coordinate = mrope_coordinates((24, 20, 20), interleaved=True)
  assert coordinate[:9].tolist() == [0, 1, 2] * 3 and coordinate[57:].tolist() == [0, 1, 2, 0, 0, 0, 0]
  assert np.bincount(coordinate).tolist() == [24, 20, 20]
  assert mrope_coordinates((2, 1, 1), interleaved=True).tolist() == [0, 1, 2, 0]
  assert mrope_coordinates((2, 1, 1)).tolist() == [0, 0, 1, 2]  # Qwen2.5-VL's blocks
  # Distinct coordinates rotate by their own position; equal ones are plain RoPE.
  inv = 1.0 / (100.0 ** (jnp.arange(0, 8, 2) / 8))
  pos = jnp.array([[[3, 5, 7]]])
  np.testing.assert_allclose(rope_angles(pos, inv, (2, 1, 1), interleaved=True)[0, 0], inv * jnp.array([3, 5, 7, 3]))
  x = jax.random.normal(jax.random.key(0), (2, 6, 3, 8))
  flat = jnp.arange(12).reshape(2, 6)
  np.testing.assert_array_equal(apply_rope(x, rope_angles(jnp.stack([flat] * 3, -1), inv, (2, 1, 1), True)),
                                apply_rope(x, rope_angles(flat, inv)))


def test_position_grid_of_its_own_size_is_read_as_is_in_merge_block_order(params):
  """An image of 4 x 4 patches on the 4 x 4 learned grid reads each entry unchanged; each merge block's 4 patches
  are consecutive, as the processor orders them. A 6 x 10 grid is the bilinear resampling, corners aligned."""
  tower = VLModel(CONFIG).vision
  table = params["vision"]["pos_embed"]
  inputs = vision_lib.vision_inputs(pixels([[1, 4, 4]], VISION), np.array([[1, 4, 4]]), VISION)
  got = np.asarray(tower.position_embedding(table, inputs.positions, inputs.sizes))
  raster = [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15]  # table row of each patch, in merge-block order
  np.testing.assert_allclose(got, np.asarray(table)[raster], atol=1e-6)

  grid = np.asarray(table).reshape(4, 4, -1)
  inputs = vision_lib.vision_inputs(pixels([[1, 6, 10]], VISION), np.array([[1, 6, 10]]), VISION)
  got = np.asarray(tower.position_embedding(table, inputs.positions, inputs.sizes))
  for (r, c), value in zip(inputs.positions, got):
    y, x = r * 3 / 5, c * 3 / 9
    y0, x0 = min(int(y), 2), min(int(x), 2)
    dy, dx = y - y0, x - x0
    want = ((1 - dy) * (1 - dx) * grid[y0, x0] + (1 - dy) * dx * grid[y0, x0 + 1]
            + dy * (1 - dx) * grid[y0 + 1, x0] + dy * dx * grid[y0 + 1, x0 + 1])
    np.testing.assert_allclose(value, want, atol=1e-6)


def test_tower_returns_merger_then_deepstack_features(params):
  grids = np.array([[1, 4, 6]])
  features = VLModel(CONFIG).vision.apply(params["vision"], vision_lib.vision_inputs(pixels(grids, VISION), grids, VISION))
  assert features.shape == (6, 3 * 32) and VISION.feature_size == 96
  # Zero the DeepStack mergers' output layers: only their (second and third) sets of features change.
  zeroed = jax.tree.map(lambda x: x, params["vision"])
  zeroed["deepstack"] = {**zeroed["deepstack"], "fc2": 0 * zeroed["deepstack"]["fc2"],
                         "fc2_bias": 0 * zeroed["deepstack"]["fc2_bias"]}
  again = VLModel(CONFIG).vision.apply(zeroed, vision_lib.vision_inputs(pixels(grids, VISION), grids, VISION))
  np.testing.assert_array_equal(again[:, :32], features[:, :32])
  assert not np.asarray(again[:, 32:]).any() and np.asarray(features[:, 32:]).any()


def test_deepstack_reaches_image_tokens_only_after_their_layers(params):
  """The DeepStack features move the logits of image tokens and what follows, not the text before the image;
  a text-only row in the same batch is the language model's."""
  tokens, mask, pos, _, grids, pixels = image_batch(CONFIG)
  model = VLModel(CONFIG)
  features = model.vision.apply(params["vision"], vision_lib.vision_inputs(pixels, grids, VISION))
  with_ds = np.asarray(model.apply(params, tokens, pos, image_features=features, attention_mask=mask).logits)
  only_main = features.at[:, 32:].set(0)
  without = np.asarray(model.apply(params, tokens, pos, image_features=only_main, attention_mask=mask).logits)
  first_image = int(np.argmax(tokens[0] == IMG))
  np.testing.assert_array_equal(with_ds[0, :first_image], without[0, :first_image])
  assert (np.abs(with_ds[0, first_image:] - without[0, first_image:]).max(axis=-1) > 0).all()
  text = Model(TEXT).apply(params, tokens[1:], np.maximum(np.cumsum(mask[1:], -1) - 1, 0),
                           attention_mask=mask[1:]).logits
  np.testing.assert_allclose(with_ds[1][mask[1]], np.asarray(text)[0][mask[1]], atol=1e-5)


def test_learner_image_features_equal_the_processor_path(params):
  """VLModel.image_features (uint8 images normalised inside jit, by Qwen3-VL's mean and std) equals the tower on
  ImageLayout.pixel_values, the sampler's path, and lays the valid images first."""
  model = VLModel(CONFIG)
  layout = images_lib.ImageLayout.from_config(CONFIG)
  assert layout.image_mean == (0.5, 0.5, 0.5) and layout.factor == 4
  images = np.random.default_rng(1).integers(0, 256, (2, 8, 12, 3), dtype=np.uint8)
  got = model.image_features(params, images, np.array([False, True]))
  want = []
  for image in images[::-1]:
    patches, grid = layout.pixel_values([image])
    want.append(model.vision.apply(params["vision"], vision_lib.vision_inputs(patches, grid, VISION)))
  np.testing.assert_allclose(got, np.concatenate(want), atol=1e-5)
