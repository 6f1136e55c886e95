"""The evaluator: held-out success during training, and pass@k of a policy on fixed task sets.

Evaluation episodes carry no method context (no reflections, tips or dropped strategies) and every token
is sampled at eval.temperature, so a number here measures the policy alone.

  periodic(pool, params, it)     eval.num_episodes held-out episodes (seeds eval.seed_offset + i)
  pass_at_k(pool, params, set)   n = eval.passk_samples episodes of every task of one task set (task_sets()):
                                 "train", the held-in training pool (seeds 0..rollout.task_pool-1); "held-out",
                                 seeds eval.seed_offset + i of the held-out split (eval.env_kwargs); and each
                                 split named in eval.more_splits, on the same seeds (ALFWorld: the unseen games
                                 of the training rooms, valid_seen, beside the unseen rooms, valid_unseen)
  warm_start_pass_at_k(...)      the warm start's pass@k, cached beside the SFT warm start
  write_summary(evals, dir)      summary.md / summary.json / pass_at_k.png (dir local or a bucket path)
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any, Callable, Optional

import jax

from explore_jax import cache as cache_lib, storage
from explore_jax.actors.pool import ActorPool
from explore_jax.actors.protocol import EpisodeSpec
from explore_jax.train import evaluation, rollout
from explore_jax.train.inference import InferenceServer
from explore_jax.train.warm_start import config_hash

WARM_PASS_AT_K = "pass_at_k_warm_start.json"
# The pass@k samples' key: the same streams for any parameters (fold_in(key, PASS_AT_K_STREAM + the set's offset:
# train 0, held-out 1, another split 2 + a hash of its name, so that adding a split moves no other set's samples).
PASS_AT_K_STREAM = 1_000_003
TRAIN, HELD_OUT = "train", "held-out"
# In the warm start's pass@k cache key: entries cached when its samples came from the RL seed's key are not read.
WARM_SAMPLES_FROM = "sft.seed"
# A sampled row's bits depend on its width (rollout.prompt_width_bucket), so another width is in that key too;
# the width every entry before it was sampled at is not, so that those entries keep their keys. Batching other
# than "fixed" (its last bits) is in the key only when set, for the same reason.
UNKEYED_PROMPT_WIDTH = 64


class Evaluator:
  """Evaluations of any parameters on the config's task sets, through the actor pool."""

  def __init__(self, config: Any, server: InferenceServer, sampling_params: Any, key: jax.Array):
    self.config, self.server, self.sampling_params, self.key = config, server, sampling_params, key

  def periodic(self, pool: ActorPool, params: Any, iteration: int) -> dict[str, float]:
    """Success and return on the held-out episodes, sampled from the iteration's evaluation stream."""
    key = jax.random.fold_in(jax.random.fold_in(self.key, iteration), 1)
    policy_fn, embed_fn = self.server.bind(params, key, self.sampling_params, iteration)
    specs = rollout.episode_specs(self.config, None, iteration, evaluation=True)
    results, m = rollout.collect(pool, specs, policy_fn, embed_fn)
    out = {f"eval/{k}": m[k] for k in ("success_rate", "return")}
    by_seed: dict[Any, list] = {}
    for r in results:
      by_seed.setdefault(r.spec.seed, []).append(r)
    diversity = evaluation.screen_diversity(list(by_seed.values()))  # a GUI world's screens, when read
    return {**out, **{f"eval/{k}": v for k, v in (diversity or {}).items()}}

  def task_sets(self) -> list[str]:
    """The task sets pass@k samples, in the summary's order: the held-in pool ("train"; none when training draws a
    fresh task per group, rollout.task_pool 0, as no task recurs), "held-out", then eval.more_splits."""
    c = self.config
    more, held_out_split = list(c.eval.get("more_splits", ())), c.eval.get("env_kwargs", {}).get("split")
    clash = [s for s in more if s in (TRAIN, HELD_OUT, held_out_split)]
    if clash or len(set(more)) != len(more):
      raise ValueError(f"eval.more_splits {tuple(more)}: each must be another value of the environment's `split` "
                       f"than the held-out one ({held_out_split!r}), named once, and not "
                       f"{TRAIN!r} or {HELD_OUT!r}")
    return ([TRAIN] if c.rollout.task_pool else []) + [HELD_OUT] + more

  def _task_set(self, name: str) -> tuple[dict, list[int], int]:
    """(environment kwargs, task seeds, sampling stream offset) of the task set `name`."""
    c = self.config
    held_out = [c.eval.seed_offset + i for i in range(c.eval.passk_held_out_tasks)]
    if name == TRAIN:
      if not c.rollout.task_pool:
        raise ValueError("rollout.task_pool is 0 (a fresh training task per group), so there is no held-in task "
                         "set to evaluate; evaluate the held-out set, or set rollout.task_pool")
      return dict(c.env.kwargs), list(range(c.rollout.task_pool)), 0
    if name == HELD_OUT:
      return {**c.env.kwargs, **c.eval.get("env_kwargs", {})}, held_out, 1
    if name not in self.task_sets():
      raise ValueError(f"unknown task set {name!r}; this config has {', '.join(self.task_sets())} "
                       "(another split of the environment goes in eval.more_splits)")
    kwargs = {**c.env.kwargs, **c.eval.get("env_kwargs", {}), "split": name}
    return kwargs, held_out, 2 + zlib.crc32(name.encode()) % (1 << 20)

  def pass_at_k(self, pool: ActorPool, params: Any, task_set: str, *, policy: str,
                log: Callable[[str], None] = print, transcripts: Optional[str] = None,
                transcripts_per_task: int = 1, key: Optional[jax.Array] = None) -> evaluation.TaskSetEval:
    """pass@k of `params` on one of task_sets(), labelled "<policy> / <task_set>", sampled from `key`'s pass@k
    streams (the run's key by default); with `transcripts` (a path), the first `transcripts_per_task` episodes
    of each task are also written there (evaluation.write_transcripts)."""
    c = self.config
    env_kwargs, seeds, stream = self._task_set(task_set)
    env_id, env_kwargs = rollout.environment(c, env_kwargs)
    n = c.eval.passk_samples
    specs = [EpisodeSpec(episode_id=i * n + j, group_id=i, traj_id=i * n + j, env_id=env_id,
                         env_kwargs=env_kwargs, seed=seed) for i, seed in enumerate(seeds) for j in range(n)]
    key = jax.random.fold_in(self.key if key is None else key, PASS_AT_K_STREAM + stream)
    policy_fn, embed_fn = self.server.bind(params, key, self.sampling_params, -1)
    from tqdm import tqdm

    label = evaluation.task_set_label(policy, task_set)
    with tqdm(total=len(specs), desc=f"pass@k {label}", unit="ep", dynamic_ncols=True, leave=False) as bar:
      results, _ = pool.run(specs, policy_fn, embed_fn=embed_fn, on_result=lambda _: bar.update(1))
    if transcripts:
      evaluation.write_transcripts(transcripts, results, transcripts_per_task)
    return evaluation.summarize(label, results)

  def task_sets_text(self) -> str:
    """What pass_at_k_sets samples, for a log line: "task of train and held-out"."""
    sets = self.task_sets()
    return "task of " + (f"{', '.join(sets[:-1])} and {sets[-1]}" if len(sets) > 1 else sets[0])

  def pass_at_k_sets(self, pool: ActorPool, params: Any, policy: str, key: Optional[jax.Array] = None,
                     before_each: Callable[[], None] = lambda: None) -> list[evaluation.TaskSetEval]:
    """pass@k on every task set (task_sets()), in order; `before_each()` is called before each set (the loop
    leaves there on a SIGTERM: train/preemption.py)."""
    evals = []
    for name in self.task_sets():
      before_each()
      evals.append(self.pass_at_k(pool, params, name, policy=policy, key=key))
    return evals

  def warm_start_sampling_key(self) -> jax.Array:
    """The key of the warm start's pass@k samples: the warm start's own (sft.seed), not the RL seed's, so that
    every run of one warm start samples the same episodes whether it computes them or reads the cache."""
    return jax.random.key(self.config.sft.seed)

  def warm_start_pass_at_k(self, pool: ActorPool, params: Any, workdir: str, warm_start_key: str,
                           log: Callable[[str], None] = print, *, write: bool = True,
                           before_each: Callable[[], None] = lambda: None) -> None:
    """The warm start's pass@k, before any RL, written to the run directory (a resumed run reads it, or, where
    its config now asks for a task set the file lacks, computes it again: the same numbers for the sets it has).

    It depends on neither the RL seed nor the method (evaluation carries no method context, and its samples
    come from warm_start_sampling_key), so it is also cached next to the SFT warm start and shared by every run
    that evaluates the same warm start the same way.
    A multi-host run computes it on every process (sampling is one SPMD program) without the cache, which is
    per host, so that no process skips what the others compute; `write=False` processes write nothing.
    """
    c = self.config
    path = os.path.join(workdir, WARM_PASS_AT_K)
    width = c.rollout.get("prompt_width_bucket", UNKEYED_PROMPT_WIDTH)
    cache = os.path.join(cache_lib.warm_start_evaluations_dir(warm_start_key), config_hash(
        warm_start_key, _env_key(c), c.eval.to_dict(), c.rollout.max_new_tokens, c.rollout.top_p,
        c.get("instruction", ""), c.get("system_prompt"), c.rollout.task_pool,  # task_pool: the held-in set
        WARM_SAMPLES_FROM, *([{"prompt_width_bucket": width}] if width != UNKEYED_PROMPT_WIDTH else []),
        *([{"batching": c.rollout.batching}] if c.rollout.get("batching", "fixed") != "fixed" else [])) + ".json")
    cached = c.sft.enabled and jax.process_count() == 1
    if cached and os.path.exists(cache):
      storage.copy(cache, path)
      log(f"[pass@k] warm start: reused {cache}")
      return
    log(f"[pass@k] warm start: {c.eval.passk_samples} samples of each {self.task_sets_text()}")
    sets = [e.to_json() for e in self.pass_at_k_sets(pool, params, evaluation.WARM_START,
                                                     self.warm_start_sampling_key(), before_each)]
    if not write:
      return
    with storage.open(path, "w") as f:
      json.dump(sets, f)
    if cached:  # the cache is local, wherever the run directory is
      os.makedirs(os.path.dirname(cache), exist_ok=True)
      storage.copy(path, cache + ".tmp")
      os.replace(cache + ".tmp", cache)

  def lacks_warm_pass_at_k(self, workdir: str) -> bool:
    """Whether the run's warm-start pass@k is missing, or lacks one of the config's task sets."""
    if not storage.exists(os.path.join(workdir, WARM_PASS_AT_K)):
      return True
    wanted = [evaluation.task_set_label(evaluation.WARM_START, s) for s in self.task_sets()]
    return [e.label for e in load_warm_pass_at_k(workdir)] != wanted

  def write_summary(self, evals: list[evaluation.TaskSetEval], directory: str, note: str = "") -> str:
    """summary.md (the pass@k table, then `note`), summary.json and pass_at_k.png in `directory`; returns
    the text of summary.md after its title."""
    storage.makedirs(directory)
    n = min(e.min_samples for e in evals)
    text = evaluation.table(evals, evaluation.powers_of_two(n)) + (f"\n\n{note}" if note else "")
    with storage.open(os.path.join(directory, "summary.json"), "w") as f:
      # per_task: the raw counts behind the curves, so that launch/compare.py can pair methods task by task.
      json.dump({e.label: {**e.to_dict(range(1, n + 1)), "per_task": e.to_json()} for e in evals}, f, indent=2)
    with storage.open(os.path.join(directory, "summary.md"), "w") as f:
      f.write(f"# {self.config.method} on {self.config.env.id}\n\n{text}\n")
    evaluation.plot_pass_at_k(evals, list(range(1, n + 1)), os.path.join(directory, "pass_at_k.png"),
                              title=f"{self.config.method}: pass@k")
    return text


