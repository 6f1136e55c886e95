"""SGE's ablations as a factorial: its three exploration components (mixed temperature, negative reflection,
positive reflection) each on or off, 2 x 2 x 2 = 8 arms of configs/sge_coding.py over the SGE protocol's warm
starts, seeds and common overrides (configs/protocols/sge_coding.py).

  python launch/sweep.py --sweep=configs/sweeps/sge_ablations.py --root=runs/sweeps/sge_ablations --dry_run
  make protocol PROTOCOL=configs/sweeps/sge_ablations.py

The protocol's arms are four of these cells: sge = mixed_neg_pos, sge_no_mixed_temperature = flat_neg_pos,
sge_no_negative_reflection = mixed_noneg_pos, sge_no_positive_reflection = mixed_neg_nopos (the same training
runs, each knob set to its default or to the protocol's ablation value). The other four (two or three components
off) say whether the components add up or stand in for each other, which one-knob ablations cannot. The "on"
values are read from configs/coding.py, so the full cell stays SGE as its defaults change.
"""

from configs import coding
from configs.protocols import sge_coding as protocol


def get_protocol() -> dict:
  sge = coding.get_config("sge").sge
  return {
      "config": "configs/sge_coding.py",
      "product": {
          # tau_s: the strategy at its own temperature (mixed) or at the code's tau (flat, no mixed temperature)
          "config.sge.strategy_temperature": {"mixed": sge.strategy_temperature, "flat": sge.temperature},
          "config.sge.p_failure": {"neg": sge.p_failure, "noneg": 0.0},  # p_B: negative reflection
          "config.sge.p_success": {"pos": sge.p_success, "nopos": 0.0},  # p_G: positive reflection
      },
      "seeds": protocol.SEEDS,
      "warm_starts": protocol.WARM_STARTS,
      "overrides": protocol.get_protocol()["overrides"],
  }
