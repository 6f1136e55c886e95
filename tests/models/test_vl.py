"""The Qwen2.5-VL model's own invariants: hand-computed positions and windows, text-only prompts are the language
model, padding and sharding change nothing, decoding after an image continues the prompt's positions.
(Parity with transformers: tests/hf/test_vl_hf.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from explore_jax.models import vision as vision_lib
from explore_jax.models import vl as vl_lib
from explore_jax.models.config import VL_PRESETS, ModelConfig, VisionConfig, VLConfig, vl_preset
from explore_jax.models.transformer import Model, apply_rope, rope_angles
from explore_jax.models.vl import VLModel
from explore_jax.parallel import DEFAULT_RULES, logical_to_spec, make_mesh, tree_shardings

TEXT = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=8, qkv_bias=True, mrope_section=(2, 1, 1))
# Windows of 2 x 2 merged tokens (8 pixels = 2 merged tokens of 2 x 2 patches of 2 pixels), full attention in block 1.
VISION = VisionConfig(depth=3, hidden_size=16, intermediate_size=24, num_heads=2, out_hidden_size=32, patch_size=2,
                      window_size=8, fullatt_block_indexes=(1,))
CONFIG = VLConfig(TEXT, VISION, image_token_id=60, vision_start_token_id=61, vision_end_token_id=62)
IMG, START, END = 60, 61, 62
MESHES = [(8, 1, 1), (2, 2, 2), (1, 2, 4)]


@pytest.fixture(scope="module")
def params():
  """Random weights drawn on the host (no compile): norms around 1, biases non-zero, so a misplaced leaf shows."""
  rng = np.random.default_rng(0)

  def draw(path, shape):
    name = jax.tree_util.keystr(path)
    if "norm" in name:
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
  tokens, mask = _batch([row, [4, 5]])
  pos, deltas = vl_lib.mrope_positions(tokens, mask, np.array([[1, 4, 6]]), CONFIG)
  text = lambda p: [p, p, p]
  image = [[3, 3 + r, 3 + c] for r in range(2) for c in range(3)]
  assert pos[0].tolist() == [text(0), text(1), text(2)] + image + [text(6), text(7)]
  # The next token sits at index 11 among the real ones + delta = 8, one after the last position.
  assert deltas.tolist() == [8 - 11, 0]
  assert pos[1].tolist() == [[0, 0, 0]] * 9 + [text(0), text(1)]  # left padding at 0


def test_mrope_positions_reject_a_layout_that_does_not_match_the_grids():
  tokens, mask = _batch([[1, START] + [IMG] * 5 + [END]])
  with pytest.raises(ValueError, match="needs 6 consecutive image tokens"):
    vl_lib.mrope_positions(tokens, mask, np.array([[1, 4, 6]]), CONFIG)
  with pytest.raises(ValueError, match="more images in the prompt"):
    vl_lib.mrope_positions(tokens, mask, None, CONFIG)
  tokens, mask = _batch([[1, 2]])
  with pytest.raises(ValueError, match="more images than the prompts"):
    vl_lib.mrope_positions(tokens, mask, np.array([[1, 4, 6]]), CONFIG)


def test_window_and_full_segments_by_hand():
  """A 6 x 10-patch image is 3 x 5 merged tokens: windows of 2 x 2 cut short on the right and at the bottom."""
  grids = np.array([[1, 6, 10], [1, 2, 2]])
  inputs = vision_lib.vision_inputs(_pixels(grids), grids, VISION, pad_to=72)
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


def test_text_only_prompt_is_the_language_model(params):
  tokens, mask = _batch([[1, 2, 3, 4, 5], [6, 7]])
  pos2d = np.maximum(np.cumsum(mask, -1) - 1, 0)
  pos3d, deltas = vl_lib.mrope_positions(tokens, mask, None, CONFIG)
  assert (deltas == 0).all() and (pos3d == pos2d[..., None]).all()
  text = Model(TEXT).apply(params, tokens, pos2d, attention_mask=mask).logits
  np.testing.assert_array_equal(VLModel(CONFIG).apply(params, tokens, pos2d, attention_mask=mask).logits, text)
  np.testing.assert_allclose(VLModel(CONFIG).apply(params, tokens, pos3d, attention_mask=mask).logits, text,
                             atol=1e-6)


def test_image_features_replace_image_tokens_in_order(params):
  grids = np.array([[1, 2, 4], [1, 2, 2]])  # 2 + 1 merged tokens
  tokens, mask = _batch([[1, START, IMG, IMG, END], [START, IMG, END, 2]])
  inputs = vision_lib.vision_inputs(_pixels(grids), grids, VISION)
  model = VLModel(CONFIG)
  x = model.embed(params, jnp.asarray(tokens), inputs)
  features = model.vision.apply(params["vision"], inputs)
  np.testing.assert_array_equal(x[0, 2:4], features[:2])
  np.testing.assert_array_equal(x[1, 2], features[2])  # after one left pad
  text = ~(tokens == IMG)
  np.testing.assert_array_equal(np.asarray(x)[text], np.asarray(params["embed"])[tokens[text]])


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


def test_padding_patches_change_nothing(params):
  tokens, mask, pos, _, grids, pixels = _image_batch()
  model = VLModel(CONFIG)
  exact = model.apply(params, tokens, pos, images=vision_lib.vision_inputs(pixels, grids, VISION),
                      attention_mask=mask).logits
  padded = vision_lib.vision_inputs(pixels, grids, VISION, pad_to=len(pixels) + 16)
  np.testing.assert_allclose(model.apply(params, tokens, pos, images=padded, attention_mask=mask).logits, exact,
                             atol=1e-5)
  with pytest.raises(ValueError, match="multiple of 4"):
    vision_lib.vision_inputs(pixels, grids, VISION, pad_to=len(pixels) + 2)


def test_decoding_after_an_image_continues_the_prompt(params):
  """Prefill a prompt with images into the cache, then decode text at position index + delta: the logits
  equal one forward pass over the whole sequence."""
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
  """sampling.generate on prompts with images (prefill over image features, decoding at index + delta): greedy
  tokens are the argmax of one forward pass over prompt + response, and sampled tokens' recorded log-probs
  are that pass's log-softmax, row by row (a text-only row among them)."""
  from explore_jax import sampling

  tokens, mask, pos, deltas, grids, pixels = _image_batch()
  images = vision_lib.vision_inputs(pixels, grids, VISION, pad_to=len(pixels) + 12)
  model = VLModel(CONFIG)
  n = 5
  for temperature in (0.0, 1.0):
    out = sampling.generate(model, params, tokens, mask, sampling.make_sampling_params(temperature),
                            jax.random.key(3), max_new_tokens=n, images=images, mrope=(pos, deltas))
    response = np.asarray(out.tokens)
    assert (np.asarray(out.lengths) == n).all()
    full_tokens = np.concatenate([tokens, response], 1)
    full_mask = np.concatenate([mask, np.ones_like(response, bool)], 1)
    full_pos, _ = vl_lib.mrope_positions(full_tokens, full_mask, grids, CONFIG)
    logits = np.asarray(model.apply(params, full_tokens, full_pos, images=images, attention_mask=full_mask).logits)
    predicting = logits[:, tokens.shape[1] - 1:-1]  # the logits that predict each response token
    if temperature == 0.0:
      np.testing.assert_array_equal(response, predicting.argmax(-1))
    logp = np.asarray(jax.nn.log_softmax(predicting, axis=-1))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.take_along_axis(logp, response[..., None], -1)[..., 0],
                               atol=2e-5)
  with pytest.raises(ValueError, match="mrope"):
    sampling.generate(model, params, tokens, mask, sampling.make_sampling_params(1.0), jax.random.key(3),
                      max_new_tokens=n, images=images)


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
    assert sharded["vision"]["layers"]["gate"].sharding.spec == P(None, "fsdp", "tensor")
    assert sharded["vision"]["merger"]["fc2"].sharding.spec == P("tensor", "fsdp")
    assert sharded["vision"]["patch_embed"].sharding.spec == P(None, "fsdp")


def test_sft_steps_learn_to_tell_two_images_apart(params):
  """One question about two different images with two different answers: the rows differ only in their pixels,
  so the project's train step can fit the answers only through the vision tower."""
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
