"""The policy model family: config, pure-functional transformer, presets; the Qwen2.5-VL vision-language model."""

from explore_jax.models.config import PRESETS, VL_PRESETS, ModelConfig, VisionConfig, VLConfig, preset, vl_preset
from explore_jax.models.transformer import KVCache, Model, ModelOutput, positions_from_mask
from explore_jax.models.vl import VLModel

__all__ = ["PRESETS", "VL_PRESETS", "KVCache", "Model", "ModelConfig", "ModelOutput", "VLConfig", "VLModel",
           "VisionConfig", "positions_from_mask", "preset", "vl_preset"]
