"""The Qwen3-VL model's own invariants: the interleaved multimodal RoPE and the learned position grid by hand, the
config's checks, text-only prompts are the language model, padding, decoding and sharding change nothing, the
learner's per-image features equal the sampler's. (Parity with transformers: tests/hf/test_qwen3_vl_hf.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from explore_jax import images as images_lib
from explore_jax.models import vision as vision_lib
from explore_jax.models import vl as vl_lib
from explore_jax.models.config import (VL_PRESETS, ModelConfig, VisionConfig, VLConfig, mrope_coordinates,
                                       vl_preset)
from explore_jax.models.transformer import Model, apply_rope, rope_angles
from explore_jax.models.vl import VLModel
from explore_jax.parallel import DEFAULT_RULES, logical_to_spec, make_mesh, tree_shardings

# head_dim 8: four rotary frequencies, interleaved as temporal, height, width, temporal.
TEXT = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=4, num_kv_heads=2,
                   head_dim=8, qk_norm=True, mrope_section=(2, 1, 1), mrope_interleaved=True)
# 2-pixel patches, a 4 x 4 learned position grid, DeepStack after blocks 0 and 2 into language layers 0 and 1.
VISION = VisionConfig(depth=3, hidden_size=16, intermediate_size=24, num_heads=2, out_hidden_size=32, patch_size=2,
                      fullatt_block_indexes=(), family="qwen3-vl", num_position_embeddings=16,
                      deepstack_visual_indexes=(0, 2))
CONFIG = VLConfig(TEXT, VISION, image_token_id=60, vision_start_token_id=61, vision_end_token_id=62)
IMG, START, END = 60, 61, 62
MESHES = [(8, 1, 1), (2, 2, 2), (1, 2, 4)]


@pytest.fixture(scope="module")
def params():
  """Random weights drawn on the host (no compile): norms around 1, biases non-zero, so a misplaced leaf shows."""
  rng = np.random.default_rng(0)

  def draw(path, shape):
    name = jax.tree_util.keystr(path)
    if "norm" in name and "bias" not in name:
      return rng.uniform(0.5, 1.5, shape.shape).astype(np.float32)
    return rng.normal(0.0, 0.1 if "bias" in name else 0.2, shape.shape).astype(np.float32)

  return jax.tree_util.tree_map_with_path(draw, VLModel(CONFIG).param_shapes())


def _pixels(grids, seed=0):
  n = int(np.prod(grids, axis=1).sum())
  return np.random.default_rng(seed).standard_normal((n, VISION.patch_dim)).astype(np.float32)


def _batch(rows, pad=0):
  """Left-padded token ids and mask of `rows`."""
  width = max(len(r) for r in rows)
  tokens = np.full((len(rows), width), pad, np.int32)
  mask = np.zeros((len(rows), width), bool)
  for i, r in enumerate(rows):
    tokens[i, width - len(r):], mask[i, width - len(r):] = r, True
  return tokens, mask


def _image_batch(batch=2):
  """`batch` rows alternating an image prompt (two images in the first row) and text only."""
  grids, rows = [], []
  for r in range(batch):
    if r % 2:
      rows.append([5 + r, 6, 7])
      continue
    g = [1, 6, 10] if r == 0 else [1, 4, 4]
    grids.append(g)
    row = [1, 2] + vl_lib.image_tokens(g, CONFIG) + [3, 4]
    if r == 0:
      grids.append([1, 2, 6])
      row += vl_lib.image_tokens([1, 2, 6], CONFIG) + [5]
    rows.append(row)
  tokens, mask = _batch(rows)
  grids = np.array(grids)
  pos, deltas = vl_lib.mrope_positions(tokens, mask, grids, CONFIG)
  return tokens, mask, pos, deltas, grids, _pixels(grids)


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
  inputs = vision_lib.vision_inputs(_pixels([[1, 4, 4]]), np.array([[1, 4, 4]]), VISION)
  got = np.asarray(tower.position_embedding(table, inputs.positions, inputs.sizes))
  raster = [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15]  # table row of each patch, in merge-block order
  np.testing.assert_allclose(got, np.asarray(table)[raster], atol=1e-6)

  grid = np.asarray(table).reshape(4, 4, -1)
  inputs = vision_lib.vision_inputs(_pixels([[1, 6, 10]]), np.array([[1, 6, 10]]), VISION)
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
  features = VLModel(CONFIG).vision.apply(params["vision"], vision_lib.vision_inputs(_pixels(grids), grids, VISION))
  assert features.shape == (6, 3 * 32) and VISION.feature_size == 96
  # Zero the DeepStack mergers' output layers: only their (second and third) sets of features change.
  zeroed = jax.tree.map(lambda x: x, params["vision"])
  zeroed["deepstack"] = {**zeroed["deepstack"], "fc2": 0 * zeroed["deepstack"]["fc2"],
                         "fc2_bias": 0 * zeroed["deepstack"]["fc2_bias"]}
  again = VLModel(CONFIG).vision.apply(zeroed, vision_lib.vision_inputs(_pixels(grids), grids, VISION))
  np.testing.assert_array_equal(again[:, :32], features[:, :32])
  assert not np.asarray(again[:, 32:]).any() and np.asarray(features[:, 32:]).any()


def test_text_only_prompt_is_the_language_model(params):
  tokens, mask = _batch([[1, 2, 3, 4, 5], [6, 7]])
  pos2d = np.maximum(np.cumsum(mask, -1) - 1, 0)
  pos3d, deltas = vl_lib.mrope_positions(tokens, mask, None, CONFIG)
  assert (deltas == 0).all() and (pos3d == pos2d[..., None]).all()
  text = Model(TEXT).apply(params, tokens, pos2d, attention_mask=mask).logits
  np.testing.assert_array_equal(VLModel(CONFIG).apply(params, tokens, pos2d, attention_mask=mask).logits, text)
  np.testing.assert_allclose(VLModel(CONFIG).apply(params, tokens, pos3d, attention_mask=mask).logits, text,
                             atol=1e-6)


def test_deepstack_reaches_image_tokens_only_after_their_layers(params):
  """The DeepStack features move the logits of image tokens and what follows, not the text before the image;
  a text-only row in the same batch is the language model's."""
  tokens, mask, pos, _, grids, pixels = _image_batch()
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


