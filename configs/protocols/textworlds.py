"""The text-world protocol: GiGPO and its GRPO baseline on TextWorld-Express and on the generated ALFWorld games,
each arm run over the same warm starts and RL seeds, one run at a time, reported by launch/compare.py per arm
(held-out success of the warm start and of the trained policy: the `summary.json` pass@1 rows).

  make protocol PROTOCOL=configs/protocols/textworlds.py
  python launch/sweep.py --protocol=configs/protocols/textworlds.py --root=runs/protocol/textworlds --only=gigpo_twx,grpo_twx

A run is (arm, warm start W, seed S) in root/<machine>/<arm>/ws<W>_seed<S> (launch/sweep.py). Arms of different
worlds share a directory tree but are only ever compared within their world (compare.py groups by arm label; read
the table per world).
"""

from configs import protocols

# Three warm starts of one RL seed each: three runs per arm and world, the minimum the results protocol asks before
# a learning claim; more seeds go on top of the same blocks.
WARM_STARTS = 3
SEEDS = 1

# The ALFWorld arms are pinned to the tiny config they were planned on, before its default moved to the smaller
# rooms and the longer warm start that wins games (configs/textworlds.py): every room, 64 search episodes, 60 SFT
# steps, 704 prompt tokens.
ALFWORLD_FIRST_TINY = ("--config.env.kwargs.max_receptacles=0", "--config.sft.steps=60",
                       "--config.sft.oracle_episodes=64", "--config.rollout.max_prompt_tokens=704")
ARMS = tuple((f"{method}_{world}", f"configs/{method}_{world}.py", ALFWORLD_FIRST_TINY if world == "alfworld" else ())
             for world in ("twx", "alfworld") for method in ("gigpo", "grpo"))
# The first TWX arm trained on a pool of 64 games and gained on them, not on held-out games. Here every group
# draws a fresh training game (no game recurs, so nothing can be learnt about one game in particular, and
# there is no held-in set), and success is read on 64 held-out games instead of 32.
ARMS += (("gigpo_twx_fresh", "configs/gigpo_twx.py",
          ("--config.rollout.task_pool=0", "--config.eval.passk_held_out_tasks=64")),)
# Its held-out failures all run out of steps walking back and forth between two rooms: the prompt shows the
# current room only, so the policy cannot tell where it has been. The same arm with the last 8 actions in the
# prompt (methods/base.py, action_history), the memory a search needs.
ARMS += (("gigpo_twx_memory", "configs/gigpo_twx.py",
          ("--config.rollout.task_pool=0", "--config.eval.passk_held_out_tasks=64", "--config.action_history=8")),)
# Neither arm moved held-out success in its first run, and training success per iteration swung between 0.12
# and 0.97 with no trend: with 4 games per iteration, which games were drawn decides an iteration. The memory
# arm with twice the games per iteration and twice the iterations (4x the RL; ~80 min per run on 2 cores).
ARMS += (("gigpo_twx_memory_big", "configs/gigpo_twx.py",
          ("--config.rollout.task_pool=0", "--config.eval.passk_held_out_tasks=64", "--config.action_history=8",
           "--config.rollout.num_tasks=8", "--config.train.num_iterations=40", "--config.checkpoint.every=4")),)
# Its first 21 iterations left held-out success flat (0.53-0.59 in the periodic evaluation) while the updates
# barely moved the policy: approx. KL 0.001-0.006 per iteration and 0-2% of tokens clipped at lr 5e-5. The
# memory arm with 4x the learning rate, the step size the clip range is there to bound.
ARMS += (("gigpo_twx_memory_lr", "configs/gigpo_twx.py",
          ("--config.rollout.task_pool=0", "--config.eval.passk_held_out_tasks=64", "--config.action_history=8",
           "--config.optimizer.learning_rate=2e-4")),)
# It did not gain either (warm start 2: 0.652 -> 0.648; entropy rose 0.21 -> 0.40). A depth-first search over
# the observations finds every coin within 6 steps, so success is not capped; but the warm start imitates gold
# paths that go straight to a coin no observation shows. The memory arm warm-started on the searching oracle's
# episodes instead (envs/twx.py, oracle="search"): behaviour the prompt (the room, its exits, the last 8
# actions) can support, for RL to sharpen.
# The same arm for GRPO (episode-level credit only) over the same warm starts: does GiGPO's step-level credit
# matter for the held-out gain the GiGPO arm shows?
ARMS += tuple((f"{method}_twx_search", f"configs/{method}_twx.py",
               ("--config.rollout.task_pool=0", "--config.eval.passk_held_out_tasks=64", "--config.action_history=8",
                "--config.sft.env_kwargs.oracle=search"))
              for method in ("gigpo", "grpo"))

# ALFWorld's tiny warm starts win nothing in rooms of up to 51 receptacles (docs/results.md): the same games
# drawn from the rooms with at most 10 (18 held-in, 5 held-out; the searching oracle wins in 4-11 steps, median
# 7, against 13), with the longer warm start (150 SFT steps on 128 search episodes).
ARMS += tuple((f"{method}_alfworld_small", f"configs/{method}_alfworld.py",
               ("--config.env.kwargs.max_receptacles=10", "--config.sft.steps=150", "--config.sft.oracle_episodes=128",
                "--config.rollout.max_prompt_tokens=704"))
              for method in ("gigpo", "grpo"))
# That warm start wins none of 384 samples; the arms from the one that wins are configs/protocols/alfworld.py.

# The `:small` scale (configs/small.py: the pretrained SmolLM2-135M-Instruct on the same tiny settings) is
# accelerator work: on 2 cores one of its RL iterations takes minutes (benchmarks/README.md). Its arms are planned to
# fit a device loan (15 minutes of one H100/H200, 600 s a call, resumable: a second call goes on from the first's
# checkpoints) with --parallel=3.
# The TWX search arms, where GiGPO gained held-out success with the tiny model.
ARMS += tuple((f"{method}_twx_search_small", f"configs/{method}_twx.py:small",
               ("--config.rollout.task_pool=0", "--config.eval.passk_held_out_tasks=64", "--config.action_history=8",
                "--config.sft.env_kwargs.oracle=search"))
              for method in ("gigpo", "grpo"))

def get_protocol() -> dict:
  return protocols.protocol(ARMS, seeds=SEEDS, warm_starts=WARM_STARTS)
