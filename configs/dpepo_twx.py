"""DPEPO (explore_jax/methods/dpepo.py) on the tiny TextWorld-Express coin setting of configs/textworlds.py: the
house in 4 parallel copies, one response acting in each, diversity-weighted advantages, a cold start on the
searching oracle's parallel demonstrations (copy 1 searches, the others take other listed actions). `:small` runs
SmolLM2-135M-Instruct, `:paper` a local model directory with the paper's recipe.

  python launch/train.py --config=configs/dpepo_twx.py --workdir=runs/dpepo_twx

Ablations are overrides: K = 1 --config.env.parallel.copies=1, no diversity weight --config.dpepo.weight=off,
depth or width only --config.dpepo.weight=depth|width, no cold start --config.sft.steps=0; the authors' parser
--config.env.parallel.parser=lenient.
"""

from configs import textworlds


def get_config(variant: str = ""):
  c = textworlds.get_config("dpepo", "twx", variant)
  c.sft.env_kwargs.oracle = "search"  # a search shows the copies something to diverge on; gold paths go straight
  return c
