"""EntropyAdv (Cheng et al. 2025): GRPO with entropy-shaped advantages, alpha 0.4, kappa 2, on coding tasks;
the SGE paper's baseline, sharing SGE's prompt and RL recipe (configs/coding.py).

  python launch/train.py --config=configs/entropyadv_coding.py --workdir=runs/entropyadv_coding
  python launch/train.py --config=configs/entropyadv_coding.py:paper --config.model.checkpoint=/path/to/Qwen3-4B-Instruct ...
"""

from configs import coding


def get_config(variant: str = ""):
  return coding.get_config("entropy_adv", variant)
