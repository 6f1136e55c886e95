"""The two tiny vision-language models the model tests share (Qwen2.5-VL and Qwen3-VL), their random weights and
batches of prompts with images."""

import jax
import numpy as np

from explore_jax.models import vl as vl_lib
from explore_jax.models.config import ModelConfig, VisionConfig, VLConfig
from explore_jax.models.vl import VLModel

IMG, START, END = 60, 61, 62
MESHES = [(8, 1, 1), (2, 2, 2), (1, 2, 4)]

QWEN25_TEXT = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                          num_kv_heads=2, head_dim=8, qkv_bias=True, mrope_section=(2, 1, 1))
# Windows of 2 x 2 merged tokens (8 pixels = 2 merged tokens of 2 x 2 patches of 2 pixels), full attention in block 1.
QWEN25_VISION = VisionConfig(depth=3, hidden_size=16, intermediate_size=24, num_heads=2, out_hidden_size=32,
                             patch_size=2, window_size=8, fullatt_block_indexes=(1,))
# head_dim 8: four rotary frequencies, interleaved as temporal, height, width, temporal.
QWEN3_TEXT = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=4,
                         num_kv_heads=2, head_dim=8, qk_norm=True, mrope_section=(2, 1, 1), mrope_interleaved=True)
# 2-pixel patches, a 4 x 4 learned position grid, DeepStack after blocks 0 and 2 into language layers 0 and 1.
QWEN3_VISION = VisionConfig(depth=3, hidden_size=16, intermediate_size=24, num_heads=2, out_hidden_size=32,
                            patch_size=2, fullatt_block_indexes=(), family="qwen3-vl", num_position_embeddings=16,
                            deepstack_visual_indexes=(0, 2))
CONFIGS = {
    "qwen2.5-vl": VLConfig(QWEN25_TEXT, QWEN25_VISION, image_token_id=IMG, vision_start_token_id=START,
                           vision_end_token_id=END),
    "qwen3-vl": VLConfig(QWEN3_TEXT, QWEN3_VISION, image_token_id=IMG, vision_start_token_id=START,
                         vision_end_token_id=END),
}
FAMILIES = list(CONFIGS)


def draw_params(config: VLConfig):
  """Random weights drawn on the host (no compile): norms around 1, biases non-zero, so a misplaced leaf shows."""
  rng = np.random.default_rng(0)

  def draw(path, shape):
    name = jax.tree_util.keystr(path)
    if "norm" in name and "bias" not in name:
      return rng.uniform(0.5, 1.5, shape.shape).astype(np.float32)
    return rng.normal(0.0, 0.1 if "bias" in name else 0.2, shape.shape).astype(np.float32)

  return jax.tree_util.tree_map_with_path(draw, VLModel(config).param_shapes())


def pixels(grids, vision: VisionConfig, seed=0):
  n = int(np.prod(grids, axis=1).sum())
  return np.random.default_rng(seed).standard_normal((n, vision.patch_dim)).astype(np.float32)


def batch(rows, pad=0):
  """Left-padded token ids and mask of `rows`."""
  width = max(len(r) for r in rows)
  tokens = np.full((len(rows), width), pad, np.int32)
  mask = np.zeros((len(rows), width), bool)
  for i, r in enumerate(rows):
    tokens[i, width - len(r):], mask[i, width - len(r):] = r, True
  return tokens, mask


def image_batch(config: VLConfig, size=2):
  """`size` rows alternating an image prompt (two images in the first row) and text only."""
  grids, rows = [], []
  for r in range(size):
    if r % 2:
      rows.append([5 + r, 6, 7])
      continue
    g = [1, 6, 10] if r == 0 else [1, 4, 4]
    grids.append(g)
    row = [1, 2] + vl_lib.image_tokens(g, config) + [3, 4]
    if r == 0:
      grids.append([1, 2, 6])
      row += vl_lib.image_tokens([1, 2, 6], config) + [5]
    rows.append(row)
  tokens, mask = batch(rows)
  grids = np.array(grids)
  pos, deltas = vl_lib.mrope_positions(tokens, mask, grids, config)
  return tokens, mask, pos, deltas, grids, pixels(grids, config.vision)
