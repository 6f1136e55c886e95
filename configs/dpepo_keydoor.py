"""DPEPO (explore_jax/methods/dpepo.py) on the built-in KeyDoor world with the tiny model, where a 2-core CPU
affords the copies' longer prompts: the key's room is not told (hints off), so an agent must search the corridor,
and 4 parallel copies can search it in several directions at once. A cold start on the searching oracle's
parallel demonstrations (copy 1 sweeps the corridor, fetches the key and opens the door, the others take other
listed actions; configs/keydoor_search.py), then DPEPO.

  python launch/train.py --config=configs/dpepo_keydoor.py --workdir=runs/dpepo_keydoor

The variants are the protocol's arms (configs/protocols/dpepo.py): `:gigpo` GiGPO on the same world in one copy
with the plain prompt; `small` (alone or after a comma) SmolLM2-135M-Instruct. Ablations are overrides: K = 1
--config.env.parallel.copies=1, no diversity weight --config.dpepo.weight=off, depth or width only
--config.dpepo.weight=depth|width, no cold start --config.sft.steps=0.
"""

import ml_collections

from configs import base, keydoor_search, small
from explore_jax.methods import dpepo, grpo


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  parts = [p for p in (variant or "").split(",") if p]
  scale = parts.pop() if parts and parts[-1] in ("tiny", "small") else "tiny"
  if parts not in ([], ["dpepo"], ["gigpo"]):
    raise ValueError(f"unknown variant {variant!r}: 'dpepo' (default), 'gigpo', a scale (tiny, small), or both")
  c = base.get_config()
  if parts == ["gigpo"]:
    grpo.configure(c, "gigpo")
    c.rl.loss.aggregation = "token-mean"
  else:
    dpepo.configure(c)
  keydoor_search.world(c)
  parallel = parts != ["gigpo"]
  # The parallel prompt shows every copy: ~4x one room's text, and a response names up to 4 actions.
  c.rollout.max_prompt_tokens = 512 if parallel else 160
  c.rollout.max_new_tokens = 72 if parallel else 8
  if parallel:
    c.dpepo.history_steps = 0          # earlier steps of a copy show their action only
  keydoor_search.recipe(c)
  return small.apply(c) if scale == "small" else c
