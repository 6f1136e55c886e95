"""RLAD: strategy dropped from 25% of training episodes, KL 0.001 to the starting policy, on coding tasks; the
SGE paper's baseline, sharing SGE's prompt and RL recipe (configs/coding.py).

  python launch/train.py --config=configs/rlad_coding.py --workdir=runs/rlad_coding
  python launch/train.py --config=configs/rlad_coding.py:paper --config.model.checkpoint=/path/to/Qwen3-4B-Instruct ...
"""

from configs import coding


def get_config(variant: str = ""):
  return coding.get_config("rlad", variant)
