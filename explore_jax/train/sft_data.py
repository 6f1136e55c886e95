"""Supervised fine-tuning data: JSONL demonstrations, oracle demonstrations, and their token arrays.

A demonstration line is `{"messages": [{"role": ..., "content": ...}, ...], "response": "..."}`: the chat
the model sees and the reply it should give. Prompts are tokenised by the actors' own `PromptTokenizer`,
so a warm-started policy sees at training time exactly what it will see when acting.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterable, Sequence

import gymnasium
import numpy as np

from explore_jax.actors.actor import PromptTokenizer
from explore_jax.actors.protocol import Prompt
from explore_jax.envs import oracle_demonstrations


def load_demonstrations(path: str) -> list[dict[str, Any]]:
  """Reads a JSONL file of demonstrations; a malformed line is an error naming its line number."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"no demonstrations file {path}")
  out = []
  with open(path) as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        d = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
      if not isinstance(d, dict) or not isinstance(d.get("messages"), list) or not isinstance(d.get("response"), str):
        raise ValueError(f"{path}:{n}: expected {{\"messages\": [...], \"response\": \"...\"}}")
      out.append(d)
  return out


def write_demonstrations(path: str, demos: Iterable[dict[str, Any]]) -> int:
  """Writes demonstrations as JSONL (atomically); returns how many."""
  tmp = f"{path}.tmp"
  n = 0
  with open(tmp, "w") as f:
    for d in demos:
      f.write(json.dumps(d) + "\n")
      n += 1
  os.replace(tmp, path)
  return n


def oracle_sft_demos(env_id: str, env_kwargs: dict[str, Any], seeds: Sequence[int],
                     prompt_hook: Callable[..., list[dict[str, str]]]) -> list[dict[str, Any]]:
  """(prompt, oracle action) demonstrations from an environment's oracle, one per step, with the
  prompts built by the method's hook from the same history the actor would hold."""
  env = gymnasium.make(env_id, **env_kwargs)
  demos = []
  for d in oracle_demonstrations(env, seeds):
    history: list[tuple[str, str]] = []
    for obs, action in zip(d.observations, d.actions):
      messages = prompt_hook(obs, list(history), {}, {})
      if isinstance(messages, Prompt):
        if messages.images:
          env.close()
          raise ValueError(f"{env_id}: the SFT warm start does not take image prompts yet (the oracle's "
                           f"prompts show screenshots); set config.sft.enabled=False")
        messages = messages.messages
      demos.append({"messages": messages, "response": action})
      history.append((obs, action))
  env.close()
  return demos


def tokenize_demos(tokenizer: Any, demos: Sequence[dict[str, Any]], prompt_len: int,
                   response_len: int) -> dict[str, np.ndarray]:
  """Token arrays for the next-token step: [prompt | response + EOS], prompt left-padded to
  `prompt_len` (longer prompts keep their end, as actors truncate), loss on the response only."""
  eos = tokenizer.eos_token_id
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
  encoder = PromptTokenizer(tokenizer, prompt_len)
  n, width = len(demos), prompt_len + response_len
  tokens = np.full((n, width), pad, np.int32)
  attention = np.zeros((n, width), bool)
  loss = np.zeros((n, width), bool)
  for i, d in enumerate(demos):
    prompt, _ = encoder.encode(d["messages"])
    response = tokenizer(d["response"], add_special_tokens=False)["input_ids"] + [eos]
    if len(response) > response_len:
      raise ValueError(f"demonstration {i}: response of {len(response)} tokens exceeds response_len={response_len}")
    start = prompt_len - len(prompt)
    tokens[i, start:prompt_len] = prompt
    tokens[i, prompt_len:prompt_len + len(response)] = response
    attention[i, start:prompt_len + len(response)] = True
    loss[i, prompt_len:prompt_len + len(response)] = True
  return {"tokens": tokens, "attention_mask": attention, "loss_mask": loss}
