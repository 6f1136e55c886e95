"""The Qwen2.5-VL model's own invariants (hand-computed positions and windows), and what both families' models
keep: text-only prompts are the language model, padding and sharding change nothing, decoding after an image
continues the prompt's positions, the train step learns through the tower. (Qwen3-VL's own: test_qwen3_vl.py;
parity with transformers: tests/hf/test_vl_hf.py.)"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from explore_jax.models import vision as vision_lib
from explore_jax.models import vl as vl_lib
from explore_jax.models.config import VL_PRESETS, vl_preset
from explore_jax.models.transformer import Model, apply_rope, rope_angles
from explore_jax.models.vl import VLModel
from explore_jax.parallel import DEFAULT_RULES, logical_to_spec, make_mesh, tree_shardings
from tests.models.vl_families import (CONFIGS, END, FAMILIES, IMG, MESHES, START, batch, draw_params, image_batch,
                                      pixels)

CONFIG = CONFIGS["qwen2.5-vl"]
TEXT, VISION = CONFIG.text, CONFIG.vision
# Where the rules put some of the tower's weights on the (1, 2, 4) mesh, as they put the language model's.
TOWER_SPECS = {
    "qwen2.5-vl": {("layers", "gate"): P(None, "fsdp", "tensor"), ("merger", "fc2"): P("tensor", "fsdp"),
                   ("patch_embed",): P(None, "fsdp")},
    "qwen3-vl": {("layers", "fc1"): P(None, "fsdp", "tensor"), ("deepstack", "fc2"): P(None, "tensor", "fsdp"),
                 ("pos_embed",): P(None, "fsdp")},
}


@functools.cache
def _params(family):
  return draw_params(CONFIGS[family])


@pytest.fixture(scope="module")
def params():
  return _params("qwen2.5-vl")


def test_param_counts_and_axes_cover_every_leaf():
  model = VLModel(CONFIG)
  params = jax.eval_shape(model.init, jax.random.key(0))
  assert CONFIG.num_params() == sum(x.size for x in jax.tree.leaves(params))
  assert jax.tree.structure(params) == jax.tree.structure(model.param_shapes())
  shapes = jax.tree.leaves(model.param_shapes())
  axes = jax.tree.leaves(model.param_axes(), is_leaf=lambda x: isinstance(x, tuple))
  assert len(shapes) == len(axes) and all(len(a) == len(s.shape) for a, s in zip(axes, shapes))
  for a in axes:  # every name has a rule, so the default table places every leaf
    logical_to_spec(a, DEFAULT_RULES)
  tiny = vl_preset("tiny-vl")
  assert tiny.vision.num_params() == sum(
      x.size for x in jax.tree.leaves(jax.eval_shape(VLModel(tiny).vision.init, jax.random.key(0))))
  assert 3e6 < tiny.num_params() < 6e6 and tiny.text.vocab_size % 8 == 0
  assert 3.6e9 < VL_PRESETS["qwen2.5-vl-3b"].num_params() < 3.9e9


def test_config_errors_name_the_problem():
  with pytest.raises(ValueError, match="must sum to head_dim/2"):
    TEXT.replace(mrope_section=(2, 2, 2))
  with pytest.raises(ValueError, match="out_hidden_size"):
    CONFIG.replace(vision=VISION.replace(out_hidden_size=16))
  with pytest.raises(ValueError, match="smaller than one merged token"):
    VISION.replace(window_size=2)
  with pytest.raises(ValueError, match="3-part mrope_section"):
    CONFIG.replace(text=TEXT.replace(mrope_section=()))


def test_mrope_positions_by_hand():
  """Two text tokens and <start>, a 4 x 6-patch image (2 x 3 merged tokens), <end> and one more token."""
  row = [1, 2, START] + [IMG] * 6 + [END, 3]
  tokens, mask = batch([row, [4, 5]])
  pos, deltas = vl_lib.mrope_positions(tokens, mask, np.array([[1, 4, 6]]), CONFIG)
  text = lambda p: [p, p, p]
  image = [[3, 3 + r, 3 + c] for r in range(2) for c in range(3)]
  assert pos[0].tolist() == [text(0), text(1), text(2)] + image + [text(6), text(7)]
  # The next token sits at index 11 among the real ones + delta = 8, one after the last position.
  assert deltas.tolist() == [8 - 11, 0]
  assert pos[1].tolist() == [[0, 0, 0]] * 9 + [text(0), text(1)]  # left padding at 0


def test_mrope_positions_reject_a_layout_that_does_not_match_the_grids():
  tokens, mask = batch([[1, START] + [IMG] * 5 + [END]])
  with pytest.raises(ValueError, match="needs 6 consecutive image tokens"):
    vl_lib.mrope_positions(tokens, mask, np.array([[1, 4, 6]]), CONFIG)
  with pytest.raises(ValueError, match="more images in the prompt"):
    vl_lib.mrope_positions(tokens, mask, None, CONFIG)
  tokens, mask = batch([[1, 2]])
  with pytest.raises(ValueError, match="more images than the prompts"):
    vl_lib.mrope_positions(tokens, mask, np.array([[1, 4, 6]]), CONFIG)


def test_window_and_full_segments_by_hand():
  """A 6 x 10-patch image is 3 x 5 merged tokens: windows of 2 x 2 cut short on the right and at the bottom."""
  grids = np.array([[1, 6, 10], [1, 2, 2]])
  inputs = vision_lib.vision_inputs(pixels(grids, VISION), grids, VISION, pad_to=72)
  merged_windows = [0, 0, 1, 1, 2, 0, 0, 1, 1, 2, 3, 3, 4, 4, 5]  # raster order over the merged tokens
  assert inputs.segments[:60, 1].tolist() == np.repeat(merged_windows, 4).tolist()
  assert inputs.segments[60:64].tolist() == [[1, 6]] * 4  # the second image: its own frame and window
  assert (inputs.segments[:60, 0] == 0).all() and (inputs.segments[64:] == vision_lib.PADDING).all()
  # Each merge block's 4 patches are consecutive: (row, column) of the first block, then of the second.
  assert inputs.positions[:8].tolist() == [[0, 0], [0, 1], [1, 0], [1, 1], [0, 2], [0, 3], [1, 2], [1, 3]]


def test_rope_with_equal_coordinates_is_plain_rope():
  pos = jnp.arange(12).reshape(2, 6)
  inv = 1.0 / (100.0 ** (jnp.arange(0, 8, 2) / 8))
  x = jax.random.normal(jax.random.key(0), (2, 6, 3, 8))
  plain = apply_rope(x, rope_angles(pos, inv))
  np.testing.assert_array_equal(apply_rope(x, rope_angles(jnp.stack([pos] * 3, -1), inv, (2, 1, 1))), plain)


def test_image_features_replace_image_tokens_in_order(params):
  grids = np.array([[1, 2, 4], [1, 2, 2]])  # 2 + 1 merged tokens
  tokens, mask = batch([[1, START, IMG, IMG, END], [START, IMG, END, 2]])
  inputs = vision_lib.vision_inputs(pixels(grids, VISION), grids, VISION)
  model = VLModel(CONFIG)
  x = model.embed(params, jnp.asarray(tokens), inputs)
  features = model.vision.apply(params["vision"], inputs)
  np.testing.assert_array_equal(x[0, 2:4], features[:2])
  np.testing.assert_array_equal(x[1, 2], features[2])  # after one left pad
  text = ~(tokens == IMG)
  np.testing.assert_array_equal(np.asarray(x)[text], np.asarray(params["embed"])[tokens[text]])




@pytest.mark.parametrize("family", FAMILIES)
def test_text_only_prompt_is_the_language_model(family):
  config, params = CONFIGS[family], _params(family)
  tokens, mask = batch([[1, 2, 3, 4, 5], [6, 7]])
  pos2d = np.maximum(np.cumsum(mask, -1) - 1, 0)
  pos3d, deltas = vl_lib.mrope_positions(tokens, mask, None, config)
  assert (deltas == 0).all() and (pos3d == pos2d[..., None]).all()
  text = Model(config.text).apply(params, tokens, pos2d, attention_mask=mask).logits
  np.testing.assert_array_equal(VLModel(config).apply(params, tokens, pos2d, attention_mask=mask).logits, text)
  np.testing.assert_allclose(VLModel(config).apply(params, tokens, pos3d, attention_mask=mask).logits, text,
                             atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_padding_patches_change_nothing(family):
  config, params = CONFIGS[family], _params(family)
  tokens, mask, pos, _, grids, pixels = image_batch(config)
  model = VLModel(config)
  exact = model.apply(params, tokens, pos, images=vision_lib.vision_inputs(pixels, grids, config.vision),
                      attention_mask=mask).logits
  padded = vision_lib.vision_inputs(pixels, grids, config.vision, pad_to=len(pixels) + 16)
  if family == "qwen3-vl":  # its learned position grid sees no size for the padding
    assert (padded.sizes[len(pixels):] == 0).all()
  np.testing.assert_allclose(model.apply(params, tokens, pos, images=padded, attention_mask=mask).logits, exact,
                             atol=1e-5)
  with pytest.raises(ValueError, match="multiple of 4"):
    vision_lib.vision_inputs(pixels, grids, config.vision, pad_to=len(pixels) + 2)


@pytest.mark.parametrize("family", FAMILIES)
def test_decoding_after_an_image_continues_the_prompt(family):
  """Prefill a prompt with images into the cache (Qwen3-VL's DeepStack through the unrolled layers), then decode
  text at position index + delta: the logits equal one forward pass over the whole sequence."""
  config, params = CONFIGS[family], _params(family)
  tokens, mask, pos, deltas, grids, pixels = image_batch(config)
  images = vision_lib.vision_inputs(pixels, grids, config.vision)
  more = np.array([[9, 10, 11], [12, 13, 14]], np.int32)
  full_tokens = np.concatenate([tokens, more], 1)
  full_mask = np.concatenate([mask, np.ones_like(more, bool)], 1)
  full_pos, _ = vl_lib.mrope_positions(full_tokens, full_mask, grids, config)
  model = VLModel(config)
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


@pytest.mark.parametrize("family", FAMILIES)
def test_the_sampler_decodes_after_images_as_one_forward_pass_predicts(family):
  """sampling.generate on prompts with images (prefill over image features, decoding at index + delta): greedy
  tokens are the argmax of one forward pass over prompt + response, and sampled tokens' recorded log-probs
  are that pass's log-softmax, row by row (a text-only row among them). Qwen2.5-VL's prompts come as padded
  patches; Qwen3-VL's as the tower's features (the merger's and DeepStack's side by side), as the central
  sampler passes them."""
  from explore_jax import sampling

  config, params = CONFIGS[family], _params(family)
  tokens, mask, pos, deltas, grids, pixels = image_batch(config)
  model = VLModel(config)
  if family == "qwen3-vl":
    vision = {"image_features": model.vision.apply(params["vision"],
                                                   vision_lib.vision_inputs(pixels, grids, config.vision))}
  else:
    vision = {"images": vision_lib.vision_inputs(pixels, grids, config.vision, pad_to=len(pixels) + 12)}
  n = 5
  for temperature in (0.0, 1.0):
    out = sampling.generate(model, params, tokens, mask, sampling.make_sampling_params(temperature),
                            jax.random.key(3), max_new_tokens=n, mrope=(pos, deltas), **vision)
    response = np.asarray(out.tokens)
    assert (np.asarray(out.lengths) == n).all()
    full_tokens = np.concatenate([tokens, response], 1)
    full_mask = np.concatenate([mask, np.ones_like(response, bool)], 1)
    full_pos, _ = vl_lib.mrope_positions(full_tokens, full_mask, grids, config)
    logits = np.asarray(model.apply(params, full_tokens, full_pos, attention_mask=full_mask, **vision).logits)
    predicting = logits[:, tokens.shape[1] - 1:-1]  # the logits that predict each response token
    if temperature == 0.0:
      np.testing.assert_array_equal(response, predicting.argmax(-1))
    logp = np.asarray(jax.nn.log_softmax(predicting, axis=-1))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.take_along_axis(logp, response[..., None], -1)[..., 0],
                               atol=2e-5)
  with pytest.raises(ValueError, match="mrope"):
    sampling.generate(model, params, tokens, mask, sampling.make_sampling_params(1.0), jax.random.key(3),
                      max_new_tokens=n, **vision)


@functools.cache
def _reference(family):
  """An 8-row batch and its logits on one device."""
  config = CONFIGS[family]
  tokens, mask, pos, _, grids, pixels = image_batch(config, size=8)
  images = vision_lib.vision_inputs(pixels, grids, config.vision)
  logits = jax.jit(VLModel(config).apply)(_params(family), tokens, pos, images=images, attention_mask=mask).logits
  return tokens, mask, pos, images, logits


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape", MESHES)
def test_sharded_forward_equals_single_device(family, shape):
  config, params = CONFIGS[family], _params(family)
  tokens, mask, pos, images, expected = _reference(family)
  mesh = make_mesh(shape)
  model = VLModel(config, mesh=mesh, rules=DEFAULT_RULES)
  sharded = jax.device_put(params, tree_shardings(mesh, model.param_axes(), DEFAULT_RULES, model.param_shapes()))
  data = jax.sharding.NamedSharding(mesh, logical_to_spec(("batch", "length"), DEFAULT_RULES, mesh))
  tokens, mask = jax.device_put((tokens, mask), data)
  logits = jax.jit(model.apply)(sharded, tokens, pos, images=images, attention_mask=mask).logits
  np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), atol=1e-5)
  if shape == (1, 2, 4):  # the tower's weights land where the rules put the language model's
    for path, spec in TOWER_SPECS[family].items():
      leaf = functools.reduce(lambda tree, key: tree[key], path, sharded["vision"])
      assert leaf.sharding.spec == spec, path


@pytest.mark.parametrize("family", FAMILIES)
def test_sft_steps_learn_to_tell_two_images_apart(family):
  """One question about two different images with two different answers: the rows differ only in their pixels,
  so the project's train step can fit the answers only through the vision tower (Qwen3-VL's learned positions
  and DeepStack included in the gradient)."""
  from explore_jax.train import sft, state as state_lib

  config, params = CONFIGS[family], _params(family)
  grids = np.array([[1, 4, 4], [1, 4, 4]])
  answers = np.array([10, 11])
  tokens, mask = batch([[1, 2] + vl_lib.image_tokens(g, config) + [3, int(a)] for g, a in zip(grids, answers)])
  pos, _ = vl_lib.mrope_positions(tokens, mask, grids, config)
  data = {"tokens": tokens, "attention_mask": mask, "positions": pos,
          "images": vision_lib.vision_inputs(pixels(grids, config.vision, seed=3), grids, config.vision)}

  def answer_loss(model, p, b):
    logits = model.apply(p, b["tokens"], b["positions"], images=b["images"], attention_mask=b["attention_mask"])
    logp = jax.nn.log_softmax(logits.logits[:, -2])
    loss = -jnp.mean(jnp.take_along_axis(logp, b["tokens"][:, -1:], -1))
    return loss, {"answer_accuracy": jnp.mean(jnp.argmax(logp, -1) == b["tokens"][:, -1])}

  optimizer = state_lib.make_optimizer(3e-3)
  step = sft.make_train_step(VLModel(config), optimizer, loss_fn=answer_loss)
  state = state_lib.create_train_state(jax.tree.map(jnp.copy, params), optimizer)
  first = None
  for _ in range(30):
    state, metrics = step(state, data)
    first = float(metrics["loss"]) if first is None else first
  assert float(metrics["loss"]) < 0.1 * first and float(metrics["answer_accuracy"]) == 1.0
  if family == "qwen3-vl":
    moved = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - np.asarray(b)), state.params["vision"],
                         params["vision"])
    assert moved["pos_embed"].max() > 0 and moved["patch_embed_bias"].max() > 0
    assert moved["deepstack"]["fc1"].max(axis=(1, 2)).min() > 0  # both DeepStack mergers learned
