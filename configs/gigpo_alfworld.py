"""GiGPO on the generated ALFWorld household games;
configs/textworlds.py has the recipe: the tiny scale by default, `:paper` for a local Qwen2.5-Instruct.

  python launch/train.py --config=configs/gigpo_alfworld.py --workdir=runs/gigpo_alfworld
  python launch/train.py --config=configs/gigpo_alfworld.py:paper --config.model.checkpoint=/path/to/Qwen2.5-7B-Instruct
"""

from configs import textworlds


def get_config(variant: str = ""):
  return textworlds.get_config("gigpo", "alfworld", variant)
