"""The ScienceWorld protocol: GiGPO and its GRPO baseline on the tiny ScienceWorld default (lifespan-longest-lived
in 4 steps, from demonstrations that name the animal as the room lists it; configs/textworlds.py) for 40
iterations, reported by launch/compare.py per arm (held-out success of the warm start and of the trained policy:
the `summary.json` pass@1 rows).

  make protocol PROTOCOL=configs/protocols/scienceworld.py \
      SWEEP_ARGS="--only=gigpo_scienceworld_it40 --carry_warm_starts"

A run is (arm, warm start W, seed S) in root/<machine>/<arm>/ws<W>_seed<S> (launch/sweep.py).
"""

from configs import protocols

# One warm start and three RL seeds: the SFT is ~12 min on 2 cores and a run's RL ~70 min, so three warm starts
# would add a third of a run's time each and teach RL nothing. More warm starts go on top.
WARM_STARTS = 1
SEEDS = 3

# One run of the default (seed 0) left held-out success flat over its 20 iterations and raised it over 40
# (pass@1 0.532 -> 0.685, 7 games up and 3 down, task-paired p 0.095; docs/results.md): the claim tested here.
# Seeds 1 and 2 did not repeat it (held-out 0.411 and 0.637; docs/results.md, "ScienceWorld under the protocol").
LONGER = ("--config.train.num_iterations=40",)
ARMS = tuple((f"{method}_scienceworld_it40", f"configs/{method}_scienceworld.py", LONGER)
             for method in ("gigpo", "grpo"))
# The `:small` scale (configs/small.py: the pretrained SmolLM2-135M-Instruct on the same tiny settings) is
# accelerator work: on 2 cores one of its RL iterations takes minutes (benchmarks/README.md). Its arms are planned to
# fit a device loan (15 minutes of one H100/H200, 600 s a call, resumable: a second call goes on from the first's
# checkpoints) with --parallel=3.
ARMS += tuple((f"{method}_scienceworld_small_it40", f"configs/{method}_scienceworld.py:small", LONGER)
              for method in ("gigpo", "grpo"))


def get_protocol() -> dict:
  return protocols.protocol(ARMS, seeds=SEEDS, warm_starts=WARM_STARTS)
