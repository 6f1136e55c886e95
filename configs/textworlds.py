"""The text worlds every text-world config shares: TextWorld-Express, ScienceWorld, TextWorld's generated games
and ALFWorld, each trained with GRPO or GiGPO (configs/{grpo,gigpo}_<world>.py) at two scales.

  tiny   (default) the built-in model on a small setting of the world that a 2-core CPU trains in minutes
         (ALFWorld's warm start excepted: ~75 min of SFT there, the least that wins its games):
         few rooms, the valid actions listed in the observation (ALFWorld: the room's receptacles), short
         episodes; SFT on the world's own oracle (a disjoint range of training games: gold paths, ScienceWorld's
         teleporting where they walk, ALFWorld's a searching agent) first, then RL on a held-in pool of
         training games;
         held-out success on the world's held-out split (eval.env_kwargs; ALFWorld's unseen rooms, and its
         unseen games in the training rooms as well, eval.more_splits).
  small  the tiny settings with the built-in pretrained SmolLM2-135M-Instruct (configs/small.py), for an
         accelerator.
  paper  GiGPO's settings (Feng et al. 2025, ALFWorld; the same recipe for every world): a local
         Qwen2.5-1.5B-Instruct or -7B-Instruct directory the user brings, 16 task groups of 8, 50 steps
         (ScienceWorld: EMPO2's 30), lr 1e-6, k3 KL 0.01, invalid-action penalty 0.1, temperature 1.0 (0.4 in
         evaluation), the last 2 steps and the admissible actions in the prompt, 150 iterations, no SFT.
                --config.model.checkpoint=/path/to/Qwen2.5-7B-Instruct
         A minibatch is 256 records of up to 2,560 tokens: on one accelerator take it in micro-batches
         (e.g. --config.rl.micro_batch_size=8, the same update in a fraction of the activation memory; by default
         their rows are sorted by prompt length and each is cut to its longest prompt).

RL recipe (both scales): the group-relative estimator of the method (GiGPO: A^E + omega A^S over anchor states,
gamma 0.95, omega 1; GRPO: A^E alone), token-mean loss, clip 0.2, `rl.format_penalty` for malformed actions.
"""

import ml_collections

from configs import base, small
from explore_jax.methods import dpepo, eapo, empo2, grpo

VARIANTS = ("", "tiny", "small", "paper")
METHODS = ("grpo", "gigpo", "empo2", "dpepo", "eapo")

SYSTEM_PROMPT = ("You are an agent in a text world. Read the task and what you see, then reply with exactly one "
                 "action on one line.")

