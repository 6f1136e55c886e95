"""ScreenExplorer's world model: (screen latent, screen text embedding, action) -> the next screen's pair.

    (ô_t, ê_t) = M_phi(o_t, e_t, a_t),   L_WM = MSE(ô_t, o'_t) + MSE(ê_t, e'_t)     (section 3.3, appendix B)

The released model is Llama-3.2-1B over one sequence: the action's word tokens, one token for the BGE-M3 text
embedding and H x W Cosmos latent tokens, each entering through a 2-layer MLP and leaving through another; the
loss is the sum of the two mean squared errors. This module keeps that layout at a size the world model can train
on every iteration, in flax:

  tokens     [action bytes (A)] [text (1)] [image (P)]
             action: the canonical action text's UTF-8 bytes (1..256, 0 pads), a learned embedding: the world
             model reads the action as text, as the released one reads its own tokenizer's tokens, with no tie to
             the policy's vocabulary; text: MLP(e_t); image: MLP over the latent read as P tokens of D / P values
             (patch_stats: the 8 x 8 patches, 6 statistics each); plus a learned position embedding
  body       `layers` pre-norm transformer blocks, bidirectional, padding bytes masked out as keys
  heads      ê_t = MLP(h_text); ô_t = MLP(h_image), flattened back to [D]

Every kernel names its logical axes ("embed", "mlp", "vocab"), so the network shards by the run's rules as the
policy does (train/aux_models.py). `loss` returns the predictions with its metrics under OUTPUTS (per row, with
the batch's "row" ids) so the runtime can keep the last epoch's (AuxModelSpec.keep_outputs), which is what the
released code scores with.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
OUTPUTS = "outputs"        # the metrics key of the per-row predictions (AuxModelSpec.keep_outputs)
ACTION_VOCAB = 257         # byte + 1; 0 pads


@dataclasses.dataclass(frozen=True)
class WorldModelConfig:
  latent_dim: int = 384     # D of the image latent
  image_tokens: int = 64    # P: the latent read as [P, D / P]
  text_dim: int = 384       # E of the text embeddings
  action_len: int = 64      # A: bytes of the action text kept
  hidden: int = 128
  layers: int = 2
  heads: int = 4
  mlp: int = 512

  def __post_init__(self):
    if self.latent_dim % self.image_tokens:
      raise ValueError(f"world_model.image_tokens={self.image_tokens} must divide the latent's "
                       f"{self.latent_dim} values")
    if self.hidden % self.heads:
      raise ValueError(f"world_model.hidden={self.hidden} must be a multiple of world_model.heads={self.heads}")

  @property
  def length(self) -> int:
    return self.action_len + 1 + self.image_tokens


def action_bytes(texts: list[str], length: int) -> tuple[np.ndarray, np.ndarray]:
  """[N, length] int32 byte ids (byte + 1, 0 pads) of each action text, cut to `length` bytes, and its mask."""
  ids = np.zeros((len(texts), length), np.int32)
  for i, text in enumerate(texts):
    raw = np.frombuffer(text.encode("utf-8")[:length], np.uint8)
    ids[i, :len(raw)] = raw.astype(np.int32) + 1
  return ids, ids > 0


def _dense(features: int, axes: tuple, name: str) -> nn.Dense:
  return nn.Dense(features, kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), axes),
                  name=name)


class _MLP(nn.Module):
  """Dense -> ReLU -> Dense: the released model's in and out projections."""
  hidden: int
  out: int

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x = nn.relu(_dense(self.hidden, ("embed", "mlp"), "up")(x))
    return _dense(self.out, ("mlp", "embed"), "down")(x)


class _Block(nn.Module):
  config: WorldModelConfig

  @nn.compact
  def __call__(self, x: Array, key_mask: Array) -> Array:
    c = self.config
    h = nn.LayerNorm(name="attention_norm")(x)
    head_dim = c.hidden // c.heads
    q, k, v = (_dense(c.hidden, ("embed", "mlp"), n)(h).reshape(*h.shape[:-1], c.heads, head_dim)
               for n in ("query", "key", "value"))
    logits = jnp.einsum("blhd,bmhd->bhlm", q, k) / np.sqrt(head_dim)
    logits = jnp.where(key_mask[:, None, None, :], logits, jnp.finfo(logits.dtype).min)
    attended = jnp.einsum("bhlm,bmhd->blhd", jax.nn.softmax(logits, axis=-1), v).reshape(h.shape)
    x = x + _dense(c.hidden, ("mlp", "embed"), "out")(attended)
    h = nn.LayerNorm(name="mlp_norm")(x)
    return x + _MLP(c.mlp, c.hidden, name="mlp")(h)


