"""Qwen2.5-VL and Qwen3-VL: a vision tower's merged patch features in place of a prompt's image tokens, read by
a language model with multimodal RoPE.

Params are the language model's tree (models/transformer.py) plus `params["vision"]` (models/vision.py), so a
text-only prompt runs exactly the language model's computation, and LoRA adapters (`params["lora"]`) and
every other consumer of the language model's leaves see the tree they know.

The prompt lays out each image as Hugging Face's processor does: <|vision_start|>, then one <|image_pad|>
(`image_token_id`) per merged token (t*h*w / merge_unit of its (t, h, w) patch grid), then <|vision_end|>
(`image_tokens`). The i-th image token of the batch, counted row by row, gets the i-th merged feature; the
images' patches are concatenated in the same order (`vision.vision_inputs`).

Positions are three coordinates per token (temporal, height, width), as transformers' get_rope_index lays them
out (`mrope_positions`): a text token has all three equal, one more than the token before; an image's tokens
start at s, the position after the text before it, and sit at (s + frame, s + row, s + column) of its merged
grid; the text after it continues from s + max(rows, columns). A text-only prompt is therefore ordinary RoPE.
Qwen3-VL lays out and numbers an image's tokens the same way; its language model spreads the three coordinates
over the rotary frequencies interleaved rather than in blocks (ModelConfig.mrope_interleaved).

Qwen3-VL's DeepStack: the tower's features carry, after the merger's, one more set per DeepStack merger
(VisionConfig.feature_size); the first set replaces the image tokens' embeddings, and set k is added to the
image tokens' hidden states after language layer k (Model.apply's `deepstack`). Text-only prompts and decoding
steps have no image tokens, so for them nothing is added.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from explore_jax.models.config import VLConfig
from explore_jax.models.transformer import KVCache, Model, ModelOutput, Params
from explore_jax import images as images_lib
from explore_jax.models import vision as vision_lib
from explore_jax.models.vision import VisionInputs, VisionTower
from explore_jax.parallel import sharding


def num_image_tokens(grid_thw, config: VLConfig) -> int:
  """Image tokens of one image of (t, h, w) patches: one per merge block."""
  t, h, w = (int(v) for v in grid_thw)
  return t * h * w // config.vision.merge_unit


def image_tokens(grid_thw, config: VLConfig) -> list[int]:
  """The token ids that stand for one image in a prompt: start, one image token per merged token, end."""
  n = num_image_tokens(grid_thw, config)
  return [config.vision_start_token_id] + [config.image_token_id] * n + [config.vision_end_token_id]


def mrope_positions(tokens: np.ndarray, attention_mask: Optional[np.ndarray], grid_thw: Optional[np.ndarray],
                    config: VLConfig) -> tuple[np.ndarray, np.ndarray]:
  """Multimodal RoPE positions [B, T, 3] (0 at padding) and each row's rope delta [B] (host side, numpy).

  Images are read in order from `grid_thw` [images, 3] as their runs of image tokens appear, row by row. A
  token generated after the prompt sits at (its index among the row's real tokens) + delta on all three
  coordinates, which is how decoding continues.
  """
  tokens = np.asarray(tokens)
  mask = np.ones(tokens.shape, bool) if attention_mask is None else np.asarray(attention_mask, bool)
  grids = iter(np.zeros((0, 3), np.int64) if grid_thw is None else np.asarray(grid_thw).reshape(-1, 3))
  m = config.vision.spatial_merge_size
  positions = np.zeros(tokens.shape + (3,), np.int64)
  deltas = np.zeros(tokens.shape[0], np.int64)
  for r in range(tokens.shape[0]):
    real = np.flatnonzero(mask[r])
    ids = tokens[r, real]
    is_image = ids == config.image_token_id
    pos = np.zeros((len(ids), 3), np.int64)
    i = next_pos = 0
    while i < len(ids):
      run_end = i + int(np.argmax(is_image[i:])) if is_image[i:].any() else len(ids)
      pos[i:run_end] = next_pos + np.arange(run_end - i)[:, None]  # text: all three coordinates equal
      next_pos += run_end - i
      i = run_end
      if i == len(ids):
        break
      grid = next(grids, None)
      if grid is None:
        raise ValueError(f"row {r}: more images in the prompt than image_grid_thw has")
      t, h, w = (int(v) for v in grid)
      n = t * (h // m) * (w // m)
      if i + n > len(ids) or not is_image[i:i + n].all():
        raise ValueError(f"row {r}: an image of grid {(t, h, w)} needs {n} consecutive image tokens at {i}")
      frame, row, col = np.meshgrid(np.arange(t), np.arange(h // m), np.arange(w // m), indexing="ij")
      pos[i:i + n] = next_pos + np.stack([frame, row, col], axis=-1).reshape(n, 3)
      next_pos += max(h, w) // m
      i += n
    positions[r, real] = pos
    deltas[r] = (pos.max() + 1 if len(pos) else 0) - len(ids)
  if next(grids, None) is not None:
    raise ValueError("image_grid_thw has more images than the prompts have")
  return positions.astype(np.int32), deltas.astype(np.int32)


@dataclasses.dataclass(frozen=True)
class VLModel:
  """The vision-language network as pure functions of a params pytree. Hashable, so a static jit argument."""

  config: VLConfig
  mesh: Optional[Mesh] = None
  rules: Optional[sharding.Rules] = None

  @property
  def text(self) -> Model:
    return Model(self.config.text, self.mesh, self.rules)

  @property
  def vision(self) -> VisionTower:
    return VisionTower(self.config.vision, self.mesh, self.rules)

  def param_axes(self) -> Params:
    return {**self.text.param_axes(), "vision": self.vision.param_axes()}

  def param_shapes(self) -> Params:
    return {**self.text.param_shapes(), "vision": self.vision.param_shapes()}

  def init(self, rng: jax.Array, std: float = 0.02) -> Params:
    text_rng, vision_rng = jax.random.split(rng)
    return {**self.text.init(text_rng, std), "vision": self.vision.init(vision_rng, std)}

  def init_cache(self, batch: int, length: int, per_row: bool = False) -> KVCache:
    return self.text.init_cache(batch, length, per_row)

  def cache_axes(self, per_row: bool = False) -> KVCache:
    return self.text.cache_axes(per_row)

  def embed(self, params: Params, tokens: jax.Array, images: VisionInputs) -> jax.Array:
    """Token embeddings [B, T, E] with the images' merged features at the image tokens (batch row-major).

    The prompts must hold exactly as many image tokens as the images have merged tokens (mrope_positions
    checks this on the host); padding patches come last and no image token reaches them.
    """
    return self.merge(params, tokens, self.vision.apply(params["vision"], images))

  def merge(self, params: Params, tokens: jax.Array, features: jax.Array) -> jax.Array:
    """Token embeddings [B, T, E] with `features` [M, E] (merged image tokens, batch row-major; rows past the
    prompts' image tokens are never read) at the image tokens: `embed` with the tower's output given.
    Qwen3-VL's features [M, feature_size] give their first E values per token."""
    return self.merge_with_deepstack(params, tokens, features)[0]

  def merge_with_deepstack(self, params: Params, tokens: jax.Array, features: jax.Array
                           ) -> tuple[jax.Array, Optional[jax.Array]]:
    """`merge`'s embeddings and, for Qwen3-VL, the DeepStack additions [K, B, T, E]: each DeepStack merger's
    features at the image tokens, zeros elsewhere (None without DeepStack)."""
    dt = self.config.text.jnp_dtype
    E, K = self.config.text.hidden_size, self.config.vision.num_deepstack
    if features.shape[-1] != self.config.vision.feature_size:
      raise ValueError(f"image features of shape {features.shape}: the tower gives "
                       f"{self.config.vision.feature_size} values per merged token")
    x = params["embed"].astype(dt)[tokens]
    features = features.astype(dt)
    is_image = tokens == self.config.image_token_id
    index = jnp.cumsum(is_image.reshape(-1)).reshape(tokens.shape) - 1
    per_token = features[jnp.clip(index, 0, features.shape[0] - 1)]
    if not K:
      return jnp.where(is_image[..., None], per_token, x), None
    embeds = jnp.where(is_image[..., None], per_token[..., :E], x)
    deepstack = per_token[..., E:].reshape(tokens.shape + (K, E))
    deepstack = jnp.where(is_image[..., None, None], deepstack, 0).transpose(2, 0, 1, 3)
    return embeds, deepstack

  def image_features(self, params: Params, images: jax.Array, valid: jax.Array) -> jax.Array:
    """Merged features of uint8 images [N, H, W, C] of one size, each through the tower on its own (vmapped),
    the `valid` [N] ones first in their order, then the others: [N * tokens per image, feature_size], the
    layout `merge` reads for prompts holding the valid images in that order. Differentiable in params["vision"]; the
    learner's twin of the sampler's per-image features (equal up to float rounding)."""
    N, H, W, _ = images.shape
    v = self.config.vision
    norm = images_lib.ImageLayout.from_config(self.config)
    patches = jax.vmap(lambda image: images_lib.patchify(
        images_lib.normalise(image, jnp, norm.image_mean, norm.image_std), v.patch_size,
        v.spatial_merge_size, v.temporal_patch_size, jnp)[0])(images)
    grid = np.array([[1, H // v.patch_size, W // v.patch_size]])
    layout = vision_lib.vision_inputs(np.zeros((patches.shape[1], v.patch_dim), np.float32), grid, v)
    features = jax.vmap(lambda p: self.vision.apply(params["vision"], layout._replace(patches=p)))(patches)
    order = jnp.argsort(~valid.astype(bool), stable=True)
    return features[order].reshape(-1, features.shape[-1])  # [N * tokens, feature_size]

  def apply(self, params: Params, tokens: jax.Array, positions: jax.Array, cache: Optional[KVCache] = None, *,
            images: Optional[VisionInputs] = None, image_features: Optional[jax.Array] = None,
            attention_mask: Optional[jax.Array] = None, return_hidden: bool = False,
            logits_to_keep: int = 0, decode_attention: str = "dense") -> ModelOutput:
    """Logits for `tokens` [B, T] at `positions` [B, T, 3] (mrope_positions; [B, T] for text only), with the
    `images` of the prompts, or their merged features already computed (`image_features` [M, feature_size]);
    without either, exactly the language model's `Model.apply`."""
    if images is not None and image_features is not None:
      raise ValueError("give the prompts' images or their image_features, not both")
    embeds = deepstack = None
    if images is not None:
      image_features = self.vision.apply(params["vision"], images)
    if image_features is not None:
      embeds, deepstack = self.merge_with_deepstack(params, tokens, image_features)
    return self.text.apply(params, tokens, positions, cache, attention_mask=attention_mask,
                           return_hidden=return_hidden, logits_to_keep=logits_to_keep, embeds=embeds,
                           deepstack=deepstack, decode_attention=decode_attention)