# Per world, the tiny scale: env id, its kwargs for training, evaluation (held-out split) and SFT, the step
# limit, the prompt budget in tokens, and the held-in pool / SFT game offset. The worlds' own docstrings
# (explore_jax/envs/*) describe their kwargs, splits and observations.
WORLDS = {
    # Find the coin in a house of 4 rooms without doors: look, move, take. Its gold paths are 2-7 actions and go
    # straight to the coin; `--config.sft.env_kwargs.oracle=search` demonstrates a search instead (envs/twx.py).
    "twx": dict(
        id="explore_jax/TextWorldExpress-v0",
        kwargs={"game": "coin", "game_params": "numLocations=4,numDistractorItems=0,includeDoors=0",
                "split": "train", "list_actions": True},
        eval_kwargs={"split": "dev"}, sft_kwargs={"oracle": "gold"},
        max_steps=8, max_prompt_tokens=384, max_new_tokens=8, sft_offset=500),
    # Find the animal with the longest life span among the three outside (lifespan-longest-lived, the world's
    # "easy" simplifications). Each variation puts one of 5 long-lived species and two of 10 short-lived ones
    # outside ("a parrot egg", "a baby wolf", ...); focusing on the long-lived one wins, on another animal fails,
    # so the episode is a choice that success alone teaches. The demonstrations teleport outside, look around and
    # focus (3 steps), naming the animal as the room lists it (`oracle_names="shown"`, which the policy can copy);
    # 4 steps leave room for one wrong name the world does not know, not for trying all five. The 62 training
    # variations are split between the SFT games (seeds 46-61) and the held-in RL pool (seeds 0-45); the 31 dev
    # variations, whose trios no training variation has, are held out. Its warm start (~12 min of SFT on 2 cores)
    # wins 0.60 of the held-in and 0.53 of the held-out games; 20 iterations (~40 min) raised held-in pass@1 to
    # 0.75, not held-out success, and 40 raised both (0.84, 0.69; one seed, docs/results.md). find-plant
    # (`--config.env.kwargs.task=find-plant`, with 256 demonstrations) is the longer task a tiny warm start wins
    # ~3% of, where RL at this scale did not raise success.
    "scienceworld": dict(
        id="explore_jax/ScienceWorld-v0",
        kwargs={"task": "lifespan-longest-lived", "simplifications": "easy", "split": "train"},
        eval_kwargs={"split": "dev"}, sft_kwargs={"oracle": "teleport", "oracle_names": "shown"}, action_history=8,
        sft_episodes=16, sft_steps=60, max_steps=4, max_prompt_tokens=512, max_new_tokens=32, sft_offset=46,
        task_pool=46, held_out=31),
    # TextWorld's coin collector at level 5: the objective names the way (go west, go north, ... take coin) in
    # varied words. Games are generated on first use (2-5 s of CPU each, then cached), so the pools are small.
    "textworld": dict(
        id="explore_jax/TextWorld-v0",
        kwargs={"challenge": "tw-coin_collector", "settings": "level=5", "split": "train", "list_actions": True},
        eval_kwargs={"split": "test"},
        max_steps=8, max_prompt_tokens=384, max_new_tokens=8, sft_offset=500, task_pool=16, sft_episodes=32,
        held_out=16),
    # The generated household games, pick & place only at the tiny scale (all six task types and every room in
    # :paper), in the rooms of at most 10 receptacles (18 held-in, 5 held-out; `max_receptacles=0`: every room,
    # up to 51, where no tiny warm start has won a game). The observation names every receptacle of the room, so
    # the actions are not listed as well: the policy copies the names it needs. The object's place is not in the
    # observation: the planner's walkthrough goes straight to it, which a policy cannot imitate (a warm start on
    # walkthroughs won 0 of 384 samples), so the SFT demonstrations are the env's searching agent
    # (oracle="search": receptacles in the listed order, opening closed ones) and the prompt lists the episode's
    # actions so far, the memory a search needs. It takes 512 search episodes and 600 SFT steps for the tiny
    # model to copy the task's object into `take` (128 episodes and 150 steps win nothing; docs/results.md):
    # ~75 min of SFT on 2 cores, seconds on a GPU.
    "alfworld": dict(
        id="explore_jax/ALFWorld-v0",
        kwargs={"split": "train", "task_types": ["pick_and_place_simple"], "list_actions": False,
                "max_receptacles": 10},
        eval_kwargs={"split": "valid_unseen"}, more_splits=("valid_seen",), sft_kwargs={"oracle": "search"},
        action_history=15, sft_episodes=512, sft_steps=600,
        max_steps=15, max_prompt_tokens=448, max_new_tokens=20, sft_offset=500, kept_env_settings=2),
}


