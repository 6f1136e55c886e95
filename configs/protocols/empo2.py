"""The EMPO² protocol: EMPO² against GRPO and GiGPO, and EMPO² without memory, on TextWorld-Express coin (the tiny
setting of configs/textworlds.py, the searching warm start where GiGPO's held-out gain is known), each arm over the
same warm starts and RL seeds, reported by launch/compare.py per arm. Fixed before any run:

  endpoint   held-out success (pass@1 of 4 samples at T = 0.4 on 64 dev games), evaluated without memory, of the
             trained policy against its warm start; held-in success and the exploration measures beside it
  arms       empo2, grpo, gigpo, and empo2_no_memory (p = 1: tips are still written, never read), from the same
             warm starts; a fresh game per group would leave EMPO2's per-task memory nothing to retrieve, so every
             arm trains on the same pool of 64 held-in games
  runs       3 warm starts x 1 seed per arm, the least the results protocol takes for a claim; the power this buys
             is stated with the results

  make protocol PROTOCOL=configs/protocols/empo2.py SWEEP_ARGS="--only=empo2,grpo"

The `:small` arms (SmolLM2, which writes its tips zero-shot) are planned for a device loan.
"""

from configs import protocols

WARM_STARTS = 3
SEEDS = 1

COMMON = ("--config.eval.passk_held_out_tasks=64", "--config.action_history=8", "--config.sft.env_kwargs.oracle=search")
ARMS = (("empo2", "configs/empo2_twx.py", COMMON),
        ("grpo", "configs/grpo_twx.py", COMMON),
        ("gigpo", "configs/gigpo_twx.py", COMMON),
        ("empo2_no_memory", "configs/empo2_twx.py", (*COMMON, "--config.empo2.p_memory_free=1.0")))
ARMS += tuple((f"{name}_small", f"{config}:small", overrides) for name, config, overrides in ARMS[:2])


def get_protocol() -> dict:
  return protocols.protocol(ARMS, seeds=SEEDS, warm_starts=WARM_STARTS)
