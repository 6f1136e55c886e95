"""Small GGUF files for the tests, written with the gguf package's own GGUFWriter as llama.cpp's converter lays
them out: `<arch>.*` metadata, the tiny tokenizer's vocabulary and merges as tokenizer.ggml.*, a ChatML template,
and random weights under llama.cpp's tensor names (Llama's q/k rows permuted), quantized to the type asked for.

gguf can quantize F16, Q8_0, Q4_0 and Q4_1 itself. For the K-quants (Q4_K, Q6_K) it only dequantizes, so their
blocks are random bytes with small finite float16 scales: any such block is a valid tensor both loaders read.
"""

from __future__ import annotations

import json
import os

import numpy as np

ARCHITECTURES = ("llama", "qwen2", "qwen3")
QUANT_TYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")
TINY_TOKENIZER = os.path.join(os.path.dirname(__file__), "..", "..", "explore_jax", "hf", "assets", "tiny",
                              "tokenizer.json")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# Dimensions every quantization type can store (rows of 256 for the K-quants). transformers' Qwen3 GGUF path takes
# head_dim from the config's default (128), not from qwen3.attention.key_length, so Qwen3 files use 128.
SHAPES = {"hidden": 256, "intermediate": 512, "layers": 2, "heads": 4, "kv_heads": 2}
HEAD_DIM = {"llama": 64, "qwen2": 64, "qwen3": 128}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp's converter's Llama q/k row order: each head's two rotary halves interleaved pair by pair."""
  return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _k_quant_blocks(rng: np.random.Generator, rows: int, cols: int, qtype) -> np.ndarray:
  import gguf

  block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
  blocks = rng.integers(0, 256, (rows * cols // block_elems, block_bytes), dtype=np.uint8)
  # Scales that keep values near the other types' (|w| up to ~0.1): d * 63 * 15 for Q4_K, d * 8 * 32 for Q6_K.
  scale = lambda n, top: rng.uniform(top / 4, top, (len(blocks), n)).astype(np.float16).view(np.uint8)  # noqa: E731
  if qtype == gguf.GGMLQuantizationType.Q4_K:  # d, dmin, then 12 bytes of 6-bit scales and the 4-bit values
    blocks[:, :4] = scale(2, 1e-4)
  else:  # Q6_K: low bits, high bits, 16 int8 scales, then d
    blocks[:, 192:208] = rng.integers(-8, 8, (len(blocks), 16), dtype=np.int8).view(np.uint8)
    blocks[:, 208:] = scale(1, 4e-4)
  return blocks.reshape(rows, -1)


def _encode(w: np.ndarray, qtype_name: str, rng: np.random.Generator):
  """(data, raw_dtype) for GGUFWriter.add_tensor: a 2-D weight in `qtype_name`."""
  import gguf

  qtype = gguf.GGMLQuantizationType[qtype_name]
  if qtype_name == "F32":
    return w.astype(np.float32), None
  if qtype_name in ("Q4_K", "Q6_K"):
    return _k_quant_blocks(rng, *w.shape, qtype), qtype
  return gguf.quants.quantize(w.astype(np.float32), qtype), (None if qtype_name == "F16" else qtype)


def write_gguf(path: str, arch: str = "llama", qtype: str = "F32", *, seed: int = 0, tied: bool = False,
               replace: dict | None = None, pre: str = "default") -> str:
  """A small `arch` checkpoint at `path` with every weight matrix stored as `qtype` (norms stay F32, as llama.cpp
  leaves them); `replace` maps tensor names to the (data, raw_dtype) written in their place."""
  import gguf

  rng = np.random.default_rng(seed)
  with open(TINY_TOKENIZER) as f:
    tok = json.load(f)
  vocab = tok["model"]["vocab"]
  tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
  added = {a["id"]: a["content"] for a in tok["added_tokens"]}
  types = [3 if i in added else 1 for i in range(len(tokens))]
  merges = [" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]]

  E, F, L, H, K = (SHAPES[k] for k in ("hidden", "intermediate", "layers", "heads", "kv_heads"))
  D, V = HEAD_DIM[arch], len(tokens)
  w = gguf.GGUFWriter(path, arch)
  w.add_block_count(L)
  w.add_context_length(512)
  w.add_embedding_length(E)
  w.add_feed_forward_length(F)
  w.add_head_count(H)
  w.add_head_count_kv(K)
  w.add_key_length(D)
  w.add_value_length(D)
  w.add_rope_dimension_count(D)
  w.add_rope_freq_base(10_000.0 if arch == "llama" else 1_000_000.0)
  w.add_layer_norm_rms_eps(1e-6)
  w.add_vocab_size(V)
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre(pre)
  w.add_token_list(tokens)
  w.add_token_types(types)
  w.add_token_merges(merges)
  w.add_bos_token_id(0)
  w.add_eos_token_id(3)
  w.add_pad_token_id(1)
  w.add_add_bos_token(False)
  w.add_chat_template(CHATML)

  def matrix(rows, cols, scale=0.05):
    return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

  def put(name, value, quantized=True):
    if name in (replace or {}):
      data, raw = replace[name]
      w.add_tensor(name, data, raw_dtype=raw)
    elif quantized and value.ndim == 2:
      data, raw = _encode(value, qtype, rng)
      w.add_tensor(name, data, raw_dtype=raw)
    else:
      w.add_tensor(name, value.astype(np.float32))

  put("token_embd.weight", matrix(V, E, 0.1))
  put("output_norm.weight", 1 + 0.1 * rng.standard_normal(E).astype(np.float32), quantized=False)
  if not tied:
    put("output.weight", matrix(V, E))
  for i in range(L):
    q, k = matrix(H * D, E), matrix(K * D, E)
    if arch == "llama":
      q, k = _permute(q, H), _permute(k, K)
    put(f"blk.{i}.attn_norm.weight", 1 + 0.1 * rng.standard_normal(E), quantized=False)
    put(f"blk.{i}.ffn_norm.weight", 1 + 0.1 * rng.standard_normal(E), quantized=False)
    put(f"blk.{i}.attn_q.weight", q)
    put(f"blk.{i}.attn_k.weight", k)
    put(f"blk.{i}.attn_v.weight", matrix(K * D, E))
    put(f"blk.{i}.attn_output.weight", matrix(E, H * D))
    put(f"blk.{i}.ffn_gate.weight", matrix(F, E))
    put(f"blk.{i}.ffn_up.weight", matrix(F, E))
    put(f"blk.{i}.ffn_down.weight", matrix(E, F))
    if arch == "qwen2":
      for n, rows in (("q", H * D), ("k", K * D), ("v", K * D)):
        put(f"blk.{i}.attn_{n}.bias", 0.1 * rng.standard_normal(rows), quantized=False)
    if arch == "qwen3":
      put(f"blk.{i}.attn_q_norm.weight", 1 + 0.1 * rng.standard_normal(D), quantized=False)
      put(f"blk.{i}.attn_k_norm.weight", 1 + 0.1 * rng.standard_normal(D), quantized=False)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path
