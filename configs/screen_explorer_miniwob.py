"""ScreenExplorer (explore_jax/methods/screen_explorer.py) on MiniWoB++ pages in Chromium: open-ended exploration
of web pages with no task reward, driven only by the method's curiosity, change and intent terms. The pages are
configs/grpo_miniwob.py's; their task reward does not train (screen_explorer.task_reward False, as on the
desktop, which has none), so what the agent learns is to explore. The held-out evaluation still reports the tasks' success: what an explorer's habits do
on the tasks themselves.

  python launch/train.py --config=configs/screen_explorer_miniwob.py --workdir=runs/screen_explorer_miniwob
  python launch/train.py --config=configs/screen_explorer_miniwob.py:paper \\
      --config.model.checkpoint=/path/to/Qwen2.5-VL-3B-Instruct --workdir=runs/se_miniwob_paper
  # the distilled model: a fresh base fine-tuned on a run's experience stream, then evaluated
  python launch/train.py --config=configs/screen_explorer_miniwob.py:distill \\
      --config.sft.demonstrations=runs/screen_explorer_miniwob/distill --workdir=runs/se_miniwob_distilled

  tiny     (default) the built-in `tiny-vl` policy, warm-started on the DOM oracle's clicks written as JSON replies
           with an intent (envs/screen_reader.py), 2 actors x 2 browsers, 4 episodes x 5 steps per iteration.
  paper    a local Qwen2.5-VL-3B-Instruct directory, zero-shot start, 8 environments x 10 steps, 1000 iterations
           (the paper's episodes), LoRA r 16.
  distill  SFT of the base checkpoint on `sft.demonstrations` (a run's <workdir>/distill), no RL: its evaluation
           is the distilled model's (compare with launch/eval.py on the base and the RL run).

Ablations are overrides: --config.screen_explorer.terms.world_vis=False --config.screen_explorer.terms.world_text=False
(no world-model reward), ...terms.des=False ...terms.inter=False (no intent rewards), ...terms.seq_vis=False
...terms.seq_text=False (no sequence reward); --config.screen_explorer.format=term and
--config.screen_explorer.sequence_form=code are the paper's and the released code's other readings.
"""

import ml_collections

from configs import grpo_miniwob
from explore_jax.methods import screen_explorer

SYSTEM_PROMPT = screen_explorer.SYSTEM_PROMPT


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "tiny", "paper", "distill"):
    raise ValueError(f"unknown variant {variant!r}; known: '', 'tiny', 'paper', 'distill'")
  c = grpo_miniwob.get_config("paper" if variant == "paper" else "")
  screen_explorer.configure(c)
  c.system_prompt = SYSTEM_PROMPT
  c.env.kwargs.max_steps = c.env.max_steps = 5 if variant != "paper" else 10
  c.rollout.group_size = 4 if variant != "paper" else 8
  c.rollout.num_tasks = 1                # one group: the estimator pools every step of the iteration anyway
  c.rollout.max_new_tokens = 96 if variant != "paper" else 128   # a JSON reply: ~50 tiny tokens
  c.rollout.max_prompt_tokens = 576 if variant != "paper" else 1024   # 48 image tokens, ~350 of instructions
                                         # and the utterance, ~120 of response format after an invalid action
  c.train.num_iterations = 40 if variant != "paper" else 1000
  c.screen_explorer.distill.from_iteration = 30
  if variant == "paper":
    c.model.lora.rank, c.model.lora.alpha = 16, 16.0   # the paper's r 16 (the released code: r 64, alpha 16)
    c.optimizer.learning_rate = 4e-5
  else:
    c.sft.steps = 300
    c.optimizer.learning_rate = 4e-5
  if variant == "distill":
    c.sft.enabled = True
    c.sft.steps = 200
    c.train.num_iterations = 0
  return c
