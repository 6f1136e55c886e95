"""Images in prompts, without jax: what actors do to a screenshot before it travels, and what the central
sampler and the learner do to it before the vision tower.

A prompt hook puts `IMAGE` ("<image>") in a message's text where an image goes, and returns the images in
order with its Prompt (actors/protocol.py). The actor's tokenizer then lays each image out as the model
family's processor does (Qwen2.5-VL: <|vision_start|>, one <|image_pad|> per merged token, <|vision_end|>),
for which it needs only the image's size: `ImageLayout.resize` brings the image to a size whose sides are
multiples of patch_size x spatial_merge_size with a pixel count within [min_pixels, max_pixels] (the
processor's smart_resize rule, bicubic), and `num_tokens` counts its merged tokens. The resized uint8 image
is what travels with the request and what a record keeps (H x W x 3 bytes, far less than its float patches);
`pixel_values` turns images into the tower's input (rescale, normalise by the family's mean and std,
patchify), on the sampler's and the learner's side alike.

The families differ only in numbers: Qwen2.5-VL's processor has 14-pixel patches, the CLIP mean and std and
pixel counts within [56^2, 28^2 x 1280]; Qwen3-VL's (the same Qwen2VLImageProcessor, configured by the
checkpoint's preprocessor_config.json) 16-pixel patches, mean and std 0.5 and [2^16, 2^24] pixels
(`PROCESSOR_DEFAULTS`, which `ImageLayout.from_config` applies).

Resizing uses Pillow's bicubic filter; transformers' fast image processor resizes with torchvision, whose
bicubic differs in the last bits of some pixels, so pixel parity with it holds only for images already of
the target size (as MiniWoB's screenshots are when the size is chosen so).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

IMAGE = "<image>"  # where a prompt hook puts an image in a message's text

# OpenAI CLIP's normalisation, which Qwen2-VL's and Qwen2.5-VL's processors use.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# Each vision family's image processor settings (VisionConfig.family): normalisation and pixel bounds.
PROCESSOR_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen2.5-vl": dict(image_mean=CLIP_MEAN, image_std=CLIP_STD, min_pixels=56 * 56, max_pixels=28 * 28 * 1280),
    "qwen3-vl": dict(image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5), min_pixels=65_536,
                     max_pixels=16_777_216),
}


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
  """The processor's target size: sides multiples of `factor`, pixels within [min_pixels, max_pixels], the
  aspect ratio kept as closely as that allows."""
  if min(height, width) < 1 or max(height, width) / min(height, width) > 200:
    raise ValueError(f"an image of {height} x {width} pixels cannot be laid out (aspect ratio at most 200)")
  h = max(factor, round(height / factor) * factor)
  w = max(factor, round(width / factor) * factor)
  if h * w > max_pixels:
    beta = math.sqrt(height * width / max_pixels)
    h = max(factor, math.floor(height / beta / factor) * factor)
    w = max(factor, math.floor(width / beta / factor) * factor)
  elif h * w < min_pixels:
    beta = math.sqrt(min_pixels / (height * width))
    h = math.ceil(height * beta / factor) * factor
    w = math.ceil(width * beta / factor) * factor
  return h, w


@dataclasses.dataclass(frozen=True)
class ImageLayout:
  """How one model family lays images out (picklable: it travels to the actors). From a VLConfig with
  `from_config`, which takes the family's processor settings; the defaults here are Qwen2.5-VL's."""
  start_id: int
  pad_id: int
  end_id: int
  patch_size: int = 14
  merge_size: int = 2
  temporal_patch_size: int = 2
  in_channels: int = 3
  min_pixels: int = 56 * 56
  max_pixels: int = 28 * 28 * 1280
  image_mean: tuple[float, ...] = CLIP_MEAN
  image_std: tuple[float, ...] = CLIP_STD

  @classmethod
  def from_config(cls, config: Any, **overrides: Any) -> "ImageLayout":
    """The layout of a VLConfig's family (its processor's pixel bounds and normalisation), with `overrides`
    (e.g. min_pixels=..., max_pixels=...)."""
    v = config.vision
    defaults = PROCESSOR_DEFAULTS[getattr(v, "family", "qwen2.5-vl")]
    return cls(start_id=config.vision_start_token_id, pad_id=config.image_token_id,
               end_id=config.vision_end_token_id, patch_size=v.patch_size, merge_size=v.spatial_merge_size,
               temporal_patch_size=v.temporal_patch_size, in_channels=v.in_channels,
               **{**defaults, **overrides})

  @property
  def factor(self) -> int:
    return self.patch_size * self.merge_size

  @property
  def patch_dim(self) -> int:
    return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

  def check(self, image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != self.in_channels:
      raise ValueError(f"an image must be uint8 [H, W, {self.in_channels}], got {image.dtype} {list(image.shape)}")
    return image

  def target_size(self, height: int, width: int) -> tuple[int, int]:
    """(height, width) an image of this size is resized to (the processor's smart_resize rule)."""
    return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)

  def resize(self, image: np.ndarray) -> np.ndarray:
    """The image at its target size (unchanged when it already has it), uint8 [H', W', C]."""
    image = self.check(image)
    h, w = self.target_size(image.shape[0], image.shape[1])
    if (h, w) == image.shape[:2]:
      return image
    from PIL import Image

    return np.asarray(Image.fromarray(image).resize((w, h), Image.BICUBIC))

  def grid(self, image: np.ndarray) -> tuple[int, int, int]:
    """(t, h, w) in patches of an image at its target size."""
    H, W = self.check(image).shape[:2]
    if H % self.factor or W % self.factor:
      raise ValueError(f"an image of {H} x {W} pixels is not at a target size (resize it first)")
    return 1, H // self.patch_size, W // self.patch_size

  def num_tokens(self, image: np.ndarray) -> int:
    t, h, w = self.grid(image)
    return t * h * w // self.merge_size ** 2

  def expand(self, ids: Sequence[int], images: Sequence[np.ndarray]) -> list[int]:
    """Prompt ids with each image's single pad token (as chat templates write it) repeated once per merged
    token of that image; the prompt must hold exactly one pad token per image."""
    ids = [int(i) for i in ids]
    found = sum(i == self.pad_id for i in ids)
    if found != len(images):
      raise ValueError(f"the prompt has {found} image tokens for {len(images)} images")
    out, it = [], iter(images)
    for i in ids:
      out.extend([i] * self.num_tokens(next(it)) if i == self.pad_id else [i])
    return out

  def placeholder(self, tokenizer: Any) -> str:
    """The text the IMAGE marker becomes before tokenization: start, one pad, end tokens."""
    return "".join(tokenizer.convert_ids_to_tokens([self.start_id, self.pad_id, self.end_id]))

  def pixel_values(self, images: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The vision tower's input for images at their target sizes: patches [N, patch_dim] float32 (rescaled
    to [0, 1], normalised by the family's mean and std, in the processor's patch order) and grids [images, 3]."""
    patches, grids = [], []
    for image in images:
      normalised = normalise(self.check(image), np, self.image_mean, self.image_std)
      p, grid = patchify(normalised, self.patch_size, self.merge_size, self.temporal_patch_size)
      patches.append(p)
      grids.append(grid)
    if not patches:
      return np.zeros((0, self.patch_dim), np.float32), np.zeros((0, 3), np.int64)
    return np.concatenate(patches).astype(np.float32), np.asarray(grids, np.int64)


def normalise(image: Any, xp: Any = np, mean: Sequence[float] = CLIP_MEAN, std: Sequence[float] = CLIP_STD) -> Any:
  """uint8 pixels [..., C] rescaled to [0, 1] and normalised by the processor's mean and std per channel (CLIP's
  by default; float32); `xp` is numpy or jax.numpy (the learner normalises records' images inside its jitted
  loss)."""
  mean, std = xp.asarray(mean, xp.float32), xp.asarray(std, xp.float32)
  return (image.astype(xp.float32) / 255.0 - mean) / std


def patchify(image: Any, patch_size: int, merge_size: int, temporal_patch_size: int, xp: Any = np
             ) -> tuple[Any, tuple[int, int, int]]:
  """One image [H, W, C] (already resized and normalised) as pixel_values [h*w, patch_dim] and its grid
  (1, h, w) in patches, laid out as Hugging Face's Qwen2VLImageProcessor does: the still image repeated over
  the temporal patch, patches in merge-block order, each flattened channel, frame, row, column. Pure
  reshapes, in numpy or (xp=jax.numpy) under jit."""
  P, m, T = patch_size, merge_size, temporal_patch_size
  H, W, C = image.shape
  if H % (P * m) or W % (P * m):
    raise ValueError(f"image of shape {image.shape}: height and width must be multiples of {P * m} "
                     f"(patch_size x spatial_merge_size)")
  h, w = H // P, W // P
  x = image.reshape(h // m, m, P, w // m, m, P, C)
  x = x.transpose(0, 3, 1, 4, 6, 2, 5)  # [h/m, w/m, m, m, C, P, P]: merge blocks, then their patches
  x = xp.broadcast_to(x[:, :, :, :, :, None], x.shape[:5] + (T, P, P))
  return x.reshape(h * w, C * T * P * P), (1, h, w)