class WorldModel(nn.Module):
  config: WorldModelConfig

  @nn.compact
  def __call__(self, latent: Array, text: Array, actions: Array) -> tuple[Array, Array]:
    """latent [B, D], text [B, E], actions [B, A] byte ids -> (predicted latent [B, D], predicted text [B, E])."""
    c = self.config
    b = latent.shape[0]
    tokens = latent.reshape(b, c.image_tokens, c.latent_dim // c.image_tokens)
    embed = nn.Embed(ACTION_VOCAB, c.hidden, name="action_embed",
                     embedding_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), ("vocab", "embed")))
    x = jnp.concatenate([embed(actions), _MLP(c.hidden, c.hidden, name="text_in")(text)[:, None, :],
                         _MLP(c.hidden, c.hidden, name="image_in")(tokens)], axis=1)
    position = self.param("position", nn.with_logical_partitioning(nn.initializers.normal(0.02), (None, "embed")),
                          (c.length, c.hidden))
    x = x + position[None]
    key_mask = jnp.concatenate([actions > 0, jnp.ones((b, 1 + c.image_tokens), bool)], axis=1)
    for i in range(c.layers):
      x = _Block(c, name=f"block_{i}")(x, key_mask)
    x = nn.LayerNorm(name="final_norm")(x)
    text_out = _MLP(c.hidden, c.text_dim, name="text_out")(x[:, c.action_len])
    image_out = _MLP(c.hidden, c.latent_dim // c.image_tokens, name="image_out")(x[:, c.action_len + 1:])
    return image_out.reshape(b, c.latent_dim), text_out


def _example(config: WorldModelConfig) -> tuple[Array, Array, Array]:
  return (jnp.zeros((1, config.latent_dim), jnp.float32), jnp.zeros((1, config.text_dim), jnp.float32),
          jnp.zeros((1, config.action_len), jnp.int32))


def init(key: Array, config: WorldModelConfig) -> dict:
  """The world model's parameters (plain arrays)."""
  return nn.meta.unbox(WorldModel(config).init(key, *_example(config))["params"])


def param_axes(config: WorldModelConfig) -> dict:
  """The params tree with each leaf replaced by its logical axis names (norms and biases: replicated)."""
  boxed = jax.eval_shape(lambda: WorldModel(config).init(jax.random.key(0), *_example(config))["params"])
  return jax.tree.map(lambda x: tuple(x.names) if isinstance(x, nn.Partitioned) else (None,) * len(x.shape),
                      boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def predict(params: dict, batch: dict, config: WorldModelConfig) -> tuple[Array, Array]:
  """(ô, ê) for batch["latent"] [B, D], batch["text"] [B, E], batch["actions"] [B, A]."""
  return WorldModel(config).apply({"params": params}, batch["latent"].astype(jnp.float32),
                                  batch["text"].astype(jnp.float32), batch["actions"].astype(jnp.int32))


def loss(params: dict, batch: dict, config: WorldModelConfig) -> tuple[Array, dict]:
  """MSE(ô, o') + MSE(ê, e') over the rows with batch["mask"], each a mean over its values; the metrics carry
  both parts and, under OUTPUTS, the predictions with the batch's row ids."""
  image, text = predict(params, batch, config)
  mask = batch["mask"].astype(jnp.float32)
  rows = jnp.maximum(jnp.sum(mask), 1.0)
  image_mse = jnp.sum(jnp.mean(jnp.square(image - batch["next_latent"]), -1) * mask) / rows
  text_mse = jnp.sum(jnp.mean(jnp.square(text - batch["next_text"]), -1) * mask) / rows
  value = image_mse + text_mse
  outputs = {"row": batch["row"], "latent": jax.lax.stop_gradient(image), "text": jax.lax.stop_gradient(text)}
  return value, {"loss": value, "image_mse": image_mse, "text_mse": text_mse, OUTPUTS: outputs}
