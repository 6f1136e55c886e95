"""A BERT encoder (post-LayerNorm, GELU, absolute learned positions) as pure functions of a params pytree, and
sentence-transformers' mean pooling with L2 normalisation: enough for all-MiniLM-L6-v2 (explore_jax/hf/encoder.py).

Parameters, float32, layers stacked on a leading axis and run under `lax.scan`:

  embed/word [vocab, E]  embed/position [max_positions, E]  embed/token_type [type_vocab, E]
  embed/norm, norm_bias [E]
  layers/q, k, v, o [L, E, E]                 layers/q_bias, k_bias, v_bias, o_bias [L, E]
  layers/attn_norm, attn_norm_bias [L, E]
  layers/fc1 [L, E, mlp]  layers/fc1_bias [L, mlp]  layers/fc2 [L, mlp, E]  layers/fc2_bias [L, E]
  layers/mlp_norm, mlp_norm_bias [L, E]

Matrices are [in, out] (x @ W), the transpose of torch's Linear weights. Inputs are right-padded token rows with
a boolean mask of the real tokens; a padding token never reaches a real token's output, so a row's result does
not depend on how far its batch was padded.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

# Full float32 matmuls: accelerators whose default float32 matmul goes through bfloat16 would otherwise miss
# sentence-transformers' outputs by ~1e-3 instead of ~1e-6. On CPU this is the default anyway.
_PRECISION = jax.lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """The fields of a BERT config.json that the forward pass reads (hidden_act "gelu", absolute positions)."""
  vocab_size: int = 30522
  hidden_size: int = 384
  num_layers: int = 6
  num_heads: int = 12
  intermediate_size: int = 1536
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads


def param_shapes(config: BertConfig) -> dict[str, dict[str, tuple[int, ...]]]:
  """The shape of every leaf of the params pytree (module docstring), for loaders to check tensors against."""
  E, L, M = config.hidden_size, config.num_layers, config.intermediate_size
  layers = {name: (L, E, E) for name in ("q", "k", "v", "o")}
  layers.update({name + "_bias": (L, E) for name in ("q", "k", "v", "o")})
  layers.update({"attn_norm": (L, E), "attn_norm_bias": (L, E), "fc1": (L, E, M), "fc1_bias": (L, M),
                 "fc2": (L, M, E), "fc2_bias": (L, E), "mlp_norm": (L, E), "mlp_norm_bias": (L, E)})
  embed = {"word": (config.vocab_size, E), "position": (config.max_position_embeddings, E),
           "token_type": (config.type_vocab_size, E), "norm": (E,), "norm_bias": (E,)}
  return {"embed": embed, "layers": layers}


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
  """(x - mean) / sqrt(var + eps) * weight + bias over the last axis, var the biased variance (torch's)."""
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps) * weight + bias


def _dense(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
  return jnp.einsum("bti,io->bto", x, w, precision=_PRECISION) + b


def _attention(p: dict[str, jax.Array], config: BertConfig, x: jax.Array, mask: jax.Array) -> jax.Array:
  """softmax(Q K^T / sqrt(head_dim)) V per head over the real keys of each row, then the output projection."""
  B, T, _ = x.shape
  H, D = config.num_heads, config.head_dim
  q = _dense(x, p["q"], p["q_bias"]).reshape(B, T, H, D)
  k = _dense(x, p["k"], p["k_bias"]).reshape(B, T, H, D)
  v = _dense(x, p["v"], p["v_bias"]).reshape(B, T, H, D)
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=_PRECISION) / math.sqrt(D)
  # The most negative finite float rather than -inf, as transformers' BERT masks: a row with no real token at
  # all (a batch's filler row) then gets uniform weights instead of NaN, and real rows are unaffected
  # (exp underflows to exactly 0 either way).
  scores = jnp.where(mask[:, None, None, :], scores, jnp.finfo(scores.dtype).min)
  weights = jax.nn.softmax(scores, axis=-1)
  context = jnp.einsum("bhqk,bkhd->bqhd", weights, v, precision=_PRECISION).reshape(B, T, H * D)
  return _dense(context, p["o"], p["o_bias"])


def _layer(p: dict[str, jax.Array], config: BertConfig, x: jax.Array, mask: jax.Array) -> jax.Array:
  """One post-LayerNorm block: x = LN(x + Attn(x)); x = LN(x + W2 GELU(W1 x))."""
  eps = config.layer_norm_eps
  x = layer_norm(x + _attention(p, config, x, mask), p["attn_norm"], p["attn_norm_bias"], eps)
  # BERT's "gelu" is the exact one, x * Phi(x) with erf; the tanh approximation would cost ~1e-4 of parity.
  h = jax.nn.gelu(_dense(x, p["fc1"], p["fc1_bias"]), approximate=False)
  return layer_norm(x + _dense(h, p["fc2"], p["fc2_bias"]), p["mlp_norm"], p["mlp_norm_bias"], eps)


def apply(params: dict[str, Any], config: BertConfig, tokens: jax.Array, mask: jax.Array) -> jax.Array:
  """The last layer's hidden states [B, T, E] of right-padded token rows [B, T] (int32) with mask [B, T] (bool).

  Embeddings are word + position (0..T-1) + token type 0 (single sentences), then LayerNorm; T may not exceed
  max_position_embeddings.
  """
  T = tokens.shape[1]
  if T > config.max_position_embeddings:
    raise ValueError(f"{T} tokens per row, but the model has {config.max_position_embeddings} positions")
  e = params["embed"]
  x = e["word"][tokens] + e["position"][:T][None] + e["token_type"][0]
  x = layer_norm(x, e["norm"], e["norm_bias"], config.layer_norm_eps)
  mask = mask.astype(bool)

  def body(h, layer_params):
    return _layer(layer_params, config, h, mask), None

  x, _ = jax.lax.scan(body, x, params["layers"])
  return x


def mean_pool_normalized(hidden: jax.Array, mask: jax.Array) -> jax.Array:
  """sum_t m_t h_t / max(sum_t m_t, 1e-9), then divided by max(||.||_2, 1e-12): [B, T, E] -> [B, E].

  The clamps are sentence-transformers' Pooling (1e-9) and torch.nn.functional.normalize (1e-12); a row
  without any real token comes out as zeros rather than NaN.
  """
  m = mask.astype(hidden.dtype)[..., None]
  pooled = jnp.sum(hidden * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1e-9)
  norm = jnp.linalg.norm(pooled, axis=-1, keepdims=True)
  return pooled / jnp.maximum(norm, 1e-12)
