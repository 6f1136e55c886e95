"""LoRA adapters in PEFT's format, which transformers/PEFT and vLLM load on top of the base checkpoint.

  adapter_config.json         peft_type "LORA", r, lora_alpha, target_modules, ... (the fields PEFT writes)
  adapter_model.safetensors   base_model.model.<module>.lora_A.weight [r, in] and <module>.lora_B.weight [out, r]
                              for every layer, <module> named as the base weight is (hf/convert.py), e.g.
                              base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight

PEFT computes W x + (lora_alpha / r) lora_B lora_A x, so our A [in, r] is lora_A^T and our B [r, out] is lora_B^T,
with head axes flattened as in the base weight ([q_heads, head_dim] -> q_heads * head_dim). The merged model,
for tools that take no adapters, is `hf.save_pretrained(dir, config, models.lora.merge(base, adapters, lora))`.
On a vision-language checkpoint the adapters are the language model's: their modules are named as transformers
holds them (`model.language_model.layers.{i}...`), and target_modules is a pattern that matches those alone, so
PEFT adds no adapters to the vision tower's MLP (which has gate/up/down_proj too).
(This module is not named peft.py so that it never shadows the peft package.)
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from explore_jax.hf import convert, convert_vl, safetensors_io
from explore_jax.models.config import VLConfig, language_config
from explore_jax.models.lora import Adapters, LoraConfig

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."  # PeftModel's wrapper around the base model's own module names


def adapter_config(lora: LoraConfig, base_model_name_or_path: str = "", vl: bool = False) -> dict[str, Any]:
  """adapter_config.json's fields: plain LoRA (no DoRA, rsLoRA, biases or extra trained modules). With `vl`,
  target_modules is a pattern matching the language model's modules only (PEFT full-matches a string)."""
  alpha = float(lora.alpha)
  targets: Any = list(lora.target_modules)
  if vl:
    targets = rf".*language_model\.layers\.\d+\.(self_attn|mlp)\.({'|'.join(lora.target_modules)})"
  return {
      "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model_name_or_path or None,
      "revision": None, "r": lora.rank, "lora_alpha": int(alpha) if alpha.is_integer() else alpha,
      "lora_dropout": 0.0, "target_modules": targets, "bias": "none", "fan_in_fan_out": False,
      "use_rslora": False, "use_dora": False, "init_lora_weights": True, "inference_mode": True,
      "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {},
      "alpha_pattern": {},
  }


def peft_tensors(config: Any, adapters: Adapters, lora: LoraConfig) -> dict[str, np.ndarray]:
  """Every adapter matrix under its PEFT name, float32, in PEFT's [r, in] / [out, r] layout (a ModelConfig, or
  a VLConfig: its language model's modules as transformers holds them)."""
  vl = isinstance(config, VLConfig)
  mapping = convert_vl._mapping(config, nested=True) if vl else convert._mapping(config)
  out = {}
  for module, leaf in zip(lora.target_modules, lora.leaves):
    path = mapping[("layers", leaf)][0].removesuffix(".weight")  # model.layers.{i}.self_attn.q_proj
    a, b = np.asarray(adapters[leaf]["a"], np.float32), np.asarray(adapters[leaf]["b"], np.float32)
    for i in range(language_config(config).num_layers):
      name = _PREFIX + path.format(i=i)
      out[f"{name}.lora_A.weight"] = a[i].reshape(-1, lora.rank).T
      out[f"{name}.lora_B.weight"] = b[i].reshape(lora.rank, -1).T
  return out


def save_peft(out_dir: str, config: Any, adapters: Adapters, lora: LoraConfig, *,
              base_model_name_or_path: str = "") -> str:
  """Writes adapter_config.json and adapter_model.safetensors to `out_dir`; returns its absolute path."""
  out_dir = os.path.abspath(out_dir)
  os.makedirs(out_dir, exist_ok=True)
  safetensors_io.write_file(os.path.join(out_dir, WEIGHTS_FILE), peft_tensors(config, adapters, lora))
  with open(os.path.join(out_dir, CONFIG_FILE), "w") as f:
    json.dump(adapter_config(lora, base_model_name_or_path, vl=isinstance(config, VLConfig)), f, indent=2)
  return out_dir
