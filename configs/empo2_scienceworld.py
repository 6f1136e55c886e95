"""EMPO² on the tiny ScienceWorld setting of configs/textworlds.py (lifespan-longest-lived in 4 steps), as
configs/empo2_twx.py describes it; `:paper` is the paper's ScienceWorld recipe (30 steps, group 8, lr 1e-6, KL 0,
clip 0.2/0.3, 16 training variations, a local Qwen2.5-7B-Instruct).

  python launch/train.py --config=configs/empo2_scienceworld.py --workdir=runs/empo2_scienceworld
  python launch/train.py --config=configs/empo2_scienceworld.py:paper --config.model.checkpoint=/path/to/Qwen2.5-7B-Instruct
"""

from configs import textworlds


def get_config(variant: str = ""):
  return textworlds.get_config("empo2", "scienceworld", variant)
