"""KeyDoor without hints, the tiny protocol world of DPEPO and EAPO (configs/dpepo_keydoor.py, configs/eapo_keydoor.py):
5 rooms, the key's room not told, so an agent must search the corridor and walk back; 12 steps, two more than the
oracle's worst case. `world` sets the world and the rollout's groups, `recipe` the shared RL, evaluation and warm
start settings; each method's config sets its budgets between them."""

import ml_collections


def world(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  c.env.id = "explore_jax/KeyDoor-v0"
  c.env.kwargs = ml_collections.ConfigDict({"num_rooms": 5, "num_distractors": 1, "hints": False, "max_steps": 12})
  c.env.max_steps = 12
  c.system_prompt = ""
  c.action_history = 4                 # the plain prompt's memory of where it went (GiGPO's arm)
  c.rollout.num_tasks = 8
  c.rollout.group_size = 4
  c.rollout.task_pool = 64
  return c


def recipe(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  # The copies' and the fields' prompts vary in width from step to step, and fixed-shape calls sample a full batch
  # per width: continuous batching decodes them in one set of slots (benchmarks/README.md, "The sampler inside
  # the loop"). Set before either protocol ran; a protocol keeps one setting.
  c.rollout.batching = "continuous"
  c.rl.micro_batch_size = 8
  c.optimizer.learning_rate = 5e-5
  c.optimizer.warmup_steps = 10
  c.eval.temperature = 0.4             # the evaluation temperature of DPEPO and GiGPO (1.0 in training)
  c.eval.num_episodes = 64
  c.eval.seed_offset = 100_000         # held-out episodes: seeds the pool (0-63) and the warm start never play
  c.eval.passk_samples = 4
  c.eval.passk_held_out_tasks = 64
  c.sft.enabled = True
  # Who plays the demonstrations (envs/keydoor.py): "search" sweeps the corridor as an agent that sees only the
  # observations can; "planner" (round 0) sees the layout, which no observation shows here. Recipe round 1 of
  # both protocols (docs/results.md, "DPEPO"): the search, and 240 SFT steps, where 60 left DPEPO's 4-copy
  # warm start a well-formed random walker (held-in pass@1 0.000 -> 0.234 at T = 0.4).
  c.sft.env_kwargs = ml_collections.ConfigDict({"oracle": "search"})
  c.sft.oracle_seed_offset = 10_000
  c.sft.oracle_episodes = 64
  c.sft.steps = 240
  c.sft.batch_size = 32
  c.sft.learning_rate = 1e-3
  # Recipe round 2, set before any run of either protocol had ended, for cost alone: round 1's 30 iterations of
  # 32 episodes, two epochs each, cost ~4 h a run on 2 cores (DPEPO's 4-copy prompts; EAPO's ~100-token fields),
  # ~2 days for a protocol. Half the episodes (4 tasks x 4), one epoch over them in minibatches of 32 (6 updates an
  # iteration, half round 1's 12), 20 iterations and an evaluation every 10 bring a run to under an hour.
  c.rollout.num_tasks = 4
  c.rl.minibatch_size = 32
  c.rl.epochs = 1
  c.train.num_iterations = 20
  c.eval.every = 10
  c.checkpoint.every = 5
  return c
