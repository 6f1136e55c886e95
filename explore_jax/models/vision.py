"""The Qwen2.5-VL and Qwen3-VL vision towers as pure functions of a params pytree, and the host-side layout of
their inputs.

Parameters, blocks stacked on a leading axis and run under `lax.scan` like the language model's layers.
Qwen2.5-VL (RMSNorm, gated MLP):

  patch_embed [patch_dim, embed]               (patch_dim = channels x temporal_patch x patch x patch)
  layers/norm1, norm2 [L, embed]
  layers/qkv [L, embed, 3, heads, head_dim]    layers/qkv_bias [L, 3, heads, head_dim]
  layers/o [L, heads, head_dim, embed]         layers/o_bias [L, embed]
  layers/gate, up [L, embed, mlp]              layers/gate_bias, up_bias [L, mlp]
  layers/down [L, mlp, embed]                  layers/down_bias [L, embed]
  merger/norm [embed]  merger/fc1 [unit*embed, unit*embed]  merger/fc2 [unit*embed, out]  (+ fc1_bias, fc2_bias)

Qwen3-VL (LayerNorm with biases, GELU MLP, learned positions, DeepStack mergers):

  patch_embed [patch_dim, embed]  patch_embed_bias [embed]  pos_embed [num_position_embeddings, embed]
  layers/norm1, norm1_bias, norm2, norm2_bias [L, embed]
  layers/qkv, qkv_bias, o, o_bias              as above
  layers/fc1 [L, embed, mlp]  layers/fc1_bias [L, mlp]  layers/fc2 [L, mlp, embed]  layers/fc2_bias [L, embed]
  merger/norm, norm_bias [embed]  merger/fc1, fc2 (+ biases) as above
  deepstack/norm, norm_bias [K, unit*embed]  deepstack/fc1 [K, unit*embed, unit*embed]  deepstack/fc2
  [K, unit*embed, out] (+ fc1_bias [K, unit*embed], fc2_bias [K, out]): one merger per DeepStack block

The Qwen3-VL tower returns [merged tokens, (1 + K) * out]: the merger's features, then each DeepStack
merger's, side by side (VisionConfig.feature_size), so that every consumer of merged features (the sampler's
per-image features, the learner's) carries them as one array; models/vl.py splits them.

Qwen3-VL's learned position embedding is a square grid resampled bilinearly (corners aligned) to each image's
patch grid, as transformers' get_vision_interpolation_indices_and_weights does; each patch reads it at its
(row, column), so it comes in the patches' merge-block order by itself.

Every axis carries the language model's logical names (embed, q_heads, head_dim, mlp, layers), so the same
sharding rules place the tower; the patch axis of activations is "length" (replicated by default).

Images arrive as Hugging Face's image processor (Qwen2VLImageProcessor) lays them out: the patches of all
images concatenated, pixel_values [N, patch_dim] with image_grid_thw [images, 3] in patches, each frame's
patches in raster order of spatial_merge_size^2 blocks whose own patches are consecutive. `patchify` makes
that layout from an image array. The merger concatenates each run of merge_unit consecutive patches into one
language-model token.

Attention. Transformers reorders the patches window by window and attends within each window (or, in the
`fullatt_block_indexes` blocks, each frame) by variable-length attention. We keep the patches where they are
and mask instead: `vision_inputs` gives every patch a segment id per attention kind, and a patch sees the
patches of its segment. Attention is indifferent to the order of its keys and windows are made of whole
merge blocks, so the result is the same, with static shapes and no gathers. The price is [N, N] scores per
block over all patches of the call, which suits the few small images of an agent's prompt; many large images
would want a segment-aware attention kernel.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from explore_jax import images as images_lib
from explore_jax.models.config import VisionConfig
from explore_jax.models.transformer import (ParamSpec, Params, SpecParams, apply_rope, attention, rms_norm,
                                            rope_angles)
from explore_jax.parallel import sharding

PADDING = -1  # segment id of padding patches: they see only each other, and no image token reads them
NORM_EPS = 1e-6  # of every RMSNorm and LayerNorm in the tower (fixed in transformers, not a config field)


class VisionInputs(NamedTuple):
  """What the tower reads: patches and, computed on the host from image_grid_thw, where each one is."""
  patches: jax.Array    # [N, patch_dim] as the image processor flattens them
  positions: jax.Array  # [N, 2] int32: the patch's row and column in its image (the 2-D RoPE coordinates)
  segments: jax.Array   # [N, 2] int32: attention segment for full attention (image frame) and for windows
  # [N, 2] int32: the height and width in patches of the patch's image (0 for padding), to which Qwen3-VL's
  # learned position embedding is resampled; None for Qwen2.5-VL.
  sizes: Optional[jax.Array] = None


def patchify(image: np.ndarray, config: VisionConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
  """One image [H, W, C] (already resized and normalised) as pixel_values [h*w, patch_dim] and its grid
  (1, h, w) in patches, in the processor's layout (explore_jax/images.py, which actors use without jax)."""
  if image.shape[-1] != config.in_channels:
    raise ValueError(f"image of shape {image.shape}: channels must be {config.in_channels}")
  return images_lib.patchify(image, config.patch_size, config.spatial_merge_size, config.temporal_patch_size)


