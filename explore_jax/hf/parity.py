"""Logit parity between our import of a checkpoint and transformers' PyTorch implementation of it.

A Qwen2.5-VL or Qwen3-VL checkpoint is compared on the same prompts with a random image in the middle of every
other one (one left-padded batch mixing image and text-only rows); transformers computes its own multimodal
positions, so the comparison covers our mrope_positions too.
"""

from __future__ import annotations

import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from explore_jax.hf import convert, convert_vl, gguf_import, load_tokenizer
from explore_jax.models import vision as vision_lib
from explore_jax.models import vl as vl_lib
from explore_jax.models.config import VLConfig
from explore_jax.models.transformer import Model, positions_from_mask

DEFAULT_PROMPTS = (
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "You are in a kitchen. There is a locked door to the north and a key on the table.",
    "Hello",
    "<|im_start|>user\nWrite a function that reverses a list.<|im_end|>\n<|im_start|>assistant\n",
)


def padded_batch(tokenizer, prompts: Sequence[str], padding_side: str = "left") -> tuple[np.ndarray, np.ndarray]:
  """Token ids and attention mask of `prompts`, padded to the longest with the tokenizer's pad id."""
  ids = [tokenizer(p, add_special_tokens=False)["input_ids"] or [0] for p in prompts]
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  return pad_rows(ids, pad, padding_side)


def pad_rows(ids: Sequence[Sequence[int]], pad: int, padding_side: str = "left") -> tuple[np.ndarray, np.ndarray]:
  """Rows of token ids as one [B, longest] array and its attention mask."""
  width = max(len(x) for x in ids)
  tokens = np.full((len(ids), width), pad, np.int32)
  mask = np.zeros((len(ids), width), bool)
  for r, x in enumerate(ids):
    sl = slice(width - len(x), width) if padding_side == "left" else slice(0, len(x))
    tokens[r, sl], mask[r, sl] = x, True
  return tokens, mask


def max_logit_diffs(hf_dir: str, prompts: Sequence[str] = DEFAULT_PROMPTS, *, dtype: str = "float32",
                    padding_side: str = "left") -> list[float]:
  """Per-prompt max |logits_ours - logits_transformers| over real tokens of one padded batch. `hf_dir` may also be a
  GGUF file (or a directory holding one): ours runs our conversion of it, transformers its own GGUF loader."""
  gguf_file = gguf_import.find_gguf(hf_dir)
  reference_kwargs = {}
  if gguf_file is not None:
    hf_dir, reference_dir = gguf_import.converted_dir(gguf_file), os.path.dirname(gguf_file)
    reference_kwargs = {"gguf_file": os.path.basename(gguf_file)}
  else:
    reference_dir = hf_dir
  if convert_vl.is_vl_checkpoint(hf_dir):
    return vl_max_logit_diffs(hf_dir, prompts, dtype=dtype, padding_side=padding_side)
  import torch
  from transformers import AutoModelForCausalLM

  tokenizer = load_tokenizer(hf_dir)
  tokens, mask = padded_batch(tokenizer, prompts, padding_side)
  positions = np.asarray(positions_from_mask(jnp.asarray(mask)))

  config = convert.config_from_hf(hf_dir, param_dtype=dtype)
  params = convert.load_params(hf_dir, config)
  with jax.default_matmul_precision("highest"):  # GPUs/TPUs would otherwise use reduced-precision passes
    ours = jax.jit(Model(config).apply)(params, tokens, positions, attention_mask=mask).logits
  ours = np.asarray(ours, np.float32)
  del params

  torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
  ref_model = AutoModelForCausalLM.from_pretrained(reference_dir, local_files_only=True, dtype=torch_dtype,
                                                   **reference_kwargs)
  ref_model.eval()
  with torch.no_grad():
    ref = ref_model(input_ids=torch.from_numpy(tokens.astype(np.int64)),
                    attention_mask=torch.from_numpy(mask.astype(np.int64)),
                    position_ids=torch.from_numpy(positions.astype(np.int64))).logits.float().numpy()
  return [float(np.abs(ours[r][mask[r]] - ref[r][mask[r]]).max()) for r in range(len(prompts))]


def image_prompts(tokenizer, prompts: Sequence[str], config: VLConfig, seed: int = 0
                  ) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
  """Token ids of `prompts` with a random image in the middle of every other one (the first, third, ...),
  and those images' pixel_values and grids. Image k is 3 + k attention windows tall and 2 wide, its last row
  and column of windows cut short, so window attention sees ragged windows (Qwen3-VL, without windows: as if
  windows were 2 merged tokens wide, so image k is 5 + 2k merged tokens tall and 3 wide)."""
  v = config.vision
  rng = np.random.default_rng(seed)
  rows, pixels, grids = [], [], []
  window = v.window_merged if v.family == "qwen2.5-vl" else 2
  for r, prompt in enumerate(prompts):
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"] or [0]
    if r % 2 == 0:
      k = r // 2
      side = v.patch_size * v.spatial_merge_size  # pixels of one merged token
      height, width = side * (window * (2 + k) + 1), side * (window + 1)
      patches, grid = vision_lib.patchify(rng.standard_normal((height, width, v.in_channels)), v)
      pixels.append(patches.astype(np.float32))
      grids.append(grid)
      half = len(ids) // 2
      ids = ids[:half] + vl_lib.image_tokens(grid, config) + ids[half:]
    rows.append(ids)
  return rows, np.concatenate(pixels), np.asarray(grids, np.int64)


def vl_max_logit_diffs(hf_dir: str, prompts: Sequence[str] = DEFAULT_PROMPTS, *, dtype: str = "float32",
                       padding_side: str = "left") -> list[float]:
  """max_logit_diffs for a Qwen2.5-VL or Qwen3-VL checkpoint, with images in every other prompt
  (`image_prompts`)."""
  import torch
  import transformers

  tokenizer = load_tokenizer(hf_dir)
  config = convert_vl.config_from_hf(hf_dir, param_dtype=dtype)
  rows, pixel_values, grids = image_prompts(tokenizer, prompts, config)
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  tokens, mask = pad_rows(rows, pad, padding_side)

  positions, _ = vl_lib.mrope_positions(tokens, mask, grids, config)
  images = vision_lib.vision_inputs(pixel_values, grids, config.vision)
  params = convert_vl.load_params(hf_dir, config)
  with jax.default_matmul_precision("highest"):
    ours = jax.jit(vl_lib.VLModel(config).apply)(params, tokens, positions, images=images,
                                                  attention_mask=mask).logits
  ours = np.asarray(ours, np.float32)
  del params

  torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
  reference = getattr(transformers, convert_vl.ARCHITECTURES[config.family])
  ref_model = reference.from_pretrained(hf_dir, local_files_only=True, dtype=torch_dtype)
  ref_model.eval()
  ids = torch.from_numpy(tokens.astype(np.int64))
  with torch.no_grad():  # transformers computes its own multimodal positions from the image tokens
    ref = ref_model(input_ids=ids, attention_mask=torch.from_numpy(mask.astype(np.int64)),
                    pixel_values=torch.from_numpy(pixel_values).to(torch_dtype),
                    image_grid_thw=torch.from_numpy(grids),
                    mm_token_type_ids=(ids == config.image_token_id).long()).logits.float().numpy()
  return [float(np.abs(ours[r][mask[r]] - ref[r][mask[r]]).max()) for r in range(len(prompts))]
