"""Hugging Face checkpoints <-> our params pytree (Llama, Qwen2, Qwen3), from local directories only.

Import streams tensor by tensor: each of our (layer-stacked) leaves is assembled from the checkpoint's
memory-mapped tensors, cast to the configured dtype, placed on the devices, and only then is the next
leaf built. A 7B model therefore never needs two full copies in host memory.
"""

from __future__ import annotations

import json
import os
import types
from typing import Any, Callable, Optional

import jax
import ml_dtypes
import numpy as np
from jax.sharding import Mesh

from explore_jax.hf import safetensors_io
from explore_jax.models.config import ModelConfig
from explore_jax.models.transformer import Model
from explore_jax.parallel import sharding

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
# Tensors some checkpoints carry that our model derives instead.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class UnsupportedCheckpointError(ValueError):
  """A checkpoint directory our importer cannot read, with the file or field that is the reason."""


def _read_config_json(hf_dir: str) -> dict[str, Any]:
  path = os.path.join(hf_dir, "config.json")
  if not os.path.isdir(hf_dir):
    raise FileNotFoundError(f"checkpoint directory {hf_dir} does not exist")
  if not os.path.exists(path):
    raise FileNotFoundError(f"no config.json in {hf_dir}")
  with open(path) as f:
    return json.load(f)


def family_of(raw: dict[str, Any], where: str = "config.json") -> str:
  archs = raw.get("architectures") or []
  for arch in archs:
    if arch in ARCHITECTURES:
      return ARCHITECTURES[arch]
  model_type = raw.get("model_type")
  if model_type in ARCHITECTURES.values():
    return model_type
  raise UnsupportedCheckpointError(
      f"{where}: unsupported architecture {archs or model_type!r}; supported: {sorted(ARCHITECTURES)}")


# The config.json fields config_from_hf reads. A config.json that spells out every one, in transformers 5's layout
# (rope_parameters, as hf_config_dict and transformers 5 write it), is read as written: there is no default to
# supply. Any other goes through transformers' AutoConfig, which supplies the family's defaults and converts older
# layouts (a top-level rope_theta, rope_scaling), at the price of importing torch (~3.5 s of CPU a process).
EXPLICIT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_parameters", "tie_word_embeddings",
                   "max_position_embeddings")
_LEGACY_FIELDS = ("rope_theta", "rope_scaling")


def hf_config(hf_dir: str, raw: dict[str, Any]) -> Any:
  """The checkpoint's config as attributes: `raw` (its config.json) itself where every EXPLICIT_FIELDS entry is
  there, else transformers' AutoConfig of the directory."""
  if all(k in raw for k in EXPLICIT_FIELDS) and not any(k in raw for k in _LEGACY_FIELDS):
    return types.SimpleNamespace(**raw)
  import transformers  # imported here: only import/export needs it

  return transformers.AutoConfig.from_pretrained(hf_dir, local_files_only=True)


def config_from_hf(hf_dir: str, *, param_dtype: str = "float32", dtype: Optional[str] = None) -> ModelConfig:
  """Our ModelConfig from a checkpoint's config.json (transformers' defaults where it leaves a field out:
  hf_config)."""
  raw = _read_config_json(hf_dir)
  where = os.path.join(hf_dir, "config.json")
  family = family_of(raw, where)
  hf = hf_config(hf_dir, raw)
  for flag in ("attention_bias", "mlp_bias", "use_sliding_window"):
    if getattr(hf, flag, False):
      raise UnsupportedCheckpointError(f"{where}: {flag}=true is not supported")
  rope = dict(getattr(hf, "rope_parameters", None) or {})
  rope_type = rope.pop("rope_type", rope.pop("type", "default"))
  theta = rope.pop("rope_theta", getattr(hf, "rope_theta", 10_000.0))
  scaling = ()
  if rope_type == "linear":
    scaling = (("factor", float(rope["factor"])),)
  elif rope_type == "llama3":
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    scaling = tuple((k, float(rope[k])) for k in keys)
  elif rope_type != "default":
    raise UnsupportedCheckpointError(f"{where}: rope type {rope_type!r} is not supported")
  heads = hf.num_attention_heads
  return ModelConfig(
      vocab_size=hf.vocab_size,
      hidden_size=hf.hidden_size,
      intermediate_size=hf.intermediate_size,
      num_layers=hf.num_hidden_layers,
      num_heads=heads,
      num_kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
      head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
      rope_theta=float(theta),
      rope_type=rope_type,
      rope_scaling=scaling,
      rms_norm_eps=hf.rms_norm_eps,
      qkv_bias=family == "qwen2",
      qk_norm=family == "qwen3",
      tie_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
      max_position_embeddings=hf.max_position_embeddings,
      param_dtype=param_dtype,
      dtype=dtype or param_dtype,
  )