def test_padding_patches_change_nothing(params):
  tokens, mask, pos, _, grids, pixels = _image_batch()
  model = VLModel(CONFIG)
  exact = model.apply(params, tokens, pos, images=vision_lib.vision_inputs(pixels, grids, VISION),
                      attention_mask=mask).logits
  padded = vision_lib.vision_inputs(pixels, grids, VISION, pad_to=len(pixels) + 16)
  assert (padded.sizes[len(pixels):] == 0).all()
  np.testing.assert_allclose(model.apply(params, tokens, pos, images=padded, attention_mask=mask).logits, exact,
                             atol=1e-5)


def test_decoding_after_an_image_continues_the_prompt(params):
  """Prefill a prompt with images into the cache (DeepStack through the unrolled layers), then decode text at
  position index + delta: the logits equal one forward pass over the whole sequence."""
  tokens, mask, pos, deltas, grids, pixels = _image_batch()
  images = vision_lib.vision_inputs(pixels, grids, VISION)
  more = np.array([[9, 10, 11], [12, 13, 14]], np.int32)
  full_tokens = np.concatenate([tokens, more], 1)
  full_mask = np.concatenate([mask, np.ones_like(more, bool)], 1)
  full_pos, _ = vl_lib.mrope_positions(full_tokens, full_mask, grids, CONFIG)
  model = VLModel(CONFIG)
  full = model.apply(params, full_tokens, full_pos, images=images, attention_mask=full_mask).logits
  out = model.apply(params, tokens, pos, model.init_cache(2, full_tokens.shape[1]), images=images,
                    attention_mask=mask)
  steps, cache = [out.logits], out.cache
  decode = jax.jit(model.apply)  # one compile for the three steps
  for j in range(more.shape[1]):
    step_pos = (mask.sum(1) + j + deltas)[:, None, None] * np.ones((1, 1, 3), np.int32)
    out = decode(params, more[:, j:j + 1], step_pos, cache)
    steps.append(out.logits)
    cache = out.cache
  got = np.concatenate(steps, 1)
  np.testing.assert_allclose(got[full_mask], np.asarray(full)[full_mask], atol=1e-5)


