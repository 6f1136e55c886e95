"""Qwen3-VL import/export, its own: the learned position grid and image processor layout match transformers',
our params exported load in Qwen3VLForConditionalGeneration, the published layout loads. (What both families
keep, logit parity, multimodal positions and bit-exact round trips: test_vl_hf.py.)"""

import json
import os

import jax
import numpy as np
import pytest

from explore_jax import hf
from explore_jax.hf import convert, convert_vl, parity
from explore_jax.images import ImageLayout
from explore_jax.models import vision as vision_lib
from explore_jax.models.config import VL_PRESETS
from explore_jax.models.vl import VLModel
from tests.hf import vl_checkpoints
from tests.hf.vl_checkpoints import checkpoints  # noqa: F401 (a fixture)

torch = pytest.importorskip("torch", reason="PyTorch (a dev extra) is the parity reference")
transformers = pytest.importorskip("transformers")

# preprocessor_config.json of the published Qwen3-VL checkpoints (2B to 32B alike).
QWEN3_VL_PREPROCESSOR = {
    "size": {"longest_edge": 16_777_216, "shortest_edge": 65_536}, "patch_size": 16, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast"}


@pytest.fixture(scope="module")
def checkpoint(checkpoints):
  return checkpoints("qwen3-vl")


@pytest.fixture(scope="module")
def reference(checkpoint):
  return vl_checkpoints.reference("qwen3-vl", checkpoint)


def test_position_embedding_matches_transformers_resampling(checkpoint, reference):
  """Our bilinear resampling of the learned grid equals transformers' taps and weights and torch's
  F.interpolate(align_corners=True), patch for patch in merge-block order, for grids smaller and larger than
  the 6 x 6 table, and a video's two frames."""
  from transformers import vision_utils

  config = convert_vl.config_from_hf(checkpoint)
  tower = VLModel(config).vision
  table = reference.model.visual.pos_embed.weight.detach()
  grids = np.array([[1, 4, 4], [1, 6, 10], [2, 8, 2], [1, 12, 6]])
  n = int(grids.prod(1).sum())
  inputs = vision_lib.vision_inputs(np.zeros((n, config.vision.patch_dim), np.float32), grids, config.vision)
  ours = np.asarray(tower.position_embedding(table.numpy(), inputs.positions, inputs.sizes))
  index, weight = vision_utils.get_vision_interpolation_indices_and_weights(
      torch.from_numpy(grids), num_grid_per_side=6, mode="bilinear", align_corners=True, spatial_merge_size=2)
  theirs = (table[index] * weight[:, :, None]).sum(1).numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-6)
  grid = table.T.reshape(1, -1, 6, 6)
  start = 0
  for t, h, w in grids.tolist():
    resized = torch.nn.functional.interpolate(grid, size=(h, w), mode="bilinear", align_corners=True)[0]
    rows, cols = inputs.positions[start:start + t * h * w].T
    np.testing.assert_allclose(ours[start:start + t * h * w], resized[:, rows, cols].T.numpy(), atol=1e-5)
    start += t * h * w


