"""DPEPO (explore_jax/methods/dpepo.py) on the tiny ScienceWorld task of configs/textworlds.py (find the
longest-lived animal): 4 parallel copies, group 4 as the paper's ScienceWorld runs, diversity-weighted
advantages, a cold start where copy 1 walks the gold path and the others take other admissible actions.
`:small` runs SmolLM2-135M-Instruct, `:paper` the paper's recipe on a local Qwen2.5-7B-Instruct directory.

  python launch/train.py --config=configs/dpepo_scienceworld.py --workdir=runs/dpepo_scienceworld

As the released ScienceWorld scripts ran (no diversity weight): --config.dpepo.weight=scripts. Ablations as in
configs/dpepo_twx.py.
"""

from configs import textworlds


def get_config(variant: str = ""):
  return textworlds.get_config("dpepo", "scienceworld", variant)
