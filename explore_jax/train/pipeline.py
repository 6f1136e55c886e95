"""Rollouts ahead of the learner: iteration t+1's episodes are played while the learner updates on iteration t's.

`config.rollout.max_staleness` = k bounds how many updates old the policy that sampled a batch may be:

  k = 0   synchronous (the default): iteration t's episodes are sampled with theta_t, after update t-1, on the
          calling thread -- exactly the loop as it was before overlap existed.
  k >= 1  as soon as iteration t's episodes are in (and the method has observed them), rollouts t+1 .. t+k
          start on a background thread with the parameters of that moment, theta_t, published as a copy
          (the learner's update donates its own buffers). The learner then updates on iteration t's records,
          which theta_{t-k} .. theta_t sampled; the clipped ratio against the recorded behaviour log-probs is
          the off-policy correction, and the records pass through the device replay (replay/buffer.py), whose
          staleness bound (current version - policy_version <= k) and reuse limit (each record trains one
          update) decide what the learner may take.

What stays exact:
* A rollout's episodes, seeds and sampling keys are those of its iteration, whichever thread plays it; its
  episode specs (and the method's context in them, SGE's strategy draws) are built on the loop's thread when
  it is launched, after the method observed iteration t. A rollout launched earlier sees an older method
  state and older parameters: that is what overlap means, and what `rollout/staleness` reports.
* Checkpoint iterations are synchronisation points: rollout n, n a multiple of checkpoint.every, is launched
  only after update n-1 (with theta_n), and nothing past it before. A run resumed from checkpoint n therefore
  makes the same rollouts with the same parameters as the run that was not interrupted.
* Evaluation shares the actor pool: before it, the loop waits for the rollouts in flight (`wait`), so the
  evaluation and the schedule of rollouts are those of an uninterrupted overlapped run.

One background thread plays the rollouts in launch order (the actor pool runs one collection at a time); a
multi-host run stays synchronous (each process would interleave its two threads' collective calls in its own
order). On
one host the sampler and the learner share the devices: what overlap buys is the time the devices would sit
idle while environments step and actors answer, and the host time of one phase under the other's device time.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from explore_jax.actors.pool import ActorPool
from explore_jax.actors.protocol import EpisodeResult
from explore_jax.parallel.sharding import DEFAULT_RULES
from explore_jax.replay import Records, Replay
from explore_jax.train import rollout


def iteration_key(key: jax.Array, iteration: int) -> jax.Array:
  """The sampling key of an iteration's rollout."""
  return jax.random.fold_in(jax.random.fold_in(key, iteration), 0)


@dataclasses.dataclass
class Collected:
  """One iteration's finished episodes, their metrics and the policy version (updates done) that sampled them."""
  results: list[EpisodeResult]
  metrics: dict[str, float]
  version: int


