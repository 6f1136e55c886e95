"""Vision-language import/export: what both families keep (logit parity with transformers on prompts with images
and text only, multimodal positions, bit-exact round trips, check_hf), and Qwen2.5-VL's own windows, image
processor layout and published layout. (Qwen3-VL's own: test_qwen3_vl_hf.py.)"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from explore_jax import hf
from explore_jax.hf import convert, convert_vl, parity, safetensors_io
from explore_jax.models import vision as vision_lib
from explore_jax.models import vl as vl_lib
from explore_jax.models.config import VL_PRESETS, VisionConfig
from explore_jax.models.vl import VLModel
from tests.hf.vl_checkpoints import (FAMILIES, MAKERS, REPO, assert_relaid_out_checkpoint_loads_the_same,
                                     reference)
from tests.hf.vl_checkpoints import checkpoints  # noqa: F401 (a fixture)

torch = pytest.importorskip("torch", reason="PyTorch (a dev extra) is the parity reference")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoint(checkpoints):
  return checkpoints("qwen2.5-vl")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_logits_match_transformers_with_images(checkpoints, family, padding_side):
  """One batch: images in the middle of the first and third prompts (Qwen3-VL's 10 x 6 and 14 x 6 patches,
  taller than its 6 x 6 position grid), the others text only, padded."""
  checkpoint = checkpoints(family)
  if family == "qwen3-vl":
    config = convert_vl.config_from_hf(checkpoint)
    assert config.family == "qwen3-vl" and config.text.mrope_interleaved and config.text.head_dim == 24
  diffs = parity.max_logit_diffs(checkpoint, padding_side=padding_side)
  assert len(diffs) == 4 and max(diffs) <= 1e-4, diffs


@pytest.mark.parametrize("family", FAMILIES)
def test_text_only_prompt_matches_transformers(checkpoints, family):
  checkpoint = checkpoints(family)
  pre = hf.load_pretrained(checkpoint)
  ids = pre.tokenizer("You are in a kitchen. There is a key on the table.", add_special_tokens=False)["input_ids"]
  tokens = np.asarray([ids], np.int32)
  ours = pre.model.apply(pre.params, tokens, np.arange(len(ids))[None]).logits
  with torch.no_grad():
    ref = reference(family, checkpoint)(input_ids=torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
  assert np.abs(np.asarray(ours) - ref).max() <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_mrope_positions_match_get_rope_index(checkpoints, family):
  checkpoint = checkpoints(family)
  config = convert_vl.config_from_hf(checkpoint)
  grids = np.array([[1, 6, 10], [1, 4, 4], [1, 2, 8]])
  rows = [[1, 2] + vl_lib.image_tokens(grids[0], config) + [3] + vl_lib.image_tokens(grids[1], config) + [4, 5],
          [6, 7, 8],
          vl_lib.image_tokens(grids[2], config) + [9]]
  tokens, mask = parity.pad_rows(rows, 0)
  ours, deltas = vl_lib.mrope_positions(tokens, mask, grids, config)
  ids = torch.from_numpy(tokens.astype(np.int64))
  ref, ref_deltas = reference(family, checkpoint).model.get_rope_index(
      ids, (ids == config.image_token_id).int(), image_grid_thw=torch.from_numpy(grids),
      attention_mask=torch.from_numpy(mask.astype(np.int64)))
  np.testing.assert_array_equal(ours[mask], ref.numpy().transpose(1, 2, 0)[mask])
  np.testing.assert_array_equal(deltas, ref_deltas.numpy().ravel())


def test_windows_and_rope_positions_match_transformers():
  """Our segments group the patches exactly as transformers' window permutation and cu_seqlens do."""
  from transformers import vision_utils

  config = VisionConfig(depth=2, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=8,
                                   patch_size=4, window_size=16, fullatt_block_indexes=(1,))
  grids = np.array([[1, 6, 10], [1, 4, 4], [2, 8, 6]])  # the last one has two frames
  n = int(grids.prod(1).sum())
  inputs = vision_lib.vision_inputs(np.zeros((n, config.patch_dim), np.float32), grids, config)
  g = torch.from_numpy(grids)
  m, unit = config.spatial_merge_size, config.merge_unit
  np.testing.assert_array_equal(inputs.positions, vision_utils.get_vision_position_ids(g, m).numpy())
  window_index, cu_windows = vision_utils.get_vision_window_index(g, m, config.window_size, config.patch_size)
  permuted = (window_index.numpy()[:, None] * unit + np.arange(unit)).reshape(-1)  # patch order by window
  window_of = np.repeat(np.arange(len(cu_windows) - 1), np.diff(cu_windows.numpy()))
  frame_of = np.repeat(np.arange(int(grids[:, 0].sum())), np.repeat(grids[:, 1] * grids[:, 2], grids[:, 0]))
  for kind, theirs in ((1, window_of), (0, frame_of[permuted])):
    ours = inputs.segments[permuted, kind]
    same_ours, same_theirs = ours[:, None] == ours[None], theirs[:, None] == theirs[None]
    np.testing.assert_array_equal(same_ours, same_theirs)


