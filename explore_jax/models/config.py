"""The policy model family's configuration: one dataclass covers Llama 2/3, Qwen2/2.5 and Qwen3."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
ROPE_TYPES = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of a decoder-only transformer.

  The architecture differences of the supported families are flags:
  Llama 2/3 (untied, llama3 RoPE scaling), Qwen2/2.5 (`qkv_bias`), Qwen3 (`qk_norm`, often tied).
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

  def __post_init__(self):
    for name in ("param_dtype", "dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r}: expected one of {sorted(_DTYPES)}")
    if self.rope_type not in ROPE_TYPES:
      raise ValueError(f"ModelConfig.rope_type={self.rope_type!r} is not supported; expected one of {ROPE_TYPES}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")

  @property
  def jnp_param_dtype(self):
    return _DTYPES[self.param_dtype]

  @property
  def jnp_dtype(self):
    return _DTYPES[self.dtype]

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


# Shapes of real checkpoints, for benchmarks and for configs that import weights from a local directory
# (the importer reads the real numbers from config.json; these are for random-weight runs).
PRESETS: dict[str, ModelConfig] = {
    # The built-in model every command can use without downloads (its tokenizer is in hf/assets/tiny).
    "tiny": ModelConfig(
        vocab_size=4096, hidden_size=256, intermediate_size=704, num_layers=4, num_heads=8,
        num_kv_heads=4, head_dim=32, rope_theta=10_000.0, qk_norm=True, tie_embeddings=True,
        max_position_embeddings=4096),
    "qwen3-0.6b": ModelConfig(
        vocab_size=151_936, hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
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
