"""A pure-functional decoder-only transformer (Llama 2/3, Qwen2/2.5, Qwen3, the language models of Qwen2.5-VL and
Qwen3-VL).

Parameters are a plain pytree of arrays, layers stacked on a leading axis and run under `lax.scan`:

  embed [vocab, embed]                    final_norm [embed]        lm_head [embed, vocab] (untied only)
  layers/attn_norm, mlp_norm [L, embed]
  layers/q [L, embed, q_heads, head_dim]  layers/k, v [L, embed, kv_heads, head_dim]
  layers/o [L, q_heads, head_dim, embed]  layers/{q,k,v}_bias (qkv_bias)   layers/{q,k}_norm (qk_norm)
  layers/gate, up [L, embed, mlp]         layers/down [L, mlp, embed]

`Model.param_axes()` gives the same tree of logical axis names, which the sharding rules map to the mesh.
An optional `params["lora"]` subtree holds LoRA adapters on these leaves (models/lora.py: `adapted`), whose
outputs the projections add.

Attention works in cache *slots*: a query in slot i sees keys in slots j <= i that are valid. Without a
cache the slots are the T input positions; with one, the T new tokens are written at slots
[cache.index, cache.index + T); a cache indexed per row (continuous batching) takes one token per row, written
at that row's own slot index[b]. Positions (for RoPE) are given explicitly per token, so left padding,
right padding and packed rows all work; `attention_mask` marks the real tokens. With `config.mrope_section`
a token's position may be three coordinates (temporal, height, width: multimodal RoPE, models/vl.py),
`embeds` may replace the token embeddings (a VLM's image features at its image tokens), and `deepstack` adds
Qwen3-VL's DeepStack features to the hidden states after the first layers.

Two layer loops: without a cache (training, scoring) the layers run under `lax.scan`, which keeps compile
time flat in depth. With a cache (sampling) they are unrolled over one [B, kv_heads, S, head_dim] buffer
per layer: a decode step then updates each buffer in place and feeds it to the attention dots as it is,
where slicing a stacked [L, ...] cache inside a scan costs two copies of the cache per token.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from explore_jax.models import decode_attention as decode_attention_lib
from explore_jax.models.config import ModelConfig, mrope_coordinates
from explore_jax.parallel import sharding

Params = dict[str, Any]
_NEG = -1e30  # finite, so a query with no visible key (a padding row) gets a uniform softmax, not NaN


class KVCache(NamedTuple):
  """Preallocated keys/values of every layer, the validity of each slot and the next slot to write."""
  k: tuple[jax.Array, ...]  # L x [B, kv_heads, S, head_dim]
  v: tuple[jax.Array, ...]  # L x [B, kv_heads, S, head_dim]
  mask: jax.Array           # [B, S] bool: slot holds a real token
  # Next slot to write: [] for a cache all rows fill in step (prefill, `sampling.generate`), or [B], each row
  # its own, for continuous batching (`sampling.slots`): one new token per row per call, at its own slot.
  index: jax.Array


class ModelOutput(NamedTuple):
  logits: jax.Array                 # [B, T, vocab] float32
  cache: Optional[KVCache] = None   # updated cache, when one was given
  hidden: Optional[jax.Array] = None  # [B, T, embed] after the final norm, when asked for


@dataclasses.dataclass(frozen=True)
class ParamSpec:
  """One parameter: its shape, the logical names of its axes (which the sharding rules map to the mesh), and
  how it starts. A tree of these defines a model's params (here and in models/vision.py)."""
  shape: tuple[int, ...]
  axes: tuple[Optional[str], ...]
  init: str  # "normal", "ones" or "zeros"


def _is_spec(x: Any) -> bool:
  return isinstance(x, ParamSpec)


def spec_axes(specs: Any) -> Params:
  """The tree with each ParamSpec replaced by its tuple of logical axis names."""
  return jax.tree.map(lambda s: s.axes, specs, is_leaf=_is_spec)


def spec_shapes(specs: Any, dtype: Any) -> Params:
  """The tree of jax.ShapeDtypeStruct (no memory)."""
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype), specs, is_leaf=_is_spec)


