"""GRPO with DAPO's modifications minus clip-higher (the paper's GRPO baseline), on coding tasks; the SGE
paper's baseline, sharing SGE's prompt and RL recipe (configs/coding.py).

  python launch/train.py --config=configs/grpo_coding.py --workdir=runs/grpo_coding
  python launch/train.py --config=configs/grpo_coding.py:paper --config.model.checkpoint=/path/to/Qwen3-4B-Instruct ...
"""

from configs import coding


def get_config(variant: str = ""):
  return coding.get_config("grpo", variant)
