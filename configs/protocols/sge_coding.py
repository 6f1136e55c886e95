"""The SGE protocol on the tiny coding tasks: SGE, its GRPO baseline and SGE's ablations, every arm run
over the same warm starts and RL seeds, one run at a time, reported by launch/compare.py per arm.

  python launch/sweep.py --protocol=configs/protocols/sge_coding.py --root=runs/protocol/sge_coding
  make protocol PROTOCOL=configs/protocols/sge_coding.py          # the same

A run is (arm, warm start W, seed S) in root/<machine>/<arm>/ws<W>_seed<S>: the arm's config and overrides,
the common overrides below, --config.sft.seed=W (runs with the same W on one machine share one cached SFT
warm start; another machine computes another one, docs/determinism.md) and --config.seed=S. The
ablations are overrides of configs/sge_coding.py, so they differ from SGE in one knob.
"""

from configs import protocols

# How many warm starts and RL seeds every arm gets on each machine: runs per arm and machine = WARM_STARTS x
# SEEDS. docs/results.md holds the power argument (stats.permutation_power with strata): what buys power
# is runs per arm (about 24 for SGE vs GRPO), and more warm starts make the result less a property of one
# starting policy, so warm starts of two seeds each. Eight warm starts on one machine plus the first
# machine's earlier design (2 warm starts x 4 seeds, kept in the comparison) make 24 runs per arm.
WARM_STARTS = 8
SEEDS = 2

# Common to all arms (these are configs/coding.py's defaults, pinned so the protocol states them).
ITERATIONS = 16   # RL iterations per run
TASKS = 32        # held-in training tasks (the rollout pool and the environment's task set)

ARMS = (
    ("sge", "configs/sge_coding.py", ()),
    ("grpo", "configs/grpo_coding.py", ()),
    ("sge_no_mixed_temperature", "configs/sge_coding.py", ("--config.sge.strategy_temperature=0.7",)),
    ("sge_no_negative_reflection", "configs/sge_coding.py", ("--config.sge.p_failure=0",)),
    ("sge_no_positive_reflection", "configs/sge_coding.py", ("--config.sge.p_success=0",)),
)
# The `:small` scale (configs/small.py: the pretrained SmolLM2-135M-Instruct on the same tiny settings) is
# accelerator work: on 2 cores one of its RL iterations takes minutes (benchmarks/README.md). Its arms are planned to
# fit a device loan (15 minutes of one H100/H200, 600 s a call, resumable: a second call goes on from the first's
# checkpoints) with --parallel=3.
# SGE against GRPO only; a strategy that a model can read is where SGE's claim lives.
ARMS += (("sge_small", "configs/sge_coding.py:small", ()), ("grpo_small", "configs/grpo_coding.py:small", ()))


def get_protocol() -> dict:
  return protocols.protocol(
      ARMS, seeds=SEEDS, warm_starts=WARM_STARTS,
      overrides=[f"--config.train.num_iterations={ITERATIONS}", f"--config.rollout.task_pool={TASKS}",
                 f"--config.env.kwargs.num_tasks={TASKS}"])
