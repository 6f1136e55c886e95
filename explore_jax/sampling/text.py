"""Chat prompts in, greedy text out, from a checkpoint beside the policy: a model asked a few questions now and then
(EAPO's rollback teacher). The policy's own sampling goes through train/inference.py's InferenceServer; this is the
plain path, one `generate` call per batch of prompts, on the default devices.

  chat = ChatModel.load("/path/to/Qwen3-8B")          # or a .gguf file, or a built-in name
  chat.complete([[{"role": "user", "content": "..."}], ...], max_new_tokens=16)  # -> ["...", ...]
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from explore_jax.sampling.sampler import generate, left_pad
from explore_jax.sampling.schedule import make_sampling_params

WIDTH_BUCKET = 64  # prompt widths are rounded up to this: one compiled program per bucket


@dataclasses.dataclass
class ChatModel:
  """A language model, its params and tokenizer, answering chat prompts greedily (temperature 0)."""
  model: Any
  params: Any
  tokenizer: Any
  max_prompt_tokens: int = 1024
  batch_size: int = 8

  @classmethod
  def load(cls, checkpoint: str, **kwargs: Any) -> "ChatModel":
    """A local Hugging Face directory, a .gguf file or a built-in name (hf.resolve), never the network."""
    from explore_jax import hf
    from explore_jax.models import Model

    pre = hf.load_pretrained(checkpoint)
    return cls(Model(pre.config), pre.params, pre.tokenizer, **kwargs)

  def complete(self, prompts: Sequence[list[dict[str, str]]], max_new_tokens: int = 32) -> list[str]:
    """Each prompt's greedy answer as text (special tokens left out), cut from the left to `max_prompt_tokens`."""
    from explore_jax.actors.actor import PromptTokenizer

    encoder = PromptTokenizer(self.tokenizer, self.max_prompt_tokens)
    ids = [encoder.encode(list(messages))[0] for messages in prompts]
    pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
    sampling = make_sampling_params(0.0, eos_ids=[self.tokenizer.eos_token_id])
    answers = []
    for start in range(0, len(ids), self.batch_size):
      rows = ids[start:start + self.batch_size]
      width = -(-max(len(r) for r in rows) // WIDTH_BUCKET) * WIDTH_BUCKET
      tokens, mask = left_pad(rows, width, self.batch_size, pad_id)
      active = np.arange(self.batch_size) < len(rows)
      out = generate(self.model, self.params, tokens, mask, sampling, jax.random.key(0),
                     max_new_tokens=max_new_tokens, active=active, pad_id=pad_id)
      tokens, lengths = jax.device_get((out.tokens, out.lengths))
      answers += [self.tokenizer.decode(tokens[i, :lengths[i]], skip_special_tokens=True) for i in range(len(rows))]
    return answers
