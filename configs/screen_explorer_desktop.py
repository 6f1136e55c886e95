"""ScreenExplorer (explore_jax/methods/screen_explorer.py) on a real X desktop (explore_jax/Desktop-v0: Xvfb,
openbox, desktop icons, xterm, mousepad, galculator, the file manager): no task, no reward from the world, only
the method's curiosity, change and intent terms; the screens read by ScreenReading-v0 (patch_stats latents,
tesseract OCR).

  python launch/train.py --config=configs/screen_explorer_desktop.py --workdir=runs/screen_explorer_desktop
  python launch/train.py --config=configs/screen_explorer_desktop.py:paper \\
      --config.model.checkpoint=/path/to/Qwen2.5-VL-3B-Instruct --workdir=runs/se_desktop_paper
  # the distilled model: a fresh base fine-tuned on a run's experience stream (steps from iteration 30 on)
  python launch/train.py --config=configs/screen_explorer_desktop.py:distill \\
      --config.sft.demonstrations=runs/screen_explorer_desktop/distill --workdir=runs/se_desktop_distilled
  # base, RL and distilled policies side by side: D_grp of their held-out episodes (summary.json)
  python launch/eval.py --config=configs/screen_explorer_desktop.py --policy=base
  python launch/eval.py --config=configs/screen_explorer_desktop.py --run=runs/screen_explorer_desktop

  tiny     (default) the built-in `tiny-vl` policy on a 320 x 240 desktop (88 image tokens), warm-started on the
           desktop's oracle (double-clicks on the launchers) written as JSON replies with an intent; 4 desktops
           x 5 steps per iteration, 40 iterations.
  paper    a local Qwen2.5-VL-3B-Instruct directory, zero-shot start, a 1920 x 1080 desktop, 1 s after each action,
           8 desktops x 10 steps, 1000 iterations, LoRA r 16.
  distill  SFT of the base checkpoint on `sft.demonstrations` (a run's <workdir>/distill), no RL.

Ablations are overrides, as in configs/screen_explorer_miniwob.py: --config.screen_explorer.terms.world_vis=False
--config.screen_explorer.terms.world_text=False (no world-model reward), ...terms.des=False ...terms.inter=False
(no intent rewards), ...terms.seq_vis=False ...terms.seq_text=False (no sequence reward).

Each desktop is its own X server with its applications (benchmarks/README.md, "Desktop-v0", for their memory
and speed): num_actors x envs_per_actor of them run at once.
"""

import ml_collections

from configs import base
from explore_jax.methods import screen_explorer


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  if variant not in ("", "tiny", "paper", "distill"):
    raise ValueError(f"unknown variant {variant!r}; known: '', 'tiny', 'paper', 'distill'")
  paper = variant == "paper"
  c = base.get_config()
  screen_explorer.configure(c)
  c.model.checkpoint = "tiny-vl"
  width, height = (1920, 1080) if paper else (320, 240)
  steps = 10 if paper else 5

  c.env.id = "explore_jax/Desktop-v0"
  c.env.max_steps = steps
  c.env.kwargs = ml_collections.ConfigDict({"screen_size": (width, height), "settle_s": 1.0 if paper else 0.3,
                                            "max_steps": steps})
  c.env.screen_reading.oracle = "world"      # the desktop's launchers, answered in JSON with an intent
  c.rollout.image_shape = (height, width, 3)
  c.rollout.max_images = 1                   # the current screenshot only
  c.rollout.num_tasks = 1                    # one group: every desktop of the iteration (the estimator's group)
  c.rollout.group_size = 8 if paper else 4
  c.rollout.num_actors = 8 if paper else 2
  c.rollout.envs_per_actor = 1 if paper else 2
  c.rollout.max_prompt_tokens = 4096 if paper else 576
  c.rollout.max_new_tokens = 128 if paper else 96
  c.rollout.episode_timeout_s = 600.0
  c.rl.minibatch_size = 16
  c.train.num_iterations = 1000 if paper else 40
  c.checkpoint.every = 5
  c.eval.every = 10 if not paper else 50     # eval/d_grp_vis of greedy held-out episodes
  c.eval.num_episodes = 4
  c.eval.temperature = 0.0
  c.screen_explorer.distill.from_iteration = 30

  c.sft.enabled = not paper
  c.sft.oracle_episodes = 64
  c.sft.steps = 300
  c.sft.batch_size = 16
  if paper:
    c.model.checkpoint = ml_collections.config_dict.placeholder(str)  # a local Qwen2.5-VL-3B-Instruct
    c.model.param_dtype = c.model.dtype = "bfloat16"
    c.model.remat = True
    c.model.lora.rank, c.model.lora.alpha = 16, 16.0   # the paper's r 16 (the released code: r 64, alpha 16)
  if variant == "distill":
    c.sft.enabled = True
    c.sft.steps = 200
    c.train.num_iterations = 0
  return c
