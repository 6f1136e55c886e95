"""The coding setup every coding config shares (SGE paper, section 4 and Table 2): one place for the
environment, the shared strategy prompt, the RL recipe and the two scales.

  RL recipe   GRPO with DAPO's modifications minus clip-higher: token-mean loss, groups with equal returns
              dropped, overlong shaping, clip 0.2 both ways; no KL term (RLAD adds one).
  tiny        (default) the built-in 4M-parameter model on generated tasks (explore_jax/envs/coding,
              `dataset="procedural"`), warm-started by SFT on solved tasks of a disjoint split; sized so a
              run fits a 2-core CPU in minutes.
  small       the tiny settings with the built-in pretrained SmolLM2-135M-Instruct (configs/small.py), for an
              accelerator.
  paper       Table 2 with a local Qwen3-4B-Instruct directory and LeetCodeDataset files the user brings:
                --config.model.checkpoint=/path/to/Qwen3-4B-Instruct
                --config.env.kwargs.dataset=/path/to/train.jsonl --config.eval.env_kwargs.dataset=/path/to/test.jsonl
"""

import ml_collections

from configs import base, small
from explore_jax.methods import grpo, rnd
from explore_jax.methods.sge import STRATEGY_PROMPT

VARIANTS = ("", "tiny", "small", "paper")


def get_config(method: str, variant: str = "") -> ml_collections.ConfigDict:
  """The shared coding config for `method` ("sge", "grpo", "entropy_adv", "rnd", "rlad", or a composition such
  as "sge+rnd") at a scale."""
  if variant not in VARIANTS:
    raise ValueError(f"unknown variant {variant!r}; known: {', '.join(repr(v) for v in VARIANTS)}")
  c = base.get_config()
  grpo.configure(c, "dapo")                      # token-mean, dynamic sampling
  c.rl.loss.eps_high = c.rl.loss.eps_low = 0.2   # ... without clip-higher
  c.method = method
  c.system_prompt = ""
  c.instruction = STRATEGY_PROMPT                # every method writes a strategy first (paper, section 4)

  c.env.id = "explore_jax/Coding-v0"
  c.env.kwargs = ml_collections.ConfigDict({"dataset": "procedural", "split": "train", "num_tasks": 32,
                                            "attempts": 2, "time_limit_s": 2.0})
  c.env.max_steps = 2                            # attempts per episode
  c.eval.env_kwargs = ml_collections.ConfigDict({"split": "test"})
  c.eval.seed_offset = 0                         # held-out task i is seed i of the test split
  c.eval.num_episodes = 32
  c.eval.temperature = 0.7                       # tau: pass@k and success are sampled, never greedy
  c.eval.every = 5
  c.eval.passk_samples = 16
  c.eval.passk_held_out_tasks = 32

  c.rollout.task_pool = 32                       # the held-in training tasks: seeds 0..31 of the train split
  c.rollout.num_tasks = 4
  c.rollout.group_size = 8
  c.rollout.envs_per_actor = 16                  # 2 actors x 16: the sampler's batch of 32 prompts
  c.rollout.temperature = 0.7
  c.rollout.max_prompt_tokens = 256
  c.rollout.max_new_tokens = 48
  c.rl.overlong_buffer = 12
  c.rl.epochs = 2
  c.rl.minibatch_size = 32
  c.optimizer.learning_rate = 5e-5
  c.optimizer.warmup_steps = 5
  c.train.num_iterations = 16
  c.checkpoint.every = 4

  c.sft.enabled = True
  c.sft.env_kwargs = ml_collections.ConfigDict({"split": "sft", "num_tasks": 512, "attempts": 1})
  c.sft.oracle_seed_offset = 0
  c.sft.oracle_episodes = 512
  c.sft.steps = 120
  c.sft.batch_size = 32
  c.sft.learning_rate = 1e-3

  # Method options (only the selected method reads its block).
  c.sge = ml_collections.ConfigDict()
  c.sge.temperature = 0.7                        # tau: everything after the strategy
  c.sge.strategy_temperature = 1.2               # tau_s: the strategy, up to and including the delimiter
  c.sge.strategy_delimiter = "### Code"
  c.sge.buffer_size = 32                         # per-task FIFO buffers B_G, B_B
  c.sge.p_failure = 0.25                         # p_B: negative reflection
  c.sge.p_success = 0.1                          # p_G: positive reflection
  from explore_jax.methods import sge
  c.sge.positive_prompt = sge.POSITIVE_REFLECTION_PROMPT
  c.sge.negative_prompt = sge.NEGATIVE_REFLECTION_PROMPT
  c.sge.max_strategy_chars = 400
  c.sge.max_feedback_chars = 300
  parts = method.split("+")
  if "entropy_adv" in parts:
    c.rl.loss.entropy_advantage = True           # alpha 0.4, kappa 2 (base config)
  if "rlad" in parts:
    c.rlad = ml_collections.ConfigDict({"p_drop_strategy": 0.25, "direct_prompt": sge.DIRECT_PROMPT})
    c.rl.loss.kl_coef = 0.001
  if "empo2" in parts:  # tips around the strategy prompt (explore_jax/methods/empo2.py)
    from explore_jax.methods import empo2
    empo2.add_config(c)
    c.rollout.final_max_new_tokens = 128
  if "rnd" in parts:
    rnd.add_config(c)  # coef 0.1: methods/rnd.py says why

  if variant == "paper":
    c.model.checkpoint = ml_collections.config_dict.placeholder(str)  # a local Qwen3-4B-Instruct directory
    c.model.param_dtype = c.model.dtype = "bfloat16"
    c.model.remat = True
    c.env.kwargs = ml_collections.ConfigDict({"dataset": "", "attempts": 2, "time_limit_s": 2.0})
    c.eval.env_kwargs = ml_collections.ConfigDict({"dataset": ""})
    c.rollout.task_pool = 606                    # LeetCodeDataset hard split: 606 train / 228 test
    c.eval.passk_held_out_tasks = 228
    c.eval.num_episodes = 228
    c.eval.passk_samples = 64
    c.rollout.num_tasks = 64                     # 64 tasks x G 16 = 1024 trajectories per update
    c.rollout.group_size = 16
    c.rollout.num_actors = 16
    c.rollout.envs_per_actor = 16
    c.rollout.max_prompt_tokens = 4096
    c.rollout.max_new_tokens = 2048
    c.rl.overlong_buffer = 512
    c.rl.minibatch_size = 128                    # global update batch, in steps
    c.rl.epochs = 2
    c.optimizer.learning_rate = 1e-6             # constant
    c.optimizer.warmup_steps = 0
    c.train.num_iterations = 200
    c.checkpoint.every = 10
    c.sft.enabled = False                        # RL from the instruct model
  return small.apply(c) if variant == "small" else c