def test_image_layout_matches_the_qwen3_vl_image_processor(tmp_path):
  """ImageLayout.from_config of a Qwen3-VL config resizes as the processor a Qwen3-VL directory loads (published
  preprocessor_config.json), counts the same image tokens and normalises the same way."""
  with open(tmp_path / "preprocessor_config.json", "w") as f:
    json.dump(QWEN3_VL_PREPROCESSOR, f)
  with open(tmp_path / "config.json", "w") as f:
    json.dump({"model_type": "qwen3_vl"}, f)
  processor = transformers.AutoImageProcessor.from_pretrained(str(tmp_path))
  layout = ImageLayout.from_config(VL_PRESETS["tiny-qwen3-vl"])
  assert (layout.factor, layout.min_pixels, layout.max_pixels) == (32, 65_536, 16_777_216)
  for height, width in ((160, 210), (50, 60), (1080, 1920), (900, 40), (6000, 5000)):
    h, w = layout.target_size(height, width)
    patches = processor.get_number_of_image_patches(height, width, {})
    assert patches == (h // 16) * (w // 16), (height, width)
    assert layout.num_tokens(np.zeros((h, w, 3), np.uint8)) == patches // 4
  rng = np.random.default_rng(0)
  for height, width in ((160, 210), (256, 320)):  # resized by the rule, then already at its size
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = processor(images=[image], return_tensors="np")
    resized = layout.resize(image)
    assert out["image_grid_thw"].tolist() == [list(layout.grid(resized))]
    patches, grids = layout.pixel_values([resized])
    np.testing.assert_array_equal(grids, out["image_grid_thw"])
    if (height, width) == resized.shape[:2]:  # no resampling: the same pixels, normalised alike
      np.testing.assert_allclose(patches, out["pixel_values"], atol=1e-6)


def test_our_params_exported_load_in_transformers_with_same_logits(tmp_path):
  """tiny-qwen3-vl (16-pixel patches, the 48 x 48 position grid) with large random weights drawn by us, saved by
  save_pretrained: transformers loads the directory and computes our logits."""
  config = VL_PRESETS["tiny-qwen3-vl"]
  rng = np.random.default_rng(2)

  def draw(path, shape):
    name = jax.tree_util.keystr(path)
    if "norm" in name and "bias" not in name:
      return rng.uniform(0.5, 1.5, shape.shape).astype(np.float32)
    return rng.normal(0.0, 0.1, shape.shape).astype(np.float32)

  params = jax.tree_util.tree_map_with_path(draw, VLModel(config).param_shapes())
  out = hf.save_pretrained(tmp_path / "out", config, params, hf.tiny_vl_tokenizer())
  assert json.load(open(os.path.join(out, "config.json")))["architectures"] == ["Qwen3VLForConditionalGeneration"]
  diffs = parity.max_logit_diffs(out)
  assert max(diffs) <= 1e-4, diffs


def test_tiny_qwen3_vl_is_a_built_in_checkpoint(tmp_path, monkeypatch):
  monkeypatch.setenv("EXPLORE_JAX_CACHE", str(tmp_path))
  pre = hf.load_pretrained("tiny-qwen3-vl")
  assert pre.config == VL_PRESETS["tiny-qwen3-vl"] and isinstance(pre.model, VLModel)
  assert pre.tokenizer.convert_tokens_to_ids("<|image_pad|>") == pre.config.image_token_id
  assert os.path.basename(hf.tiny_vl_dir("tiny-qwen3-vl")).startswith("tiny-qwen3-vl-")
  assert hf.tiny_vl_dir("tiny-qwen3-vl") != hf.tiny_vl_dir("tiny-vl")


def test_flat_tensor_names_and_published_config_layout_load(tmp_path, checkpoint):
  """Tensors named without transformers' in-memory prefixes (model., visual.), and config.json as the published
  checkpoints write it (rope_scaling and rope_theta in text_config, the vision model_type 'qwen3_vl')."""

  def published(raw):
    rope = raw["text_config"].pop("rope_parameters")
    raw["text_config"]["rope_theta"] = rope.pop("rope_theta")
    raw["text_config"]["rope_scaling"] = rope
    raw["vision_config"]["model_type"] = "qwen3_vl"
    return raw

  vl_checkpoints.assert_relaid_out_checkpoint_loads_the_same(
      checkpoint, str(tmp_path),
      lambda n: n.replace("model.language_model.", "model.", 1).replace("model.visual.", "visual.", 1), published)


def test_errors_name_the_problem(tmp_path, checkpoint):
  raw = json.load(open(os.path.join(checkpoint, "config.json")))
  for name, change, match in (
      ("act", lambda c: c["vision_config"].update(hidden_act="gelu"), "only gelu_pytorch_tanh"),
      ("bias", lambda c: c["text_config"].update(attention_bias=True), "attention_bias"),
      ("grid", lambda c: c["vision_config"].update(num_position_embeddings=30), "positive square"),
      ("rope", lambda c: c["text_config"]["rope_parameters"].update(mrope_section=[2, 4, 6]), "interleaved layout")):
    changed = json.loads(json.dumps(raw))
    change(changed)
    os.makedirs(tmp_path / name)
    with open(tmp_path / name / "config.json", "w") as f:
      json.dump(changed, f)
    with pytest.raises(convert.UnsupportedCheckpointError, match=match):
      convert_vl.config_from_hf(str(tmp_path / name))
  config = convert_vl.config_from_hf(checkpoint)
  with pytest.raises(ValueError, match="q/k norms, no qkv biases"):
    convert_vl.hf_config_dict(config.replace(text=config.text.replace(qkv_bias=True)))