def test_the_sampler_decodes_after_images_as_one_forward_pass_predicts(params):
  """sampling.generate from the prompts' image features (the merger's and DeepStack's side by side, as the
  central sampler passes them): greedy tokens are the argmax of one forward pass over prompt + response."""
  from explore_jax import sampling

  tokens, mask, pos, deltas, grids, pixels = _image_batch()
  model = VLModel(CONFIG)
  features = model.vision.apply(params["vision"], vision_lib.vision_inputs(pixels, grids, VISION))
  out = sampling.generate(model, params, tokens, mask, sampling.make_sampling_params(0.0), jax.random.key(3),
                          max_new_tokens=4, image_features=features, mrope=(pos, deltas))
  response = np.asarray(out.tokens)
  full_tokens = np.concatenate([tokens, response], 1)
  full_mask = np.concatenate([mask, np.ones_like(response, bool)], 1)
  full_pos, _ = vl_lib.mrope_positions(full_tokens, full_mask, grids, CONFIG)
  logits = model.apply(params, full_tokens, full_pos, image_features=features, attention_mask=full_mask).logits
  np.testing.assert_array_equal(response, np.asarray(logits)[:, tokens.shape[1] - 1:-1].argmax(-1))


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


@pytest.fixture(scope="module")
def reference(params):
  tokens, mask, pos, _, grids, pixels = _image_batch(batch=8)
  images = vision_lib.vision_inputs(pixels, grids, VISION)
  logits = jax.jit(VLModel(CONFIG).apply)(params, tokens, pos, images=images, attention_mask=mask).logits
  return tokens, mask, pos, images, logits


@pytest.mark.parametrize("shape", MESHES)
def test_sharded_forward_equals_single_device(params, reference, shape):
  tokens, mask, pos, images, expected = reference
  mesh = make_mesh(shape)
  model = VLModel(CONFIG, mesh=mesh, rules=DEFAULT_RULES)
  sharded = jax.device_put(params, tree_shardings(mesh, model.param_axes(), DEFAULT_RULES, model.param_shapes()))
  data = jax.sharding.NamedSharding(mesh, logical_to_spec(("batch", "length"), DEFAULT_RULES, mesh))
  tokens, mask = jax.device_put((tokens, mask), data)
  logits = jax.jit(model.apply)(sharded, tokens, pos, images=images, attention_mask=mask).logits
  np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), atol=1e-5)
  if shape == (1, 2, 4):  # the tower's weights land where the rules put the language model's
    assert sharded["vision"]["layers"]["fc1"].sharding.spec == P(None, "fsdp", "tensor")
    assert sharded["vision"]["deepstack"]["fc2"].sharding.spec == P(None, "tensor", "fsdp")
    assert sharded["vision"]["pos_embed"].sharding.spec == P(None, "fsdp")


def test_sft_steps_learn_to_tell_two_images_apart(params):
  """One question about two different images with two different answers: the rows differ only in their pixels,
  so the project's train step can fit the answers only through the vision tower (its learned positions and
  DeepStack included in the gradient)."""
  from explore_jax.train import sft, state as state_lib

  grids = np.array([[1, 4, 4], [1, 4, 4]])
  answers = np.array([10, 11])
  tokens, mask = _batch([[1, 2] + vl_lib.image_tokens(g, CONFIG) + [3, int(a)] for g, a in zip(grids, answers)])
  pos, _ = vl_lib.mrope_positions(tokens, mask, grids, CONFIG)
  batch = {"tokens": tokens, "attention_mask": mask, "positions": pos,
           "images": vision_lib.vision_inputs(_pixels(grids, seed=3), grids, VISION)}

  def answer_loss(model, p, b):
    logits = model.apply(p, b["tokens"], b["positions"], images=b["images"], attention_mask=b["attention_mask"])
    logp = jax.nn.log_softmax(logits.logits[:, -2])
    loss = -jnp.mean(jnp.take_along_axis(logp, b["tokens"][:, -1:], -1))
    return loss, {"answer_accuracy": jnp.mean(jnp.argmax(logp, -1) == b["tokens"][:, -1])}

  optimizer = state_lib.make_optimizer(3e-3)
  step = sft.make_train_step(VLModel(CONFIG), optimizer, loss_fn=answer_loss)
  state = state_lib.create_train_state(jax.tree.map(jnp.copy, params), optimizer)
  first = None
  for _ in range(30):
    state, metrics = step(state, batch)
    first = float(metrics["loss"]) if first is None else first
  assert float(metrics["loss"]) < 0.1 * first and float(metrics["answer_accuracy"]) == 1.0
  moved = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - np.asarray(b)), state.params["vision"], params["vision"])
  assert moved["pos_embed"].max() > 0 and moved["patch_embed_bias"].max() > 0
  assert moved["deepstack"]["fc1"].max(axis=(1, 2)).min() > 0  # both DeepStack mergers learned
