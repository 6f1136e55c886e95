"""Next-token cross-entropy and its jitted, sharded update step (pre-training style and SFT).

The step is built once per (model, optimizer, mesh): state and batch shardings are fixed in the jit, the
state is donated, and an update whose loss or gradient is not finite is skipped (and counted) instead of
poisoning the parameters.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from explore_jax.models import lora as lora_lib
from explore_jax.models import vl as vl_lib
from explore_jax.models.transformer import Model
from explore_jax.parallel import sharding
from explore_jax.train.state import TrainState, apply_if_finite

Batch = dict[str, jax.Array]


def next_token_loss(model: Model, params: Any, batch: Batch, *, totals: Optional[dict[str, jax.Array]] = None,
                    last: int = 0) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean over masked targets of -log p(tokens[t+1] | tokens[<=t]).

  batch: tokens [B, T] int; loss_mask [B, T] marks the tokens that are *targets* (e.g. the response);
  optional attention_mask [B, T] (default: all real) and positions [B, T] (default: from the mask). A
  vision-language policy's image prompts add images, image_count and positions [B, T, 3] (image_fields).
  With `totals` (`next_token_totals` of the batch this one is a micro-batch of) the mean is taken over
  their targets: the loss and accuracy are this micro-batch's share of the whole batch's.

  `last` = K > 0 says that every target lies in the last K columns (SFT's [prompt | response] rows,
  sft_data.tokenize_demos): only the K positions that predict them are projected onto the vocabulary, not
  the prompt's [B, T, V] logits that no target needs. A loss_mask outside those columns is then not read.
  """
  tokens = batch["tokens"]
  mask = batch.get("attention_mask", jnp.ones_like(tokens, bool)).astype(bool)
  positions = batch.get("positions")
  if positions is None:
    positions = jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)
  features = batch_image_features(model, params, batch)
  images = {} if features is None else {"image_features": features}
  kept = {"logits_to_keep": last + 1} if 0 < last < tokens.shape[1] else {}
  logits = model.apply(params, tokens, positions, attention_mask=mask, **images, **kept).logits[:, :-1]
  n = logits.shape[1]  # position T - 1 - n + j predicts column T - n + j
  targets = tokens[:, -n:]
  weights = _target_weights(batch)[:, -n:]
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  count = jnp.sum(weights)
  denominator = jnp.maximum(count if totals is None else totals["tokens"], 1.0)
  loss = jnp.sum(nll * weights) / denominator
  acc = jnp.sum((jnp.argmax(logits, -1) == targets) * weights) / denominator
  return loss, {"loss": loss, "token_accuracy": acc, "target_tokens": count}


def _target_weights(batch: Batch) -> jax.Array:
  mask = batch.get("attention_mask", jnp.ones_like(batch["tokens"], bool)).astype(bool)
  return (batch["loss_mask"][:, 1:] & mask[:, 1:]).astype(jnp.float32)


def next_token_totals(batch: Batch) -> dict[str, jax.Array]:
  """The denominator of `next_token_loss` over a whole batch: its target tokens."""
  return {"tokens": jnp.sum(_target_weights(batch))}


