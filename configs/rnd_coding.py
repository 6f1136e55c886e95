"""RND (i-MENTOR): an exploration reward from random network distillation on failed trajectories, on coding
tasks; the SGE paper's baseline, sharing SGE's prompt and RL recipe (configs/coding.py).

  python launch/train.py --config=configs/rnd_coding.py --workdir=runs/rnd_coding
  python launch/train.py --config=configs/rnd_coding.py:paper --config.model.checkpoint=/path/to/Qwen3-4B-Instruct ...
"""

from configs import coding


def get_config(variant: str = ""):
  return coding.get_config("rnd", variant)