# ---- the name and layout mapping -------------------------------------------------------------------
# Each entry: our leaf path -> (HF name with {i} for the layer, to_ours, to_hf). Linear weights are
# stored [out, in] by PyTorch and [in, ...heads] by us. A leaf whose name has {i} stacks one checkpoint
# tensor per index of its leading (layer) axis; load_mapped / save_mapped serve any such mapping
# (hf/convert_vl.py adds a vision tower's).
Mapping = dict[tuple[str, ...], tuple[str, Callable, Callable]]


def _mapping(c: ModelConfig) -> Mapping:
  E, H, K, D = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
  same = (lambda w: w, lambda w: w)
  t = (lambda w: w.T, lambda w: w.T)

  def proj(n):
    return (lambda w: w.T.reshape(E, n, D), lambda w: w.reshape(E, n * D).T)

  def bias(n):
    return (lambda w: w.reshape(n, D), lambda w: w.reshape(n * D))

  att, mlp = "model.layers.{i}.self_attn", "model.layers.{i}.mlp"
  m = {
      ("embed",): ("model.embed_tokens.weight", *same),
      ("final_norm",): ("model.norm.weight", *same),
      ("layers", "attn_norm"): ("model.layers.{i}.input_layernorm.weight", *same),
      ("layers", "mlp_norm"): ("model.layers.{i}.post_attention_layernorm.weight", *same),
      ("layers", "q"): (f"{att}.q_proj.weight", *proj(H)),
      ("layers", "k"): (f"{att}.k_proj.weight", *proj(K)),
      ("layers", "v"): (f"{att}.v_proj.weight", *proj(K)),
      ("layers", "o"): (f"{att}.o_proj.weight", lambda w: w.reshape(E, H, D).transpose(1, 2, 0),
                        lambda w: w.transpose(2, 0, 1).reshape(E, H * D)),
      ("layers", "gate"): (f"{mlp}.gate_proj.weight", *t),
      ("layers", "up"): (f"{mlp}.up_proj.weight", *t),
      ("layers", "down"): (f"{mlp}.down_proj.weight", *t),
  }
  if c.qkv_bias:
    m[("layers", "q_bias")] = (f"{att}.q_proj.bias", *bias(H))
    m[("layers", "k_bias")] = (f"{att}.k_proj.bias", *bias(K))
    m[("layers", "v_bias")] = (f"{att}.v_proj.bias", *bias(K))
  if c.qk_norm:
    m[("layers", "q_norm")] = (f"{att}.q_norm.weight", *same)
    m[("layers", "k_norm")] = (f"{att}.k_norm.weight", *same)
  if not c.tie_embeddings:
    m[("lm_head",)] = ("lm_head.weight", *t)
  return m


def _get(tree: dict, path: tuple[str, ...]) -> Any:
  for p in path:
    tree = tree[p]
  return tree


def _set(tree: dict, path: tuple[str, ...], value: Any) -> None:
  for p in path[:-1]:
    tree = tree.setdefault(p, {})
  tree[path[-1]] = value


def load_params(hf_dir: str, config: ModelConfig, *, mesh: Optional[Mesh] = None,
                rules: Optional[sharding.Rules] = None) -> dict[str, Any]:
  """Imports a checkpoint's tensors into our params pytree, in config.param_dtype, sharded on `mesh`."""
  model = Model(config)
  return load_mapped(hf_dir, _mapping(config), model.param_shapes(), model.param_axes(), config.param_dtype,
                     mesh=mesh, rules=rules,
                     unused=lambda n: config.tie_embeddings and n == "lm_head.weight")


