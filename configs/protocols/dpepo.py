"""The DPEPO protocol: DPEPO against its ablations (no diversity weight, K = 1) and GiGPO on KeyDoor without hints
(configs/dpepo_keydoor.py: the key's room is not told, so the corridor must be searched; the world where a 2-core
CPU affords 4 copies' prompts, benchmarks/README.md "DPEPO's iteration"), each arm over the same warm start
seeds and RL seeds, reported by launch/compare.py per arm. Fixed before any run:

  endpoint   held-out success (pass@1 of 4 samples at T = 0.4 on 64 held-out layouts) of the trained policy
             against its warm start; beside it, from metrics.jsonl, the diversity per iteration
             (dpepo/distinct_actions_per_step, dpepo/distinct_transitions_per_group) and steps to success
  arms       dpepo (K = 4, W_t), dpepo_no_weight (W_t = 1), dpepo_k1 (one copy: the same pipeline without
             parallelism), gigpo (one copy, the plain prompt with the last 4 actions); each arm's warm start is
             its own cold start (the K = 4 arms share theirs)
  runs       3 warm starts x 1 seed per arm; the power this buys is stated with the results

  make protocol PROTOCOL=configs/protocols/dpepo.py SWEEP_ARGS="--only=dpepo,dpepo_no_weight"

The paper's claim: diversity rises and success rises, with shorter episodes. The `:small` arms (SmolLM2) are for
a device loan.

Recipe round 1, before any run had ended (round 0's first run stopped after 2 iterations, once its cost was
known): its warm start, 60 SFT steps on the planner's demonstrations (the planner sees the layout, which no
observation shows without hints), succeeded 0 of 64 held-in layouts at T = 0.4. A probe of the warm start alone
(launch/eval.py --policy=warm_start --transcripts=1) showed why: on the searching oracle's demonstrations at 60
steps every answer was well formed, yet a copy that saw the key took it 7 times in 558 (a random walk over
"go left"/"go right"); at 240 steps it took it 144 times in 475 and won 15 of 64 layouts (pass@1 0.234, 95% of
answers well formed). configs/keydoor_search.py now has both, for every arm of this protocol and of EAPO's; the
planner at 240 steps was not measured, so the two changes are not separated. Prompts that fit the budget
(ParallelPrompt's shorter forms) came with round 1 too.

Recipe round 2, the last, for cost alone and before any run had ended: round 1's runs were ~4 h each on 2 cores
(~2 days for the 12 tiny runs) and no device is lent, so configs/keydoor_search.py now trains 20 iterations of 16
episodes (4 tasks x 4), one epoch in minibatches of 32, and evaluates every 10 iterations. The arms, the endpoint
and the run count are unchanged. Runs resume where they stopped; each finished run is recorded under
docs/results/protocol/dpepo/ as it ends.
"""

from configs import protocols

WARM_STARTS = 3
SEEDS = 1

CONFIG = "configs/dpepo_keydoor.py"
ARMS = (("dpepo", CONFIG, ()),
        ("dpepo_no_weight", CONFIG, ("--config.dpepo.weight=off",)),
        ("dpepo_k1", CONFIG, ("--config.env.parallel.copies=1",)),
        ("gigpo", f"{CONFIG}:gigpo", ()))
ARMS += tuple((f"{name}_small", f"{config}{',' if ':' in config else ':'}small", overrides)
              for name, config, overrides in ARMS[:2])


def get_protocol() -> dict:
  return protocols.protocol(ARMS, seeds=SEEDS, warm_starts=WARM_STARTS)
