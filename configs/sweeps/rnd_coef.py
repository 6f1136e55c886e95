"""RND's weight: the intrinsic bonus at configs/coding.py's 0.1 against 1.0, where the tiny policy learned to
fail in novel ways (docs/results.md, "The other baselines, one seed": held-in pass@1 0.46 -> 0.05; that row was
one seed with an earlier learner). Two arms of configs/rnd_coding.py, named coef=0.1 and coef=1.0, over two warm
starts x two seeds with the SGE protocol's common overrides.

  python launch/sweep.py --sweep=configs/sweeps/rnd_coef.py --root=runs/sweeps/rnd_coef --dry_run
  make protocol PROTOCOL=configs/sweeps/rnd_coef.py
"""

from configs.protocols import sge_coding as protocol

WARM_STARTS = 2
SEEDS = 2


def get_protocol() -> dict:
  return {
      "config": "configs/rnd_coding.py",
      "product": {"config.rnd.coef": [0.1, 1.0]},
      "seeds": SEEDS,
      "warm_starts": WARM_STARTS,
      "overrides": protocol.get_protocol()["overrides"],
  }
