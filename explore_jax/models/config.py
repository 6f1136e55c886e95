"""The policy model family's configuration: one dataclass covers Llama 2/3, Qwen2/2.5 and Qwen3; VLConfig adds
a vision tower to one of them (Qwen2.5-VL, Qwen3-VL)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def resolve_dtype(name: str) -> str:
  """A config's dtype name, with "auto" resolved: bfloat16 on a GPU or TPU, float32 on the CPU."""
  if name == "auto":
    import jax

    return "float32" if jax.default_backend() == "cpu" else "bfloat16"
  if name not in _DTYPES:
    raise ValueError(f"unknown dtype {name!r}: one of {sorted(_DTYPES)} or 'auto'")
  return name
ROPE_TYPES = ("default", "linear", "llama3")


class _Dtypes:
  """The jnp dtypes of a config's `param_dtype` and `dtype` names."""

  @property
  def jnp_param_dtype(self):
    return _DTYPES[self.param_dtype]

  @property
  def jnp_dtype(self):
    return _DTYPES[self.dtype]


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Dtypes):
  """Shape and numerics of a decoder-only transformer.

  The architecture differences of the supported families are flags:
  Llama 2/3 (untied, llama3 RoPE scaling), Qwen2/2.5 (`qkv_bias`), Qwen3 (`qk_norm`, often tied), the language
  model of Qwen2.5-VL (`qkv_bias` and `mrope_section`) and of Qwen3-VL (`qk_norm`, `mrope_section` and
  `mrope_interleaved`).
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10_000.0
  # RoPE scaling as in Hugging Face's `rope_parameters`: ("llama3", (("factor", 8.0), ...)).
  rope_type: str = "default"
  rope_scaling: tuple[tuple[str, float], ...] = ()
  rms_norm_eps: float = 1e-6
  qkv_bias: bool = False
  qk_norm: bool = False
  tie_embeddings: bool = False
  max_position_embeddings: int = 4096
  param_dtype: str = "float32"
  dtype: str = "float32"  # compute dtype; logits and softmax are always float32
  remat: bool = False  # rematerialise each layer in the backward pass (memory for compute)
  # Multimodal RoPE (Qwen2-VL's mRoPE): the head_dim/2 rotary frequencies split into consecutive blocks of
  # these sizes, block j rotated by a token's j-th position coordinate (temporal, height, width); () is plain
  # RoPE. Left out of repr: hf.tiny_dir names the built-in checkpoint by repr(config), and the text models'
  # names (and the warm starts cached under them) must not change.
  mrope_section: tuple[int, ...] = dataclasses.field(default=(), repr=False)
  # Qwen3-VL's layout of those frequencies: interleaved rather than in blocks (`mrope_coordinates`). Out of
  # repr for the same reason.
  mrope_interleaved: bool = dataclasses.field(default=False, repr=False)

  def __post_init__(self):
    for name in ("param_dtype", "dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r}: expected one of {sorted(_DTYPES)}")
    if self.rope_type not in ROPE_TYPES:
      raise ValueError(f"ModelConfig.rope_type={self.rope_type!r} is not supported; expected one of {ROPE_TYPES}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
    if self.mrope_section and sum(self.mrope_section) != self.head_dim // 2:
      raise ValueError(f"mrope_section={self.mrope_section} must sum to head_dim/2={self.head_dim // 2}")
    if self.mrope_interleaved:
      if not self.mrope_section:
        raise ValueError("mrope_interleaved needs an mrope_section")
      counts = np.bincount(mrope_coordinates(self.mrope_section, True), minlength=len(self.mrope_section))
      if tuple(counts) != tuple(self.mrope_section):
        raise ValueError(f"mrope_section={self.mrope_section} does not fit the interleaved layout of "
                         f"{self.head_dim // 2} frequencies (it would give {tuple(counts.tolist())})")

  @property
  def rope_scaling_dict(self) -> dict[str, float]:
    return dict(self.rope_scaling)

  def replace(self, **kwargs: Any) -> "ModelConfig":
    return dataclasses.replace(self, **kwargs)

  def num_params(self) -> int:
    """Parameter count, embeddings included (tied embeddings counted once)."""
    e, f, d = self.hidden_size, self.intermediate_size, self.head_dim
    attn = e * d * (self.num_heads * 2 + self.num_kv_heads * 2)
    if self.qkv_bias:
      attn += d * (self.num_heads + 2 * self.num_kv_heads)
    if self.qk_norm:
      attn += 2 * d
    layer = attn + 3 * e * f + 2 * e
    head = 0 if self.tie_embeddings else self.vocab_size * e
    return self.vocab_size * e + self.num_layers * layer + e + head


def mrope_coordinates(sections: tuple[int, ...], interleaved: bool = False) -> np.ndarray:
  """Which position coordinate rotates each of the sum(sections) RoPE frequencies under multimodal RoPE.

  In blocks (Qwen2-VL, Qwen2.5-VL): the first sections[0] frequencies follow coordinate 0 (temporal), the next
  sections[1] coordinate 1 (height), then coordinate 2 (width). Interleaved (Qwen3-VL): frequencies cycle
  through the coordinates, frequency i following coordinate j = i mod A (A coordinates) while j > 0 has
  frequencies left (the first sections[j] of its residue class), coordinate 0 otherwise; so every coordinate
  gets high and low frequencies alike (the lowest few are temporal only).
  """
  if not interleaved:
    return np.repeat(np.arange(len(sections)), sections)
  a = len(sections)
  coordinate = np.zeros(sum(sections), np.int64)
  for j in range(1, a):
    coordinate[j:a * sections[j]:a] = j
  return coordinate


# Shapes of real checkpoints, for benchmarks and for configs that import weights from a local directory
# (the importer reads the real numbers from config.json; these are for random-weight runs).
PRESETS: dict[str, ModelConfig] = {
    # The built-in model every command can use without downloads (its tokenizer is in hf/assets/tiny).
    "tiny": ModelConfig(
        vocab_size=4096, hidden_size=256, intermediate_size=704, num_layers=4, num_heads=8,
        num_kv_heads=4, head_dim=32, rope_theta=10_000.0, qk_norm=True, tie_embeddings=True,
        max_position_embeddings=4096),
    # The built-in pretrained model's shape ("smollm2-135m-instruct" in hf.load_pretrained has its weights).
    "smollm2-135m": ModelConfig(
        vocab_size=49_152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
        head_dim=64, rope_theta=100_000.0, rms_norm_eps=1e-5, tie_embeddings=True, max_position_embeddings=8192),
    "qwen3-0.6b": ModelConfig(
        vocab_size=151_936, hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
        num_kv_heads=8, head_dim=128, rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=True,
        max_position_embeddings=40_960),
    "qwen3-1.7b": ModelConfig(
        vocab_size=151_936, hidden_size=2048, intermediate_size=6144, num_layers=28, num_heads=16,
        num_kv_heads=8, head_dim=128, rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=True,
        max_position_embeddings=40_960),
    "qwen3-4b": ModelConfig(
        vocab_size=151_936, hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32,
        num_kv_heads=8, head_dim=128, rope_theta=5_000_000.0, qk_norm=True, tie_embeddings=True,
        max_position_embeddings=262_144),
    "qwen2.5-7b": ModelConfig(
        vocab_size=152_064, hidden_size=3584, intermediate_size=18_944, num_layers=28, num_heads=28,
        num_kv_heads=4, head_dim=128, rope_theta=1_000_000.0, qkv_bias=True, max_position_embeddings=32_768),
    "llama3.1-8b": ModelConfig(
        vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_layers=32, num_heads=32,
        num_kv_heads=8, head_dim=128, rope_theta=500_000.0, rope_type="llama3",
        rope_scaling=(("factor", 8.0), ("low_freq_factor", 1.0), ("high_freq_factor", 4.0),
                      ("original_max_position_embeddings", 8192.0)),
        rms_norm_eps=1e-5, max_position_embeddings=131_072),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
  """A named preset, with field overrides (e.g. dtype="bfloat16")."""
  if name not in PRESETS:
    raise KeyError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
  return PRESETS[name].replace(**overrides)


VISION_FAMILIES = ("qwen2.5-vl", "qwen3-vl")


@dataclasses.dataclass(frozen=True)
class VisionConfig(_Dtypes):
  """Shape of a Qwen2.5-VL or Qwen3-VL vision tower (`family`).

  A ViT over patches of `temporal_patch_size` frames x `patch_size`^2 pixels with 2-D (height, width) RoPE,
  and a merger that maps each `spatial_merge_size`^2 block of neighbouring patches to one language-model token.

  Qwen2.5-VL: RMSNorm, gated SiLU MLPs, a patch embedding without bias; every block but `fullatt_block_indexes`
  attends within windows of `window_size` pixels per side only.
  Qwen3-VL: LayerNorm, GELU (tanh) MLPs, a biased patch embedding plus a learned position embedding of
  `num_position_embeddings` (a square grid, resampled to each image's), full attention in every block (the
  window fields are unused), and DeepStack: the patches after each block of `deepstack_visual_indexes` go
  through a merger of their own, and those features join the language model's hidden states at the image
  tokens after its first len(deepstack_visual_indexes) layers.
  """

  depth: int
  hidden_size: int
  intermediate_size: int
  num_heads: int
  out_hidden_size: int  # the language model's hidden size
  in_channels: int = 3
  patch_size: int = 14
  temporal_patch_size: int = 2
  spatial_merge_size: int = 2
  window_size: int = 112
  fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
  rope_theta: float = 10_000.0
  param_dtype: str = "float32"
  dtype: str = "float32"
  # Qwen3-VL's fields. The repr shows them only when set (`__repr__`), so a Qwen2.5-VL config prints as it
  # did before they existed: hf.tiny_vl_dir names the tiny-vl checkpoint by its repr.
  family: str = dataclasses.field(default="qwen2.5-vl", repr=False)
  num_position_embeddings: int = dataclasses.field(default=0, repr=False)
  deepstack_visual_indexes: tuple[int, ...] = dataclasses.field(default=(), repr=False)

  def __post_init__(self):
    for name in ("param_dtype", "dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"VisionConfig.{name}={getattr(self, name)!r}: expected one of {sorted(_DTYPES)}")
    if self.family not in VISION_FAMILIES:
      raise ValueError(f"VisionConfig.family={self.family!r}: expected one of {VISION_FAMILIES}")
    if self.hidden_size % self.num_heads or self.head_dim % 4:
      raise ValueError(f"vision hidden_size={self.hidden_size} / num_heads={self.num_heads} must be a multiple "
                       "of 4 (the 2-D RoPE gives height and width a quarter of each head's dimensions each)")
    if self.family == "qwen2.5-vl":
      if self.window_merged < 1:
        raise ValueError(f"window_size={self.window_size} is smaller than one merged token "
                         f"({self.patch_size * self.spatial_merge_size} pixels)")
      if any(not 0 <= i < self.depth for i in self.fullatt_block_indexes):
        raise ValueError(f"fullatt_block_indexes={self.fullatt_block_indexes} outside depth={self.depth}")
      if self.num_position_embeddings or self.deepstack_visual_indexes:
        raise ValueError("num_position_embeddings and deepstack_visual_indexes are Qwen3-VL's (family='qwen3-vl')")
      return
    side = self.position_grid_side
    if side < 1 or side * side != self.num_position_embeddings:
      raise ValueError(f"num_position_embeddings={self.num_position_embeddings} must be a positive square "
                       "(the learned position grid is square)")
    ds = self.deepstack_visual_indexes
    if any(not 0 <= i < self.depth for i in ds) or list(ds) != sorted(set(ds)):
      raise ValueError(f"deepstack_visual_indexes={ds} must be increasing block indexes below depth={self.depth}")

  def __repr__(self) -> str:
    shown = [f for f in dataclasses.fields(self) if f.repr or getattr(self, f.name) != f.default]
    return f"{type(self).__qualname__}({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in shown)})"

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:
    """Values per patch as the image processor flattens it: channels x frames x pixels x pixels."""
    return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

  @property
  def merge_unit(self) -> int:
    """Patches per language-model token."""
    return self.spatial_merge_size ** 2

  @property
  def window_merged(self) -> int:
    """Side of an attention window in merged tokens (Hugging Face's vit_merger_window_size)."""
    return self.window_size // self.spatial_merge_size // self.patch_size

  @property
  def position_grid_side(self) -> int:
    """Side of Qwen3-VL's square grid of learned position embeddings (0 without one)."""
    return int(np.sqrt(self.num_position_embeddings) + 0.5)

  @property
  def num_deepstack(self) -> int:
    return len(self.deepstack_visual_indexes)

  @property
  def feature_size(self) -> int:
    """Values per merged token the tower returns: the merger's out_hidden_size, then each DeepStack merger's."""
    return self.out_hidden_size * (1 + self.num_deepstack)

  def replace(self, **kwargs: Any) -> "VisionConfig":
    return dataclasses.replace(self, **kwargs)

  def num_params(self) -> int:
    e, f, m, o = self.hidden_size, self.intermediate_size, self.merge_unit * self.hidden_size, self.out_hidden_size
    if self.family == "qwen2.5-vl":
      block = 2 * e + 4 * e * e + 4 * e + 3 * e * f + 2 * f + e
      merger = e + m * m + m + m * o + o
      return self.patch_dim * e + self.depth * block + merger
    block = 4 * e + 4 * e * e + 4 * e + 2 * e * f + f + e
    merger = m * m + m + m * o + o
    embed = self.patch_dim * e + e + self.num_position_embeddings * e
    return embed + self.depth * block + (2 * e + merger) + self.num_deepstack * (2 * m + merger)


@dataclasses.dataclass(frozen=True)
class VLConfig:
  """A vision-language model (Qwen2.5-VL, Qwen3-VL: `vision.family`): a vision tower whose merged patch features
  replace the embeddings of the prompt's image tokens, and a language model with multimodal RoPE (interleaved
  for Qwen3-VL). The prompt lays out each image as <vision_start> <image_token> x (patches / merge_unit)
  <vision_end>, as Hugging Face's processor does."""

  text: ModelConfig
  vision: VisionConfig
  image_token_id: int
  vision_start_token_id: int
  vision_end_token_id: int

  def __post_init__(self):
    if len(self.text.mrope_section) != 3:
      raise ValueError(f"the language model needs a 3-part mrope_section (temporal, height, width); "
                       f"got {self.text.mrope_section}")
    if self.vision.out_hidden_size != self.text.hidden_size:
      raise ValueError(f"vision out_hidden_size={self.vision.out_hidden_size} differs from the language "
                       f"model's hidden_size={self.text.hidden_size}")
    for name in ("image_token_id", "vision_start_token_id", "vision_end_token_id"):
      if not 0 <= getattr(self, name) < self.text.vocab_size:
        raise ValueError(f"{name}={getattr(self, name)} is outside the vocabulary ({self.text.vocab_size})")
    if self.text.mrope_interleaved != (self.family == "qwen3-vl"):
      raise ValueError(f"a {self.family} language model needs mrope_interleaved="
                       f"{self.family == 'qwen3-vl'} (Qwen3-VL interleaves the multimodal RoPE, Qwen2.5-VL does not)")
    if self.vision.num_deepstack > self.text.num_layers:
      raise ValueError(f"{self.vision.num_deepstack} DeepStack features for {self.text.num_layers} language layers")

  @property
  def family(self) -> str:
    return self.vision.family

  def replace(self, **kwargs: Any) -> "VLConfig":
    return dataclasses.replace(self, **kwargs)

  def num_params(self) -> int:
    return self.text.num_params() + self.vision.num_params()


_QWEN25_VL_TOKENS = dict(image_token_id=151_655, vision_start_token_id=151_652, vision_end_token_id=151_653)
_QWEN3_VL_TOKENS = _QWEN25_VL_TOKENS  # the same Qwen tokenizer and vision tokens


def language_config(config: Any) -> ModelConfig:
  """The language model's config of a ModelConfig (itself) or a VLConfig (its `text`)."""
  return config.text if isinstance(config, VLConfig) else config


VL_PRESETS: dict[str, VLConfig] = {
    # Small enough to train on 2 CPU cores: the tiny model's shape as a Qwen2.5-VL language model, a 4-block
    # vision tower with real patch geometry (so real image processors apply), and three vision tokens after
    # the tiny tokenizer's 4096 (hf.tiny_vl_tokenizer adds them; the vocabulary is padded to a multiple of 8).
    "tiny-vl": VLConfig(
        text=ModelConfig(
            vocab_size=4104, hidden_size=256, intermediate_size=704, num_layers=4, num_heads=8, num_kv_heads=4,
            head_dim=32, rope_theta=1_000_000.0, qkv_bias=True, tie_embeddings=True,
            max_position_embeddings=4096, mrope_section=(4, 6, 6)),
        vision=VisionConfig(depth=4, hidden_size=64, intermediate_size=176, num_heads=4, out_hidden_size=256,
                            fullatt_block_indexes=(1, 3)),
        image_token_id=4098, vision_start_token_id=4096, vision_end_token_id=4097),
    "qwen2.5-vl-3b": VLConfig(
        text=ModelConfig(
            vocab_size=151_936, hidden_size=2048, intermediate_size=11_008, num_layers=36, num_heads=16,
            num_kv_heads=2, head_dim=128, rope_theta=1_000_000.0, qkv_bias=True, tie_embeddings=True,
            max_position_embeddings=128_000, mrope_section=(16, 24, 24)),
        vision=VisionConfig(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048),
        **_QWEN25_VL_TOKENS),
    "qwen2.5-vl-7b": VLConfig(
        text=ModelConfig(
            vocab_size=152_064, hidden_size=3584, intermediate_size=18_944, num_layers=28, num_heads=28,
            num_kv_heads=4, head_dim=128, rope_theta=1_000_000.0, qkv_bias=True,
            max_position_embeddings=128_000, mrope_section=(16, 24, 24)),
        vision=VisionConfig(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584),
        **_QWEN25_VL_TOKENS),
    # tiny-vl's sizes as a Qwen3-VL: a Qwen3 language model (q/k norms, interleaved mRoPE) and a 4-block tower
    # with the real patch geometry (16 pixels, the 48 x 48 learned position grid) and DeepStack into the
    # first three language layers.
    "tiny-qwen3-vl": VLConfig(
        text=ModelConfig(
            vocab_size=4104, hidden_size=256, intermediate_size=704, num_layers=4, num_heads=8, num_kv_heads=4,
            head_dim=32, rope_theta=5_000_000.0, qk_norm=True, tie_embeddings=True,
            max_position_embeddings=4096, mrope_section=(6, 5, 5), mrope_interleaved=True),
        vision=VisionConfig(depth=4, hidden_size=64, intermediate_size=176, num_heads=4, out_hidden_size=256,
                            patch_size=16, fullatt_block_indexes=(), family="qwen3-vl",
                            num_position_embeddings=2304, deepstack_visual_indexes=(0, 1, 2)),
        image_token_id=4098, vision_start_token_id=4096, vision_end_token_id=4097),
    "qwen3-vl-2b": VLConfig(
        text=ModelConfig(
            vocab_size=151_936, hidden_size=2048, intermediate_size=6144, num_layers=28, num_heads=16,
            num_kv_heads=8, head_dim=128, rope_theta=5_000_000.0, qk_norm=True, tie_embeddings=True,
            max_position_embeddings=262_144, mrope_section=(24, 20, 20), mrope_interleaved=True),
        vision=VisionConfig(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2048,
                            patch_size=16, fullatt_block_indexes=(), family="qwen3-vl",
                            num_position_embeddings=2304, deepstack_visual_indexes=(5, 11, 17)),
        **_QWEN3_VL_TOKENS),
    "qwen3-vl-4b": VLConfig(
        text=ModelConfig(
            vocab_size=151_936, hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32,
            num_kv_heads=8, head_dim=128, rope_theta=5_000_000.0, qk_norm=True, tie_embeddings=True,
            max_position_embeddings=262_144, mrope_section=(24, 20, 20), mrope_interleaved=True),
        vision=VisionConfig(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2560,
                            patch_size=16, fullatt_block_indexes=(), family="qwen3-vl",
                            num_position_embeddings=2304, deepstack_visual_indexes=(5, 11, 17)),
        **_QWEN3_VL_TOKENS),
}


def vl_preset(name: str, **overrides: Any) -> VLConfig:
  """A named vision-language preset, with field overrides of the VLConfig (e.g. text=..., vision=...)."""
  if name not in VL_PRESETS:
    raise KeyError(f"unknown vision-language preset {name!r}; known: {sorted(VL_PRESETS)}")
  return VL_PRESETS[name].replace(**overrides)
