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

import jax
import jax.numpy as jnp


def sequence_logprob(token_logprobs: jax.Array, mask: jax.Array) -> jax.Array:
  """[B] summed log-probs of each target's real tokens."""
  return jnp.sum(jnp.where(mask, token_logprobs, 0.0), axis=-1)


def q_phi_loss(q_token_logprobs: jax.Array, prior_token_logprobs: jax.Array, mask: jax.Array,
               task_rewards: jax.Array, *, beta: float = 1.0, kappa: float = 1.0) -> jax.Array:
  """Eq. 8's loss over B targets ([B, T] token log-probs under q and the frozen prior, [B, T] mask, [B] R_task)."""
  log_q = sequence_logprob(q_token_logprobs, mask)
  log_p = jax.lax.stop_gradient(sequence_logprob(prior_token_logprobs, mask))
  weight = jax.lax.stop_gradient(beta * task_rewards - kappa * (log_q - log_p))
  return -jnp.mean(weight * log_q)