# Said under a training run's summary: which of its numbers another machine would change, and where claims
# about methods are made.
ONE_RUN_NOTE = (
    "One run, one seed. Repeating this command on this machine with the same settings reproduces every number "
    "(bit for bit).\nOn another CPU model or thread count, XLA's CPU arithmetic rounds differently: the warm "
    "start and every number\nabove move (by up to ~0.15 pass@16 after RL at this scale; docs/determinism.md). "
    "Only the task set and the\nsampling protocol are machine-independent. Method comparisons are made over "
    "warm starts and seeds with\nconfidence intervals: `make protocol` (docs/results.md).")


def before_and_after(warm: list[evaluation.TaskSetEval],
                     trained: list[evaluation.TaskSetEval]) -> list[evaluation.TaskSetEval]:
  """The summary's rows: each task set's warm start, then its trained policy (pass_at_k_sets' sets, one or two)."""
  sets = [(evaluation.split_task_set_label(w.label)[1], evaluation.split_task_set_label(t.label)[1])
          for w, t in zip(warm, trained)]
  if len(warm) != len(trained) or any(a != b for a, b in sets):
    raise ValueError(f"the warm start's task sets {[w.label for w in warm]} do not match the trained policy's "
                     f"{[t.label for t in trained]}")
  return [e for pair in zip(warm, trained) for e in pair]


def load_warm_pass_at_k(workdir: str) -> list[evaluation.TaskSetEval]:
  with storage.open(os.path.join(workdir, WARM_PASS_AT_K)) as f:
    return [evaluation.TaskSetEval.from_json(e) for e in json.load(f)]


def _env_key(c: Any) -> dict:
  """config.env as the warm pass@k cache names it: without screen_reading when it is off (the key such entries
  had before screens could be read)."""
  env = c.env.to_dict()
  if not env.get("screen_reading"):
    env.pop("screen_reading", None)
  return env