def vision_inputs(pixel_values: np.ndarray, grid_thw: np.ndarray, config: VisionConfig,
                  pad_to: Optional[int] = None) -> VisionInputs:
  """Positions and attention segments of every patch, from each image's (t, h, w) grid.

  A frame is a full-attention segment; its merged tokens (blocks of m x m patches) are cut into windows of
  `config.window_merged` blocks per side from the top-left, the last row and column of windows possibly
  smaller, as transformers' get_vision_window_index does (Qwen3-VL has no windows: its window segments are
  the frames). `pad_to` appends zero patches of segment PADDING up to that many, so calls with different
  images can share one compiled shape.
  """
  grid_thw = np.asarray(grid_thw, np.int64).reshape(-1, 3)
  windowed = config.family == "qwen2.5-vl"
  m = config.spatial_merge_size
  positions, full, window, sizes = [], [], [], []
  frame = windows = 0
  for t, h, w in grid_thw.tolist():
    if h % m or w % m:
      raise ValueError(f"image grid {(t, h, w)}: height and width must be multiples of spatial_merge_size={m}")
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    rc = np.stack([rows, cols], axis=-1).reshape(h // m, m, w // m, m, 2).transpose(0, 2, 1, 3, 4).reshape(-1, 2)
    ws = config.window_merged if windowed else max(h, w) // m  # one window per frame without windows
    br, bc = np.meshgrid(np.arange(h // m), np.arange(w // m), indexing="ij")  # merged token's row, column
    windows_w = -(-(w // m) // ws)
    block_window = ((br // ws) * windows_w + bc // ws).reshape(-1)
    per_frame = -(-(h // m) // ws) * windows_w
    for _ in range(t):
      positions.append(rc)
      full.append(np.full(h * w, frame))
      window.append(np.repeat(block_window, m * m) + windows)
      sizes.append(np.broadcast_to(np.array([h, w]), (h * w, 2)))
      frame += 1
      windows += per_frame
  n = int(grid_thw.prod(axis=1).sum())
  pixel_values = np.asarray(pixel_values)
  if pixel_values.shape != (n, config.patch_dim):
    raise ValueError(f"pixel_values of shape {pixel_values.shape}; image_grid_thw implies {(n, config.patch_dim)}")
  total = n if pad_to is None else pad_to
  if total < n or total % config.merge_unit:
    raise ValueError(f"pad_to={pad_to} must be at least {n} patches and a multiple of {config.merge_unit}")
  pad = total - n
  positions = np.concatenate(positions + [np.zeros((pad, 2), np.int64)])
  segments = np.stack([np.concatenate(full + [np.full(pad, PADDING)]),
                       np.concatenate(window + [np.full(pad, PADDING)])], axis=-1)
  patches = np.concatenate([pixel_values, np.zeros((pad, config.patch_dim), pixel_values.dtype)])
  inputs = VisionInputs(patches=patches, positions=positions.astype(np.int32), segments=segments.astype(np.int32))
  if windowed:
    return inputs
  return inputs._replace(sizes=np.concatenate(sizes + [np.zeros((pad, 2), np.int64)]).astype(np.int32))


def _param_specs(c: VisionConfig) -> dict:
  if c.family == "qwen3-vl":
    return _qwen3_param_specs(c)
  L, E, F, H, D = c.depth, c.hidden_size, c.intermediate_size, c.num_heads, c.head_dim
  M, O = c.merge_unit * E, c.out_hidden_size
  return {
      "patch_embed": ParamSpec((c.patch_dim, E), (None, "embed"), "normal"),
      "layers": {
          "norm1": ParamSpec((L, E), ("layers", "embed"), "ones"),
          "qkv": ParamSpec((L, E, 3, H, D), ("layers", "embed", None, "q_heads", "head_dim"), "normal"),
          "qkv_bias": ParamSpec((L, 3, H, D), ("layers", None, "q_heads", "head_dim"), "zeros"),
          "o": ParamSpec((L, H, D, E), ("layers", "q_heads", "head_dim", "embed"), "normal"),
          "o_bias": ParamSpec((L, E), ("layers", "embed"), "zeros"),
          "norm2": ParamSpec((L, E), ("layers", "embed"), "ones"),
          "gate": ParamSpec((L, E, F), ("layers", "embed", "mlp"), "normal"),
          "gate_bias": ParamSpec((L, F), ("layers", "mlp"), "zeros"),
          "up": ParamSpec((L, E, F), ("layers", "embed", "mlp"), "normal"),
          "up_bias": ParamSpec((L, F), ("layers", "mlp"), "zeros"),
          "down": ParamSpec((L, F, E), ("layers", "mlp", "embed"), "normal"),
          "down_bias": ParamSpec((L, E), ("layers", "embed"), "zeros"),
      },
      "merger": {
          "norm": ParamSpec((E,), ("embed",), "ones"),
          "fc1": ParamSpec((M, M), ("embed", "mlp"), "normal"),
          "fc1_bias": ParamSpec((M,), ("mlp",), "zeros"),
          "fc2": ParamSpec((M, O), ("mlp", "embed"), "normal"),
          "fc2_bias": ParamSpec((O,), ("embed",), "zeros"),
      },
  }


def _qwen3_param_specs(c: VisionConfig) -> dict:
  L, E, F, H, D, K = c.depth, c.hidden_size, c.intermediate_size, c.num_heads, c.head_dim, c.num_deepstack
  M, O = c.merge_unit * E, c.out_hidden_size

  def merger(*lead):
    """A merger's params, with leading axes `lead` (the DeepStack mergers are stacked like layers)."""
    n, axes = tuple(k for k, _ in lead), tuple(a for _, a in lead)
    return {
        "norm": ParamSpec(n + (M if lead else E,), axes + ("embed",), "ones"),
        "norm_bias": ParamSpec(n + (M if lead else E,), axes + ("embed",), "zeros"),
        "fc1": ParamSpec(n + (M, M), axes + ("embed", "mlp"), "normal"),
        "fc1_bias": ParamSpec(n + (M,), axes + ("mlp",), "zeros"),
        "fc2": ParamSpec(n + (M, O), axes + ("mlp", "embed"), "normal"),
        "fc2_bias": ParamSpec(n + (O,), axes + ("embed",), "zeros"),
    }

  specs = {
      "patch_embed": ParamSpec((c.patch_dim, E), (None, "embed"), "normal"),
      "patch_embed_bias": ParamSpec((E,), ("embed",), "zeros"),
      "pos_embed": ParamSpec((c.num_position_embeddings, E), (None, "embed"), "normal"),
      "layers": {
          "norm1": ParamSpec((L, E), ("layers", "embed"), "ones"),
          "norm1_bias": ParamSpec((L, E), ("layers", "embed"), "zeros"),
          "qkv": ParamSpec((L, E, 3, H, D), ("layers", "embed", None, "q_heads", "head_dim"), "normal"),
          "qkv_bias": ParamSpec((L, 3, H, D), ("layers", None, "q_heads", "head_dim"), "zeros"),
          "o": ParamSpec((L, H, D, E), ("layers", "q_heads", "head_dim", "embed"), "normal"),
          "o_bias": ParamSpec((L, E), ("layers", "embed"), "zeros"),
          "norm2": ParamSpec((L, E), ("layers", "embed"), "ones"),
          "norm2_bias": ParamSpec((L, E), ("layers", "embed"), "zeros"),
          "fc1": ParamSpec((L, E, F), ("layers", "embed", "mlp"), "normal"),
          "fc1_bias": ParamSpec((L, F), ("layers", "mlp"), "zeros"),
          "fc2": ParamSpec((L, F, E), ("layers", "mlp", "embed"), "normal"),
          "fc2_bias": ParamSpec((L, E), ("layers", "embed"), "zeros"),
      },
      "merger": merger(),
  }
  if K:
    specs["deepstack"] = merger((K, "layers"))
  return specs


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
  """LayerNorm over the last axis, computed in float32 whatever x's dtype."""
  x32 = x.astype(jnp.float32)
  mean = jnp.mean(x32, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
  normed = (x32 - mean) * jax.lax.rsqrt(var + eps)
  return (normed * weight.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def rope_inv_freq(c: VisionConfig) -> jax.Array:
  """Inverse frequencies [head_dim/2] of the tower's 2-D RoPE: head_dim/4 frequencies (those of a RoPE over
  head_dim/2) for the row, the same again for the column."""
  quarter = 1.0 / (c.rope_theta ** (jnp.arange(0, c.head_dim // 2, 2, dtype=jnp.float32) / (c.head_dim // 2)))
  return jnp.concatenate([quarter, quarter])


@dataclasses.dataclass(frozen=True)
class VisionTower(SpecParams):
  """Patches in, one language-model embedding per merge block out. Hashable, so it can be a static jit arg."""

  config: VisionConfig
  mesh: Optional[Mesh] = None
  rules: Optional[sharding.Rules] = None

  def param_specs(self) -> Any:
    return _param_specs(self.config)

  def _constrain(self, x: jax.Array, axes: tuple[Optional[str], ...]) -> jax.Array:
    return sharding.constrain(x, axes, self.mesh, self.rules)

  def apply(self, params: Params, inputs: VisionInputs) -> jax.Array:
    """Merged features [N / merge_unit, feature_size] of the patches, in their order (padding last):
    out_hidden_size values per token for Qwen2.5-VL, then out_hidden_size more per DeepStack merger for
    Qwen3-VL."""
    if self.config.family == "qwen3-vl":
      return self._apply_qwen3(params, inputs)
    c = self.config
    dt = c.jnp_dtype
    x = jnp.einsum("np,pe->ne", inputs.patches.astype(dt), params["patch_embed"].astype(dt))
    x = self._constrain(x, ("length", "act_embed"))
    angles = self._rope_angles(inputs)
    full, window = inputs.segments[:, 0], inputs.segments[:, 1]
    sees_full = (full[:, None] == full[None, :])[None]  # [1, N, N]: a batch of one packed sequence
    sees_window = (window[:, None] == window[None, :])[None]
    is_full = np.isin(np.arange(c.depth), c.fullatt_block_indexes)

    def block(x, inputs):
      lp, full_attention = inputs
      h = rms_norm(x, lp["norm1"], NORM_EPS)
      x = x + self._attention(h, lp, angles, jnp.where(full_attention, sees_full, sees_window))
      h = rms_norm(x, lp["norm2"], NORM_EPS)
      gate = jnp.einsum("ne,ef->nf", h, lp["gate"].astype(dt)) + lp["gate_bias"].astype(dt)
      up = jnp.einsum("ne,ef->nf", h, lp["up"].astype(dt)) + lp["up_bias"].astype(dt)
      act = self._constrain(jax.nn.silu(gate) * up, ("length", "mlp"))
      x = x + jnp.einsum("nf,fe->ne", act, lp["down"].astype(dt)) + lp["down_bias"].astype(dt)
      return self._constrain(x, ("length", "act_embed")), None

    x, _ = jax.lax.scan(block, x, (params["layers"], jnp.asarray(is_full)))
    mp = params["merger"]
    return self._merger_mlp(mp, rms_norm(x, mp["norm"], NORM_EPS).reshape(-1, c.merge_unit * c.hidden_size))

  def _rope_angles(self, inputs: VisionInputs) -> jax.Array:
    """The 2-D RoPE angles [N, head_dim/2] of the patches: a quarter of each head's dimensions per coordinate."""
    half = self.config.head_dim // 4
    return rope_angles(inputs.positions, rope_inv_freq(self.config), (half, half))

  def _attention(self, h: jax.Array, lp: Params, angles: jax.Array, visible: jax.Array) -> jax.Array:
    """One block's attention output [N, embed] (projected, biased) for normalised inputs h [N, embed]."""
    dt = self.config.jnp_dtype
    qkv = jnp.einsum("ne,ecjd->ncjd", h, lp["qkv"].astype(dt)) + lp["qkv_bias"].astype(dt)
    # RoPE in float32 whatever the compute dtype, as transformers does in the tower.
    q, k = (apply_rope(qkv[:, i].astype(jnp.float32), angles).astype(dt) for i in (0, 1))
    q = self._constrain(q, ("length", "q_heads", "head_dim"))
    out = attention(q[None], k.transpose(1, 0, 2)[None], qkv[:, 2].transpose(1, 0, 2)[None], visible)[0]
    return jnp.einsum("njd,jde->ne", out, lp["o"].astype(dt)) + lp["o_bias"].astype(dt)

  def _merger_mlp(self, mp: Params, x: jax.Array) -> jax.Array:
    """A merger's two layers (exact GELU between) on merged tokens x [N / merge_unit, merge_unit * embed]."""
    dt = self.config.jnp_dtype
    x = jax.nn.gelu(x @ mp["fc1"].astype(dt) + mp["fc1_bias"].astype(dt), approximate=False)
    return x @ mp["fc2"].astype(dt) + mp["fc2_bias"].astype(dt)

  def position_embedding(self, table: jax.Array, positions: jax.Array, sizes: jax.Array) -> jax.Array:
    """Qwen3-VL's learned position embedding [N, embed] at each patch: the square `table` [side^2, embed]
    resampled bilinearly, corners aligned, to the patch's image grid (`sizes` [N, 2] patches high and wide)
    and read at its (row, column) `positions` [N, 2]."""
    side = self.config.position_grid_side
    # A patch's place on the table's grid, per axis: row * (side - 1) / (height - 1), 0 for one-patch sides.
    place = positions.astype(jnp.float32) * (side - 1) / jnp.maximum(sizes - 1, 1).astype(jnp.float32)
    floor = jnp.floor(place)
    offsets = jnp.arange(2)
    taps = jnp.clip(floor.astype(jnp.int32)[..., None] + offsets, 0, side - 1)  # [N, 2 axes, 2 taps]
    weights = jnp.maximum(1.0 - jnp.abs(place[..., None] - floor[..., None] - offsets), 0.0)
    index = taps[:, 0, :, None] * side + taps[:, 1, None, :]  # [N, 2 row taps, 2 column taps]
    weight = weights[:, 0, :, None] * weights[:, 1, None, :]
    return jnp.einsum("nab,nabe->ne", weight, table[index].astype(jnp.float32))

  def _apply_qwen3(self, params: Params, inputs: VisionInputs) -> jax.Array:
    c = self.config
    dt = c.jnp_dtype
    if inputs.sizes is None:
      raise ValueError("a Qwen3-VL tower needs VisionInputs.sizes (vision_inputs with its config fills them)")
    x = jnp.einsum("np,pe->ne", inputs.patches.astype(dt), params["patch_embed"].astype(dt))
    x = x + params["patch_embed_bias"].astype(dt)
    x = x + self.position_embedding(params["pos_embed"], inputs.positions, inputs.sizes).astype(dt)
    x = self._constrain(x, ("length", "act_embed"))
    angles = self._rope_angles(inputs)
    frame = inputs.segments[:, 0]
    visible = (frame[:, None] == frame[None, :])[None]  # every block attends within the image frame
    # Which DeepStack slot each block's output fills (-1: none); the slots ride along the scan's carry.
    slot = np.full(c.depth, -1)
    slot[list(c.deepstack_visual_indexes)] = np.arange(c.num_deepstack)
    taken = jnp.zeros((c.num_deepstack,) + x.shape, dt)

    def block(carry, inputs):
      x, taken = carry
      lp, s = inputs
      h = layer_norm(x, lp["norm1"], lp["norm1_bias"], NORM_EPS)
      x = x + self._attention(h, lp, angles, visible)
      h = layer_norm(x, lp["norm2"], lp["norm2_bias"], NORM_EPS)
      act = jnp.einsum("ne,ef->nf", h, lp["fc1"].astype(dt)) + lp["fc1_bias"].astype(dt)
      act = self._constrain(jax.nn.gelu(act, approximate=True), ("length", "mlp"))
      x = x + jnp.einsum("nf,fe->ne", act, lp["fc2"].astype(dt)) + lp["fc2_bias"].astype(dt)
      x = self._constrain(x, ("length", "act_embed"))
      if c.num_deepstack:
        kept = jax.lax.dynamic_update_index_in_dim(taken, x, jnp.maximum(s, 0), 0)
        taken = jnp.where(s >= 0, kept, taken)
      return (x, taken), None

    (x, taken), _ = jax.lax.scan(block, (x, taken), (params["layers"], jnp.asarray(slot, jnp.int32)))
    unit = c.merge_unit * c.hidden_size
    mp = params["merger"]
    features = [self._merger_mlp(mp, layer_norm(x, mp["norm"], mp["norm_bias"], NORM_EPS).reshape(-1, unit))]
    for j in range(c.num_deepstack):  # DeepStack mergers normalise the merged tokens, not the patches
      dp = jax.tree.map(lambda p, j=j: p[j], params.get("deepstack", {}))
      merged = taken[j].reshape(-1, unit)
      features.append(self._merger_mlp(dp, layer_norm(merged, dp["norm"], dp["norm_bias"], NORM_EPS)))
    return jnp.concatenate(features, axis=-1)
