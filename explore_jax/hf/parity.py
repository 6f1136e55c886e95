"""Logit parity between our import of a checkpoint and transformers' PyTorch implementation of it."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from explore_jax.hf import convert, load_tokenizer
from explore_jax.models.transformer import Model, positions_from_mask

DEFAULT_PROMPTS = (
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "You are in a kitchen. There is a locked door to the north and a key on the table.",
    "Hello",
    "<|im_start|>user\nWrite a function that reverses a list.<|im_end|>\n<|im_start|>assistant\n",
)


def padded_batch(tokenizer, prompts: Sequence[str], padding_side: str = "left") -> tuple[np.ndarray, np.ndarray]:
  """Token ids and attention mask of `prompts`, padded to the longest with the tokenizer's pad id."""
  ids = [tokenizer(p, add_special_tokens=False)["input_ids"] or [0] for p in prompts]
  width = max(len(x) for x in ids)
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  tokens = np.full((len(ids), width), pad, np.int32)
  mask = np.zeros((len(ids), width), bool)
  for r, x in enumerate(ids):
    sl = slice(width - len(x), width) if padding_side == "left" else slice(0, len(x))
    tokens[r, sl], mask[r, sl] = x, True
  return tokens, mask


def max_logit_diffs(hf_dir: str, prompts: Sequence[str] = DEFAULT_PROMPTS, *, dtype: str = "float32",
                    padding_side: str = "left") -> list[float]:
  """Per-prompt max |logits_ours - logits_transformers| over real tokens of one padded batch."""
  import torch
  from transformers import AutoModelForCausalLM

  tokenizer = load_tokenizer(hf_dir)
  tokens, mask = padded_batch(tokenizer, prompts, padding_side)
  positions = np.asarray(positions_from_mask(jnp.asarray(mask)))

  config = convert.config_from_hf(hf_dir, param_dtype=dtype)
  params = convert.load_params(hf_dir, config)
  with jax.default_matmul_precision("highest"):  # GPUs/TPUs would otherwise use reduced-precision passes
    ours = jax.jit(Model(config).apply)(params, tokens, positions, attention_mask=mask).logits
  ours = np.asarray(ours, np.float32)
  del params

  torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
  ref_model = AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True, dtype=torch_dtype)
  ref_model.eval()
  with torch.no_grad():
    ref = ref_model(input_ids=torch.from_numpy(tokens.astype(np.int64)),
                    attention_mask=torch.from_numpy(mask.astype(np.int64)),
                    position_ids=torch.from_numpy(positions.astype(np.int64))).logits.float().numpy()
  return [float(np.abs(ours[r][mask[r]] - ref[r][mask[r]]).max()) for r in range(len(prompts))]
