"""Acting: which episodes an iteration plays, playing them on the actor pool, and packing them into Records.

  specs   = episode_specs(config, method, iteration)     B task groups x G episodes (seeds from (seed, it))
  results = collect(pool, specs, policy_fn, embed_fn)    the actors play them; per-iteration metrics
  records = to_records(spec, method, results, ...)       fixed-shape numpy Records with the method's fields

Every random choice is a function of (seed, iteration, episode, step): environment seeds here, the
sampler's per-row streams in train/inference.py.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional

import numpy as np

from explore_jax.actors.pool import ActorPool
from explore_jax.actors.protocol import EpisodeResult, EpisodeSpec
from explore_jax.envs.fields import fields_env
from explore_jax.envs.parallel import parallel_env
from explore_jax.envs.screen_reader import screen_reading_env
from explore_jax.methods import Method
from explore_jax.replay import RecordSpec, from_host


def task_groups(config: Any, iteration: int, *, evaluation: bool) -> tuple[list[tuple[int, int]], dict[str, Any],
                                                                           np.random.Generator]:
  """[(task seed, group size)], the environment kwargs and the iteration's host random stream."""
  c = config
  rng = np.random.default_rng([c.seed, iteration, int(evaluation)])
  env_kwargs = dict(c.env.kwargs)
  if evaluation:
    groups = [(c.eval.seed_offset + i, 1) for i in range(c.eval.num_episodes)]
    env_kwargs.update(c.eval.get("env_kwargs", {}))
  else:
    high = c.rollout.get("task_pool", 0) or 2**31 - 1  # a finite pool: tasks recur across iterations
    groups = [(int(rng.integers(0, high)), c.rollout.group_size) for _ in range(c.rollout.num_tasks)]
  return groups, env_kwargs, rng


def environment(config: Any, env_kwargs: dict[str, Any], *, demonstrations: bool = False
                ) -> tuple[str, dict[str, Any]]:
  """(id, kwargs) of the environment episodes play: config.env.id with `env_kwargs`, in K parallel copies when
  config.env.parallel.copies is K >= 1 (envs/parallel.py; DPEPO's setting), answered in EAPO's fields when
  config.env.answer is "fields" (envs/fields.py), its screens read when config.env.screen_reading is set
  (envs/screen_reader.py; ScreenExplorer's); all open to every method."""
  env_id, env_kwargs = parallel_env(config.env.id, env_kwargs, config.env.get("parallel"),
                                    demonstrations=demonstrations)
  env_id, env_kwargs = fields_env(env_id, env_kwargs, config.env.get("answer", "plain"))
  return screen_reading_env(env_id, env_kwargs, config.env.get("screen_reading"))


def episode_specs(config: Any, method: Optional[Method], iteration: int, *, evaluation: bool) -> list[EpisodeSpec]:
  """B task groups of G episodes each (a group's episodes share the environment seed); training episodes
  carry the method's context, evaluation episodes none."""
  groups, env_kwargs, rng = task_groups(config, iteration, evaluation=evaluation)
  env_id, env_kwargs = environment(config, env_kwargs)
  specs, traj = [], 0
  for g, (seed, size) in enumerate(groups):
    for _ in range(size):
      # Ids are unique within the iteration; the sampler's key is folded with the iteration.
      spec = EpisodeSpec(episode_id=traj, group_id=g, traj_id=traj, env_id=env_id,
                         env_kwargs=env_kwargs, seed=seed)
      if not evaluation and method is not None:
        spec = dataclasses.replace(spec, context=method.episode_context(spec, rng))
      specs.append(spec)
      traj += 1
  return specs


def collect(pool: ActorPool, specs: list[EpisodeSpec], policy_fn: Callable, embed_fn: Optional[Callable] = None
            ) -> tuple[list[EpisodeResult], dict[str, float]]:
  """The finished episodes (dropped ones left out) and the rollout's metrics."""
  t0 = time.time()
  results, pool_metrics = pool.run(specs, policy_fn, embed_fn=embed_fn)
  wall = time.time() - t0
  finished = [r for r in results if not r.dropped]
  n = max(len(finished), 1)
  steps = sum(len(r.steps) for r in finished)
  new_tokens = sum(len(s.response.tokens) for r in finished for s in r.steps)
  prompt_tokens = sum(len(s.prompt_ids) for r in finished for s in r.steps)
  sample_time = float(pool_metrics["policy_seconds"])
  return finished, {
      "success_rate": sum(r.success for r in finished) / n,
      "return": sum(r.total_reward for r in finished) / n,
      "episode_length": steps / n,
      "format_ok": sum(s.format_reward for r in finished for s in r.steps) / max(steps, 1),
      "episodes_dropped": float(pool_metrics["episodes_dropped"]),
      "actor_restarts": float(pool_metrics["actor_restarts"]),
      "truncated_prompts": float(pool_metrics["truncated_prompts"]),
      "shortened_prompts": float(pool_metrics["shortened_prompts"]),
      "time_rollout_s": wall, "time_sampling_s": sample_time,
      "time_environment_s": max(wall - sample_time, 0.0),
      "sample_tokens_per_s": new_tokens / max(sample_time, 1e-9),
      # Prompt tokens prefilled per second of sampling: with short actions and long observations (the text
      # worlds), prefill, not decoding, is where sampling time goes.
      "sample_prompt_tokens_per_s": prompt_tokens / max(sample_time, 1e-9),
      **revisit_measures(finished),
  }


