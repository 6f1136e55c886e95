"""The policy model family: config, pure-functional transformer, presets."""

from explore_jax.models.config import PRESETS, ModelConfig, preset
from explore_jax.models.transformer import KVCache, Model, ModelOutput, positions_from_mask

__all__ = ["PRESETS", "KVCache", "Model", "ModelConfig", "ModelOutput", "positions_from_mask", "preset"]
