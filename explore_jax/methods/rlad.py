"""RLAD baseline as the SGE paper runs it (appendix A.4; Qu et al. 2025): one model writes the strategy
("abstraction") and the solution; in training the strategy is dropped from 25% of episodes, which are asked
for the code alone, and a KL term to the starting policy (beta = 0.001, config `rl.loss.kl_coef`) holds the
policy near it. Everything else is the shared GRPO update."""

from __future__ import annotations

from typing import Any

import numpy as np

from explore_jax.actors.protocol import EpisodeSpec
from explore_jax.methods.base import Method, register_method
from explore_jax.methods.sge import StrategyPrompt


@register_method("rlad")
class RLAD(Method):
  """Strategy prompting with abstraction dropout (probability `rlad.p_drop_strategy`) and a KL anchor."""

  name = "rlad"

  def __init__(self, config: Any):
    super().__init__(config)
    p = config.rlad.p_drop_strategy
    if not 0.0 <= p <= 1.0:
      raise ValueError(f"rlad.p_drop_strategy must be a probability, got {p}")
    if config.rl.loss.kl_coef <= 0:
      raise ValueError("RLAD trains with a KL term to the starting policy: set rl.loss.kl_coef > 0 (paper 0.001)")

  def prompt_hook(self) -> StrategyPrompt:
    return StrategyPrompt(system=self.config.get("system_prompt", ""), instruction=self.config.instruction,
                          direct=self.config.rlad.direct_prompt, history_steps=self.config.get("history_steps", 0))

  def episode_context(self, spec: EpisodeSpec, rng: np.random.Generator) -> dict[str, Any]:
    return {"direct": True} if rng.random() < self.config.rlad.p_drop_strategy else {}
