"""The jitted policy-gradient update on a minibatch of records (PPO-style clipped surrogate).

Current log-probs are recomputed at each token's recorded temperature (`sampling.response_logprobs`), so
the importance ratio of a fresh on-policy batch starts at exactly 1 even under SGE's mixed temperatures.
EMPO2's off-policy update is only a different `prompt_tokens` (the prompt without tips) with the same
behaviour log-probs.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from explore_jax.models.transformer import Model
from explore_jax.parallel import sharding
from explore_jax.rl.losses import PolicyLossConfig, policy_loss
from explore_jax.sampling import response_logprobs
from explore_jax.train.state import TrainState, apply_if_finite

Batch = dict[str, jax.Array]
# prompt_tokens/prompt_mask [B, P]; response_tokens/response_mask/temperatures/behaviour_logprobs [B, R];
# advantages [B] or [B, R]; valid [B]; optional ref_logprobs [B, R] when the KL term is on.
BATCH_KEYS = ("prompt_tokens", "prompt_mask", "response_tokens", "response_mask", "temperatures",
              "behaviour_logprobs", "advantages", "valid")


def rl_loss(model: Model, params: Any, batch: Batch, loss_config: PolicyLossConfig
            ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """policy_loss on the batch's response tokens, with log-probs recomputed under `params`."""
  needs_entropy = loss_config.entropy_coef != 0.0 or loss_config.entropy_advantage
  out = response_logprobs(model, params, batch["prompt_tokens"], batch["prompt_mask"],
                          batch["response_tokens"], batch["response_mask"], batch["temperatures"],
                          return_entropy=True)
  mask = batch["response_mask"].astype(bool) & batch["valid"].astype(bool)[:, None]
  loss, metrics = policy_loss(out.logprobs, batch["behaviour_logprobs"], batch["advantages"], mask,
                              loss_config, ref_logp=batch.get("ref_logprobs"),
                              entropy=out.entropy if needs_entropy else None)
  n = jnp.maximum(jnp.sum(mask), 1)
  metrics = {**metrics, "entropy": jnp.sum(jnp.where(mask, out.entropy, 0.0)) / n,
             "response_tokens": jnp.sum(mask)}
  return loss, metrics


def make_reference_logprobs(model: Model) -> Callable[[Any, Batch], jax.Array]:
  """Jitted log-probs of the batch's responses under fixed (reference) params, for the KL term."""
  def fn(params, batch):
    return response_logprobs(model, params, batch["prompt_tokens"], batch["prompt_mask"],
                             batch["response_tokens"], batch["response_mask"], batch["temperatures"]).logprobs
  return jax.jit(fn)


def make_rl_step(model: Model, optimizer: optax.GradientTransformation, loss_config: PolicyLossConfig,
                 state_shardings: Optional[TrainState] = None) -> Callable:
  """`step(state, batch) -> (state, metrics)`: one optimizer update, state donated, non-finite skipped."""

  def step(state: TrainState, batch: Batch):
    grad_fn = jax.value_and_grad(lambda p: rl_loss(model, p, batch, loss_config), has_aux=True)
    (loss, metrics), grads = grad_fn(state.params)
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    new = TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    metrics = {**metrics, "loss": loss, "grad_norm": grad_norm, "skipped": (~ok).astype(jnp.int32)}
    return apply_if_finite(state, new, ok), metrics

  if state_shardings is None or model.mesh is None:
    return jax.jit(step, donate_argnums=0)
  mesh = model.mesh
  batch_spec = NamedSharding(mesh, sharding.logical_to_spec(("batch",), model.rules or (), mesh))
  return jax.jit(step, in_shardings=(state_shardings, batch_spec),
                 out_shardings=(state_shardings, NamedSharding(mesh, P())), donate_argnums=0)
