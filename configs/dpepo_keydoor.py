"""DPEPO (explore_jax/methods/dpepo.py) on the built-in KeyDoor world with the tiny model, where a 2-core CPU
affords the copies' longer prompts: the key's room is not told (hints off), so an agent must search the corridor,
and 4 parallel copies can search it in several directions at once. A cold start on the oracle's parallel
demonstrations (copy 1 fetches the key and opens the door, the others take other listed actions), then DPEPO.

  python launch/train.py --config=configs/dpepo_keydoor.py --workdir=runs/dpepo_keydoor

The variants are the protocol's arms (configs/protocols/dpepo.py): `:gigpo` GiGPO on the same world in one copy
with the plain prompt; `small` (alone or after a comma) SmolLM2-135M-Instruct. Ablations are overrides: K = 1
--config.env.parallel.copies=1, no diversity weight --config.dpepo.weight=off, depth or width only
--config.dpepo.weight=depth|width, no cold start --config.sft.steps=0.
"""

import ml_collections

from configs import base, small
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
  c.env.id = "explore_jax/KeyDoor-v0"
  c.env.kwargs = ml_collections.ConfigDict({"num_rooms": 5, "num_distractors": 1, "hints": False, "max_steps": 12})
  c.env.max_steps = 12                 # two more than the oracle's worst case
  c.system_prompt = ""
  c.action_history = 4                 # the plain prompt's memory of where it went (GiGPO's arm)
  c.rollout.num_tasks = 8
  c.rollout.group_size = 4
  c.rollout.task_pool = 64
  parallel = parts != ["gigpo"]
  # The parallel prompt shows every copy: ~4x one room's text, and a response names up to 4 actions.
  c.rollout.max_prompt_tokens = 512 if parallel else 160
  c.rollout.max_new_tokens = 72 if parallel else 8
  if parallel:
    c.dpepo.history_steps = 0          # earlier steps of a copy show their action only
  c.rl.minibatch_size = 64
  c.rl.epochs = 2
  c.rl.micro_batch_size = 8
  c.optimizer.learning_rate = 5e-5
  c.optimizer.warmup_steps = 10
  c.eval.temperature = 0.4             # DPEPO's evaluation temperature (1.0 in training)
  c.eval.every = 5
  c.eval.num_episodes = 64
  c.eval.seed_offset = 100_000         # held-out episodes: seeds the pool (0-63) and the cold start never play
  c.eval.passk_samples = 4
  c.eval.passk_held_out_tasks = 64
  c.sft.enabled = True
  c.sft.oracle_seed_offset = 10_000
  c.sft.oracle_episodes = 64
  c.sft.steps = 60
  c.sft.batch_size = 32
  c.sft.learning_rate = 1e-3
  c.train.num_iterations = 30
  c.checkpoint.every = 5
  return small.apply(c) if scale == "small" else c
