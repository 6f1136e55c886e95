"""Next-token cross-entropy and its jitted, sharded update step (pre-training style and SFT).

The step is built once per (model, optimizer, mesh): state and batch shardings are fixed in the jit, the
state is donated, and an update whose loss or gradient is not finite is skipped (and counted) instead of
poisoning the parameters.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from explore_jax.models import lora as lora_lib
from explore_jax.models.transformer import Model
from explore_jax.parallel import sharding
from explore_jax.train.state import TrainState, apply_if_finite

Batch = dict[str, jax.Array]


def next_token_loss(model: Model, params: Any, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean over masked targets of -log p(tokens[t+1] | tokens[<=t]).

  batch: tokens [B, T] int; loss_mask [B, T] marks the tokens that are *targets* (e.g. the response);
  optional attention_mask [B, T] (default: all real) and positions [B, T] (default: from the mask).
  """
  tokens = batch["tokens"]
  mask = batch.get("attention_mask", jnp.ones_like(tokens, bool)).astype(bool)
  positions = batch.get("positions")
  if positions is None:
    positions = jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)
  logits = model.apply(params, tokens, positions, attention_mask=mask).logits[:, :-1]
  targets = tokens[:, 1:]
  weights = (batch["loss_mask"][:, 1:] & mask[:, 1:]).astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  n = jnp.sum(weights)
  loss = jnp.sum(nll * weights) / jnp.maximum(n, 1.0)
  acc = jnp.sum((jnp.argmax(logits, -1) == targets) * weights) / jnp.maximum(n, 1.0)
  return loss, {"loss": loss, "token_accuracy": acc, "target_tokens": n}


def make_train_step(model: Model, optimizer: optax.GradientTransformation,
                    state_shardings: Optional[TrainState] = None,
                    loss_fn: Callable[..., tuple[jax.Array, dict]] = next_token_loss, *,
                    lora: Optional[lora_lib.LoraConfig] = None, base: Any = None) -> Callable:
  """`step(state, batch) -> (state, metrics)`: one optimizer update of `loss_fn(model, params, batch)`,
  jitted with the state donated; a non-finite loss or gradient skips the update (metrics["skipped"]).

  Every update in the project goes through here (SFT with the default loss, RL with `rl_step.rl_loss`).
  With `state_shardings` (from `train.state.state_shardings`) the state keeps its layout across steps;
  every batch array is split over its leading (record) axis by the model's rules (data and fsdp).

  With `lora`, `state.params` are LoRA adapters on the frozen `base` params and the loss sees
  `lora.adapted(base, adapters)`: the gradient is taken with respect to the adapters alone, so the base has
  neither gradients nor optimizer state. The base enters the jitted step as an argument on every call (in
  its own shardings, not donated), never as a constant baked into the compiled program.
  """
  if (lora is None) != (base is None):
    raise ValueError("a LoRA train step needs both `lora` and the frozen `base` params")

  def step(state: TrainState, batch: Batch, frozen: Any = None):
    def objective(p):
      return loss_fn(model, p if lora is None else lora_lib.adapted(frozen, p, lora), batch)

    (loss, metrics), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    new = TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                     opt_state=opt_state)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    metrics = {**metrics, "loss": loss, "grad_norm": grad_norm, "skipped": (~ok).astype(jnp.int32)}
    return apply_if_finite(state, new, ok), metrics

  if state_shardings is None:
    jitted = jax.jit(step, donate_argnums=0)
  else:
    mesh = model.mesh
    if mesh is None:
      raise ValueError("a sharded train step needs Model(config, mesh=..., rules=...)")
    replicated = NamedSharding(mesh, P())
    batch_spec = NamedSharding(mesh, sharding.logical_to_spec(("batch",), model.rules or (), mesh))
    in_shardings = (state_shardings, batch_spec)
    if lora is not None:
      in_shardings += (jax.tree.map(lambda x: x.sharding, base),)
    jitted = jax.jit(step, in_shardings=in_shardings, out_shardings=(state_shardings, replicated),
                     donate_argnums=0)
  if lora is None:
    return jitted
  return lambda state, batch: jitted(state, batch, base)
