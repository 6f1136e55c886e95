"""Hugging Face Qwen2.5-VL and Qwen3-VL checkpoints (Qwen2_5_VLForConditionalGeneration,
Qwen3VLForConditionalGeneration) <-> VLConfig and our params.

Qwen2.5-VL: the language model's tensors are named as a Qwen2 checkpoint's (hf/convert.py's mapping); the
tower's sit under `visual.`. That is the layout transformers writes (it renames its in-memory
`model.language_model.` and `model.visual.` modules back on save) and the one published checkpoints use;
checkpoints written in the in-memory layout load too.

Qwen3-VL: transformers writes its in-memory names (`model.language_model.` as a Qwen3 checkpoint's `model.`,
`model.visual.`, `lm_head.`), as the published checkpoints have them; we write those, and read either layout.
The tower's DeepStack mergers are `model.visual.deepstack_merger_list.{k}`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from jax.sharding import Mesh

from explore_jax.hf import convert, safetensors_io
from explore_jax.models.config import ModelConfig, VisionConfig, VLConfig
from explore_jax.models.vl import VLModel
from explore_jax.parallel import sharding

ARCHITECTURE = "Qwen2_5_VLForConditionalGeneration"
MODEL_TYPE = "qwen2_5_vl"
QWEN3_ARCHITECTURE = "Qwen3VLForConditionalGeneration"
QWEN3_MODEL_TYPE = "qwen3_vl"
# Our vision family (VisionConfig.family) of each model_type, and its architecture.
FAMILIES = {MODEL_TYPE: "qwen2.5-vl", QWEN3_MODEL_TYPE: "qwen3-vl"}
ARCHITECTURES = {"qwen2.5-vl": ARCHITECTURE, "qwen3-vl": QWEN3_ARCHITECTURE}
# In-memory module prefixes of transformers 5 -> the prefixes on disk.
_NESTED_PREFIXES = (("model.language_model.", "model."), ("model.visual.", "visual."))


def checkpoint_family(hf_dir: str) -> Optional[str]:
  """The vision family ("qwen2.5-vl", "qwen3-vl") a checkpoint directory's config.json describes, or None."""
  path = os.path.join(hf_dir, "config.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    raw = json.load(f)
  for model_type, family in FAMILIES.items():
    if raw.get("model_type") == model_type or ARCHITECTURES[family] in (raw.get("architectures") or []):
      return family
  return None


def is_vl_checkpoint(hf_dir: str) -> bool:
  """Whether a checkpoint directory's config.json describes a Qwen2.5-VL or Qwen3-VL model."""
  return checkpoint_family(hf_dir) is not None


def config_from_hf(hf_dir: str, *, param_dtype: str = "float32", dtype: Optional[str] = None) -> VLConfig:
  """Our VLConfig from a checkpoint's config.json, read through transformers (which also reads the flat
  layout of published Qwen2.5-VL checkpoints, with `rope_scaling: {type: mrope, ...}`, and the `rope_scaling`
  of published Qwen3-VL ones)."""
  import transformers  # imported here: only import/export needs it

  where = os.path.join(hf_dir, "config.json")
  hf = transformers.AutoConfig.from_pretrained(hf_dir, local_files_only=True)
  if getattr(hf, "model_type", None) == QWEN3_MODEL_TYPE:
    return _qwen3_config(hf, where, param_dtype, dtype or param_dtype)
  if getattr(hf, "model_type", None) != MODEL_TYPE:
    raise convert.UnsupportedCheckpointError(
        f"{where}: model_type {hf.model_type!r} is not one of {sorted(FAMILIES)}")
  t, v = hf.text_config, hf.vision_config
  if getattr(t, "use_sliding_window", False):
    raise convert.UnsupportedCheckpointError(f"{where}: use_sliding_window=true is not supported")
  for part, act in (("text_config", t.hidden_act), ("vision_config", v.hidden_act)):
    if act != "silu":
      raise convert.UnsupportedCheckpointError(f"{where}: {part}.hidden_act={act!r}; only silu is supported")
  rope = _mrope_parameters(t, v, where)
  heads = t.num_attention_heads
  text = ModelConfig(
      vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
      num_layers=t.num_hidden_layers, num_heads=heads, num_kv_heads=t.num_key_value_heads or heads,
      head_dim=t.hidden_size // heads,  # transformers' Qwen2.5-VL attention ignores any head_dim field
      rope_theta=float(rope["rope_theta"]), rms_norm_eps=t.rms_norm_eps, qkv_bias=True,
      tie_embeddings=bool(hf.tie_word_embeddings), max_position_embeddings=t.max_position_embeddings,
      mrope_section=tuple(int(s) for s in rope["mrope_section"]), param_dtype=param_dtype,
      dtype=dtype or param_dtype)
  vision = VisionConfig(
      depth=v.depth, hidden_size=v.hidden_size, intermediate_size=v.intermediate_size, num_heads=v.num_heads,
      out_hidden_size=v.out_hidden_size, in_channels=v.in_channels, patch_size=v.patch_size,
      temporal_patch_size=v.temporal_patch_size, spatial_merge_size=v.spatial_merge_size,
      window_size=v.window_size, fullatt_block_indexes=tuple(v.fullatt_block_indexes),
      rope_theta=float((v.rope_parameters or {}).get("rope_theta", 10_000.0)), param_dtype=param_dtype,
      dtype=dtype or param_dtype)
  return VLConfig(text=text, vision=vision, image_token_id=hf.image_token_id,
                  vision_start_token_id=hf.vision_start_token_id, vision_end_token_id=hf.vision_end_token_id)


def _mrope_parameters(t: Any, v: Any, where: str) -> dict[str, Any]:
  """The text config's RoPE parameters, checked to be plain multimodal RoPE over a tower of square patches."""
  rope = dict(t.rope_parameters or {})
  if rope.get("rope_type", "default") != "default" or "mrope_section" not in rope:
    raise convert.UnsupportedCheckpointError(f"{where}: text rope {rope} is not plain multimodal RoPE")
  if not isinstance(v.patch_size, int) or not isinstance(v.temporal_patch_size, int):
    raise convert.UnsupportedCheckpointError(f"{where}: non-square patch sizes are not supported")
  return rope


def _qwen3_config(hf: Any, where: str, param_dtype: str, dtype: str) -> VLConfig:
  t, v = hf.text_config, hf.vision_config
  if getattr(t, "attention_bias", False):
    raise convert.UnsupportedCheckpointError(f"{where}: text_config.attention_bias=true is not supported")
  for part, act, want in (("text_config", t.hidden_act, "silu"), ("vision_config", v.hidden_act, "gelu_pytorch_tanh")):
    if act != want:
      raise convert.UnsupportedCheckpointError(f"{where}: {part}.hidden_act={act!r}; only {want} is supported")
  rope = _mrope_parameters(t, v, where)
  heads = t.num_attention_heads
  try:
    # transformers' Qwen3-VL always interleaves the multimodal RoPE, whatever `mrope_interleaved` says.
    text = ModelConfig(
        vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
        num_layers=t.num_hidden_layers, num_heads=heads, num_kv_heads=t.num_key_value_heads or heads,
        head_dim=getattr(t, "head_dim", None) or t.hidden_size // heads, rope_theta=float(rope["rope_theta"]),
        rms_norm_eps=t.rms_norm_eps, qk_norm=True, tie_embeddings=bool(hf.tie_word_embeddings),
        max_position_embeddings=t.max_position_embeddings,
        mrope_section=tuple(int(s) for s in rope["mrope_section"]), mrope_interleaved=True,
        param_dtype=param_dtype, dtype=dtype)
    vision = VisionConfig(
        depth=v.depth, hidden_size=v.hidden_size, intermediate_size=v.intermediate_size, num_heads=v.num_heads,
        out_hidden_size=v.out_hidden_size, in_channels=v.in_channels, patch_size=v.patch_size,
        temporal_patch_size=v.temporal_patch_size, spatial_merge_size=v.spatial_merge_size,
        fullatt_block_indexes=(), rope_theta=float((v.rope_parameters or {}).get("rope_theta", 10_000.0)),
        family="qwen3-vl", num_position_embeddings=v.num_position_embeddings,
        deepstack_visual_indexes=tuple(int(i) for i in v.deepstack_visual_indexes), param_dtype=param_dtype,
        dtype=dtype)
    return VLConfig(text=text, vision=vision, image_token_id=hf.image_token_id,
                    vision_start_token_id=hf.vision_start_token_id, vision_end_token_id=hf.vision_end_token_id)
  except ValueError as e:
    raise convert.UnsupportedCheckpointError(f"{where}: {e}") from e


def _vision_mapping(c: VisionConfig) -> convert.Mapping:
  if c.family == "qwen3-vl":
    return _qwen3_vision_mapping(c)
  same = (lambda w: w, lambda w: w)
  t = (lambda w: w.T, lambda w: w.T)
  blk = "visual.blocks.{i}"
  return {
      **_patch_and_attention(c),
      ("vision", "layers", "norm1"): (f"{blk}.norm1.weight", *same),
      ("vision", "layers", "norm2"): (f"{blk}.norm2.weight", *same),
      **{("vision", "layers", name): (f"{blk}.mlp.{name}_proj.weight", *t) for name in ("gate", "up", "down")},
      **{("vision", "layers", f"{name}_bias"): (f"{blk}.mlp.{name}_proj.bias", *same)
         for name in ("gate", "up", "down")},
      ("vision", "merger", "norm"): ("visual.merger.ln_q.weight", *same),
      ("vision", "merger", "fc1"): ("visual.merger.mlp.0.weight", *t),
      ("vision", "merger", "fc1_bias"): ("visual.merger.mlp.0.bias", *same),
      ("vision", "merger", "fc2"): ("visual.merger.mlp.2.weight", *t),
      ("vision", "merger", "fc2_bias"): ("visual.merger.mlp.2.bias", *same),
  }


def _patch_and_attention(c: VisionConfig) -> convert.Mapping:
  """What both towers name alike: the patch embedding and each block's attention."""
  E, H, D, C, T, P = c.hidden_size, c.num_heads, c.head_dim, c.in_channels, c.temporal_patch_size, c.patch_size
  blk = "visual.blocks.{i}"
  return {
      # A Conv3d whose stride is its kernel: a linear map of each flattened (channel, frame, row, column) patch.
      ("vision", "patch_embed"): ("visual.patch_embed.proj.weight", lambda w: w.reshape(E, C * T * P * P).T,
                                  lambda w: w.T.reshape(E, C, T, P, P)),
      ("vision", "layers", "qkv"): (f"{blk}.attn.qkv.weight", lambda w: w.T.reshape(E, 3, H, D),
                                    lambda w: w.reshape(E, 3 * H * D).T),
      ("vision", "layers", "qkv_bias"): (f"{blk}.attn.qkv.bias", lambda w: w.reshape(3, H, D),
                                         lambda w: w.reshape(3 * H * D)),
      ("vision", "layers", "o"): (f"{blk}.attn.proj.weight", lambda w: w.reshape(E, H, D).transpose(1, 2, 0),
                                  lambda w: w.transpose(2, 0, 1).reshape(E, H * D)),
      ("vision", "layers", "o_bias"): (f"{blk}.attn.proj.bias", lambda w: w, lambda w: w),
  }


def _qwen3_vision_mapping(c: VisionConfig) -> convert.Mapping:
  same = (lambda w: w, lambda w: w)
  t = (lambda w: w.T, lambda w: w.T)
  blk = "visual.blocks.{i}"

  def merger(ours: tuple[str, ...], theirs: str) -> convert.Mapping:
    return {
        (*ours, "norm"): (f"{theirs}.norm.weight", *same),
        (*ours, "norm_bias"): (f"{theirs}.norm.bias", *same),
        (*ours, "fc1"): (f"{theirs}.linear_fc1.weight", *t),
        (*ours, "fc1_bias"): (f"{theirs}.linear_fc1.bias", *same),
        (*ours, "fc2"): (f"{theirs}.linear_fc2.weight", *t),
        (*ours, "fc2_bias"): (f"{theirs}.linear_fc2.bias", *same),
    }

  m = {
      **_patch_and_attention(c),
      ("vision", "patch_embed_bias"): ("visual.patch_embed.proj.bias", *same),
      ("vision", "pos_embed"): ("visual.pos_embed.weight", *same),
      **{("vision", "layers", f"norm{n}"): (f"{blk}.norm{n}.weight", *same) for n in (1, 2)},
      **{("vision", "layers", f"norm{n}_bias"): (f"{blk}.norm{n}.bias", *same) for n in (1, 2)},
      **{("vision", "layers", name): (f"{blk}.mlp.linear_{name}.weight", *t) for name in ("fc1", "fc2")},
      **{("vision", "layers", f"{name}_bias"): (f"{blk}.mlp.linear_{name}.bias", *same) for name in ("fc1", "fc2")},
      **merger(("vision", "merger"), "visual.merger"),
  }
  if c.num_deepstack:  # stacked like layers: {i} is the DeepStack merger's index
    m.update(merger(("vision", "deepstack"), "visual.deepstack_merger_list.{i}"))
  return m


def _mapping(config: VLConfig, nested: bool = False) -> convert.Mapping:
  """Our leaf -> checkpoint tensor, in the on-disk layout, or with `nested` transformers' in-memory one."""
  m = {**convert._mapping(config.text), **_vision_mapping(config.vision)}
  if not nested:
    return m

  def rename(name: str) -> str:
    for memory, disk in _NESTED_PREFIXES:
      if name.startswith(disk):
        return memory + name[len(disk):]
    return name

  return {path: (rename(name), *fns) for path, (name, *fns) in m.items()}


def load_params(hf_dir: str, config: VLConfig, *, mesh: Optional[Mesh] = None,
                rules: Optional[sharding.Rules] = None) -> dict[str, Any]:
  """Imports a Qwen2.5-VL or Qwen3-VL checkpoint into our params tree, in config.text.param_dtype, sharded on
  `mesh`."""
  nested = "model.language_model.embed_tokens.weight" in safetensors_io.CheckpointReader(hf_dir)
  model = VLModel(config)
  return convert.load_mapped(hf_dir, _mapping(config, nested), model.param_shapes(), model.param_axes(),
                             config.text.param_dtype, mesh=mesh, rules=rules,
                             unused=lambda n: config.text.tie_embeddings and n == "lm_head.weight")


def _text_token_ids(overrides: dict[str, Any]) -> dict[str, Any]:
  """The text config's bos / eos ids: the tokenizer's (save_pretrained passes them), else none. transformers'
  text configs otherwise default to the published models' ids, outside a small vocabulary."""
  return {k: overrides.get(k) for k in ("bos_token_id", "eos_token_id")}


def hf_config_dict(config: VLConfig, **overrides: Any) -> dict[str, Any]:
  """The config.json fields transformers needs to rebuild this model."""
  t, v = config.text, config.vision
  qwen3 = config.family == "qwen3-vl"
  if qwen3 and (not t.qk_norm or t.qkv_bias or t.rope_type != "default"):
    raise ValueError("a Qwen3-VL language model has q/k norms, no qkv biases and plain (multimodal, interleaved) "
                     f"RoPE; got {t}")
  if not qwen3 and (t.head_dim * t.num_heads != t.hidden_size or t.qk_norm or not t.qkv_bias
                    or t.rope_type != "default"):
    raise ValueError("a Qwen2.5-VL language model has qkv biases, no q/k norms, plain (multimodal) RoPE and "
                     f"head_dim = hidden_size / num_heads; got {t}")
  model_type = QWEN3_MODEL_TYPE if qwen3 else MODEL_TYPE
  rope = {"rope_type": "default", "rope_theta": t.rope_theta, "mrope_section": list(t.mrope_section)}
  text = {
      "model_type": f"{model_type}_text", "vocab_size": t.vocab_size, "hidden_size": t.hidden_size,
      "intermediate_size": t.intermediate_size, "num_hidden_layers": t.num_layers,
      "num_attention_heads": t.num_heads, "num_key_value_heads": t.num_kv_heads,
      **({"head_dim": t.head_dim} if qwen3 else {}), "hidden_act": "silu",
      "max_position_embeddings": t.max_position_embeddings, "rms_norm_eps": t.rms_norm_eps,
      "rope_parameters": {**rope, "mrope_interleaved": True} if qwen3 else rope,
      **({"attention_bias": False} if qwen3 else {"use_sliding_window": False}),
      "tie_word_embeddings": t.tie_embeddings, **_text_token_ids(overrides),
  }
  if qwen3:
    tower = {"num_position_embeddings": v.num_position_embeddings,
             "deepstack_visual_indexes": list(v.deepstack_visual_indexes), "hidden_act": "gelu_pytorch_tanh"}
  else:
    tower = {"window_size": v.window_size, "fullatt_block_indexes": list(v.fullatt_block_indexes),
             "hidden_act": "silu"}
  vision = {
      "model_type": f"{model_type}_vision", "depth": v.depth, "hidden_size": v.hidden_size,
      "intermediate_size": v.intermediate_size, "num_heads": v.num_heads, "out_hidden_size": v.out_hidden_size,
      "in_channels": v.in_channels, "patch_size": v.patch_size, "temporal_patch_size": v.temporal_patch_size,
      "spatial_merge_size": v.spatial_merge_size, **tower,
      "rope_parameters": {"rope_type": "axial", "rope_theta": v.rope_theta},
  }
  d = {
      "architectures": [ARCHITECTURES[config.family]], "model_type": model_type, "text_config": text,
      "vision_config": vision, "image_token_id": config.image_token_id,
      "vision_start_token_id": config.vision_start_token_id, "vision_end_token_id": config.vision_end_token_id,
      "tie_word_embeddings": t.tie_embeddings, "dtype": t.param_dtype,
  }
  d.update(overrides)
  return d


def save_params(out_dir: str, config: VLConfig, params: dict[str, Any], *, max_shard_bytes: int = 5 * 2**30,
                **config_overrides: Any) -> None:
  """Writes config.json and safetensors that transformers' Qwen2_5_VLForConditionalGeneration (or, for a
  Qwen3-VL config, Qwen3VLForConditionalGeneration) loads, each in the tensor layout transformers writes."""
  config_dict = hf_config_dict(config, **config_overrides)  # first: it rejects what transformers cannot load
  convert.save_mapped(out_dir, _mapping(config, nested=config.family == "qwen3-vl"), params, max_shard_bytes)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(config_dict, f, indent=2)