def spec_init(specs: Any, rng: jax.Array, std: float, dtype: Any) -> Params:
  """Random parameters: normal(0, std) matrices, unit norms, zero biases (Hugging Face's defaults)."""
  leaves, treedef = jax.tree.flatten(specs, is_leaf=_is_spec)
  keys = jax.random.split(rng, len(leaves))

  def make(spec: ParamSpec, key: jax.Array) -> jax.Array:
    if spec.init == "ones":
      return jnp.ones(spec.shape, dtype)
    if spec.init == "zeros":
      return jnp.zeros(spec.shape, dtype)
    return (std * jax.random.normal(key, spec.shape, jnp.float32)).astype(dtype)

  return jax.tree.unflatten(treedef, [make(s, k) for s, k in zip(leaves, keys)])


def _param_specs(c: ModelConfig) -> dict[str, Any]:
  L, E, F, H, K, D = (c.num_layers, c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads,
                      c.head_dim)
  layers = {
      "attn_norm": ParamSpec((L, E), ("layers", "embed"), "ones"),
      "q": ParamSpec((L, E, H, D), ("layers", "embed", "q_heads", "head_dim"), "normal"),
      "k": ParamSpec((L, E, K, D), ("layers", "embed", "kv_heads", "head_dim"), "normal"),
      "v": ParamSpec((L, E, K, D), ("layers", "embed", "kv_heads", "head_dim"), "normal"),
      "o": ParamSpec((L, H, D, E), ("layers", "q_heads", "head_dim", "embed"), "normal"),
      "mlp_norm": ParamSpec((L, E), ("layers", "embed"), "ones"),
      "gate": ParamSpec((L, E, F), ("layers", "embed", "mlp"), "normal"),
      "up": ParamSpec((L, E, F), ("layers", "embed", "mlp"), "normal"),
      "down": ParamSpec((L, F, E), ("layers", "mlp", "embed"), "normal"),
  }
  if c.qkv_bias:
    layers["q_bias"] = ParamSpec((L, H, D), ("layers", "q_heads", "head_dim"), "zeros")
    layers["k_bias"] = ParamSpec((L, K, D), ("layers", "kv_heads", "head_dim"), "zeros")
    layers["v_bias"] = ParamSpec((L, K, D), ("layers", "kv_heads", "head_dim"), "zeros")
  if c.qk_norm:
    layers["q_norm"] = ParamSpec((L, D), ("layers", "head_dim"), "ones")
    layers["k_norm"] = ParamSpec((L, D), ("layers", "head_dim"), "ones")
  specs: dict[str, Any] = {
      "embed": ParamSpec((c.vocab_size, E), ("vocab", "embed"), "normal"),
      "layers": layers,
      "final_norm": ParamSpec((E,), ("embed",), "ones"),
  }
  if not c.tie_embeddings:
    specs["lm_head"] = ParamSpec((E, c.vocab_size), ("embed", "vocab"), "normal")
  return specs


