"""GRPO on the built-in KeyDoor environment with the tiny model: learns in minutes on a 2-core CPU.

  python launch/train.py --config=configs/grpo_keydoor.py --workdir=runs/grpo_keydoor

Variants select the group-relative baseline: `:grpo` (default), `:dr_grpo`, `:dapo`, `:gigpo`, e.g.
  python launch/train.py --config=configs/grpo_keydoor.py:gigpo --workdir=runs/gigpo_keydoor
and `small` the scale (configs/small.py: SmolLM2-135M-Instruct), alone or after a comma:
  python launch/train.py --config=configs/grpo_keydoor.py:small --workdir=runs/grpo_keydoor_small
  python launch/train.py --config=configs/grpo_keydoor.py:gigpo,small

The tiny model first imitates a few imperfect oracle demonstrations (SFT warm start, cached across runs),
then RL raises its success rate.
"""

import ml_collections

from configs import base, small
from explore_jax.methods import grpo


def get_config(variant: str = "grpo") -> ml_collections.ConfigDict:
  parts = [p for p in (variant or "").split(",") if p]
  scale = parts.pop() if parts and parts[-1] in ("tiny", "small") else "tiny"
  if len(parts) > 1:
    raise ValueError(f"unknown variant {variant!r}: a baseline, a scale (tiny, small), or 'baseline,scale'")
  c = base.get_config()
  grpo.configure(c, parts[0] if parts else "grpo")
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
  return small.apply(c) if scale == "small" else c
