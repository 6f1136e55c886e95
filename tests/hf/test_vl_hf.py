"""Qwen2.5-VL import/export: logit parity with transformers' Qwen2_5_VLForConditionalGeneration on prompts with
images, its multimodal positions, windows and image processor layout, bit-exact round trips."""

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

torch = pytest.importorskip("torch", reason="PyTorch (a dev extra) is the parity reference")
transformers = pytest.importorskip("transformers")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The tiny tokenizer's vision tokens (hf.tiny_vl_tokenizer) and a vocabulary padded past them.
TOKENS = dict(vision_start_token_id=4096, vision_end_token_id=4097, image_token_id=4098, video_token_id=4099)


def make_vl_checkpoint(directory, seed: int = 0, tie: bool = False) -> str:
  """A random transformers Qwen2.5-VL with a 3-block tower (block 1 full attention, the others windows of 2 x 2
  merged tokens), saved with the tiny-vl tokenizer. The weights are large enough that a wrong transpose, RoPE
  layout or window shows far above the tolerance."""
  torch.manual_seed(seed)
  config = transformers.Qwen2_5_VLConfig(
      text_config=dict(vocab_size=4104, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=512,
                       rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "mrope_section": [2, 3, 3]}),
      vision_config=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                         patch_size=4, window_size=16, fullatt_block_indexes=[1]),
      tie_word_embeddings=tie, **TOKENS)
  model = transformers.Qwen2_5_VLForConditionalGeneration(config)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name or "ln_q" in name:
        p.uniform_(0.5, 1.5)
      else:
        p.normal_(0.0, 0.1)
  model.save_pretrained(directory)
  hf.tiny_vl_tokenizer().save_pretrained(directory)
  return str(directory)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  return make_vl_checkpoint(tmp_path_factory.mktemp("vl"))


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_logits_match_transformers_with_images(checkpoint, padding_side):
  """One batch: images in the middle of the first and third prompts, the others text only, padded."""
  diffs = parity.max_logit_diffs(checkpoint, padding_side=padding_side)
  assert len(diffs) == 4 and max(diffs) <= 1e-4, diffs


def test_text_only_prompt_matches_transformers(checkpoint):
  pre = hf.load_pretrained(checkpoint)
  ids = pre.tokenizer("You are in a kitchen. There is a key on the table.", add_special_tokens=False)["input_ids"]
  tokens = np.asarray([ids], np.int32)
  ours = pre.model.apply(pre.params, tokens, np.arange(len(ids))[None]).logits
  ref_model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(checkpoint, local_files_only=True)
  with torch.no_grad():
    ref = ref_model(input_ids=torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
  assert np.abs(np.asarray(ours) - ref).max() <= 1e-4


def test_mrope_positions_match_get_rope_index(checkpoint):
  config = convert_vl.config_from_hf(checkpoint)
  grids = np.array([[1, 6, 10], [1, 4, 4], [1, 2, 8]])
  rows = [[1, 2] + vl_lib.image_tokens(grids[0], config) + [3] + vl_lib.image_tokens(grids[1], config) + [4, 5],
          [6, 7, 8],
          vl_lib.image_tokens(grids[2], config) + [9]]
  tokens, mask = parity.pad_rows(rows, 0)
  ours, deltas = vl_lib.mrope_positions(tokens, mask, grids, config)
  ref_model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(checkpoint, local_files_only=True)
  ids = torch.from_numpy(tokens.astype(np.int64))
  ref, ref_deltas = ref_model.model.get_rope_index(ids, (ids == config.image_token_id).int(),
                                                   image_grid_thw=torch.from_numpy(grids),
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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_export_reimport_is_bit_exact(tmp_path, dtype):
  src = make_vl_checkpoint(tmp_path / "src", seed=1, tie=True)
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
  reader = safetensors_io.CheckpointReader(checkpoint)
  renamed = {n: n.replace("model.", "model.language_model.", 1).replace("visual.", "model.visual.", 1)
             for n in reader.keys()}
  entries = [(renamed[n], reader.get(n).shape, reader.get(n).dtype) for n in reader.keys()]
  by_new = {v: k for k, v in renamed.items()}
  safetensors_io.write_checkpoint(str(tmp_path), entries, lambda n: np.asarray(reader.get(by_new[n])), 2**30)
  raw = json.load(open(os.path.join(checkpoint, "config.json")))
  text, vision = raw.pop("text_config"), raw.pop("vision_config")
  rope = text.pop("rope_parameters")
  vision["in_chans"] = vision.pop("in_channels")
  flat = {**raw, **text, "model_type": "qwen2_5_vl", "rope_theta": rope["rope_theta"],
          "rope_scaling": {"type": "mrope", "mrope_section": rope["mrope_section"]}, "vision_config": vision}
  with open(os.path.join(tmp_path, "config.json"), "w") as f:
    json.dump(flat, f)
  config = convert_vl.config_from_hf(str(tmp_path))
  assert config == convert_vl.config_from_hf(checkpoint)
  got, want = convert_vl.load_params(str(tmp_path), config), convert_vl.load_params(checkpoint, config)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert np.array_equal(np.asarray(a), np.asarray(b))


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


def test_check_hf_script_reports_parity_of_a_vl_checkpoint(checkpoint):
  run = subprocess.run([sys.executable, os.path.join(REPO, "launch", "check_hf.py"), f"--hf_dir={checkpoint}"],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
  assert run.returncode == 0, run.stderr[-2000:]
  last = run.stdout.strip().splitlines()[-1]
  assert last.startswith("max_abs_logit_diff=") and float(last.split("=")[1]) <= 1e-4
