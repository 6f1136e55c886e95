"""GiGPO on TextWorld-Express;
configs/textworlds.py has the recipe: the tiny scale by default, `:paper` for a local Qwen2.5-Instruct.

  python launch/train.py --config=configs/gigpo_twx.py --workdir=runs/gigpo_twx
  python launch/train.py --config=configs/gigpo_twx.py:paper --config.model.checkpoint=/path/to/Qwen2.5-7B-Instruct
"""

from configs import textworlds


def get_config(variant: str = ""):
  return textworlds.get_config("gigpo", "twx", variant)
