"""The jitted policy-gradient update on a minibatch of records (PPO-style clipped surrogate).

Current log-probs are recomputed at each token's recorded temperature (`sampling.response_logprobs`), so
the importance ratio of a fresh on-policy batch starts at exactly 1 even under SGE's mixed temperatures.
EMPO2's off-policy update is only a different `prompt_tokens` (the prompt without tips) with the same
behaviour log-probs.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from explore_jax.models import lora as lora_lib
from explore_jax.models.transformer import Model
from explore_jax.rl.losses import PolicyLossConfig, aggregate_loss, loss_totals, policy_loss
from explore_jax.sampling import response_logprobs
from explore_jax.train import sft
from explore_jax.train.sft import image_inputs
from explore_jax.train.state import TrainState

Batch = dict[str, jax.Array]
# prompt_tokens/prompt_mask [B, P]; response_tokens/response_mask/temperatures/behaviour_logprobs [B, R];
# advantages [B] or [B, R]; valid [B]; optional ref_logprobs [B, R] when the KL term is on; a vision-language
# policy's records add images [B, K, H, W, C] uint8, image_count [B] and positions [B, P + R, 3] (image_inputs).


def rl_loss(model: Model, params: Any, batch: Batch, loss_config: PolicyLossConfig, *,
            totals: Optional[dict[str, jax.Array]] = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """policy_loss on the batch's response tokens, with log-probs recomputed under `params`; with `totals`
  (`rl_totals` of the minibatch this batch is a micro-batch of) the loss and metrics are its share."""
  needs_entropy = loss_config.entropy_coef != 0.0 or loss_config.entropy_advantage
  out = response_logprobs(model, params, batch["prompt_tokens"], batch["prompt_mask"],
                          batch["response_tokens"], batch["response_mask"], batch["temperatures"],
                          return_entropy=True, **image_inputs(model, params, batch))
  mask = _loss_mask(batch)
  loss, metrics = policy_loss(out.logprobs, batch["behaviour_logprobs"], batch["advantages"], mask,
                              loss_config, ref_logp=batch.get("ref_logprobs"),
                              entropy=out.entropy if needs_entropy else None, totals=totals)
  metrics = {**metrics, "entropy": aggregate_loss(out.entropy, mask, "token-mean", totals=totals),
             "response_tokens": jnp.sum(mask)}
  return loss, metrics


def _loss_mask(batch: Batch) -> jax.Array:
  return batch["response_mask"].astype(bool) & batch["valid"].astype(bool)[:, None]


def rl_totals(batch: Batch) -> dict[str, jax.Array]:
  """The denominators of `rl_loss` over a whole minibatch (its response tokens and sequences)."""
  return loss_totals(_loss_mask(batch))


def image_batch_fields(config: Any, prompt: np.ndarray, prompt_mask: np.ndarray, response: np.ndarray,
                       response_mask: np.ndarray, images: np.ndarray, image_count: np.ndarray) -> Batch:
  """What a batch of image records adds for `image_inputs` (host side): the images, their count, and the
  multimodal RoPE positions [B, P + R, 3] of prompt and response (sft.image_fields)."""
  return sft.image_fields(config, np.concatenate([prompt, response], 1),
                          np.concatenate([prompt_mask, response_mask], 1), images, image_count)


def make_reference_logprobs(model: Model) -> Callable[[Any, Batch], jax.Array]:
  """Jitted log-probs of the batch's responses under fixed (reference) params, for the KL term."""
  def fn(params, batch):
    return response_logprobs(model, params, batch["prompt_tokens"], batch["prompt_mask"],
                             batch["response_tokens"], batch["response_mask"], batch["temperatures"],
                             **image_inputs(model, params, batch)).logprobs
  return jax.jit(fn)


def make_rl_step(model: Model, optimizer: optax.GradientTransformation, loss_config: PolicyLossConfig,
                 state_shardings: Optional[TrainState] = None, *, lora: Optional[lora_lib.LoraConfig] = None,
                 base: Any = None, micro_batches: int = 1) -> Callable:
  """`step(state, batch) -> (state, metrics)`: the shared update step (`sft.make_train_step`) on `rl_loss`
  (with `lora`, of the adapters on the frozen `base`; gradients accumulated over `micro_batches`)."""
  return sft.make_train_step(model, optimizer, state_shardings,
                             loss_fn=functools.partial(rl_loss, loss_config=loss_config), lora=lora, base=base,
                             micro_batches=micro_batches, totals_fn=rl_totals)
