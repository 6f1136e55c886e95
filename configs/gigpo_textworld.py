"""GiGPO on TextWorld's generated games;
configs/textworlds.py has the recipe: the tiny scale by default, `:paper` for a local Qwen2.5-Instruct.

  python launch/train.py --config=configs/gigpo_textworld.py --workdir=runs/gigpo_textworld
  python launch/train.py --config=configs/gigpo_textworld.py:paper --config.model.checkpoint=/path/to/Qwen2.5-7B-Instruct
"""

from configs import textworlds


def get_config(variant: str = ""):
  return textworlds.get_config("gigpo", "textworld", variant)