def load_mapped(hf_dir: str, mapping: Mapping, shapes: Any, axes: Any, param_dtype: str, *,
                mesh: Optional[Mesh] = None, rules: Optional[sharding.Rules] = None,
                unused: Callable[[str], bool] = lambda name: False) -> dict[str, Any]:
  """The params tree `mapping` builds from a checkpoint, leaf by leaf, each placed on the devices (sharded by
  its logical `axes` on `mesh`) before the next is read. Checkpoint tensors the mapping does not read are an
  error unless `unused(name)` says they may be ignored."""
  reader = safetensors_io.CheckpointReader(hf_dir)
  np_dtype = _NP_DTYPES[param_dtype]
  expected = set()
  params: dict[str, Any] = {}
  for path, (name, to_ours, _) in mapping.items():
    shape = _get(shapes, path).shape
    if "{i}" in name:
      leaf = np.empty(shape, np_dtype)
      for i in range(shape[0]):
        leaf[i] = _checked(to_ours(reader.get(_need(reader, name.format(i=i), hf_dir))), shape[1:], name)
        expected.add(name.format(i=i))
    else:
      leaf = _checked(to_ours(reader.get(_need(reader, name, hf_dir))), shape, name).astype(np_dtype)
      expected.add(name)
    if mesh is not None:
      s = sharding.named_sharding(mesh, _get(axes, path), rules or sharding.DEFAULT_RULES, shape)
      # Every process reads the whole checkpoint and hands jax only the shards its devices hold.
      _set(params, path, jax.make_array_from_callback(shape, s, lambda index, leaf=leaf: leaf[index]))
    else:
      _set(params, path, jax.device_put(leaf))
    del leaf
  unknown = [n for n in reader.keys() if n not in expected and not n.endswith(_IGNORED_SUFFIXES) and not unused(n)]
  if unknown:
    raise UnsupportedCheckpointError(f"{hf_dir}: tensors our architecture does not use: {unknown[:5]}")
  return params


def _need(reader: safetensors_io.CheckpointReader, name: str, hf_dir: str) -> str:
  if name not in reader:
    raise UnsupportedCheckpointError(f"{hf_dir}: missing tensor {name!r}")
  return name


def _checked(arr: np.ndarray, shape: tuple[int, ...], name: str) -> np.ndarray:
  if arr.shape != tuple(shape):
    raise UnsupportedCheckpointError(f"tensor {name!r} has shape {arr.shape}; config implies {tuple(shape)}")
  return arr


# ---- export --------------------------------------------------------------------------------------

def hf_config_dict(config: ModelConfig, **overrides: Any) -> dict[str, Any]:
  """The config.json fields transformers needs to rebuild this model."""
  family = "qwen3" if config.qk_norm else "qwen2" if config.qkv_bias else "llama"
  arch = {v: k for k, v in ARCHITECTURES.items()}[family]
  rope = {"rope_type": config.rope_type, "rope_theta": config.rope_theta, **config.rope_scaling_dict}
  if "original_max_position_embeddings" in rope:
    rope["original_max_position_embeddings"] = int(rope["original_max_position_embeddings"])
  d = {
      "architectures": [arch], "model_type": family, "vocab_size": config.vocab_size,
      "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
      "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
      "num_key_value_heads": config.num_kv_heads, "head_dim": config.head_dim,
      "rms_norm_eps": config.rms_norm_eps, "rope_parameters": rope, "hidden_act": "silu",
      "tie_word_embeddings": config.tie_embeddings, "max_position_embeddings": config.max_position_embeddings,
      "attention_bias": False, "dtype": config.param_dtype,
  }
  if family == "llama":
    d["mlp_bias"] = False
  else:
    d["use_sliding_window"] = False
  d.update(overrides)
  return d


def save_params(out_dir: str, config: ModelConfig, params: dict[str, Any], *,
                max_shard_bytes: int = 5 * 2**30, **config_overrides: Any) -> None:
  """Writes config.json and safetensors that transformers' AutoModelForCausalLM loads."""
  save_mapped(out_dir, _mapping(config), params, max_shard_bytes)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf_config_dict(config, **config_overrides), f, indent=2)


def save_mapped(out_dir: str, mapping: Mapping, params: dict[str, Any], max_shard_bytes: int = 5 * 2**30) -> None:
  """Writes the checkpoint tensors `mapping` makes of `params`, streamed one tensor at a time."""
  os.makedirs(out_dir, exist_ok=True)
  entries, producers = [], {}
  for path, (name, _, to_hf) in mapping.items():
    leaf = _get(params, path)
    dtype = np.dtype(leaf.dtype)
    stacked = "{i}" in name
    layer_names = [name.format(i=i) for i in range(leaf.shape[0])] if stacked else [name]
    for i, n in enumerate(layer_names):
      per = leaf.shape[1:] if stacked else leaf.shape
      shape = jax.eval_shape(to_hf, jax.ShapeDtypeStruct(per, dtype)).shape
      entries.append((n, shape, dtype))
      producers[n] = (path, i if stacked else None, to_hf)

  def produce(n: str) -> np.ndarray:
    path, i, to_hf = producers[n]
    leaf = _get(params, path)
    return to_hf(np.asarray(leaf[i] if i is not None else leaf))

  safetensors_io.write_checkpoint(out_dir, entries, produce, max_shard_bytes)
