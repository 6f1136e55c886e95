"""Tokenizers of local checkpoint directories (no jax, no network): actors and the learner load them here.

A directory with `tokenizer.json` loads through transformers (a fast tokenizer, every modern checkpoint). A
directory whose tokenizer is only a SentencePiece model, `tokenizer.model` (Llama-2-style checkpoints),
loads through `sentencepiece` itself: without a `tokenizer_class` in tokenizer_config.json transformers
guesses a tokenizer for it, and what it guesses changes between its releases (5.23 built one that split text
differently from the model's own processor; 5.24 agrees with it). The model's own processor is the reference,
whatever transformers is installed. `SentencePieceTokenizer` has the small part of the
transformers tokenizer interface this project uses: call, decode, the special token ids, token -> id, the
chat template from tokenizer_config.json, save_pretrained.

`AutoTokenizer` itself costs ~4 s of CPU in every process that calls it: choosing a class imports transformers'
model registry, and with it torch. A directory that AutoTokenizer loads as transformers' generic
`TokenizersBackend` (`direct_backend`: the tiny checkpoints, and any directory whose tokenizer_config.json names
that class, for model types where AutoTokenizer keeps it) loads through that class directly, which imports no
torch: the same class and files, so the same tokenizer (tests/hf/test_tokenization.py holds the two paths equal).
An actor loads a tokenizer and nothing else of transformers, so it starts with ~3 s less CPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, Optional, Sequence

SENTENCEPIECE_MODEL = "tokenizer.model"
TOKENIZER_CONFIG = "tokenizer_config.json"
BACKEND_CLASS = "TokenizersBackend"
# The config.json model types for which AutoTokenizer keeps a tokenizer_config.json's TokenizersBackend (those this
# project writes). Not qwen2: transformers replaces the class it names with Qwen2Tokenizer there.
BACKEND_MODEL_TYPES = ("qwen3", "llama", "qwen2_5_vl", "qwen3_vl")


def load_tokenizer(directory: str) -> Any:
  """The tokenizer saved in a local checkpoint directory (module docstring: which library reads it)."""
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"checkpoint directory {directory} does not exist")
  if (os.path.exists(os.path.join(directory, SENTENCEPIECE_MODEL))
      and not os.path.exists(os.path.join(directory, "tokenizer.json"))):
    return SentencePieceTokenizer.from_dir(directory)
  try:
    if direct_backend(directory):
      from transformers.tokenization_utils_tokenizers import TokenizersBackend

      return TokenizersBackend.from_pretrained(directory, local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, local_files_only=True)
  except (OSError, ValueError) as e:
    raise FileNotFoundError(f"no loadable tokenizer in {directory}: {str(e).splitlines()[0]}") from None


def json_file(path: str) -> Optional[Any]:
  """The parsed JSON file at `path`, or None where there is none."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def direct_backend(directory: str) -> bool:
  """Whether AutoTokenizer would load `directory` as the generic TokenizersBackend (module docstring), decided from
  the two JSON files it decides by: a tokenizer.json, a tokenizer_config.json naming TokenizersBackend with no
  custom code (auto_map), and a config.json of one of BACKEND_MODEL_TYPES or none at all."""
  if not os.path.exists(os.path.join(directory, "tokenizer.json")):
    return False
  tokenizer_config = json_file(os.path.join(directory, TOKENIZER_CONFIG)) or {}
  if tokenizer_config.get("tokenizer_class") != BACKEND_CLASS or "auto_map" in tokenizer_config:
    return False
  config = json_file(os.path.join(directory, "config.json"))
  return config is None or (config.get("model_type") in BACKEND_MODEL_TYPES and "auto_map" not in config)


def _token_text(value: Any) -> Optional[str]:
  """A special token as tokenizer_config.json writes it: a string or an AddedToken dict {"content": ...}."""
  if isinstance(value, dict):
    return value.get("content")
  return value


