"""DPEPO (explore_jax/methods/dpepo.py) on the generated ALFWorld household games of configs/textworlds.py: 4
parallel copies of a game, one response acting in each, diversity-weighted advantages, a cold start on the
searching agent's parallel demonstrations. `:small` runs SmolLM2-135M-Instruct; `:paper` the paper's recipe
(group 8, 4 copies, 25 steps, lr 1e-6, clip 0.2, k3 KL 0.01, entropy 0.001, LoRA r = alpha = 32) on a local
Qwen2.5-1.5B/3B-Instruct directory.

  python launch/train.py --config=configs/dpepo_alfworld.py --workdir=runs/dpepo_alfworld
  python launch/train.py --config=configs/dpepo_alfworld.py:paper --config.model.checkpoint=/path/to/Qwen2.5-3B-Instruct

The released run scripts' omega: --config.dpepo.omega=0.8. Ablations as in configs/dpepo_twx.py.
"""

from configs import textworlds


def get_config(variant: str = ""):
  return textworlds.get_config("dpepo", "alfworld", variant)
