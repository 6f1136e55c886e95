"""EAPO (explore_jax/methods/eapo.py) on the built-in KeyDoor world with the tiny model: the key's room is not told
(hints off), so an agent must search the corridor and walk back, the revisits EAPO's (state, visitation depth)
groups and rollback SFT are about. A warm start on the oracle answering in EAPO's fields (envs/fields.py), then EAPO
with q_phi a copy of the tiny policy.

  python launch/train.py --config=configs/eapo_keydoor.py --workdir=runs/eapo_keydoor

Variants: `:gigpo` GiGPO on the same world with the plain prompt and answers; `small` (alone or after a comma)
SmolLM2-135M-Instruct. Ablations are overrides: no R_explore --config.eapo.alpha2=0, plain GRPO grouping
--config.rl.advantage=grpo --config.rl.advantage_options="{'eps': 1e-6, 'normalize_std': True}", no rollback SFT
--config.eapo.rollback.enabled=False (neither the cold start before RL nor the later stages).
"""

import ml_collections

from configs import base, keydoor_search, small
from explore_jax.methods import eapo, grpo


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  parts = [p for p in (variant or "").split(",") if p]
  scale = parts.pop() if parts and parts[-1] in ("tiny", "small") else "tiny"
  if parts not in ([], ["eapo"], ["gigpo"]):
    raise ValueError(f"unknown variant {variant!r}: 'eapo' (default), 'gigpo', a scale (tiny, small), or both")
  c = base.get_config()
  fields = parts != ["gigpo"]
  if fields:
    eapo.configure(c)
  else:
    grpo.configure(c, "gigpo")
    c.rl.loss.aggregation = "token-mean"
  keydoor_search.world(c)
  # The fields answer: ~20 tokens of tags, two or three actions to explore and three short lines of memory.
  c.rollout.max_prompt_tokens = 384 if fields else 160
  c.rollout.max_new_tokens = 160 if fields else 8
  if fields:
    c.eapo.q_phi.max_tokens = 224      # the state (a room's two lines) then the longer, explored target
    c.eapo.q_phi.batch_size = 64       # 2 targets x ~190 records: 6 q_phi steps an iteration, as the policy takes
    # The released per-token mean: the tiny warm start's targets (~60-100 tokens) have a summed log q near -200
    # (measured, benchmarks/README.md "EAPO's iteration"), past the -60 clamp, so the "sequence" form's
    # R_explore is exp(-60) = 0 on every step.
    c.eapo.clamp = "token_mean"
  keydoor_search.recipe(c)
  return small.apply(c) if scale == "small" else c