def image_fields(config: Any, tokens: np.ndarray, mask: np.ndarray, images: np.ndarray,
                 image_count: np.ndarray) -> Batch:
  """What a batch of image prompts adds for `image_inputs` (host side, numpy): the images uint8
  [B, K, H, W, C] (the first image_count [B] of each row real, all of one size, already at the model's
  size), their count, and the multimodal RoPE positions [B, T, 3] of `tokens` [B, T] under `mask` (a
  VLConfig `config`)."""
  grid = (1, images.shape[2] // config.vision.patch_size, images.shape[3] // config.vision.patch_size)
  grids = np.array([grid] * int(np.sum(image_count)), np.int64).reshape(-1, 3)
  positions, _ = vl_lib.mrope_positions(tokens, mask, grids, config)
  return {"images": images, "image_count": np.asarray(image_count, np.int32), "positions": positions}


def batch_image_features(model: Any, params: Any, batch: Batch) -> Optional[jax.Array]:
  """The merged features of a batch's prompt images (image_fields), each image through the vision tower on
  its own, in the order the prompts hold them; None for a batch without images."""
  if "images" not in batch:
    return None
  images = batch["images"]
  B, K = images.shape[:2]
  valid = jnp.arange(K)[None, :] < batch["image_count"][:, None]
  return model.image_features(params, images.reshape((B * K,) + images.shape[2:]), valid.reshape(-1))


def image_inputs(model: Any, params: Any, batch: Batch) -> dict[str, jax.Array]:
  """sampling.response_logprobs' image arguments for a batch that keeps its prompts' images: their
  features and the batch's multimodal positions; {} for a batch without images."""
  features = batch_image_features(model, params, batch)
  return {} if features is None else {"image_features": features, "positions": batch["positions"]}


def make_train_step(model: Model, optimizer: optax.GradientTransformation,
                    state_shardings: Optional[TrainState] = None,
                    loss_fn: Callable[..., tuple[jax.Array, dict]] = next_token_loss, *,
                    lora: Optional[lora_lib.LoraConfig] = None, base: Any = None, micro_batches: int = 1,
                    totals_fn: Optional[Callable[[Batch], dict[str, jax.Array]]] = None) -> Callable:
  """`step(state, batch) -> (state, metrics)`: one optimizer update of `loss_fn(model, params, batch)`,
  jitted with the state donated; a non-finite loss or gradient skips the update (metrics["skipped"]).

  Every update in the project goes through here (SFT with the default loss, RL with `rl_step.rl_loss`).
  With `state_shardings` (from `train.state.state_shardings`) the state keeps its layout across steps;
  every batch array is split over its leading (record) axis by the model's rules (data and fsdp).

  With `lora`, `state.params` are LoRA adapters on the frozen `base` params and the loss sees
  `lora.adapted(base, adapters)`: the gradient is taken with respect to the adapters alone, so the base has
  neither gradients nor optimizer state. The base enters the jitted step as an argument on every call (in
  its own shardings, not donated), never as a constant baked into the compiled program.

  With `micro_batches` = m > 1 the batch's rows are taken in m micro-batches of B / m (row j of micro-batch i
  is row j * m + i, so each micro-batch spans every device's rows), one after another under `lax.scan`, and
  their gradients are summed: the update is the whole batch's, in about 1/m of the activation memory.
  `totals_fn(batch)` (the default loss's: `next_token_totals`) gives the whole batch's loss denominators, and
  each micro-batch's `loss_fn(..., totals=...)` is its share: the shares add up to the whole batch's loss and
  metrics (equal up to the order of floating-point sums). m = 1 is the plain step, bit for bit.

  `batch` may also be a list of micro-batches the caller cut, each of its own shape (e.g. rows of similar
  length, each cut to its longest row: learner.length_sorted_parts). Their gradients are summed in one jitted
  pass per micro-batch (compiled once per shape) and applied once: the same update as the micro-batches
  concatenated, on the columns each needs. The denominators are the sum of `totals_fn` over them.
  """
  if (lora is None) != (base is None):
    raise ValueError("a LoRA train step needs both `lora` and the frozen `base` params")
  if loss_fn is next_token_loss and totals_fn is None:
    totals_fn = next_token_totals
  if micro_batches < 1 or (micro_batches > 1 and totals_fn is None):
    raise ValueError(f"micro_batches must be >= 1 and, above 1, come with the loss's totals_fn; got "
                     f"{micro_batches}")

  def objective(p, part, frozen, totals=None):
    p = p if lora is None else lora_lib.adapted(frozen, p, lora)
    return loss_fn(model, p, part) if totals is None else loss_fn(model, p, part, totals=totals)

  value_and_grad = jax.value_and_grad(objective, has_aux=True)

  def finish(state: TrainState, out: Any):
    (loss, metrics), grads = out
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    new = TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                     opt_state=opt_state)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    metrics = {**metrics, "loss": loss, "grad_norm": grad_norm, "skipped": (~ok).astype(jnp.int32)}
    return apply_if_finite(state, new, ok), metrics

  def step(state: TrainState, batch: Batch, frozen: Any = None):
    if micro_batches == 1:
      out = value_and_grad(state.params, batch, frozen)
    else:
      out = _accumulate(lambda p, part, totals: value_and_grad(p, part, frozen, totals), state.params, batch,
                        totals_fn(batch), micro_batches)
    return finish(state, out)

  def add_part(params: Any, part: Batch, totals: dict[str, jax.Array], total: Any, frozen: Any = None):
    return jax.tree.map(jnp.add, total, value_and_grad(params, part, frozen, totals))

  if state_shardings is None:
    jitted = jax.jit(step, donate_argnums=0)
    add_jit = jax.jit(add_part, donate_argnums=3)
    finish_jit = jax.jit(finish, donate_argnums=0)
    out_spec = None
    check = lambda rows, micro=1: None  # noqa: E731
  else:
    mesh = model.mesh
    if mesh is None:
      raise ValueError("a sharded train step needs Model(config, mesh=..., rules=...)")
    replicated = NamedSharding(mesh, P())
    batch_spec = NamedSharding(mesh, sharding.logical_to_spec(("batch",), model.rules or (), mesh))
    frozen_spec = () if lora is None else (jax.tree.map(lambda x: x.sharding, base),)
    out_spec = ((replicated, replicated), state_shardings.params)
    jitted = jax.jit(step, in_shardings=(state_shardings, batch_spec) + frozen_spec,
                     out_shardings=(state_shardings, replicated), donate_argnums=0)
    add_jit = jax.jit(add_part, in_shardings=(state_shardings.params, batch_spec, replicated, out_spec) + frozen_spec,
                      out_shardings=out_spec, donate_argnums=3)
    finish_jit = jax.jit(finish, in_shardings=(state_shardings, out_spec),
                         out_shardings=(state_shardings, replicated), donate_argnums=0)
    check = _row_check(batch_spec)
  totals_jit = None if totals_fn is None else jax.jit(totals_fn)
  frozen = () if lora is None else (base,)
  made: dict[str, Callable] = {}

  def zero_total(params: Any, part: Batch, totals: dict[str, jax.Array]) -> Any:
    """Zeros shaped (and laid out) as a part's ((loss, metrics), grads), from a program traced once."""
    if "zeros" not in made:
      shapes = jax.eval_shape(value_and_grad, params, part, *(frozen or (None,)), totals)
      made["zeros"] = jax.jit(lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes),
                              out_shardings=out_spec)
    return made["zeros"]()

  def run(state: TrainState, batch: Any):
    if not isinstance(batch, (list, tuple)):
      check(_rows(batch), micro_batches)
      return jitted(state, batch, *frozen)
    if not batch or totals_jit is None:
      raise ValueError("a batch in parts needs at least one part and the loss's totals_fn")
    for part in batch:  # parts of equal rows, as the learner cuts them
      check(_rows(part) * len(batch), len(batch))
    totals = functools.reduce(lambda a, b: jax.tree.map(jnp.add, a, b), [totals_jit(part) for part in batch])
    total = zero_total(state.params, batch[0], totals)
    for part in batch:
      total = add_jit(state.params, part, totals, total, *frozen)
    return finish_jit(state, total)

  run.lower = lambda state, batch: jitted.lower(state, batch, *frozen)  # the one-batch step's, for its memory
  return run


