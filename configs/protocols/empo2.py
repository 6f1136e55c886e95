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

Recipe round 1, after the four arms ran: at this budget (384 prompt tokens) every tip prompt and most
memory-augmented step prompts were longer than the budget and were cut from the left, so the tips were written
without the task and the steps that showed tips lost their observation to them (docs/results.md, "EMPO²"). The two
EMPO² arms again, with room for the tips (768 prompt tokens: most of 10 tips of 40-90 tokens beside the state)
and `empo2.fit_prompts` (the default since) for what is longer still: such a prompt drops its lowest-ranked tips,
and a tip prompt the middle of its episode, instead of its beginning. GRPO's and GiGPO's prompts fitted 384 tokens
whole (no prompt of theirs was cut), so a larger budget would change only their padding, and their runs stand; the
round-0 arms keep what they ran (fit_prompts=False).

  make protocol PROTOCOL=configs/protocols/empo2.py SWEEP_ARGS="--only=empo2_fit,empo2_no_memory_fit"

Diagnostics of the entropy rise, after the first round-1 runs: update/entropy rose from ~0.25 to 1.2-1.5 in both
EMPO² arms, with memory and without, and stayed at 0.1-0.2 under GRPO and GiGPO; training success fell with it.
What the two EMPO² arms share and GRPO lacks is the novelty reward and the low-probability mask. The novelty
reward is small (0.01/n a step) but never equal across a group, so a group whose rollouts all succeed or all
fail, which GRPO leaves without a gradient, gets unit-scale advantages from novelty alone after the std
normalisation. Each arm drops one of the two from empo2_fit, on its first warm start only (the same policy as
empo2_fit ws0): these are diagnostics, not claims. Fixed before running: the endpoint is update/entropy, mean of
the last 5 iterations, against empo2_fit ws0's 1.12; held-out pass@1 beside it.

  make protocol PROTOCOL=configs/protocols/empo2.py SWEEP_ARGS="--only=empo2_fit_no_novelty,empo2_fit_no_mask --max_runs=2"

Their reading (docs/results.md, "EMPO²"): without the mask the entropy ended at 0.51, without the novelty reward at
1.51; the rise is the mask's.

Round 1's reading, 3 v 3: held-out pass@1 changed by -0.029 [-0.043, -0.016] with memory and -0.004 [-0.020, +0.012]
without; memory − no memory -0.025 matched (p 0.25). The memory shows no gain with the tiny model's tips.
"""

from configs import protocols

WARM_STARTS = 3
SEEDS = 1

COMMON = ("--config.eval.passk_held_out_tasks=64", "--config.action_history=8", "--config.sft.env_kwargs.oracle=search")
ROUND_0 = "--config.empo2.fit_prompts=False"
NO_MEMORY = "--config.empo2.p_memory_free=1.0"
ARMS = (("empo2", "configs/empo2_twx.py", (*COMMON, ROUND_0)),
        ("grpo", "configs/grpo_twx.py", COMMON),
        ("gigpo", "configs/gigpo_twx.py", COMMON),
        ("empo2_no_memory", "configs/empo2_twx.py", (*COMMON, ROUND_0, NO_MEMORY)))
ROOM = "--config.rollout.max_prompt_tokens=768"
ARMS += (("empo2_small", "configs/empo2_twx.py:small", COMMON),  # not run yet: the current recipe
         ("grpo_small", "configs/grpo_twx.py:small", COMMON),
         ("empo2_fit", "configs/empo2_twx.py", (*COMMON, ROOM)),
         ("empo2_no_memory_fit", "configs/empo2_twx.py", (*COMMON, ROOM, NO_MEMORY)),
         ("empo2_fit_no_novelty", "configs/empo2_twx.py", (*COMMON, ROOM, "--config.empo2.novelty=off")),
         ("empo2_fit_no_mask", "configs/empo2_twx.py", (*COMMON, ROOM, "--config.rl.loss.low_prob_mask=none")))


def get_protocol() -> dict:
  return protocols.protocol(ARMS, seeds=SEEDS, warm_starts=WARM_STARTS)