class RolloutPipeline:
  """Launches and hands over the loop's rollouts (module docstring); a context manager that stops its thread."""

  def __init__(self, parts: Any, pool: ActorPool, *, max_staleness: int, num_iterations: int,
               checkpoint_every: int):
    if max_staleness < 0:
      raise ValueError(f"config.rollout.max_staleness must be >= 0, got {max_staleness}")
    if max_staleness and jax.process_count() > 1:
      # Sampling and updates are collective programs: two threads per process would issue them in an order
      # that differs between processes.
      raise ValueError("config.rollout.max_staleness > 0 (overlapped rollout) runs on one process; a "
                       f"multi-host run ({jax.process_count()} processes) is synchronous")
    self.parts, self.pool = parts, pool
    self.max_staleness, self.num_iterations = int(max_staleness), int(num_iterations)
    self.checkpoint_every = max(int(checkpoint_every), 1)
    self._executor = (concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout")
                      if self.max_staleness else None)
    self._inflight: dict[int, tuple[int, concurrent.futures.Future]] = {}

  @classmethod
  def from_config(cls, parts: Any, pool: ActorPool) -> "RolloutPipeline":
    c = parts.config
    return cls(parts, pool, max_staleness=int(c.rollout.get("max_staleness", 0)),
               num_iterations=c.train.num_iterations, checkpoint_every=c.checkpoint.every)

  @property
  def overlapped(self) -> bool:
    return self.max_staleness > 0

  def is_sync_point(self, iteration: int) -> bool:
    """Whether rollout `iteration` waits for the update before it (a checkpoint iteration)."""
    return iteration % self.checkpoint_every == 0

  def resumes_exactly_at(self, iteration: int) -> bool:
    """Whether a checkpoint after update `iteration - 1` resumes into the same run: any iteration of a
    synchronous run, a synchronisation point of an overlapped one (later rollouts may be in flight elsewhere)."""
    return not self.overlapped or self.is_sync_point(iteration)

  def _play(self, iteration: int, params: Any, version: int) -> Callable[[], tuple[list[EpisodeResult], dict]]:
    """The work of one rollout, its specs built now (on the caller's thread, from the method's state now)."""
    parts = self.parts
    specs = rollout.episode_specs(parts.config, parts.method, iteration, evaluation=False)
    policy_fn, embed_fn = parts.server.bind(params, iteration_key(parts.key, iteration), parts.train_sampling,
                                            version, features=parts.method.wants_features)
    return lambda: rollout.collect(self.pool, specs, policy_fn, embed_fn)

  def take(self, iteration: int, params: Any) -> Collected:
    """Iteration `iteration`'s rollout: the one in flight, or one played now with `params` (theta_iteration)."""
    t0 = time.time()
    if iteration in self._inflight:
      version, future = self._inflight.pop(iteration)
      results, metrics = future.result()
    else:
      version = iteration
      results, metrics = self._play(iteration, params, version)()
    metrics = dict(metrics, **{"time_rollout_wait_s": time.time() - t0,
                               "rollout/staleness": float(iteration - version)})
    return Collected(results, metrics, version)

  def launch_ahead(self, iteration: int, params: Any) -> int:
    """Starts rollouts iteration+1 .. iteration+k that are not yet in flight, with `params` (theta_iteration),
    stopping before a synchronisation point; returns how many started. Call it after the method observed
    iteration's episodes and before the update."""
    if not self.overlapped:
      return 0
    todo = []
    for j in range(iteration + 1, min(iteration + self.max_staleness, self.num_iterations - 1) + 1):
      if self.is_sync_point(j):
        break
      if j not in self._inflight:
        todo.append(j)
    if not todo:
      return 0
    published = jax.tree.map(jnp.copy, params)  # the update donates the learner's own buffers
    for j in todo:
      self._inflight[j] = (iteration, self._executor.submit(self._play(j, published, iteration)))
    return len(todo)

  def wait(self) -> None:
    """Blocks until every rollout in flight has finished (the actor pool is then free, e.g. to evaluate)."""
    for _, future in list(self._inflight.values()):
      future.exception()  # waits; an error surfaces from take()

  def close(self) -> None:
    for _, future in self._inflight.values():
      future.cancel()
    if self._executor is not None:
      self._executor.shutdown(wait=True, cancel_futures=True)
    self._inflight.clear()

  def __enter__(self) -> "RolloutPipeline":
    return self

  def __exit__(self, *exc: Optional[BaseException]) -> None:
    self.close()


def make_replay(parts: Any) -> Optional[Replay]:
  """The device replay an overlapped run's records pass through (None when synchronous): room for the
  k + 1 iterations of records that may be eligible at once."""
  k = int(parts.config.rollout.get("max_staleness", 0))
  if k == 0:
    return None
  return Replay(parts.spec, (k + 1) * parts.records_per_iteration, mesh=parts.model.mesh,
                rules=parts.model.rules or DEFAULT_RULES)


def admit(replay: Replay, records: Records, iteration: int, max_staleness: int) -> tuple[Records, dict[str, float]]:
  """The records the update at `iteration` may train on: `records` go into the replay, and what comes out is
  every row within the staleness bound (policy_version >= iteration - max_staleness) not used before, oldest
  first, each marked used (so it trains one update), as host numpy Records of the same shape."""
  replay.insert(records)
  batch = replay.take_latest(records.num_records, since_version=iteration - max_staleness, max_reuse=1)
  taken = jax.device_get(batch.records)
  eligible, offered = int(batch.num_eligible), int(np.asarray(records.valid).sum())
  return taken, {"replay/rows_taken": float(np.asarray(taken.valid).sum()),
                 "replay/rows_left": float(max(eligible - records.num_records, 0)),
                 "replay/rows_offered": float(offered)}