def _rows(batch: Batch) -> int:
  return jax.tree.leaves(batch)[0].shape[0]


def _accumulate(value_and_grad: Callable, params: Any, batch: Batch, totals: dict[str, jax.Array],
                micro_batches: int) -> Any:
  """((loss, metrics), grads) of the whole batch as the sum of its micro-batches' (make_train_step)."""
  rows = jax.tree.leaves(batch)[0].shape[0]
  if rows % micro_batches:
    raise ValueError(f"a batch of {rows} rows cannot be split into {micro_batches} micro-batches")
  parts = jax.tree.map(lambda x: x.reshape((rows // micro_batches, micro_batches) + x.shape[1:]).swapaxes(0, 1),
                       batch)

  def add(total, part):
    return jax.tree.map(jnp.add, total, value_and_grad(params, part, totals)), None

  first = jax.tree.map(lambda x: x[0], parts)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(value_and_grad, params, first, totals))
  return jax.lax.scan(add, zeros, parts)[0]


def _row_check(batch_sharding: NamedSharding) -> Callable[..., None]:
  """`check(rows, micro_batches=1)`: a clear error when a batch's rows (each micro-batch's) do not split evenly
  over the mesh axes of its leading axis, instead of XLA's, so that no micro-batch leaves devices idle."""
  axes = batch_sharding.spec[0] if len(batch_sharding.spec) else None
  axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  shards = math.prod(batch_sharding.mesh.shape[a] for a in axes)

  def check(rows: int, micro_batches: int = 1) -> None:
    if rows % shards:
      raise ValueError(f"a batch of {rows} rows cannot be split over the {shards} devices of the mesh's "
                       f"{' x '.join(axes)} axes: use a batch size that is a multiple of {shards} "
                       f"(config.sft.batch_size, config.rl.minibatch_size)")
    if micro_batches > 1 and rows % (shards * micro_batches):
      raise ValueError(f"micro-batches of {rows / micro_batches:g} rows cannot be split over the {shards} devices "
                       f"of the mesh's {' x '.join(axes)} axes: use a multiple of {shards} "
                       f"(config.rl.micro_batch_size)")

  return check
