"""The RL training loop: collect, reward, advantages, update, evaluate, checkpoint (DESIGN.md's iteration).

One iteration:
  1. B tasks x G trajectories are assigned to the actor processes; their prompts come back to the learner,
     which samples responses for all of them in batched, jitted calls (central inference).
  2. Finished episodes become fixed-shape `Records` in the device-resident replay.
  3. The method turns rewards into one scalar per step; the registered advantage estimator (by name) turns
     those into advantages under jit; DAPO-style methods drop groups without signal.
  4. Minibatch epochs of the clipped policy loss (log-probs recomputed at the recorded temperatures), with
     the KL term against the initial policy when its coefficient is positive; then the method's own
     auxiliary networks.
  5. Metrics, periodic evaluation, orbax checkpoint.

Reproducibility: every random choice is a function of (seed, iteration, episode, step): environment
seeds, the sampler's per-row streams and the minibatch order. A run killed at any moment and started
again with the same command resumes from its last checkpoint and produces the same metrics.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from explore_jax import hf, sampling
from explore_jax.actors.pool import ActorPool
from explore_jax.actors.protocol import EpisodeResult, EpisodeSpec, PromptRequest, Response
from explore_jax.methods import make_method
from explore_jax.models import Model
from explore_jax.parallel import make_mesh
from explore_jax.parallel.sharding import rules_from_config
from explore_jax.replay import RecordSpec, Replay, from_host
from explore_jax.rl.advantages import RecordLayout, StepRecords, get_advantage_estimator, intern_keys
from explore_jax.train import checkpoint, evaluation, metrics as metrics_lib, sft, sft_data
from explore_jax.train import state as state_lib
from explore_jax.train.rl_step import make_reference_logprobs, make_rl_step


WARM_PASS_AT_K = "pass_at_k_warm_start.json"


def _config_hash(*parts: Any) -> str:
  return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


class Trainer:
  """Holds the learner's state and runs iterations; `run()` is the whole training job."""

  def __init__(self, config: Any, workdir: str):
    self.config = config
    self.workdir = os.path.abspath(workdir)
    os.makedirs(self.workdir, exist_ok=True)
    self.mesh = make_mesh(tuple(config.mesh.shape), tuple(config.mesh.axes))
    self.rules = rules_from_config(config.sharding_rules)
    self.checkpoint_dir = hf.resolve(config.model.checkpoint)
    pre = hf.load_pretrained(self.checkpoint_dir, param_dtype=config.model.param_dtype,
                             dtype=config.model.dtype, mesh=self.mesh, rules=self.rules)
    self.tokenizer = pre.tokenizer
    self.model = Model(pre.config.replace(remat=config.model.remat), mesh=self.mesh, rules=self.rules)
    self.method = make_method(config)
    _check_environments(config)

    o = config.optimizer
    self.optimizer = state_lib.make_optimizer(o.learning_rate, weight_decay=o.weight_decay, b1=o.b1, b2=o.b2,
                                              eps=o.eps, max_grad_norm=o.max_grad_norm, warmup_steps=o.warmup_steps)
    self.shardings = state_lib.state_shardings(self.model, self.optimizer, self.mesh, self.rules)
    self.initial_params = pre.params
    self.loss_config = self.method.loss_config()
    self.rl_step = make_rl_step(self.model, self.optimizer, self.loss_config, self.shardings)
    self.reference_logprobs = make_reference_logprobs(self.model) if self.loss_config.kl_coef > 0 else None

    r = config.rollout
    self.prompt_len, self.response_len = r.max_prompt_tokens, r.max_new_tokens
    self.max_steps = int(config.env.max_steps)
    self.records_per_iteration = r.num_tasks * r.group_size * self.max_steps
    self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
    extras = {"features": ((self.model.config.hidden_size,), np.float32)} if self.method.wants_features else {}
    self.spec = RecordSpec(prompt_len=self.prompt_len, response_len=self.response_len, pad_id=self.pad_id,
                           extras=extras)
    self.replay = Replay(self.spec, capacity=self.records_per_iteration * config.replay.iterations_kept,
                         mesh=self.mesh, rules=self.rules)
    self.sample_batch = r.num_actors * r.envs_per_actor
    eos = [self.tokenizer.eos_token_id] + [
        self.tokenizer.convert_tokens_to_ids(t) for t in r.get("extra_stop_tokens", ())]
    delimiters = [self.tokenizer(d, add_special_tokens=False)["input_ids"] for d in self.method.delimiters()]
    self.train_sampling = sampling.make_sampling_params(self.method.temperatures(), delimiters, eos_ids=eos,
                                                        top_p=r.top_p)
    self.eval_sampling = sampling.make_sampling_params(
        [config.eval.temperature] * len(self.method.temperatures()), delimiters, eos_ids=eos, top_p=r.top_p)
    self.key = jax.random.key(config.seed)
    self.method.init_aux(self.model.config, jax.random.fold_in(self.key, 17))
    self.checkpointer = checkpoint.Checkpointer(os.path.join(self.workdir, "checkpoints"),
                                                max_to_keep=config.checkpoint.max_to_keep)
    self.state: Optional[state_lib.TrainState] = None
    self.reference_params: Any = None

  # ---- sampling (central inference) ----------------------------------------------------------------
  def policy_fn(self, requests: list[PromptRequest], *, params: Any, key: jax.Array,
                params_sampling: sampling.SamplingParams, version: int, features: bool = False) -> list[Response]:
    """Samples a response for each request in fixed-shape batches. A row's randomness is keyed by its
    (episode, step), so the result does not depend on which requests happen to share a batch. With
    `features`, each response carries the final hidden state at its last token (training records of RND)."""
    out: list[Response] = []
    B = self.sample_batch
    # Prompts are sampled at their own length rounded up to 64 (a few compiled widths, far less prefill than
    # max_prompt_tokens); a row's width depends on its prompt alone, never on which requests share its batch.
    by_width: dict[int, list[PromptRequest]] = {}
    for r in requests:
      by_width.setdefault(min(self.prompt_len, -(-len(r.prompt_ids) // 64) * 64), []).append(r)
    chunks = [(P, rs[i:i + B]) for P, rs in sorted(by_width.items()) for i in range(0, len(rs), B)]
    for P, chunk in chunks:
      prompt = np.full((B, P), self.pad_id, np.int32)
      mask = np.zeros((B, P), bool)
      mask[:, -1] = True  # filler rows need one real token; their samples are discarded
      row_ids = np.zeros((B,), np.int32)
      for i, req in enumerate(chunk):
        ids = req.prompt_ids[-P:]
        prompt[i, P - len(ids):], mask[i, P - len(ids):] = ids, True
        row_ids[i] = req.episode_id * (self.max_steps + 1) + req.step  # unique per (episode, step)
      sample = sampling.generate(self.model, params, prompt, mask, params_sampling, key, row_ids=row_ids,
                                 max_new_tokens=self.response_len, pad_id=self.pad_id,
                                 return_hidden=features)
      s = jax.device_get(sample)
      for i, req in enumerate(chunk):
        n = int(s.lengths[i])
        out.append(Response(episode_id=req.episode_id, step=req.step, tokens=s.tokens[i, :n],
                            logprobs=s.logprobs[i, :n], temperatures=s.temperatures[i, :n],
                            segments=s.segments[i, :n], policy_version=version,
                            features=np.asarray(s.hidden[i, max(n - 1, 0)], np.float32) if features else None))
    return out

  # ---- rollouts --------------------------------------------------------------------------------------
  def episode_specs(self, iteration: int, *, evaluation: bool) -> list[EpisodeSpec]:
    """B task groups of G episodes each; a group's episodes share the environment seed."""
    c = self.config
    rng = np.random.default_rng([c.seed, iteration, int(evaluation)])
    env_kwargs = dict(c.env.kwargs)
    if evaluation:
      seeds = [c.eval.seed_offset + i for i in range(c.eval.num_episodes)]
      groups = [(s, 1) for s in seeds]
      env_kwargs.update(c.eval.get("env_kwargs", {}))
    else:
      high = c.rollout.get("task_pool", 0) or 2**31 - 1  # a finite pool: tasks recur across iterations
      groups = [(int(rng.integers(0, high)), c.rollout.group_size) for _ in range(c.rollout.num_tasks)]
    specs, traj = [], 0
    for g, (seed, size) in enumerate(groups):
      for _ in range(size):
        # Ids are unique within the iteration; the sampler's key is folded with the iteration.
        spec = EpisodeSpec(episode_id=traj, group_id=g, traj_id=traj, env_id=c.env.id,
                           env_kwargs=env_kwargs, seed=seed)
        if not evaluation:
          spec = dataclasses.replace(spec, context=self.method.episode_context(spec, rng))
        specs.append(spec)
        traj += 1
    return specs

  def collect(self, pool: ActorPool, iteration: int, *, evaluation: bool = False
              ) -> tuple[list[EpisodeResult], dict[str, float]]:
    params = self.state.params
    key = jax.random.fold_in(jax.random.fold_in(self.key, iteration), int(evaluation))
    fn = functools.partial(self.policy_fn, params=params, key=key, version=iteration,
                           params_sampling=self.eval_sampling if evaluation else self.train_sampling,
                           features=self.method.wants_features and not evaluation)
    t0 = time.time()
    results, pool_metrics = pool.run(self.episode_specs(iteration, evaluation=evaluation), fn)
    wall = time.time() - t0
    finished = [r for r in results if not r.dropped]
    n = max(len(finished), 1)
    steps = sum(len(r.steps) for r in finished)
    new_tokens = sum(len(s.response.tokens) for r in finished for s in r.steps)
    sample_time = float(pool_metrics["policy_seconds"])
    m = {
        "success_rate": sum(r.success for r in finished) / n,
        "return": sum(r.total_reward for r in finished) / n,
        "episode_length": steps / n,
        "format_ok": (sum(s.format_reward for r in finished for s in r.steps) / max(steps, 1)),
        "episodes_dropped": float(pool_metrics["episodes_dropped"]),
        "actor_restarts": float(pool_metrics["actor_restarts"]),
        "truncated_prompts": float(pool_metrics["truncated_prompts"]),
        "time_rollout_s": wall, "time_sampling_s": sample_time,
        "time_environment_s": max(wall - sample_time, 0.0),
        "sample_tokens_per_s": new_tokens / max(sample_time, 1e-9),
    }
    return finished, m

  def to_records(self, results: list[EpisodeResult], iteration: int):
    rows = []
    for r in results:
      if len(r.steps) > self.max_steps:
        raise ValueError(f"an episode of {r.spec.env_id} ran {len(r.steps)} steps; config.env.max_steps="
                         f"{self.max_steps} must bound the environment's episode length")
      for s in r.steps:
        rows.append({
            "prompt_tokens": np.asarray(s.prompt_ids[-self.prompt_len:], np.int32),
            "response_tokens": s.response.tokens, "behaviour_logprobs": s.response.logprobs,
            "temperatures": s.response.temperatures, "segment_ids": s.response.segments,
            "task_reward": s.task_reward, "format_reward": s.format_reward,
            "group_id": s.group_id, "traj_id": s.traj_id, "step_index": s.step_index,
            "actor_id": s.actor_id, "state_key": s.state_key, "policy_version": iteration, "done": s.done,
            **({"features": s.response.features} if self.method.wants_features else {}),
        })
    return from_host(self.spec, rows, pad_to=self.records_per_iteration)

  def pass_at_k_eval(self, pool: ActorPool, params: Any, *, label: str, held_out: bool
                     ) -> evaluation.TaskSetEval:
    """n = eval.passk_samples episodes of every task of a fixed set, sampled at the evaluation temperature
    without any method context: the held-in training pool (seeds 0..rollout.task_pool-1) or the held-out
    tasks (eval.env_kwargs, seeds eval.seed_offset + i for i < eval.passk_held_out_tasks)."""
    c = self.config
    env_kwargs = dict(c.env.kwargs)
    if held_out:
      env_kwargs.update(c.eval.get("env_kwargs", {}))
      seeds = [c.eval.seed_offset + i for i in range(c.eval.passk_held_out_tasks)]
    else:
      seeds = list(range(c.rollout.task_pool))
    n = c.eval.passk_samples
    specs = [EpisodeSpec(episode_id=i * n + j, group_id=i, traj_id=i * n + j, env_id=c.env.id,
                         env_kwargs=env_kwargs, seed=seed) for i, seed in enumerate(seeds) for j in range(n)]
    key = jax.random.fold_in(self.key, 1_000_003 + int(held_out))  # the same samples for any params' stream
    fn = functools.partial(self.policy_fn, params=params, key=key, version=-1, params_sampling=self.eval_sampling)
    results, _ = pool.run(specs, fn)
    return evaluation.summarize(label, results)

  def pass_at_k_sets(self, pool: ActorPool, params: Any, label: str) -> list[evaluation.TaskSetEval]:
    """pass_at_k_eval on the training tasks, then on the held-out tasks."""
    return [self.pass_at_k_eval(pool, params, label=f"{label} / {split}", held_out=held)
            for split, held in (("train", False), ("held-out", True))]

  def warm_start_pass_at_k(self, pool: ActorPool, log=print) -> None:
    """The warm-start policy's pass@k, before any RL, written to the run directory (a resumed run reads it).

    It depends on neither the RL seed nor the method (evaluation prompts carry no method context and every
    token is sampled at eval.temperature), so it is also cached next to the SFT warm start and shared by
    every run that evaluates the same warm start the same way.
    """
    c = self.config
    path = os.path.join(self.workdir, WARM_PASS_AT_K)
    cache = os.path.join(hf.cache_root(), "pass_at_k", _config_hash(
        self.warm_start_key(), c.env.to_dict(), c.eval.to_dict(), c.rollout.max_new_tokens, c.rollout.top_p,
        c.get("instruction", ""), c.get("system_prompt")) + ".json")
    if c.sft.enabled and os.path.exists(cache):
      shutil.copyfile(cache, path)
      log(f"[pass@k] warm start: reused {cache}")
      return
    log(f"[pass@k] warm start: {c.eval.passk_samples} samples of each training and held-out task")
    with open(path, "w") as f:
      json.dump([e.to_json() for e in self.pass_at_k_sets(pool, self.state.params, "warm start")], f)
    if c.sft.enabled:
      os.makedirs(os.path.dirname(cache), exist_ok=True)
      shutil.copyfile(path, cache + ".tmp")
      os.replace(cache + ".tmp", cache)

  def write_pass_at_k(self, evals: list[evaluation.TaskSetEval], directory: Optional[str] = None) -> str:
    """summary.json, summary.md (the table) and pass_at_k.png in `directory` (default: the run directory);
    returns the table."""
    directory = directory or self.workdir
    os.makedirs(directory, exist_ok=True)
    n = min(e.min_samples for e in evals)
    text = evaluation.table(evals, evaluation.powers_of_two(n))
    with open(os.path.join(directory, "summary.json"), "w") as f:
      json.dump({e.label: e.to_dict(range(1, n + 1)) for e in evals}, f, indent=2)
    with open(os.path.join(directory, "summary.md"), "w") as f:
      f.write(f"# {self.config.method} on {self.config.env.id}\n\n{text}\n")
    evaluation.plot_pass_at_k(evals, list(range(1, n + 1)), os.path.join(directory, "pass_at_k.png"),
                              title=f"{self.config.method}: pass@k")
    return text

  # ---- the update ------------------------------------------------------------------------------------
  def advantages(self, records) -> jax.Array:
    r = self.config.rollout
    rewards = self.method.step_rewards(records)
    valid = np.asarray(records.valid)
    group = np.asarray(records.group_id)
    keep = self.method.keep_groups(_group_returns(rewards, group, np.asarray(records.traj_id), valid))
    valid = valid & np.isin(group, list(keep))
    step_records = StepRecords(
        rewards=jnp.asarray(rewards, jnp.float32), group_ids=jnp.asarray(group), valid=jnp.asarray(valid),
        traj_ids=jnp.asarray(records.traj_id), step_ids=jnp.asarray(records.step_index),
        state_ids=jnp.asarray(intern_keys(np.asarray(records.state_key).tolist(), group.tolist())),
        invalid_action=jnp.asarray(np.asarray(records.format_reward) < 1.0),
        # Ids are dense (state ids per group), so the estimators skip sorting; a group holds at most
        # G * max_steps distinct states.
        layout=RecordLayout(num_groups=r.num_tasks, num_trajectories=r.num_tasks * r.group_size,
                            max_steps=self.max_steps, num_states=r.group_size * self.max_steps))
    estimator = get_advantage_estimator(self.method.advantage_name)
    adv = _jit_estimator(estimator, tuple(sorted(self.method.advantage_options().items())))(step_records)
    return adv, valid

  def update(self, batch: dict[str, jax.Array], iteration: int) -> dict[str, float]:
    c = self.config.rl
    valid_idx = np.flatnonzero(np.asarray(batch["valid"]))
    if valid_idx.size == 0:
      return {"update_skipped_no_signal": 1.0}
    batch = _trim_prompt_padding(batch, valid_idx)
    if self.reference_logprobs is not None:
      batch = {**batch, "ref_logprobs": self.reference_logprobs(self.reference_params, batch)}
    rng = np.random.default_rng([self.config.seed, iteration, 7])
    M = c.minibatch_size
    sums: dict[str, float] = {}
    count = 0
    for _ in range(c.epochs):
      order = rng.permutation(valid_idx)
      for start in range(0, len(order), M):
        idx = order[start:start + M]
        idx = np.concatenate([idx, np.full(M - len(idx), idx[0])])
        pad = np.arange(M) >= len(order[start:start + M])
        mb = {k: jnp.take(v, idx, axis=0) for k, v in batch.items()}
        mb["valid"] = mb["valid"] & ~jnp.asarray(pad)
        self.state, m = self.rl_step(self.state, mb)
        for k, v in jax.device_get(m).items():
          sums[k] = sums.get(k, 0.0) + float(v)
        count += 1
    return {f"update/{k}": v / count for k, v in sums.items()} | {"update/minibatches": float(count)}

  # ---- warm start, checkpoints -----------------------------------------------------------------------
  def warm_start_key(self) -> str:
    """What determines the warm start: the checkpoint, the SFT options and data, the prompt layout."""
    return _config_hash(self.checkpoint_dir, self.config.sft.to_dict(), self.config.env.to_dict(), self.prompt_len,
                        self.response_len, self.config.get("system_prompt"), self.config.get("instruction", ""))

  def warm_start_params(self) -> Any:
    """SFT on oracle demonstrations (or a JSONL file), cached across runs by what determines it."""
    c = self.config.sft
    if not c.enabled:
      return self.initial_params
    cache = os.path.join(hf.cache_root(), "sft", self.warm_start_key())
    abstract = checkpoint.abstract_like(jax.eval_shape(lambda: self.initial_params), self.shardings.params)
    with checkpoint.Checkpointer(cache, max_to_keep=1) as ck:
      if ck.latest_step() is not None:
        print(f"[sft] warm start reused from {cache}")
        return ck.restore(abstract).state
      demos = (sft_data.load_demonstrations(c.demonstrations) if c.demonstrations else
               sft_data.oracle_sft_demos(self.config.env.id,
                                         {**self.config.env.kwargs, **c.get("env_kwargs", {})},
                                         range(c.oracle_seed_offset, c.oracle_seed_offset + c.oracle_episodes),
                                         self.method.prompt_hook()))
      arrays = sft_data.tokenize_demos(self.tokenizer, demos, self.prompt_len, self.response_len)
      # Columns that are padding in every row cost compute and change nothing: drop them (in steps of 16).
      first = int(np.argmax(arrays["attention_mask"].any(0))) // 16 * 16
      arrays = {k: v[:, first:] for k, v in arrays.items()}
      opt = state_lib.make_optimizer(c.learning_rate, max_grad_norm=1.0)
      sh = state_lib.state_shardings(self.model, opt, self.mesh, self.rules)
      st = state_lib.create_train_state(self.initial_params, opt, sh)
      step = sft.make_train_step(self.model, opt, sh)
      rng = np.random.default_rng([c.seed, 99])
      t0, losses = time.time(), []
      for i in range(c.steps):
        idx = rng.choice(len(demos), size=c.batch_size, replace=len(demos) < c.batch_size)
        st, m = step(st, {k: v[idx] for k, v in arrays.items()})
        losses.append(float(m["loss"]))
      print(f"[sft] {c.steps} steps on {len(demos)} demonstrations: loss {losses[0]:.3f} -> "
            f"{np.mean(losses[-10:]):.3f} ({time.time() - t0:.0f}s); cached in {cache}")
      ck.save(0, st.params, metadata={"losses": losses[-10:], "demonstrations": len(demos)})
      return st.params

  def make_pool(self) -> ActorPool:
    c = self.config.rollout
    return ActorPool(num_actors=c.num_actors, tokenizer_dir=self.checkpoint_dir,
                     prompt_hook=self.method.prompt_hook(), envs_per_actor=c.envs_per_actor,
                     max_prompt_tokens=self.prompt_len, episode_timeout_s=c.episode_timeout_s)

  def _abstract_checkpoint(self) -> Any:
    """The restore target: the train state, and beside it the method's networks when it has any."""
    train = checkpoint.abstract_like(
        jax.eval_shape(lambda: state_lib.create_train_state(self.initial_params, self.optimizer)),
        self.shardings)
    aux = self.method.aux_state()
    if aux is None:
      return train
    replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
    return {"train": train, "aux": checkpoint.abstract_like(
        jax.eval_shape(lambda: aux), jax.tree.map(lambda _: replicated, aux))}

  def _restore(self, step: int) -> tuple[state_lib.TrainState, Any, dict[str, Any]]:
    """(train state, method networks or None, metadata) of checkpoint `step`."""
    restored = self.checkpointer.restore(self._abstract_checkpoint(), step)
    if self.method.aux_state() is None:
      return restored.state, None, restored.metadata
    return restored.state["train"], restored.state["aux"], restored.metadata

  def load_params(self, step: Optional[int] = None) -> Any:
    """The policy parameters of this run's checkpoint `step` (default: the latest)."""
    step = self.checkpointer.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.checkpointer.directory}")
    return self._restore(step)[0].params

  def save(self, iteration: int) -> None:
    if self.checkpointer.latest_step() == iteration:
      return
    aux = self.method.aux_state()
    self.checkpointer.save(iteration, self.state if aux is None else {"train": self.state, "aux": aux}, rng=self.key,
                           metadata={"iteration": iteration, "method": self.method.state_dict()})
    self.checkpointer.wait()

  def restore_or_init(self) -> int:
    """Restores the latest checkpoint (returns its iteration) or builds the initial state (returns 0)."""
    latest = self.checkpointer.latest_step()
    if latest is None:
      params = self.warm_start_params()
      self.state = state_lib.create_train_state(params, self.optimizer, self.shardings)
      self.reference_params = params if self.reference_logprobs is not None else None
      self.save(0)
      return 0
    self.state, aux, metadata = self._restore(latest)
    self.method.load_state_dict(metadata.get("method", {}))
    if aux is not None:
      self.method.load_aux_state(aux)
    if self.reference_logprobs is not None:
      self.reference_params = self._restore(0)[0].params
    print(f"[resume] from iteration {latest} in {self.checkpointer.directory}")
    return latest

  # ---- the job ---------------------------------------------------------------------------------------
  def run(self) -> list[dict[str, Any]]:
    c = self.config
    start = self.restore_or_init()
    writer = metrics_lib.MetricsWriter(self.workdir, resume_from=start if start > 0 else None)
    pool = self.make_pool()
    passk = c.eval.get("passk_samples", 0) > 0
    from tqdm import tqdm
    bar = tqdm(range(start, c.train.num_iterations), initial=start, total=c.train.num_iterations,
               desc=f"{c.method}", unit="it", dynamic_ncols=True)
    try:
      with pool:
        if passk and start == 0:
          self.warm_start_pass_at_k(pool, bar.write)
        if start == 0 and c.eval.every > 0:
          writer.write(0, {f"eval/{k}": v for k, v in self.collect(pool, 0, evaluation=True)[1].items()
                           if k in ("success_rate", "return")})
        for it in bar:
          m = self.iteration_step(pool, it)
          n = it + 1
          if c.eval.every > 0 and (n % c.eval.every == 0 or n == c.train.num_iterations):
            _, em = self.collect(pool, n, evaluation=True)
            m.update({f"eval/{k}": em[k] for k in ("success_rate", "return")})
          writer.write(n, m)
          if n % c.checkpoint.every == 0 or n == c.train.num_iterations:
            self.save(n)
          bar.set_postfix(success=f"{m['success_rate']:.2f}", reward=f"{m['return']:.2f}",
                          tok_s=f"{m['sample_tokens_per_s']:.0f}", sample=f"{m['time_sampling_s']:.1f}s",
                          env=f"{m['time_environment_s']:.1f}s", update=f"{m['time_update_s']:.1f}s")
        if passk:
          bar.write(f"[pass@k] trained policy: {c.eval.passk_samples} samples of each training and held-out task")
          trained = self.pass_at_k_sets(pool, self.state.params, "trained")
    finally:
      bar.close()
      writer.close()
    if passk:
      with open(os.path.join(self.workdir, WARM_PASS_AT_K)) as f:
        warm = [evaluation.TaskSetEval.from_json(e) for e in json.load(f)]
      text = self.write_pass_at_k([warm[0], trained[0], warm[1], trained[1]])
      print(f"\n{text}\n[summary] {os.path.join(self.workdir, 'summary.md')}, "
            f"{os.path.join(self.workdir, 'pass_at_k.png')}")
    history = writer.history
    metrics_lib.plot_curves(history, ["success_rate", "eval/success_rate", "return", "format_ok",
                                      "update/loss", "update/entropy"],
                            os.path.join(self.workdir, "curves.png"), title=f"{c.method} on {c.env.id}")
    return history

  def iteration_step(self, pool: ActorPool, iteration: int) -> dict[str, float]:
    results, m = self.collect(pool, iteration)
    m.update(self.method.observe(results, training=True))
    records = self.to_records(results, iteration)
    adv, valid = self.advantages(records)
    t0 = time.time()
    self.replay.insert(records)
    fresh = self.replay.take_latest(self.records_per_iteration, since_version=iteration)
    # take_latest returns the iteration's rows oldest first, in insertion order, like `records`.
    # The replay packs an insert's valid rows in order and take_latest returns them oldest first, so row i
    # of `fresh` is row i of `records` (from_host puts padding last).
    rec = fresh.records
    n = int(np.asarray(records.valid).sum())
    if int(fresh.num_eligible) != n or not np.array_equal(np.asarray(rec.traj_id)[:n], np.asarray(records.traj_id)[:n]):
      raise RuntimeError("replay returned a different set of records than this iteration inserted")
    batch = {"prompt_tokens": rec.prompt_tokens, "prompt_mask": rec.prompt_mask,
             "response_tokens": rec.response_tokens, "response_mask": rec.response_mask,
             "temperatures": rec.temperatures, "behaviour_logprobs": rec.behaviour_logprobs,
             "advantages": adv, "valid": jnp.asarray(valid)}
    m.update(self.update(batch, iteration))
    m.update(self.method.update_aux(rec, iteration))
    m["time_update_s"] = time.time() - t0
    m["advantage_abs_mean"] = float(jnp.sum(jnp.abs(adv)) / max(valid.sum(), 1))
    m["groups_kept"] = float(len(set(np.asarray(records.group_id)[valid].tolist())))
    return m


def _trim_prompt_padding(batch: dict[str, Any], rows: np.ndarray, bucket: int = 64) -> dict[str, Any]:
  """Drops the prompt columns that are padding in every row used, in steps of `bucket` columns (so an
  iteration's update compiles for one of a few prompt widths). Prompts are left-padded, so the result is
  the same computation on fewer tokens."""
  used = np.asarray(batch["prompt_mask"])[rows].any(0)
  first = int(np.argmax(used)) // bucket * bucket if used.any() else 0
  if first == 0:
    return batch
  return {**batch, "prompt_tokens": batch["prompt_tokens"][:, first:], "prompt_mask": batch["prompt_mask"][:, first:]}


def _check_environments(config: Any) -> None:
  """Builds the training and evaluation environments once here, so a bad id or kwarg (a missing dataset
  file, say) stops the run with the environment's own message instead of failing inside every actor."""
  import gymnasium

  import explore_jax.envs  # noqa: F401  (registers the ids)

  for kwargs in (dict(config.env.kwargs), {**config.env.kwargs, **config.eval.get("env_kwargs", {})}):
    try:
      gymnasium.make(config.env.id, **kwargs).close()
    except Exception as e:
      raise ValueError(f"environment {config.env.id} with {kwargs} cannot be built: {e}") from e


def _group_returns(rewards, group, traj, valid) -> dict[int, np.ndarray]:
  totals: dict[tuple[int, int], float] = {}
  for r, g, t, v in zip(rewards, group, traj, valid):
    if v:
      totals[(int(g), int(t))] = totals.get((int(g), int(t)), 0.0) + float(r)
  out: dict[int, list[float]] = {}
  for (g, _), total in totals.items():
    out.setdefault(g, []).append(total)
  return {g: np.asarray(v) for g, v in out.items()}


@functools.lru_cache(maxsize=None)
def _jit_estimator(estimator, options: tuple):
  return jax.jit(functools.partial(estimator, **dict(options)))


