"""GRPO on the built-in KeyDoor environment with the tiny model: learns in minutes on a 2-core CPU.

  python launch/train.py --config=configs/grpo_keydoor.py --workdir=runs/grpo_keydoor

Variants select the group-relative baseline: `:grpo` (default), `:dr_grpo`, `:dapo`, `:gigpo`, e.g.
  python launch/train.py --config=configs/grpo_keydoor.py:gigpo --workdir=runs/gigpo_keydoor

The tiny model first imitates a few imperfect oracle demonstrations (SFT warm start, cached across runs),
then RL raises its success rate.
"""

import ml_collections

from configs import base
from explore_jax.methods import grpo


def get_config(variant: str = "grpo") -> ml_collections.ConfigDict:
  c = base.get_config()
  grpo.configure(c, variant or "grpo")
  c.env.id = "explore_jax/KeyDoor-v0"
  c.env.kwargs = ml_collections.ConfigDict({"num_rooms": 4, "num_distractors": 2})
  c.env.max_steps = 10
  c.system_prompt = ""           # the observation lists the actions; short prompts keep CPU steps cheap
  c.rollout.num_tasks = 8
  c.rollout.group_size = 4
  c.rollout.max_prompt_tokens = 112  # invalid-action observations reach ~104 tokens
  c.rollout.max_new_tokens = 8
  c.rl.minibatch_size = 64
  c.rl.epochs = 2
  # Adam's first steps move every weight by ~lr whatever the gradient's size; with noisy policy gradients
  # a warmup and a small rate keep the warm-started policy from being scrambled (2e-4 collapsed it).
  c.optimizer.learning_rate = 5e-5
  c.optimizer.warmup_steps = 10
  c.sft.enabled = True
  c.sft.oracle_episodes = 16
  c.sft.steps = 25
  c.train.num_iterations = 30
  return c