def revisit_measures(results: list[EpisodeResult]) -> dict[str, float]:
  """How much an iteration's episodes come back to where they were (EAPO's grouping is about these; every method
  logs them):

    revisit_share     the share of steps whose state the episode had visited before (visitation depth > 0)
    step_group_size   steps per (state, visitation depth) group of a task group: the size of the step-level groups
                      EAPO's estimator normalises in (1: every step alone, no group-relative signal)
  """
  revisits = steps = 0
  by_task: dict[int, set] = {}
  for r in results:
    depths = visitation_depths([s.state_key for s in r.steps])
    keys = by_task.setdefault(r.spec.group_id, set())
    keys.update((s.state_key, d) for s, d in zip(r.steps, depths))
    revisits += sum(d > 0 for d in depths)
    steps += len(depths)
  groups = sum(len(k) for k in by_task.values())
  return {"revisit_share": revisits / max(steps, 1), "step_group_size": steps / max(groups, 1)}


# A vision-language policy's records keep their prompts' images (what the learner needs to recompute
# log-probs): uint8 [K, H, W, C] at the size the model read them, the first `image_count` real.
IMAGES, IMAGE_COUNT = "images", "image_count"


def image_record_fields(max_images: int, image_shape: tuple[int, int, int]) -> dict[str, tuple]:
  """The record fields of image prompts: at most `max_images` images of `image_shape` (H, W, C) per step.
  Memory per record: max_images x H x W x C bytes (a 168 x 224 screenshot: 113 kB)."""
  return {IMAGES: ((int(max_images), *(int(v) for v in image_shape)), "uint8"), IMAGE_COUNT: ((), "int32")}


def _image_columns(spec: RecordSpec, step: Any) -> dict[str, np.ndarray]:
  """A step's image fields as the spec declares them (empty when the records keep no images)."""
  field = spec.extra_fields.get(IMAGES)
  if field is None:
    if step.images:
      raise ValueError(f"episode {step.episode_id} step {step.step_index} has {len(step.images)} image(s), but "
                       f"the records keep none (a vision-language policy declares image_record_fields)")
    return {}
  K, shape = field.shape[0], field.shape[1:]
  if len(step.images) > K:
    raise ValueError(f"episode {step.episode_id} step {step.step_index} has {len(step.images)} images, more than "
                     f"the {K} its records keep")
  images = np.zeros(field.shape, np.uint8)
  for k, image in enumerate(step.images):
    if tuple(image.shape) != shape:
      raise ValueError(f"episode {step.episode_id} step {step.step_index}: an image of shape {list(image.shape)}, "
                       f"but records keep images of {list(shape)}")
    images[k] = image
  return {IMAGES: images, IMAGE_COUNT: len(step.images)}


def visitation_depths(state_keys: list[int]) -> list[int]:
  """kappa(s_t) = #{k < t : s_k = s_t} along one trajectory (EAPO, eq. 12)."""
  seen: dict[int, int] = {}
  out = []
  for key in state_keys:
    out.append(seen.get(key, 0))
    seen[key] = out[-1] + 1
  return out


def to_records(spec: RecordSpec, method: Method, results: list[EpisodeResult], *, max_steps: int, pad_to: int):
  """numpy Records of every step of `results` (padded to `pad_to` rows), with the method's fields; a record's
  policy_version is the version of the parameters that sampled it (its response's)."""
  rows = []
  for r in results:
    if len(r.steps) > max_steps:
      raise ValueError(f"an episode of {r.spec.env_id} ran {len(r.steps)} steps; config.env.max_steps="
                       f"{max_steps} must bound the environment's episode length")
    fields = method.step_fields(r)
    if len(fields) != len(r.steps):  # zip below would silently drop the steps without fields
      raise ValueError(f"method {method.name!r} returned step fields for {len(fields)} of the episode's "
                       f"{len(r.steps)} steps; step_fields must return one dict per step")
    depths = visitation_depths([s.state_key for s in r.steps])
    for s, extra, depth in zip(r.steps, fields, depths):
      rows.append({
          "prompt_tokens": np.asarray(s.prompt_ids[-spec.prompt_len:], np.int32),
          "response_tokens": s.response.tokens, "behaviour_logprobs": s.response.logprobs,
          "temperatures": s.response.temperatures, "segment_ids": s.response.segments,
          "task_reward": s.task_reward, "format_reward": s.format_reward,
          "group_id": s.group_id, "traj_id": s.traj_id, "step_index": s.step_index,
          "actor_id": s.actor_id, "state_key": s.state_key, "visitation_depth": depth,
          "policy_version": s.response.policy_version, "done": s.done,
          **({"intrinsic": np.zeros(spec.num_intrinsic, np.float32)} if spec.num_intrinsic else {}),
          **_image_columns(spec, s),
          **extra,
      })
  return from_host(spec, rows, pad_to=pad_to)
