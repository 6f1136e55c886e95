"""Qwen3-VL import/export: logit parity with transformers' Qwen3VLForConditionalGeneration on prompts with images,
its multimodal positions, learned position grid and image processor layout, bit-exact round trips."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from explore_jax import hf
from explore_jax.hf import convert, convert_vl, parity, safetensors_io
from explore_jax.images import ImageLayout
from explore_jax.models import vision as vision_lib
from explore_jax.models import vl as vl_lib
from explore_jax.models.config import VL_PRESETS
from explore_jax.models.vl import VLModel

torch = pytest.importorskip("torch", reason="PyTorch (a dev extra) is the parity reference")
transformers = pytest.importorskip("transformers")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The tiny tokenizer's vision tokens (hf.tiny_vl_tokenizer) and a vocabulary padded past them.
TOKENS = dict(vision_start_token_id=4096, vision_end_token_id=4097, image_token_id=4098, video_token_id=4099)
# preprocessor_config.json of the published Qwen3-VL checkpoints (2B to 32B alike).
QWEN3_VL_PREPROCESSOR = {
    "size": {"longest_edge": 16_777_216, "shortest_edge": 65_536}, "patch_size": 16, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast"}


def make_qwen3_vl_checkpoint(directory, seed: int = 0, tie: bool = False) -> str:
  """A random transformers Qwen3-VL: a 3-block tower with 4-pixel patches, a 6 x 6 learned position grid and
  DeepStack after blocks 0 and 2; a 3-layer language model whose head_dim (24) is not hidden / heads, with
  the 12 rotary frequencies interleaved 4/4/4. Saved with the tiny-vl tokenizer. The weights are large enough
  that a wrong transpose, RoPE layout, position resampling or DeepStack step shows far above the tolerance."""
  torch.manual_seed(seed)
  config = transformers.Qwen3VLConfig(
      text_config=dict(vocab_size=4104, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6,
                       max_position_embeddings=512,
                       rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "mrope_section": [4, 4, 4],
                                        "mrope_interleaved": True}),
      vision_config=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                         patch_size=4, num_position_embeddings=36, deepstack_visual_indexes=[0, 2]),
      tie_word_embeddings=tie, **TOKENS)
  model = transformers.Qwen3VLForConditionalGeneration(config)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name and name.endswith("weight"):
        p.uniform_(0.5, 1.5)
      else:
        p.normal_(0.0, 0.1)
  model.save_pretrained(directory)
  hf.tiny_vl_tokenizer().save_pretrained(directory)
  return str(directory)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  return make_qwen3_vl_checkpoint(tmp_path_factory.mktemp("qwen3vl"))


@pytest.fixture(scope="module")
def reference(checkpoint):
  model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(checkpoint, local_files_only=True)
  return model.eval()


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_logits_match_transformers_with_images(checkpoint, padding_side):
  """One batch: images of 10 x 6 and 14 x 6 patches (taller than the 6 x 6 position grid) in the middle of the
  first and third prompts, the others text only, padded."""
  config = convert_vl.config_from_hf(checkpoint)
  assert config.family == "qwen3-vl" and config.text.mrope_interleaved and config.text.head_dim == 24
  diffs = parity.max_logit_diffs(checkpoint, padding_side=padding_side)
  assert len(diffs) == 4 and max(diffs) <= 1e-4, diffs


def test_text_only_prompt_matches_transformers(checkpoint, reference):
  pre = hf.load_pretrained(checkpoint)
  ids = pre.tokenizer("You are in a kitchen. There is a key on the table.", add_special_tokens=False)["input_ids"]
  tokens = np.asarray([ids], np.int32)
  ours = pre.model.apply(pre.params, tokens, np.arange(len(ids))[None]).logits
  with torch.no_grad():
    ref = reference(input_ids=torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
  assert np.abs(np.asarray(ours) - ref).max() <= 1e-4


def test_mrope_positions_match_get_rope_index(checkpoint, reference):
  config = convert_vl.config_from_hf(checkpoint)
  grids = np.array([[1, 6, 10], [1, 4, 4], [1, 2, 8]])
  rows = [[1, 2] + vl_lib.image_tokens(grids[0], config) + [3] + vl_lib.image_tokens(grids[1], config) + [4, 5],
          [6, 7, 8],
          vl_lib.image_tokens(grids[2], config) + [9]]
  tokens, mask = parity.pad_rows(rows, 0)
  ours, deltas = vl_lib.mrope_positions(tokens, mask, grids, config)
  ids = torch.from_numpy(tokens.astype(np.int64))
  ref, ref_deltas = reference.model.get_rope_index(ids, (ids == config.image_token_id).int(),
                                                   image_grid_thw=torch.from_numpy(grids),
                                                   attention_mask=torch.from_numpy(mask.astype(np.int64)))
  np.testing.assert_array_equal(ours[mask], ref.numpy().transpose(1, 2, 0)[mask])
  np.testing.assert_array_equal(deltas, ref_deltas.numpy().ravel())


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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_export_reimport_is_bit_exact(tmp_path, dtype):
  src = make_qwen3_vl_checkpoint(tmp_path / "src", seed=1, tie=True)
  pre = hf.load_pretrained(src, param_dtype=dtype)
  assert isinstance(pre.model, VLModel) and pre.config.text.tie_embeddings
  out = hf.save_pretrained(tmp_path / "out", pre.config, pre.params, pre.tokenizer)
  again = hf.load_pretrained(out, param_dtype=dtype)
  assert again.config == pre.config
  for a, b in zip(jax.tree.leaves(pre.params), jax.tree.leaves(again.params)):
    assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
  if dtype == "float32":  # transformers' own tensors come back unchanged, name for name
    src_r, out_r = safetensors_io.CheckpointReader(src), safetensors_io.CheckpointReader(out)
    assert sorted(src_r.keys()) == sorted(out_r.keys())
    for name in src_r.keys():
      assert np.array_equal(src_r.get(name), out_r.get(name)), name


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
  reader = safetensors_io.CheckpointReader(checkpoint)
  renamed = {n: n.replace("model.language_model.", "model.", 1).replace("model.visual.", "visual.", 1)
             for n in reader.keys()}
  entries = [(renamed[n], reader.get(n).shape, reader.get(n).dtype) for n in reader.keys()]
  by_new = {v: k for k, v in renamed.items()}
  safetensors_io.write_checkpoint(str(tmp_path), entries, lambda n: np.asarray(reader.get(by_new[n])), 2**30)
  raw = json.load(open(os.path.join(checkpoint, "config.json")))
  rope = raw["text_config"].pop("rope_parameters")
  raw["text_config"]["rope_theta"] = rope.pop("rope_theta")
  raw["text_config"]["rope_scaling"] = rope
  raw["vision_config"]["model_type"] = "qwen3_vl"
  with open(os.path.join(tmp_path, "config.json"), "w") as f:
    json.dump(raw, f)
  config = convert_vl.config_from_hf(str(tmp_path))
  assert config == convert_vl.config_from_hf(checkpoint)
  got, want = convert_vl.load_params(str(tmp_path), config), convert_vl.load_params(checkpoint, config)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert np.array_equal(np.asarray(a), np.asarray(b))


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


def test_check_hf_script_reports_parity_of_a_qwen3_vl_checkpoint(checkpoint):
  env = {**os.environ, "PYTHONPATH": REPO}  # this checkout's explore_jax, whichever one the environment installed
  run = subprocess.run([sys.executable, os.path.join(REPO, "launch", "check_hf.py"), f"--hf_dir={checkpoint}"],
                       capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
  assert run.returncode == 0, run.stderr[-2000:]
  last = run.stdout.strip().splitlines()[-1]
  assert last.startswith("max_abs_logit_diff=") and float(last.split("=")[1]) <= 1e-4