def get_config(method: str, world: str, variant: str = "") -> ml_collections.ConfigDict:
  """The config of `method` ("grpo" or "gigpo") on `world` (a key of WORLDS) at a scale."""
  if method not in METHODS:
    raise ValueError(f"unknown text-world method {method!r}; known: {', '.join(METHODS)}")
  if world not in WORLDS:
    raise ValueError(f"unknown text world {world!r}; known: {', '.join(WORLDS)}")
  if variant not in VARIANTS:
    raise ValueError(f"unknown variant {variant!r}; known: {', '.join(repr(v) for v in VARIANTS)}")
  w = WORLDS[world]
  c = base.get_config()
  if method == "empo2":
    empo2.configure(c)
    c.rollout.final_max_new_tokens = 128         # a tip (the tiny warm start's oracle tips are ~40-90 tokens)
  elif method == "dpepo":
    dpepo.configure(c)
  elif method == "eapo":
    eapo.configure(c)
  else:
    grpo.configure(c, method)
  c.rl.loss.aggregation = "token-mean"
  c.system_prompt = SYSTEM_PROMPT

  c.env.id = w["id"]
  c.env.max_steps = w["max_steps"]
  c.env.kwargs = ml_collections.ConfigDict({**w["kwargs"], "max_steps": w["max_steps"]})
  c.eval.env_kwargs = ml_collections.ConfigDict(w["eval_kwargs"])
  c.eval.seed_offset = 0                         # held-out game i is seed i of the held-out split
  c.eval.num_episodes = w.get("held_out", 32)
  c.eval.temperature = 0.4                       # GiGPO's validation temperature; success is sampled
  c.eval.every = 5
  c.eval.passk_samples = 4                       # summary.json: success (pass@1 of 4 samples) before and after RL
  c.eval.passk_held_out_tasks = w.get("held_out", 32)
  c.eval.more_splits = w.get("more_splits", ())  # ALFWorld: the seen rooms too, as DPEPO reports both

  c.rollout.task_pool = w.get("task_pool", 64)   # held-in games: seeds 0..N-1 of the training split
  c.rollout.num_tasks = 4
  c.rollout.group_size = 8
  c.rollout.envs_per_actor = 16
  c.rollout.temperature = 1.0
  # An ALFWorld environment is a process (~77 MB) that takes 1-2 s to start: keep training's and evaluation's
  # (benchmarks/README.md, "An evaluation between rollouts"); a JVM world's are heavier to keep twice.
  c.rollout.kept_env_settings = w.get("kept_env_settings", c.rollout.kept_env_settings)
  c.rollout.max_prompt_tokens = w["max_prompt_tokens"]
  c.rollout.max_new_tokens = w["max_new_tokens"]
  c.rl.epochs = 2
  c.rl.minibatch_size = 64
  # Rows sorted by prompt length, 8 at a time, each micro-batch as wide as its longest prompt: the same update in
  # about half the time of the whole minibatch's on 2 cores and an eighth of its activation memory
  # (benchmarks/micro_batches.py; rl.micro_batches_by_length).
  c.rl.micro_batch_size = 8
  c.optimizer.learning_rate = 5e-5
  c.optimizer.warmup_steps = 5
  c.train.num_iterations = 20
  c.checkpoint.every = 5

  c.action_history = w.get("action_history", 0)  # the prompt lists the last N actions (methods/base.py)

  c.sft.enabled = True                           # gold paths of training games outside the RL pool
  c.sft.env_kwargs = ml_collections.ConfigDict(w.get("sft_kwargs", {}))
  c.sft.oracle_seed_offset = w["sft_offset"]
  c.sft.oracle_episodes = w.get("sft_episodes", 64)
  c.sft.steps = w.get("sft_steps", 60)
  c.sft.batch_size = 32
  c.sft.learning_rate = 1e-3

  if variant == "paper":
    c.model.checkpoint = ml_collections.config_dict.placeholder(str)  # a local Qwen2.5-{1.5B,7B}-Instruct
    c.model.param_dtype = c.model.dtype = "bfloat16"
    c.model.remat = True
    steps = 30 if world == "scienceworld" else 50
    c.env.max_steps = steps
    c.env.kwargs.max_steps = steps
    c.history_steps = 2                          # verl-agent's history length: the last 2 (observation, action)s
    c.action_history = 0
    if world == "alfworld":
      c.env.kwargs.task_types = ["pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
                                 "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep",
                                 "pick_two_obj_and_place"]
      c.env.kwargs.list_actions = True           # GiGPO's prompt lists the admissible actions
      c.env.kwargs.max_receptacles = 0           # in every room
    c.rollout.task_pool = 0                      # a fresh training game per group
    c.rollout.num_tasks = 16
    c.rollout.group_size = 8
    c.rollout.num_actors = 16
    c.rollout.envs_per_actor = 8
    c.rollout.temperature = 1.0
    c.rollout.max_prompt_tokens = 2048
    c.rollout.max_new_tokens = 512
    c.eval.num_episodes = 128
    c.eval.passk_samples = 0                     # success every `eval.every` iterations (a fresh pool has no pass@k set)
    c.rl.loss.kl_coef = 0.01
    c.rl.loss.kl_type = "k3"
    c.rl.format_penalty = 0.1
    c.rl.epochs = 1
    c.rl.minibatch_size = 256
    c.optimizer.learning_rate = 1e-6
    c.optimizer.warmup_steps = 0
    c.train.num_iterations = 150
    c.checkpoint.every = 10
    c.sft.enabled = False
    if method == "empo2":                        # EMPO2's ScienceWorld recipe (appendix C; the released scripts)
      c.rollout.task_pool = 16                   # its memories are per task: 16 training variations
      c.rollout.final_max_new_tokens = 512       # the released tip budget
      c.rl.loss.kl_coef = 0.0
      c.rl.loss.eps_high = 0.3
      c.rl.loss.dual_clip = 10.0
      c.rl.format_penalty = 0.0
  if method == "dpepo":
    parallel_scale(c, world, variant)
  if method == "eapo":
    fields_scale(c, world, variant)
  return small.apply(c) if variant == "small" else c


