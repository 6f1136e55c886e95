"""GRPO on TextWorld-Express;
configs/textworlds.py has the recipe: the tiny scale by default, `:paper` for a local Qwen2.5-Instruct.

  python launch/train.py --config=configs/grpo_twx.py --workdir=runs/grpo_twx
  python launch/train.py --config=configs/grpo_twx.py:paper --config.model.checkpoint=/path/to/Qwen2.5-7B-Instruct
"""

from configs import textworlds


def get_config(variant: str = ""):
  return textworlds.get_config("grpo", "twx", variant)
