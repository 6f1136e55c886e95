"""GRPO on ScienceWorld;
configs/textworlds.py has the recipe: the tiny scale by default, `:paper` for a local Qwen2.5-Instruct.

  python launch/train.py --config=configs/grpo_scienceworld.py --workdir=runs/grpo_scienceworld
  python launch/train.py --config=configs/grpo_scienceworld.py:paper --config.model.checkpoint=/path/to/Qwen2.5-7B-Instruct
"""

from configs import textworlds


def get_config(variant: str = ""):
  return textworlds.get_config("grpo", "scienceworld", variant)
