"""Defaults every experiment shares; experiment configs start from `get_config()` and override fields.

Every field can be overridden from the command line, e.g.
  python launch/train.py --config=configs/sge_coding.py --config.optimizer.learning_rate=3e-6
"""

import ml_collections

from explore_jax.parallel.sharding import DEFAULT_RULES


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.system_prompt = "You are an agent acting in a text environment. Reply with your next action only."
  c.instruction = ""             # appended to every observation (e.g. SGE's strategy prompt)

  # The policy: "tiny" (built in, no downloads) or a local Hugging Face checkpoint directory.
  c.model = ml_collections.ConfigDict()
  c.model.checkpoint = "tiny"
  # Parameters stay float32 (the optimizer's master weights: a bfloat16 weight would round updates of 1e-6 of
  # its size away); "auto" computes in bfloat16 on a GPU or TPU and in float32 on the CPU. The sampler reads a
  # copy of the parameters cast to the compute dtype once per rollout. Logits and softmax stay float32.
  c.model.param_dtype = "float32"
  c.model.dtype = "auto"
  c.model.remat = False            # rematerialise layers in the backward pass
  # LoRA (Hu et al. 2021): rank r > 0 freezes the checkpoint and trains W + (alpha / r) A B on the target modules
  # (Hugging Face names, or "all-linear"); warm start, RL and checkpoints then hold only the adapters.
  # Export: python launch/export.py --config=... --run=<run dir> [--merged]
  c.model.lora = ml_collections.ConfigDict()
  c.model.lora.rank = 0            # r; 0: no LoRA, every weight trains
  c.model.lora.alpha = 32.0        # alpha
  c.model.lora.target_modules = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
  c.model.lora.seed = 0            # A's initialisation (part of the starting policy, not the RL seed)

  # Devices: mesh axes (data, fsdp, tensor), -1 takes the rest; the rules map logical axes to them.
  c.mesh = ml_collections.ConfigDict()
  c.mesh.shape = (-1, 1, 1)
  c.mesh.axes = ("data", "fsdp", "tensor")
  c.sharding_rules = [list(rule) for rule in DEFAULT_RULES]

  # Multi-host: jax.distributed settings (explore_jax/parallel/distributed.py). The defaults mean "one
  # process" (or, on a Cloud TPU VM, "jax detects the slice"); on other clusters set all three per process.
  c.distributed = ml_collections.ConfigDict()
  c.distributed.coordinator_address = ""  # "host:port" of process 0's coordinator; "": not set
  c.distributed.num_processes = 0         # 0: not set
  c.distributed.process_id = -1           # -1: not set

  # AdamW with global-norm clipping.
  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.learning_rate = 1e-6
  c.optimizer.weight_decay = 0.0
  c.optimizer.b1 = 0.9
  c.optimizer.b2 = 0.999
  c.optimizer.eps = 1e-8
  c.optimizer.max_grad_norm = 1.0
  c.optimizer.warmup_steps = 0

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 10        # iterations between saves
  c.checkpoint.max_to_keep = 3

  # The environment (a gymnasium id of explore_jax.envs or a registered adapter).
  c.env = ml_collections.ConfigDict()
  c.env.id = "explore_jax/KeyDoor-v0"
  c.env.kwargs = ml_collections.ConfigDict()
  c.env.max_steps = 10           # bounds step ids of a trajectory (fixed record shapes)
  # K parallel copies of the world acted on by one response (envs/parallel.py; DPEPO's setting, open to every
  # method): copies 0 plays the world itself. parser "strict" | "lenient" (the authors'); the warm start's
  # demonstrations are played by sft_oracle ("diverse": copy 1 follows the oracle, the others explore with
  # probability `explore`; "same": the oracle in every copy).
  c.env.parallel = ml_collections.ConfigDict()
  c.env.parallel.copies = 0
  c.env.parallel.parser = "strict"
  c.env.parallel.sft_oracle = "diverse"
  c.env.parallel.explore = 0.5
  # How a response answers the world: "plain" (the world's own grammar) or "fields" (EAPO's
  # <think><explore><memory><action>\boxed{a}</action> answer, the boxed action played; envs/fields.py).
  c.env.answer = "plain"
  # Screens read at every step (envs/screen_reader.py; ScreenExplorer's, open to every GUI world): {} off, else
  # ScreenReader's options, e.g. {"latent": "patch_stats", "ocr": True, "oracle": "world"}.
  c.env.screen_reading = ml_collections.ConfigDict()

  # Rollouts: B tasks x G trajectories per iteration, stepped by actor processes.
  c.rollout = ml_collections.ConfigDict()
  c.rollout.num_tasks = 8        # B
  c.rollout.task_pool = 0        # 0: a fresh task seed per group; N: tasks are seeds 0..N-1 (a held-in set)
  c.rollout.group_size = 8       # G: trajectories per task (the GRPO group)
  c.rollout.num_actors = 2       # per process: each process of a multi-host run plays its share of the episodes
  c.rollout.envs_per_actor = 8
  c.rollout.max_prompt_tokens = 128
  c.rollout.max_new_tokens = 16
  c.rollout.temperature = 1.0
  c.rollout.top_p = 1.0
  c.rollout.episode_timeout_s = 120.0
  c.rollout.env_threads = 0        # resets and steps an actor makes at once (threads) in worlds whose instances
                                   # are processes of their own (ALFWorld, the JVM worlds); 0: envs_per_actor, 1: one at a time.
                                   # The episodes are the same either way
  c.rollout.kept_env_settings = 1  # each actor keeps idle environments of this many settings (env kwargs),
                                   # envs_per_actor of each; 2: training's and evaluation's, so that an evaluation
                                   # starts none afresh (for worlds slow to start and light to keep: ALFWorld)
  # After the first prompt request of a sampler call, wait up to this long for more from actors still busy:
  # fuller, fewer calls (a response never depends on which requests share its call, so results do not change).
  # inf: until every busy actor has spoken, so each call holds every live episode's request of the round (make
  # run's coding setup: rows filled 54% against 34% at 0; benchmarks/README.md). A hung actor still times out.
  c.rollout.batch_wait_s = float("inf")
  c.rollout.min_sampler_rows = 0   # 0: every sampling call has num_actors x envs_per_actor (x processes) rows;
                                   # N: the fewest of N, 2N, 4N, ... that hold its requests (less work, more
                                   # compiled shapes)
  c.rollout.prompt_width_bucket = 64  # a prompt is sampled at its length rounded up to this: a row's bits depend
                                      # on its width, so a protocol keeps one setting
  # How the central sampler batches requests. "fixed": one generate call per prompt width, batch-sized, every row
  # waiting for the longest. "continuous" (sampling/slots.py): a round's requests go through the batch's rows as
  # decode slots, each finished row refilled by the next prompt, one prefill per width and per task group's
  # prompt. "streaming": the same slots, and each response goes back to its actor as soon as it is done, its
  # next request joining the slots while the others decode. The same tokens as "fixed"; log-probs move in their
  # last bits (<= 1e-5; with "streaming" they depend on timing), so a protocol keeps one setting.
  c.rollout.batching = "fixed"
  # With "continuous" or "streaming": how a row's new token attends to its cached keys (models/decode_attention.py).
  # "dense" reads the whole preallocated cache; "blocked" only the blocks the longest row needs; "pallas" the GPU
  # kernel that reads each row's own range (benchmarks/README.md: no difference in make run's loop on a CPU).
  c.rollout.decode_attention = "dense"
  # Rollout overlapped with learning (train/pipeline.py): 0 = synchronous (iteration t sampled with theta_t);
  # k >= 1 = iterations t+1..t+k are played while update t runs, with the parameters of that moment, and the
  # learner trains on records at most k updates old (the replay's staleness bound).
  c.rollout.max_staleness = 0

  # The policy update. Symbols as in the papers.
  # New tokens of a method's generation after an episode (a prompt hook's final_prompt: EMPO2's tip); 0: the
  # step budget, max_new_tokens.
  c.rollout.final_max_new_tokens = 0

  # The text encoder that answers prompt hooks' embedding requests (and a method's own, EMPO2's memory keys):
  # "policy" (the policy's mean final hidden state), "all-minilm-l6-v2" (the sentence encoder that installs with
  # the project) or a local sentence-transformers directory (explore_jax/hf/encoder.py).
  c.embedding = ml_collections.ConfigDict()
  c.embedding.encoder = "policy"

  c.rl = ml_collections.ConfigDict()
  c.rl.advantage = "grpo"        # a name in rl.advantages' registry
  c.rl.advantage_options = ml_collections.ConfigDict({"eps": 1e-6, "normalize_std": True})
  c.rl.epochs = 1                # passes over the iteration's records
  c.rl.first_update = 0          # the first iteration (0-based) whose records update the policy; before it the
                                 # rollouts, aux models and rewards run as usual (ScreenExplorer lets its world
                                 # model learn for a few episodes first)
  c.rl.minibatch_size = 64       # records per optimizer step
  c.rl.micro_batch_size = 0      # records per forward/backward pass of a step, gradients summed (activation
                                 # memory); 0: the whole minibatch at once. Equal updates up to float sums
  c.rl.micro_batches_by_length = True  # with micro_batch_size: a minibatch's rows sorted by prompt length into
                                 # its micro-batches, each cut to its longest prompt (less padding, one compile per
                                 # width); False: rows interleaved at the batch's width under one lax.scan. The
                                 # same update either way
  c.rl.format_penalty = 0.1      # subtracted from a step's reward when its action is malformed
  c.rl.drop_uniform_groups = False  # DAPO dynamic sampling: drop groups whose outcome (task) returns are equal
  c.rl.overlong_buffer = 0       # DAPO overlong shaping's L_cache in tokens (L_max = max_new_tokens); 0: off
  c.rl.overlong_factor = 1.0
  c.rl.loss = ml_collections.ConfigDict()
  c.rl.loss.eps_low = 0.2        # epsilon_low
  c.rl.loss.eps_high = 0.2       # epsilon_high (clip-higher when > eps_low)
  c.rl.loss.dual_clip = 3.0      # c of dual clip for A < 0; negative disables
  c.rl.loss.aggregation = "seq-mean-token-mean"
  c.rl.loss.max_len = ml_collections.config_dict.placeholder(int)  # Dr.GRPO's constant; None = response length
  c.rl.loss.kl_type = "k3"       # k1, k2, k3 (low_var_kl) or abs
  c.rl.loss.kl_coef = 0.0        # beta; a reference policy is kept only when > 0
  c.rl.loss.entropy_coef = 0.0
  c.rl.loss.entropy_advantage = False  # EntropyAdv: A' = A + min(alpha H, |A| / kappa)
  c.rl.loss.entropy_adv_alpha = 0.4
  c.rl.loss.entropy_adv_kappa = 2.0
  c.rl.loss.low_prob_mask = ml_collections.config_dict.placeholder(str)  # EMPO2 eq. 2: "token", "sequence"; None: off
  c.rl.loss.low_prob_log_threshold = -5.0  # log delta of that mask

  c.replay = ml_collections.ConfigDict()
  c.replay.iterations_kept = 2   # replay capacity in iterations' worth of records

  c.train = ml_collections.ConfigDict()
  c.train.compilation_cache = True   # XLA's persistent compilation cache (train/xla_cache.py)
  c.train.num_iterations = 50
  c.train.log_samples = 2        # training episodes per iteration written as text to samples.jsonl (train/samples.py)
  c.train.peak_tflops = 0.0      # per-device peak for MFU; 0: the device kind's (train/throughput.py), none on CPU

  c.eval = ml_collections.ConfigDict()
  c.eval.every = 5               # iterations between evaluations; 0 disables
  c.eval.num_episodes = 32
  c.eval.temperature = 0.0       # greedy
  c.eval.seed_offset = 10_000_000  # held-out task seeds
  c.eval.env_kwargs = ml_collections.ConfigDict()  # overrides of env.kwargs for evaluation (e.g. the split)
  c.eval.passk_samples = 0       # n samples per task for pass@k of warm start and trained policy; 0: off
  c.eval.passk_held_out_tasks = 0  # held-out tasks in that table (seeds seed_offset + i); train: rollout.task_pool
  # Other values of the environment's `split` whose held-out seeds pass@k also samples, each its own task set
  # (ALFWorld: valid_seen, unseen games in the training rooms, beside the unseen rooms of eval.env_kwargs).
  c.eval.more_splits = ()

  # Warm start: SFT on demonstrations (a JSONL file, or the environment's oracle) before RL.
  c.sft = ml_collections.ConfigDict()
  c.sft.enabled = False
  c.sft.demonstrations = ""      # JSONL path; empty: generate with the environment's oracle
  c.sft.env_kwargs = ml_collections.ConfigDict()  # overrides of env.kwargs for the oracle's episodes
  c.sft.oracle_episodes = 64
  c.sft.oracle_seed_offset = 20_000_000
  c.sft.steps = 200
  c.sft.batch_size = 32
  c.sft.micro_batch_size = 0     # rows per gradient pass (0: the whole batch); less memory, other float sums
  c.sft.learning_rate = 1e-3
  c.sft.seed = 0                 # the warm start's own seed: runs with different `seed`s share one warm start
  c.sft.checkpoint_every = 50    # a long warm start saves its progress this often, and a killed one goes on
  return c