class SentencePieceTokenizer:
  """A SentencePiece model with tokenizer_config.json's special tokens and chat template.

  Encoding adds the BOS token in front when `add_special_tokens` (as Llama-2's tokenizer does, unless the
  config says add_bos_token false) and EOS at the end only if add_eos_token is true. Decoding with
  skip_special_tokens drops the control pieces (BOS, EOS, pad, unk stays as SentencePiece renders it).
  """

  def __init__(self, model_file: str, config: Optional[dict[str, Any]] = None):
    import sentencepiece

    config = dict(config or {})
    self.model_file = model_file
    self.config = config
    self.sp = sentencepiece.SentencePieceProcessor(model_file=model_file)
    self.add_bos_token = bool(config.get("add_bos_token", True))
    self.add_eos_token = bool(config.get("add_eos_token", False))
    self.chat_template = config.get("chat_template")

    def special(name: str, default_id: int) -> Optional[int]:
      text = _token_text(config.get(name))
      if text is not None:
        token_id = self.sp.piece_to_id(text)
        if token_id == self.sp.unk_id() and text != self.sp.id_to_piece(self.sp.unk_id()):
          raise ValueError(f"{TOKENIZER_CONFIG}: {name} {text!r} is not a piece of {model_file}")
        return token_id
      return default_id if default_id >= 0 else None

    self.bos_token_id = special("bos_token", self.sp.bos_id())
    self.eos_token_id = special("eos_token", self.sp.eos_id())
    self.pad_token_id = special("pad_token", self.sp.pad_id())
    self.unk_token_id = special("unk_token", self.sp.unk_id())
    self.bos_token = None if self.bos_token_id is None else self.sp.id_to_piece(self.bos_token_id)
    self.eos_token = None if self.eos_token_id is None else self.sp.id_to_piece(self.eos_token_id)
    self.all_special_ids = sorted({i for i in (self.bos_token_id, self.eos_token_id, self.pad_token_id)
                                   if i is not None})
    self._special_ids = {self.sp.id_to_piece(i): i for i in self.all_special_ids}
    self._special_split = (re.compile("(" + "|".join(re.escape(t) for t in sorted(self._special_ids, key=len,
                                                                                    reverse=True)) + ")")
                           if self._special_ids else None)

  @classmethod
  def from_dir(cls, directory: str) -> "SentencePieceTokenizer":
    config_path = os.path.join(directory, TOKENIZER_CONFIG)
    config = {}
    if os.path.exists(config_path):
      with open(config_path) as f:
        config = json.load(f)
    return cls(os.path.join(directory, SENTENCEPIECE_MODEL), config)

  def __len__(self) -> int:
    return self.sp.get_piece_size()

  @property
  def vocab_size(self) -> int:
    return self.sp.get_piece_size()

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    """Token ids of `text`. A special token written in the text (a chat template's "<s>", "</s>") is that
    token's id, and the text between special tokens is encoded piece by piece, each with SentencePiece's dummy
    prefix: as Llama-2's reference code encodes a chat, one turn at a time."""
    ids: list[int] = []
    for part in self._special_split.split(text) if self._special_split is not None else [text]:
      if part in self._special_ids:
        ids.append(self._special_ids[part])
      elif part:
        ids.extend(self.sp.encode(part))
    if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
      ids = [self.bos_token_id] + ids
    if add_special_tokens and self.add_eos_token and self.eos_token_id is not None:
      ids = ids + [self.eos_token_id]
    return ids

  def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
    ids = self.encode(text, add_special_tokens=add_special_tokens)
    return {"input_ids": ids, "attention_mask": [1] * len(ids)}

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    ids = [int(i) for i in ids]
    if skip_special_tokens:
      special = set(self.all_special_ids)
      ids = [i for i in ids if i not in special]
    return self.sp.decode(ids)

  def convert_tokens_to_ids(self, token: str) -> int:
    return self.sp.piece_to_id(token)

  def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = False,
                          tokenize: bool = True) -> Any:
    """The config's Jinja chat template rendered as transformers renders it (a sandboxed environment with
    bos_token, eos_token and raise_exception)."""
    if not self.chat_template:
      raise ValueError(f"{self.model_file}: the checkpoint has no chat_template in {TOKENIZER_CONFIG}")
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
      raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    text = env.from_string(self.chat_template).render(
        messages=messages, add_generation_prompt=add_generation_prompt, bos_token=self.bos_token or "",
        eos_token=self.eos_token or "")
    return self.encode(text, add_special_tokens=False) if tokenize else text

  def save_pretrained(self, directory: str) -> None:
    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, SENTENCEPIECE_MODEL)
    if not os.path.exists(target) or not os.path.samefile(self.model_file, target):
      shutil.copyfile(self.model_file, target)
    with open(os.path.join(directory, TOKENIZER_CONFIG), "w") as f:
      json.dump(self.config, f, indent=2)
