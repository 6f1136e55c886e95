"""EAPO (explore_jax/methods/eapo.py) on MiniWoB++ in Chromium with a vision-language policy, the GUI stand-in for
the paper's phone and desktop worlds: configs/grpo_miniwob.py's tasks and budgets, answered in EAPO's fields
(envs/fields.py: the boxed action is a ScreenExplorer action such as Click(80, 105)), the warm start on the DOM
oracle's answers in fields, q_phi a copy of the policy.

  python launch/train.py --config=configs/eapo_miniwob.py --workdir=runs/eapo_miniwob
  python launch/train.py --config=configs/eapo_miniwob.py:paper --config.model.checkpoint=/path/to/Qwen3-VL-2B-Instruct

  tiny   (default) the built-in `tiny-vl` policy (random weights before its warm start) on four click tasks.
  paper  a local Qwen3-VL directory (the paper's 2B/4B/8B), bfloat16, table 3's group 16, lr 1e-4 and KL 0.01.

q_phi scores each step's fields from the state's text (the task's utterance); the screenshot is the policy's
alone. The world lists no admissible actions, so the oracle's explore field is "none", and rollback guesses come
from the episodes' own steps back only. Ablations as in configs/eapo_keydoor.py.
"""

import ml_collections

from configs import grpo_miniwob
from explore_jax.methods import eapo


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = grpo_miniwob.get_config(variant)
  eapo.configure(c)
  c.system_prompt = ("You control a web page through its screenshot. Answer in the four blocks asked for; the "
                     "action is one screen action, e.g. \\boxed{Click(80, 105)}, in screen pixels.")
  c.rl.minibatch_size = 16
  c.optimizer.learning_rate = 1e-4
  if variant == "paper":
    c.rollout.group_size = 16
    c.rollout.max_prompt_tokens = 2048
    c.rollout.max_new_tokens = 512
    c.eapo.q_phi.max_tokens = 1024
    c.rl.loss.kl_coef = 0.01
    c.rl.loss.kl_type = "k3"
  else:
    # The fields add the last explore and memory and the format (~90 tokens) to grpo_miniwob's 320, and an answer
    # is ~50 tokens of tags and memory around the action.
    c.rollout.max_prompt_tokens = 448
    c.rollout.max_new_tokens = 96
    c.eapo.q_phi.max_tokens = 192
    c.eapo.clamp = "token_mean"        # as configs/eapo_keydoor.py: a tiny model's summed log q is below the clamp
  return c