def test_patchify_matches_the_image_processor():
  from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

  config = VisionConfig(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=8,
                                   patch_size=4, fullatt_block_indexes=())
  processor = Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2)
  image = np.random.default_rng(0).integers(0, 256, (24, 40, 3), dtype=np.uint8)
  out = processor(images=[image], return_tensors="np", do_resize=False)
  normalised = (image / 255.0 - np.asarray(processor.image_mean)) / np.asarray(processor.image_std)
  patches, grid = vision_lib.patchify(normalised, config)
  assert out["image_grid_thw"].tolist() == [list(grid)]
  np.testing.assert_allclose(patches, out["pixel_values"], atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_export_reimport_is_bit_exact(tmp_path, family, dtype):
  src = MAKERS[family](tmp_path / "src", seed=1, tie=True)
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


def test_tiny_vl_export_loads_in_transformers_with_same_logits(tmp_path, monkeypatch):
  monkeypatch.setenv("EXPLORE_JAX_CACHE", str(tmp_path))
  pre = hf.load_pretrained("tiny-vl")
  assert pre.config == VL_PRESETS["tiny-vl"] and isinstance(pre.model, VLModel)
  assert pre.tokenizer.convert_tokens_to_ids("<|image_pad|>") == pre.config.image_token_id
  assert max(parity.max_logit_diffs(hf.tiny_vl_dir())) <= 1e-4  # real patch geometry: 14-pixel patches


def test_in_memory_tensor_names_and_published_config_layout_load(tmp_path, checkpoint):
  """Tensors named as transformers' modules are in memory (model.language_model., model.visual.), and the flat
  config.json of published checkpoints (text fields at the top, rope_scaling of type mrope, in_chans)."""

  def flat(raw):
    text, vision = raw.pop("text_config"), raw.pop("vision_config")
    rope = text.pop("rope_parameters")
    vision["in_chans"] = vision.pop("in_channels")
    return {**raw, **text, "model_type": "qwen2_5_vl", "rope_theta": rope["rope_theta"],
            "rope_scaling": {"type": "mrope", "mrope_section": rope["mrope_section"]}, "vision_config": vision}

  assert_relaid_out_checkpoint_loads_the_same(
      checkpoint, str(tmp_path),
      lambda n: n.replace("model.", "model.language_model.", 1).replace("visual.", "model.visual.", 1), flat)


def test_errors_name_the_problem(tmp_path, checkpoint):
  raw = json.load(open(os.path.join(checkpoint, "config.json")))
  raw["text_config"]["use_sliding_window"] = True
  os.makedirs(tmp_path / "a")
  with open(tmp_path / "a" / "config.json", "w") as f:
    json.dump(raw, f)
  with pytest.raises(convert.UnsupportedCheckpointError, match="use_sliding_window"):
    convert_vl.config_from_hf(str(tmp_path / "a"))
  config = convert_vl.config_from_hf(checkpoint)
  with pytest.raises(ValueError, match="qkv biases, no q/k norms"):
    convert_vl.hf_config_dict(config.replace(text=config.text.replace(qk_norm=True)))


@pytest.mark.parametrize("family", FAMILIES)
def test_check_hf_script_reports_parity_of_a_vl_checkpoint(checkpoints, family):
  env = {**os.environ, "PYTHONPATH": REPO}  # this checkout's explore_jax, whichever one the environment installed
  run = subprocess.run([sys.executable, os.path.join(REPO, "launch", "check_hf.py"),
                        f"--hf_dir={checkpoints(family)}"], capture_output=True, text=True, timeout=300, cwd=REPO,
                       env=env)
  assert run.returncode == 0, run.stderr[-2000:]
  last = run.stdout.strip().splitlines()[-1]
  assert last.startswith("max_abs_logit_diff=") and float(last.split("=")[1]) <= 1e-4
