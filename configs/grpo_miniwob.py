"""GRPO on MiniWoB++ click tasks in Chromium with a vision-language policy: the screenshot and the task's
utterance in, a ScreenExplorer action (`Click(x, y)`, ...) out.

  python launch/train.py --config=configs/grpo_miniwob.py --workdir=runs/grpo_miniwob
  python launch/train.py --config=configs/grpo_miniwob.py:paper --config.model.checkpoint=/path/to/Qwen2.5-VL-3B-Instruct

  tiny   (default) the built-in `tiny-vl` policy (random weights) on four click tasks, 2 actors x 2 browsers,
         3 steps per episode, RL from an SFT warm start on the tasks' own solutions: MiniWoB-v0's DOM oracle
         reads the target element's rectangle from the page and clicks its centre (envs/miniwob.py), one
         demonstration per step of its episodes on train-split seeds that RL never draws (sft.oracle_seed_offset),
         each with the screenshot the policy sees.
  paper  a local Qwen2.5-VL-3B-Instruct directory (ScreenExplorer's policy size), bfloat16, 8 task groups of 8,
         10 steps, lr 1e-6.

Each browser holds ~180 MiB (the first ~460 MiB): num_actors x envs_per_actor browsers run at once. The
screenshot (210 x 160) reaches the model at 224 x 168 (the processor's resize rule): 48 image tokens.
"""

import ml_collections

from configs import base
from explore_jax.methods import grpo

TASKS = ["click-test", "click-button", "click-link", "focus-text"]
SYSTEM_PROMPT = ("You control a web page through its screenshot. Reply with one action, e.g. Click(80, 105), in "
                 "screen pixels.")


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "tiny", "paper"):
    raise ValueError(f"unknown variant {variant!r}; known: '', 'tiny', 'paper'")
  c = base.get_config()
  grpo.configure(c, "grpo")
  c.system_prompt = SYSTEM_PROMPT
  c.model.checkpoint = "tiny-vl"

  c.env.id = "explore_jax/MiniWoB-v0"
  c.env.max_steps = 3
  c.env.kwargs = ml_collections.ConfigDict({"task": TASKS, "split": "train", "max_steps": 3})
  c.eval.env_kwargs = ml_collections.ConfigDict({"split": "test"})
  c.eval.seed_offset = 0
  c.eval.num_episodes = 16
  c.eval.temperature = 0.0
  c.eval.every = 5
  # Before and after RL: greedy success (pass@1) on the 64 held-in seeds RL trains on and on 64 test-split seeds
  # (16 instances of each task), per task in summary.json.
  c.eval.passk_samples = 1
  c.eval.passk_held_out_tasks = 64

  c.rollout.image_shape = (210, 160, 3)          # MiniWoB's task area (height, width, RGB)
  c.rollout.max_images = 1                       # the current screenshot only
  c.rollout.task_pool = 64                       # held-in instances: train-split seeds 0..63
  c.rollout.num_tasks = 2
  c.rollout.group_size = 4
  c.rollout.num_actors = 2
  c.rollout.envs_per_actor = 2
  c.rollout.max_prompt_tokens = 320              # 48 image tokens + the system prompt, the utterance and, after
                                                 # an invalid action, the response format (~120 tokens)
  c.rollout.max_new_tokens = 16
  c.rollout.episode_timeout_s = 300.0
  c.rl.minibatch_size = 16
  c.optimizer.learning_rate = 1e-4
  c.train.num_iterations = 20
  c.checkpoint.every = 5
  c.sft.enabled = True
  c.sft.oracle_episodes = 256                    # 64 per task, one click each
  c.sft.steps = 600                              # greedy success 0.25 on held-out seeds (200 steps on 128: 0.16)
  c.sft.batch_size = 16

  if variant == "paper":
    c.model.checkpoint = ml_collections.config_dict.placeholder(str)  # a local Qwen2.5-VL-3B-Instruct
    c.model.param_dtype = c.model.dtype = "bfloat16"
    c.model.remat = True
    c.env.max_steps = 10
    c.env.kwargs.max_steps = 10
    c.rollout.num_tasks = 8
    c.rollout.group_size = 8
    c.rollout.num_actors = 8
    c.rollout.envs_per_actor = 4
    c.rollout.max_prompt_tokens = 1024
    c.rollout.max_new_tokens = 128
    c.optimizer.learning_rate = 1e-6
    c.train.num_iterations = 200
    c.sft.enabled = False                        # the instruct model acts zero-shot, as in ScreenExplorer
  return c