# DPEPO's prompt shows every copy, so it is longer than one world's; and a response names an action per copy.
# Per world at the tiny scale: (prompt tokens, response tokens, earlier steps shown per copy), measured on the
# diverse cold start's episodes (benchmarks/dpepo_iteration.py prints them).
PARALLEL_TINY = {"twx": (1536, 72, 0), "scienceworld": (2560, 112, 0), "textworld": (1536, 72, 0),
                 "alfworld": (1792, 112, 0)}


def parallel_scale(c: ml_collections.ConfigDict, world: str, variant: str) -> None:
  """DPEPO's settings on a text world: the paper's recipe at :paper (Section 4 and the released scripts), the
  copies' longer prompts and responses at the tiny scale."""
  c.rollout.group_size = 4 if world == "scienceworld" else 8
  if world in ("scienceworld", "alfworld"):
    c.sft.env_kwargs.admissible = True           # the cold start's other copies draw from the admissible actions,
    c.dpepo.show_admissible = variant == "paper"  # which the tiny prompts do not show (ALFWorld's :paper lists them)
  if variant != "paper":
    c.rollout.max_prompt_tokens, c.rollout.max_new_tokens, c.dpepo.history_steps = PARALLEL_TINY[world]
    return
  steps = 25                                     # the episode ends at the first success or after 25 steps
  c.env.max_steps = c.env.kwargs.max_steps = steps
  c.dpepo.history_steps = -1                     # the parallel layout shows every earlier step whole
  c.rollout.temperature = 1.0
  c.eval.temperature = 0.4
  c.rollout.max_prompt_tokens = 6144
  c.rollout.max_new_tokens = 1024
  c.optimizer.learning_rate = 1e-6
  c.rl.loss.eps_low = c.rl.loss.eps_high = 0.2
  c.rl.loss.aggregation = "token-mean"
  c.rl.loss.kl_coef = 0.01
  c.rl.loss.kl_type = "k3"
  c.rl.loss.entropy_coef = 0.001
  c.model.lora.rank = 32                         # LoRA r = alpha = 32
  c.model.lora.alpha = 32.0
  if world == "alfworld":
    c.dpepo.width_ignore = "look"                # the released ALFWorld code leaves "look" out of c_wid


# EAPO's answer is four blocks (envs/fields.py's oracle: up to 3 actions to explore, 3 short lines of memory) and
# its prompt adds the last answer's explore and memory and the format: per world at the tiny scale, (prompt tokens,
# response tokens, q_phi row tokens: a state then the explored target).
FIELDS_TINY = {"twx": (640, 160, 512), "scienceworld": (768, 192, 640), "textworld": (640, 160, 512),
               "alfworld": (768, 192, 640)}


def fields_scale(c: ml_collections.ConfigDict, world: str, variant: str) -> None:
  """EAPO's settings on a text world: table 3's at :paper (group 16, lr 1e-4 for the policy and q_phi, KL 0.01,
  gamma 0.9), the fields' longer prompts and answers at the tiny scale."""
  if world in ("scienceworld", "alfworld"):
    c.env.kwargs.admissible = True   # the oracle's explore field and the rollback guesses read them (info only)
  if variant != "paper":
    c.rollout.max_prompt_tokens, c.rollout.max_new_tokens, c.eapo.q_phi.max_tokens = FIELDS_TINY[world]
    c.eapo.clamp = "token_mean"      # a tiny model's summed log q of a long target is far below the -60 clamp
    return
  c.rollout.group_size = 16
  c.rollout.num_tasks = 8
  c.rollout.max_prompt_tokens = 4096
  c.rollout.max_new_tokens = 1024
  c.eapo.q_phi.max_tokens = 4096
  c.optimizer.learning_rate = 1e-4
  c.rl.loss.kl_coef = 0.01
  c.rl.loss.kl_type = "k3"
  c.rl.format_penalty = 0.0          # R_format is eq. 10's own term
