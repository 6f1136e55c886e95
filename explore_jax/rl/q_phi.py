"""EAPO's variational exploration model q_phi: its training loss (eq. 8 as released; METHODS.md "EAPO").

q_phi is a language model of the policy's architecture scoring a step's target text (methods/eapo_fields.py) from
the state; a frozen copy of its initial weights is the prior p. Per target b, with its tokens' log-probs under q and
p and the episode's task reward R_b:

  log q_b = sum_t mask_bt log q_bt,  log p_b likewise
  loss    = -1/B sum_b (beta R_b - kappa sg(log q_b - log p_b)) log q_b        (beta = kappa = 1)

sg is stop-gradient: the bracket is a fixed weight (REINFORCE on beta E_q[R] - KL(q || p)), so the gradient in
q's token log-probs is -(beta R_b - kappa (log q_b - log p_b)) mask_bt / B.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp


def sequence_logprob(token_logprobs: jax.Array, mask: jax.Array) -> jax.Array:
  """[B] summed log-probs of each target's real tokens."""
  return jnp.sum(jnp.where(mask, token_logprobs, 0.0), axis=-1)


def q_phi_loss(q_token_logprobs: jax.Array, prior_token_logprobs: jax.Array, mask: jax.Array,
               task_rewards: jax.Array, *, beta: float = 1.0, kappa: float = 1.0,
               valid: Optional[jax.Array] = None) -> jax.Array:
  """Eq. 8's loss over B targets ([B, T] token log-probs under q and the frozen prior, [B, T] mask, [B] R_task);
  with `valid` [B], the mean is over the valid targets only (a fixed-shape batch's padding rows count nothing)."""
  log_q = sequence_logprob(q_token_logprobs, mask)
  log_p = jax.lax.stop_gradient(sequence_logprob(prior_token_logprobs, mask))
  weight = jax.lax.stop_gradient(beta * task_rewards - kappa * (log_q - log_p))
  if valid is None:
    return -jnp.mean(weight * log_q)
  valid = valid.astype(log_q.dtype)
  return -jnp.sum(valid * weight * log_q) / jnp.maximum(jnp.sum(valid), 1.0)


def target_scores(model, params, tokens: jax.Array, attention: jax.Array, target: jax.Array
                  ) -> tuple[jax.Array, jax.Array]:
  """q's [B] summed log-probs of each row's target tokens and their [B] counts, from one forward pass over
  [B, T] rows of state then target (right-padded: `attention` marks real tokens, `target` the target's)."""
  from explore_jax.sampling.sampler import token_logprobs

  lp = token_logprobs(model, params, tokens, jnp.ones(tokens.shape, jnp.float32), attention).logprobs
  return sequence_logprob(lp, target), jnp.sum(target, axis=-1)


def clamped_log_q(sums: jax.Array, counts: jax.Array, clamp: str = "sequence") -> jax.Array:
  """log q from the summed target log-probs: the sum ("sequence") or the per-token mean ("token_mean"), clamped
  to [-60, 0] (methods/eapo_fields.log_q, one target at a time, is the same arithmetic)."""
  if clamp not in ("sequence", "token_mean"):
    raise ValueError(f"clamp must be 'sequence' or 'token_mean', got {clamp!r}")
  value = sums / jnp.maximum(counts, 1) if clamp == "token_mean" else sums
  return jnp.clip(value, -60.0, 0.0)


def explore_rewards(log_plain: jax.Array, log_explored: jax.Array, plain_valid: jax.Array,
                    explored_valid: jax.Array, gamma: float = 0.9) -> jax.Array:
  """R_explore (eq. 9) per step: max{q(plain), gamma^2 q(explored)}; a missing target contributes 0 (a malformed
  answer has neither, as the released manager scores an empty target)."""
  plain = jnp.where(plain_valid, jnp.exp(log_plain), 0.0)
  explored = jnp.where(explored_valid, gamma**2 * jnp.exp(log_explored), 0.0)
  return jnp.maximum(plain, explored)


def loss_and_metrics(model, params, batch, *, beta: float = 1.0, kappa: float = 1.0
                     ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Eq. 8 on a batch of targets ({"tokens", "attention", "target" [B, T], "reward", "valid" [B]}), q = params["q"],
  p = params["prior"] (frozen)."""
  from explore_jax.sampling.sampler import token_logprobs

  ones = jnp.ones(batch["tokens"].shape, jnp.float32)
  lp_q = token_logprobs(model, params["q"], batch["tokens"], ones, batch["attention"]).logprobs
  lp_p = token_logprobs(model, params["prior"], batch["tokens"], ones, batch["attention"]).logprobs
  valid = batch["valid"]
  loss = q_phi_loss(lp_q, lp_p, batch["target"], batch["reward"], beta=beta, kappa=kappa, valid=valid)
  n = jnp.maximum(jnp.sum(valid), 1)
  log_q = sequence_logprob(lp_q, batch["target"])
  log_p = sequence_logprob(lp_p, batch["target"])
  return loss, {"loss": loss, "log_q": jnp.sum(jnp.where(valid, log_q, 0.0)) / n,
                "kl": jnp.sum(jnp.where(valid, log_q - log_p, 0.0)) / n, "targets": jnp.sum(valid)}