def rope_inv_freq(c: ModelConfig) -> jax.Array:
  """Inverse RoPE frequencies [head_dim/2], with linear or llama3-style scaling (Hugging Face's rules)."""
  d = c.head_dim
  inv = 1.0 / (c.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
  s = c.rope_scaling_dict
  if c.rope_type == "linear":
    return inv / s["factor"]
  if c.rope_type == "llama3":
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = jnp.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return jnp.where(medium, smoothed, scaled)
  return inv


def rope_angles(positions: jax.Array, inv_freq: jax.Array, sections: tuple[int, ...] = (),
                interleaved: bool = False) -> jax.Array:
  """Rotation angles [..., D/2] of RoPE: each frequency times the position it rotates by.

  Without `sections`, positions [...] give all frequencies the token's one position. With them, positions
  [..., A] give each token A coordinates and the frequencies split into consecutive blocks of these sizes,
  block j rotating by coordinate j: Qwen2-VL's multimodal RoPE (temporal, height, width) and the 2-D RoPE
  of its vision tower (height, width). `interleaved`: Qwen3-VL's layout of the same counts instead
  (config.mrope_coordinates).
  """
  if not sections:
    return positions[..., None].astype(jnp.float32) * inv_freq
  if positions.shape[-1] != len(sections):
    raise ValueError(f"positions have {positions.shape[-1]} coordinates; sections {sections} need {len(sections)}")
  coordinate = mrope_coordinates(sections, interleaved)  # [D/2]: which coordinate each frequency uses
  return positions[..., coordinate].astype(jnp.float32) * inv_freq


def apply_rope(x: jax.Array, angles: jax.Array) -> jax.Array:
  """Rotary embedding in the half-split layout of Hugging Face checkpoints. x [..., N, D], angles [..., D/2]
  (the same for all N heads)."""
  emb = jnp.concatenate([angles, angles], axis=-1)[..., None, :]
  cos, sin = jnp.cos(emb).astype(x.dtype), jnp.sin(emb).astype(x.dtype)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos + rotated * sin


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return weight.astype(x.dtype) * normed.astype(x.dtype)


class SpecParams(abc.ABC):
  """Parameters described by a ParamSpec tree (`param_specs()`): their logical axes, shapes and random values all
  come from that one tree, for any network of the project (the language model, the vision tower). Subclasses
  are dataclasses with a `config` that has `jnp_param_dtype`."""

  @abc.abstractmethod
  def param_specs(self) -> Any:
    """The network's ParamSpec tree."""

  def param_axes(self) -> Params:
    """The params tree with each leaf replaced by its tuple of logical axis names."""
    return spec_axes(self.param_specs())

  def param_shapes(self) -> Params:
    """The params tree of jax.ShapeDtypeStruct (no memory)."""
    return spec_shapes(self.param_specs(), self.config.jnp_param_dtype)

  def init(self, rng: jax.Array, std: float = 0.02) -> Params:
    """Random parameters: normal(0, std) matrices, unit norms, zero biases (Hugging Face's defaults)."""
    return spec_init(self.param_specs(), rng, std, self.config.jnp_param_dtype)


@dataclasses.dataclass(frozen=True)
class Model(SpecParams):
  """The network as pure functions of a params pytree. Hashable, so it can be a static jit argument.

  `mesh` and `rules` (optional) add logical sharding constraints on activations; parameters get their
  shardings from `param_axes()` and the same rules wherever they are created or loaded.
  """

  config: ModelConfig
  mesh: Optional[Mesh] = None
  rules: Optional[sharding.Rules] = None

  def param_specs(self) -> Any:
    return _param_specs(self.config)

  def init_cache(self, batch: int, length: int, per_row: bool = False) -> KVCache:
    """An empty KV cache of `length` slots in the compute dtype; `per_row`: each row its own next slot."""
    c = self.config
    shape = (batch, c.num_kv_heads, length, c.head_dim)
    layers = range(c.num_layers)
    return KVCache(k=tuple(jnp.zeros(shape, c.jnp_dtype) for _ in layers),
                   v=tuple(jnp.zeros(shape, c.jnp_dtype) for _ in layers),
                   mask=jnp.zeros((batch, length), bool),
                   index=jnp.zeros((batch,) if per_row else (), jnp.int32))

  def cache_axes(self, per_row: bool = False) -> KVCache:
    kv = tuple(("batch", "kv_heads", "cache_length", "head_dim") for _ in range(self.config.num_layers))
    return KVCache(k=kv, v=kv, mask=("batch", "cache_length"), index=("batch",) if per_row else ())

  # ---- forward ----------------------------------------------------------------------------------
  def _constrain(self, x: jax.Array, axes: tuple[Optional[str], ...]) -> jax.Array:
    return sharding.constrain(x, axes, self.mesh, self.rules)

  def apply(self, params: Params, tokens: jax.Array, positions: jax.Array,
            cache: Optional[KVCache] = None, *, attention_mask: Optional[jax.Array] = None,
            return_hidden: bool = False, logits_to_keep: int = 0,
            embeds: Optional[jax.Array] = None, deepstack: Optional[jax.Array] = None,
            decode_attention: str = "dense") -> ModelOutput:
    """Logits for `tokens` [B, T] at RoPE `positions` [B, T]; writes into and returns `cache` if given.

    With `config.mrope_section`, positions may also be [B, T, 3] (multimodal RoPE; [B, T] means the same
    position on all three). `embeds` [B, T, E], when given, is the first layer's input instead of the
    embeddings of `tokens` (which then only give the shape). `deepstack` [K, B, T, E], when given, is added
    to the hidden states after each of the first K layers, slice k after layer k (Qwen3-VL's DeepStack: image
    features from the vision tower's earlier blocks at the image tokens, zeros elsewhere).
    attention_mask [B, T] (default all ones) marks real tokens; padding is never attended to.
    logits_to_keep > 0 projects only the last that many positions onto the vocabulary (logits
    [B, logits_to_keep, V]): the learner scores responses, not prompts, and the [B, T, V] logits of a
    long prompt are the largest tensor of the step. `hidden` stays [B, T, E]. With a cache indexed per row,
    `decode_attention` names how a row attends to its keys (models/decode_attention.py; "dense" by default).
    """
    c = self.config
    dt = c.jnp_dtype
    B, T = tokens.shape
    if attention_mask is None:
      attention_mask = jnp.ones((B, T), bool)
    attention_mask = attention_mask.astype(bool)

    per_row = cache is not None and cache.index.ndim == 1
    if cache is None:
      start = jnp.zeros((), jnp.int32)
      key_mask = attention_mask
    elif per_row:
      if T != 1:
        raise ValueError(f"a cache indexed per row takes one new token per row, got {T}")
      start = cache.index  # [B]
      written = jnp.arange(cache.mask.shape[1])[None, :] == start[:, None]
      key_mask = jnp.where(written, attention_mask, cache.mask)
    else:
      start = cache.index
      key_mask = jax.lax.dynamic_update_slice(cache.mask, attention_mask, (0, start))
    S = key_mask.shape[1]
    if per_row:
      visible = (jnp.arange(S)[None, :] <= start[:, None])[:, None, :] & key_mask[:, None, :]  # [B, 1, S]
      first = jnp.argmax(key_mask, axis=1)  # a row's keys are the slots [first, start]
    else:
      query_slot = start + jnp.arange(T)
      visible = (jnp.arange(S)[None, :] <= query_slot[:, None])[None] & key_mask[:, None, :]  # [B, T, S]

    x = params["embed"].astype(dt)[tokens] if embeds is None else embeds.astype(dt)
    x = self._constrain(x, ("batch", "length", "act_embed"))
    if positions.ndim == tokens.ndim:
      angles = rope_angles(positions, rope_inv_freq(c))
    elif c.mrope_section:
      angles = rope_angles(positions, rope_inv_freq(c), c.mrope_section, c.mrope_interleaved)
    else:
      raise ValueError(f"positions of shape {positions.shape} for tokens {tokens.shape} need config.mrope_section")

    adapters = params.get("lora", {})
    if deepstack is not None:
      if not 0 < deepstack.shape[0] <= c.num_layers or deepstack.shape[1:] != x.shape:
        raise ValueError(f"deepstack of shape {deepstack.shape} for hidden states {x.shape} and {c.num_layers} layers")
      deepstack = self._constrain(deepstack.astype(dt), (None, "batch", "length", "act_embed"))

    def attention_inputs(x, lp, la):
      h = rms_norm(x, lp["attn_norm"], c.rms_norm_eps)
      q = _dense("bte,ehd->bthd", h, lp, la, "q", dt)
      k = _dense("bte,ehd->bthd", h, lp, la, "k", dt)
      v = _dense("bte,ehd->bthd", h, lp, la, "v", dt)
      if c.qkv_bias:
        q, k, v = q + lp["q_bias"].astype(dt), k + lp["k_bias"].astype(dt), v + lp["v_bias"].astype(dt)
      if c.qk_norm:
        q, k = rms_norm(q, lp["q_norm"], c.rms_norm_eps), rms_norm(k, lp["k_norm"], c.rms_norm_eps)
      q, k = apply_rope(q, angles), apply_rope(k, angles)
      q = self._constrain(q, ("batch", "length", "q_heads", "head_dim"))
      # Keys and values head-major, [B, K, T, D]: the layout of the cache and of the attention dots.
      return q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

    def attention_out_and_mlp(x, lp, la, attn):
      attn = self._constrain(attn, ("batch", "length", "q_heads", "head_dim"))
      x = x + _dense("bthd,hde->bte", attn, lp, la, "o", dt)
      x = self._constrain(x, ("batch", "length", "act_embed"))
      h = rms_norm(x, lp["mlp_norm"], c.rms_norm_eps)
      gate = _dense("bte,ef->btf", h, lp, la, "gate", dt)
      up = _dense("bte,ef->btf", h, lp, la, "up", dt)
      act = self._constrain(jax.nn.silu(gate) * up, ("batch", "length", "mlp"))
      x = x + _dense("btf,fe->bte", act, lp, la, "down", dt)
      return self._constrain(x, ("batch", "length", "act_embed"))

    if cache is None:
      def layer(x, layer_params):
        lp, la = layer_params
        q, k, v = attention_inputs(x, lp, la)
        return attention_out_and_mlp(x, lp, la, attention(q, k, v, visible)), None

      if c.remat:
        layer = jax.checkpoint(layer, prevent_cse=False)
      if deepstack is None:
        x, _ = jax.lax.scan(layer, x, (params["layers"], adapters))
      else:
        K = deepstack.shape[0]

        def layer_and_deepstack(x, inputs):
          layer_params, i = inputs
          x, _ = layer(x, layer_params)
          added = jax.lax.dynamic_index_in_dim(deepstack, jnp.minimum(i, K - 1), keepdims=False)
          x = jnp.where(i < K, x + added, x)
          return self._constrain(x, ("batch", "length", "act_embed")), None

        x, _ = jax.lax.scan(layer_and_deepstack, x, ((params["layers"], adapters), jnp.arange(c.num_layers)))
      new_cache = None
    else:
      ks, vs = list(cache.k), list(cache.v)
      for i in range(c.num_layers):
        lp, la = jax.tree.map(lambda p, i=i: p[i], (params["layers"], adapters))
        q, k, v = attention_inputs(x, lp, la)
        if per_row:  # row b's key and value [K, D] into its own slot start[b]
          rows = jnp.arange(B)
          ks[i] = ks[i].at[rows, :, start].set(k[:, :, 0].astype(ks[i].dtype))
          vs[i] = vs[i].at[rows, :, start].set(v[:, :, 0].astype(vs[i].dtype))
        else:
          ks[i] = jax.lax.dynamic_update_slice(ks[i], k.astype(ks[i].dtype), (0, 0, start, 0))
          vs[i] = jax.lax.dynamic_update_slice(vs[i], v.astype(vs[i].dtype), (0, 0, start, 0))
        if per_row and decode_attention != "dense":
          attn = decode_attention_lib.decode_attention(q, ks[i], vs[i], first, start + 1, decode_attention)
        else:
          attn = attention(q, ks[i], vs[i], visible)
        x = attention_out_and_mlp(x, lp, la, attn)
        if deepstack is not None and i < deepstack.shape[0]:
          x = x + deepstack[i]
      new_cache = KVCache(k=tuple(ks), v=tuple(vs), mask=key_mask, index=start + T)

    hidden = rms_norm(x, params["final_norm"], c.rms_norm_eps)
    head = params["embed"].T if c.tie_embeddings else params["lm_head"]
    scored = hidden[:, T - logits_to_keep:] if 0 < logits_to_keep < T else hidden
    logits = jnp.einsum("bte,ev->btv", scored, head.astype(dt), preferred_element_type=jnp.float32)
    logits = self._constrain(logits, ("batch", "length", "vocab"))
    return ModelOutput(logits=logits, cache=new_cache, hidden=hidden if return_hidden else None)


def _dense(equation: str, x: jax.Array, lp: Params, la: Params, name: str, dt: Any) -> jax.Array:
  """x W by `equation`, plus (x A) B when the layer's LoRA adapters `la` target W: A [*in, r] contracts the
  axes W takes in, B [r, *out] gives W's outputs. Two rank-r dots, so no [in, out] matrix is formed."""
  y = jnp.einsum(equation, x, lp[name].astype(dt))
  if name in la:
    a, b = la[name]["a"].astype(dt), la[name]["b"].astype(dt)
    y = y + jnp.tensordot(jnp.tensordot(x, a, axes=a.ndim - 1), b, axes=1)
  return y


def attention(q: jax.Array, k: jax.Array, v: jax.Array, visible: jax.Array) -> jax.Array:
  """Grouped-query attention. q [B,T,H,D], k/v [B,K,S,D], visible [B,T,S] -> [B,T,H,D]."""
  B, T, H, D = q.shape
  K = k.shape[1]
  q = q.reshape(B, T, K, H // K, D)
  scores = jnp.einsum("btkgd,bksd->bkgts", q, k, preferred_element_type=jnp.float32) / math.sqrt(D)
  scores = jnp.where(visible[:, None, None], scores, _NEG)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgts,bksd->btkgd", probs, v)
  return out.reshape(B, T, H, D)


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
  """RoPE positions for (left- or right-) padded rows: the index of each token among the real ones."""
  m = attention_mask.astype(jnp.int32)
  return jnp.maximum(jnp.cumsum(m, axis=-1) - 1, 0)
