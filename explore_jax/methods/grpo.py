"""The group-relative baselines: GRPO, Dr.GRPO, DAPO and GiGPO (one plug-in, four sets of answers).

  GRPO     A = (R - mean_g R) / (std_g R + eps); loss seq-mean-token-mean; clip 0.2 (Shao et al. 2024)
  Dr.GRPO  A = R - mean_g R; loss seq-mean-token-sum-norm (Liu et al. 2025)
  DAPO     token-mean; clip-higher (0.2, 0.28); groups with equal returns dropped (Yu et al. 2025)
  GiGPO    A = A^E + omega * A^S over anchor-state groups, gamma 0.95, omega 1 (Feng et al. 2025)
  EntropyAdv  GRPO with A'_t = A + min(alpha H_t, |A| / kappa), H detached, alpha 0.4, kappa 2 (Cheng et al. 2025)

A config picks one with `configure(config, name)`; every field stays overridable afterwards.
"""

from __future__ import annotations

from typing import Any

from explore_jax.methods.base import Method, register_method

VARIANTS = ("grpo", "dr_grpo", "dapo", "gigpo", "entropy_adv")


def configure(c: Any, name: str) -> Any:
  """Writes the variant's defaults into config `c` (its `method`, `rl.advantage*` and `rl.loss`)."""
  if name not in VARIANTS:
    raise ValueError(f"unknown group-relative variant {name!r}; known: {VARIANTS}")
  c.method = name
  rl = c.rl
  rl.advantage = "gigpo" if name == "gigpo" else "grpo"
  rl.advantage_options = {"eps": 1e-6, "normalize_std": name != "dr_grpo"}
  if name == "gigpo":
    rl.advantage_options.update({"omega": 1.0, "gamma": 0.95})
  rl.loss.aggregation = {"grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm",
                         "dapo": "token-mean", "gigpo": "token-mean", "entropy_adv": "seq-mean-token-mean"}[name]
  rl.loss.eps_low = 0.2
  rl.loss.eps_high = 0.28 if name == "dapo" else 0.2
  rl.drop_uniform_groups = name == "dapo"
  rl.loss.entropy_advantage = name == "entropy_adv"
  return c


class GroupRelative(Method):
  """On-policy group-relative policy optimisation; the variant lives entirely in the config."""

  @property
  def name(self) -> str:
    return self.config.method


for _name in VARIANTS:
  register_method(_name)(GroupRelative)
