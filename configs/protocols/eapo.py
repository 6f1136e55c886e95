"""The EAPO protocol: EAPO against its three ablations and GiGPO on KeyDoor without hints (configs/eapo_keydoor.py:
the key's room is not told, so an agent searches the corridor and walks back through rooms it has seen, the
revisits EAPO's grouping is about), each arm over the same warm start seeds and RL seeds, reported by
launch/compare.py per arm. Fixed before any run:

  endpoint   held-out success (pass@1 of 4 samples at T = 0.4 on 64 held-out layouts) of the trained policy against
             its warm start; beside it, from metrics.jsonl, the share of steps that revisit a state (revisit_share)
             and the size of the (state, depth) groups (step_group_size) over the iterations: the paper's measures
             of exploration collapsing under plain grouping
  arms       eapo (eq. 10's terms, (state, depth) groups, rollback SFT before RL and every 5 iterations),
             eapo_no_explore (alpha2 = 0), eapo_task_groups (the same step returns normalised over the task group),
             eapo_no_rollback, gigpo (the plain prompt and answers); the EAPO arms share their warm start (the
             oracle in fields)
  runs       3 warm starts x 1 seed per arm; the power this buys is stated with the results

  make protocol PROTOCOL=configs/protocols/eapo.py SWEEP_ARGS="--only=eapo,gigpo"

The `:small` arms (SmolLM2-135M-Instruct) and the ALFWorld arms (configs/eapo_alfworld.py against
configs/gigpo_alfworld.py; a tiny ALFWorld warm start is ~75 min of SFT on 2 cores) are for a device loan.

Before any run: the KeyDoor warm start plays the searching oracle for 240 SFT steps (configs/keydoor_search.py,
DPEPO's recipe round 1, configs/protocols/dpepo.py), where it played the planner, which sees the layout, for 60.
Also before any run, the method gained Algorithm 1's first stage, rollback SFT before RL on the oracle's episodes
(eapo.rollback.cold_start, cached with the warm start): the eapo arms start RL from the warm start and that stage,
eapo_no_rollback (eapo.rollback.enabled=False, neither stage) from the warm start alone.

Also before any run, for cost alone (DPEPO's recipe round 2, configs/protocols/dpepo.py): 20 iterations of 16
episodes, one epoch in minibatches of 32, an evaluation every 10 iterations (configs/keydoor_search.py); the
rollback stage after every 5th iteration runs 4 times a run, and, like the cold start, rehearses the oracle's steps
beside its rollbacks (eapo.rollback.rehearsal: on rollbacks alone one such stage took held-out success from 0.33 to
0.13; docs/results.md "EAPO").
"""

from configs import protocols

WARM_STARTS = 3
SEEDS = 1

CONFIG = "configs/eapo_keydoor.py"
ARMS = (("eapo", CONFIG, ()),
        ("eapo_no_explore", CONFIG, ("--config.eapo.alpha2=0",)),
        ("eapo_task_groups", CONFIG, ("--config.rl.advantage_options.groups=task",)),
        ("eapo_no_rollback", CONFIG, ("--config.eapo.rollback.enabled=False",)),
        ("gigpo", f"{CONFIG}:gigpo", ()))
ARMS += (("eapo_small", f"{CONFIG}:small", ()), ("gigpo_small", f"{CONFIG}:gigpo,small", ()),
         ("eapo_alfworld", "configs/eapo_alfworld.py", ()), ("gigpo_alfworld", "configs/gigpo_alfworld.py", ()))


def get_protocol() -> dict:
  return protocols.protocol(ARMS, seeds=SEEDS, warm_starts=WARM_STARTS)
