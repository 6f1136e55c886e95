"""The actor pool's bookkeeping: its view of each actor slot, the state of one run (with its metrics), what the
processes of a multi-process run exchange, and the end of an actor's process (actors/pool.py runs all of them)."""

from __future__ import annotations

import collections
import dataclasses
import signal
import time
from typing import Any, Callable, Optional, Protocol, Union

from explore_jax.actors.protocol import STOP, ActorHello, EmbedRequest, EpisodeResult, EpisodeSpec, PromptRequest


class Exchange(Protocol):
  """What a multi-process pool needs from the learner side: an allgather among the run's processes."""
  process_index: int
  process_count: int

  def allgather(self, obj: Any) -> list[Any]:
    """Every process's `obj` (picklable), in process order; a collective call."""


@dataclasses.dataclass(frozen=True)
class Round:
  """One process's part of a round: its actors' pending requests, whether its share is done, its error."""
  requests: list[Union[PromptRequest, EmbedRequest]]
  finished: bool
  error: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Share:
  """One process's part of a run, exchanged at its end: its results and its local fault counters."""
  results: list[EpisodeResult]
  restarts: int
  actor_drops: int

# How long close() lets actors finish closing their environments before killing them.
CLOSE_GRACE_S = 5.0


@dataclasses.dataclass
class ActorSlot:
  """The learner's view of one actor slot; its process is replaced on failure, the slot stays."""
  actor_id: int
  process: Any = None
  inbox: Any = None            # Queue, learner -> actor
  conn: Any = None             # Connection, actor -> learner
  hello: Optional[ActorHello] = None
  failure: Optional[str] = None
  incarnation: int = 0
  started_at: float = 0.0
  live: dict[int, EpisodeSpec] = dataclasses.field(default_factory=dict)
  owed: int = 0                # messages the actor has to answer (specs, responses, a cancellation)
  last_progress: float = 0.0   # last message, or when it last got work while owing nothing
  cancelling: bool = False     # what it sends before EpisodesCancelled belongs to a failed run

  @property
  def ready(self) -> bool:
    return self.process is not None and self.hello is not None and not self.cancelling


class RunState:
  """The state of one `run` call: episodes still to hand out, results, counters."""

  def __init__(self, specs: list[EpisodeSpec], on_result: Optional[Callable[[EpisodeResult], None]] = None):
    self.on_result = on_result
    self.total = len(specs)
    self.pending = collections.deque(specs)
    self.results: dict[int, EpisodeResult] = {}
    self.restarts = 0
    self.actor_drops = 0
    self.policy_calls = 0
    self.requests = 0
    self.max_batch = 0
    self.policy_seconds = 0.0
    self.embed_calls = 0
    self.embed_requests = 0
    self.embed_seconds = 0.0
    self.wait_seconds = 0.0
    self.rounds = 0               # multi-process runs: exchanges of requests, and the time spent in them
    self.exchange_seconds = 0.0

  @property
  def unfinished(self) -> bool:
    return len(self.results) < self.total

  def finish(self, result: EpisodeResult) -> None:
    self.results[result.spec.episode_id] = result
    if self.on_result is not None:
      self.on_result(result)

  def drop(self, spec: EpisodeSpec, error: str, actor_id: int) -> None:
    self.finish(EpisodeResult(spec=spec, steps=[], success=False, total_reward=0.0, feedback="", error=error,
                              actor_id=actor_id))
    self.actor_drops += 1

  def metrics(self, wall_seconds: float) -> dict[str, float]:
    results = self.results.values()
    dropped = sum(r.dropped for r in results)
    return dict(
        episodes=self.total,
        episodes_done=self.total - dropped,
        episodes_dropped=dropped,
        dropped_by_env_errors=dropped - self.actor_drops,
        dropped_by_actor_failures=self.actor_drops,
        actor_restarts=self.restarts,
        steps=sum(len(r.steps) for r in results),
        truncated_prompts=sum(r.truncated_prompts for r in results),
        shortened_prompts=sum(r.shortened_prompts for r in results),
        policy_calls=self.policy_calls,
        requests=self.requests,
        mean_batch_size=self.requests / max(self.policy_calls, 1),
        max_batch_size=self.max_batch,
        policy_seconds=self.policy_seconds,
        embed_calls=self.embed_calls,
        embed_requests=self.embed_requests,
        embed_seconds=self.embed_seconds,
        wait_seconds=self.wait_seconds,
        rounds=self.rounds,
        exchange_seconds=self.exchange_seconds,
        wall_seconds=wall_seconds,
    )


def exit_text(process: Any, wait: bool = False) -> str:
  if wait:
    # Its pipe closes a moment before it exits.
    process.join(1.0)
  code = process.exitcode
  if code is None:
    return "closed its pipe"
  if code < 0:
    try:
      return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
      return f"was killed by signal {-code}"
  return f"died with exit code {code}"


def release(actor: ActorSlot) -> None:
  """Kills (if needed) and reaps an actor's process and closes its channels."""
  if actor.process is not None:
    if actor.process.is_alive():
      actor.process.kill()
    actor.process.join()
    actor.process.close()
  if actor.inbox is not None:
    # Responses still queued for a dead actor must not keep the learner from exiting.
    actor.inbox.cancel_join_thread()
    actor.inbox.close()
  if actor.conn is not None:
    actor.conn.close()
  actor.process = actor.inbox = actor.conn = None
  actor.hello = None
  actor.cancelling = False
  actor.live, actor.owed = {}, 0


def shutdown(actors: list[ActorSlot]) -> None:
  for actor in actors:
    if actor.process is not None and actor.process.is_alive():
      try:
        actor.inbox.put(STOP)
      except (OSError, ValueError):
        pass
  deadline = time.monotonic() + CLOSE_GRACE_S
  for actor in actors:
    if actor.process is not None:
      actor.process.join(max(0.0, deadline - time.monotonic()))
    release(actor)
