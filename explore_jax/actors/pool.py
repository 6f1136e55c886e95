"""ActorPool: the learner's side of the actors -- episodes out, prompts in, one batched policy call at a time.

  with ActorPool(num_actors=2, tokenizer_dir=d, prompt_hook=hook, envs_per_actor=4) as pool:
    results, metrics = pool.run(episode_specs, policy_fn)  # policy_fn(list[PromptRequest]) -> list[Response]
    # A hook with embedding_texts needs the learner's encoder too:
    results, metrics = pool.run(episode_specs, policy_fn, embed_fn)  # (list[EmbedRequest]) -> [array [n, E]]

`run` hands each actor up to `envs_per_actor` episodes (the least loaded first, another as one finishes),
then loops: block until some actor says something, drain whatever else has arrived, call `embed_fn` once
on every pending EmbedRequest and then `policy_fn` once on every pending PromptRequest of every actor
(central inference: one encoder call, one sampler call), and send each answer back to the actor that
asked. Embeddings go out first, so those actors build their prompts while `policy_fn` samples. Actors
step their environments while `policy_fn` samples for the others. Final requests (PromptRequest.final,
from a hook's final_prompt) go to `policy_fn` with the others. Results come back sorted by episode_id,
whatever the timing.

Streaming. A `policy_fn` that also has `submit(requests)`, `advance() -> responses` and `busy`
(train/inference.py's StreamingPolicy, rollout.batching = "streaming") is fed as requests arrive instead: each
loop submits what has come in (waiting for a first message only while the policy is idle), runs one round of
the policy's decoding while it is busy, and hands every response done in that round to its actor at once, so
an actor whose environment steps fast is not held by the slowest row. Multi-process runs keep their rounds.

Transport. Each actor process has its own two channels, so no death can damage another actor's: a
spawn-context Queue to it (its feeder thread means the learner never blocks on a slow or hung actor) and
a one-way Pipe back (one writer per pipe: a process killed halfway through a message ruins only its own
pipe, which is thrown away with it). The learner waits on every pipe and every process sentinel at once
(multiprocessing.connection.wait), so it sees a death the moment it happens.

Faults. An actor that dies, or that sends nothing for `episode_timeout_s` while it has work in hand (a
spec, a response or embeddings it has not answered; time the actor spends waiting for `policy_fn` or
`embed_fn` never counts), is killed and replaced by a fresh process with the same actor_id. Results it
sent before are kept; its unfinished episodes come back dropped (`EpisodeResult.error` says why, no
steps) and are never retried here: the caller decides. An environment or a prompt hook that raises drops
only its episode (the actor sends the error). More than `max_restarts` replacements in one run raise
RuntimeError, as does an actor that cannot start. When `run` raises (that, an exception from `policy_fn`
or `embed_fn`, or an EmbedRequest when there is no `embed_fn`), the actors abandon the run's episodes
(CancelEpisodes) and the pool serves the next run with the same processes.

Multi-process runs. In a multi-host run every process has its own pool (its own actors on its own host)
and the sampler is one SPMD program: every process must call `policy_fn` and `embed_fn` with the same
requests, in the same order, the same number of times. A pool given an `exchange` (an object with
process_index, process_count and allgather(obj) -> [each process's obj], e.g. explore_jax/parallel/
exchange.py's ProcessExchange; the pool itself stays free of jax) plays only its process's share of the
specs, the specs at positions i with i % process_count == process_index (so every process plays about 1/P
of every task group), and runs in rounds:

  1. hand out specs and collect what its own actors asked for (as above, but waiting at most
     `round_wait_s` for a first message: other processes may be waiting on this one);
  2. exchange the pending requests and a "my share is finished" flag with every process (allgather);
  3. call `embed_fn` and then `policy_fn` on the union of every process's requests, sorted by
     (episode_id, step) (so every process makes the same calls), and hand its own actors their answers.

The rounds end when every share is finished (no request can then be pending anywhere). The results are
then exchanged, so every process returns all of them (and calls `on_result` for another process's results
once its own are all in), and the metrics count every process's episodes, drops and restarts. A sample
is keyed by (episode, step) (train/inference.py), so it does not depend on which process or round asked.
Restarts, hang deadlines and dropped episodes stay local to each process; an exception in one process's
collection (more than `max_restarts`, a misbehaving actor) travels with its round, and every process
raises. Without an exchange (or with one process) `run` is exactly the single-process loop above.

Spawned processes import the main module again (the usual `if __name__ == "__main__":` guard applies),
and everything the prompt hook and the environments import: keep jax out of those modules. Each actor
reports whether jax got loaded (`actor_info()`), and the pool warns when it did.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import pickle
import time
import warnings
import weakref
from multiprocessing import connection
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import numpy as np

from explore_jax.actors.actor import ActorConfig, actor_main
from explore_jax.actors.protocol import (ActorFailure, ActorHello, CancelEpisodes, EmbedRequest,
                                         Embeddings, EpisodeResult, EpisodesCancelled, EpisodeSpec, PromptHook,
                                         PromptRequest, Response)
from explore_jax.actors.pool_state import (ActorSlot, Exchange, Round, RunState, Share, exit_text, release,
                                           shutdown)
from explore_jax.images import ImageLayout

PolicyFn = Callable[[list[PromptRequest]], Sequence[Response]]
# One array [len(request.texts), E] per request, in the order of the requests.
EmbedFn = Callable[[list[EmbedRequest]], Sequence[np.ndarray]]
# What actors ask the learner for, with the actor and the incarnation of its process that asked (no actor:
# another process's actors asked; the answer is theirs).
_Asked = tuple[Union[PromptRequest, EmbedRequest], Optional["ActorSlot"], int]


class ActorPool:
  """Actor processes that play episodes; `run` drives them with a central, batched policy.

  Args:
    num_actors: actor processes.
    tokenizer_dir: a local directory with a Hugging Face tokenizer (the policy's).
    prompt_hook: the method's prompt builder (protocol.PromptHook; picklable, importable without jax).
    envs_per_actor: live episodes one actor interleaves.
    kept_env_settings: how many environment settings (env id and kwargs) each actor keeps idle instances of,
      envs_per_actor of each (2: training's and evaluation's; an evaluation then starts no environment again,
      for twice the idle environments' memory).
    env_threads: how many resets and steps an actor makes at once, on threads, for environments that declare
      their instances independent (actors/actor.py; ALFWorld, ScienceWorld, TWX); 0: envs_per_actor, 1: one after another. The
      episodes do not change.
    max_prompt_tokens: longer prompts keep their last this-many tokens (counted in the metrics).
    request_timeout_s: an actor whose request waits longer than this for its answer takes the learner for
      gone and exits (None: wait as long as the learner lives); must exceed the slowest policy_fn (and
      embed_fn) call.
    episode_timeout_s: an actor silent this long while it has work in hand is hung: killed and replaced.
    max_restarts: actor replacements allowed in one run before it raises RuntimeError.
    start_timeout_s: how long a (re)started actor may take to load the tokenizer and say hello.
    batch_wait_s: after the first request of a batch, how long to wait for more while actors are busy
      (0: take what has arrived; larger batches, less overlap; inf: until no actor owes an answer, i.e.
      lock-step rounds, still bounded by episode_timeout_s for a hung actor).
    image_layout: how a vision-language policy lays images out (explore_jax/images.py); prompts with images
      need it.
    exchange: in a multi-process run, the allgather among the processes (module docstring: each pool plays
      its share, and the policy calls are collective rounds); None for one process.
    round_wait_s: with an exchange, how long a round waits for this process's actors' first message.
  """

  def __init__(self, num_actors: int, tokenizer_dir: str, prompt_hook: PromptHook, envs_per_actor: int = 4,
               max_prompt_tokens: int = 2048, request_timeout_s: Optional[float] = None,
               episode_timeout_s: float = 60.0, max_restarts: int = 3, start_timeout_s: float = 120.0,
               batch_wait_s: float = 0.0, image_layout: Optional[ImageLayout] = None,
               exchange: Optional[Exchange] = None, round_wait_s: float = 0.05, kept_env_settings: int = 1,
               env_threads: int = 0):
    for name, value, low in (("num_actors", num_actors, 1), ("envs_per_actor", envs_per_actor, 1),
                             ("kept_env_settings", kept_env_settings, 1), ("env_threads", env_threads, 0),
                             ("max_prompt_tokens", max_prompt_tokens, 1), ("max_restarts", max_restarts, 0)):
      if value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}")
    for name, value in (("episode_timeout_s", episode_timeout_s), ("start_timeout_s", start_timeout_s),
                        ("request_timeout_s", request_timeout_s)):
      if value is not None and value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    for name, value in (("batch_wait_s", batch_wait_s), ("round_wait_s", round_wait_s)):
      if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    if exchange is not None and not 0 <= exchange.process_index < exchange.process_count:
      raise ValueError(f"exchange.process_index {exchange.process_index} is not one of its "
                       f"{exchange.process_count} processes")
    if not os.path.isdir(tokenizer_dir):
      raise FileNotFoundError(f"tokenizer directory {tokenizer_dir} does not exist")
    self.envs_per_actor = envs_per_actor
    self.episode_timeout_s = episode_timeout_s
    self.start_timeout_s = start_timeout_s
    self.max_restarts = max_restarts
    self.batch_wait_s = batch_wait_s
    self.round_wait_s = round_wait_s
    self._exchange = exchange if exchange is not None and exchange.process_count > 1 else None
    self._configs = [ActorConfig(i, os.path.abspath(tokenizer_dir), prompt_hook, envs_per_actor,
                                 max_prompt_tokens, request_timeout_s, image_layout, kept_env_settings,
                                 env_threads or envs_per_actor)
                     for i in range(num_actors)]
    self._ctx = multiprocessing.get_context("spawn")
    self._actors = [ActorSlot(i) for i in range(num_actors)]
    self._warned_jax = False
    # Actors are stopped even when the pool is dropped without close(), or at interpreter exit.
    self._finalizer = weakref.finalize(self, shutdown, self._actors)
    try:
      for actor in self._actors:
        self._spawn(actor)
      while not all(actor.ready for actor in self._actors):
        self._poll(None, self._next_timeout())
    except BaseException:
      self.close()
      raise

  # ---- public -----------------------------------------------------------------------------------------

  def actor_pids(self) -> list[Optional[int]]:
    """The process id of each actor slot (None while a slot has no process)."""
    return [None if a.process is None else a.process.pid for a in self._actors]

  def actor_info(self) -> list[Optional[ActorHello]]:
    """What each current actor process reported when it started (None until it has)."""
    return [a.hello for a in self._actors]

  def run(self, episode_specs: Iterable[EpisodeSpec], policy_fn: PolicyFn, embed_fn: Optional[EmbedFn] = None,
          on_result: Optional[Callable[[EpisodeResult], None]] = None
          ) -> tuple[list[EpisodeResult], dict[str, float]]:
    """Plays every episode to its end or drops it; returns the results by episode_id and the metrics.

    `embed_fn` answers the EmbedRequests of a prompt hook with embedding_texts; without one, such a
    request raises ValueError. `on_result` is called with each result as it arrives (a progress bar).
    With an exchange, every process passes the same specs, plays its share and returns all results.
    """
    if not self._finalizer.alive:
      raise RuntimeError("the ActorPool is closed")
    specs = list(episode_specs)
    ids = [spec.episode_id for spec in specs]
    if len(set(ids)) != len(ids):
      raise ValueError(f"episode ids must be unique in a run, got duplicates "
                       f"{sorted(i for i, n in collections.Counter(ids).items() if n > 1)}")
    exchange = self._exchange
    run = RunState(specs if exchange is None else specs[exchange.process_index::exchange.process_count], on_result)
    start = time.monotonic()
    try:
      self._revive(run)
      if exchange is None and callable(getattr(policy_fn, "submit", None)):
        self._stream(run, policy_fn, embed_fn)
      elif exchange is None:
        while run.unfinished:
          self._assign(run)
          batch = self._collect(run)
          if batch:
            self._answer(run, batch, policy_fn, embed_fn)
      else:
        self._rounds(run, policy_fn, embed_fn)
    except BaseException:
      # Actors holding episodes of this run would answer into the next one.
      self._abort()
      raise
    if exchange is not None:
      self._gather_results(run, len(specs))
    results = [run.results[i] for i in sorted(run.results)]
    return results, run.metrics(time.monotonic() - start)

  def close(self) -> None:
    """Stops every actor (STOP, then a kill after a grace period) and reaps the processes."""
    self._finalizer()

  def __enter__(self) -> "ActorPool":
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()

  # ---- processes --------------------------------------------------------------------------------------

  def _spawn(self, actor: ActorSlot) -> None:
    inbox = self._ctx.Queue()
    reader, writer = self._ctx.Pipe(duplex=False)
    process = self._ctx.Process(target=actor_main, args=(self._configs[actor.actor_id], inbox, writer),
                                name=f"explore_jax-actor-{actor.actor_id}", daemon=True)
    try:
      process.start()
    except BaseException:
      inbox.close()
      reader.close()
      raise
    finally:
      writer.close()  # the child's copy is the only writer left, so its death reads as EOF here
    actor.process, actor.inbox, actor.conn = process, inbox, reader
    actor.hello = actor.failure = None
    actor.cancelling = False
    actor.incarnation += 1
    actor.started_at = actor.last_progress = time.monotonic()
    actor.live, actor.owed = {}, 0

  def _replace(self, actor: ActorSlot, run: Optional[RunState], reason: str) -> None:
    """Kills an actor's process, keeps what it managed to send, drops the rest, starts a new one."""
    process = actor.process
    if process.is_alive():
      process.kill()
    process.join()
    self._drain(actor, run)
    # An actor that explains why it cannot start would fail the same way again; outside a run there is
    # no restart budget to spend on one that just died.
    if actor.hello is None and (actor.failure is not None or run is None):
      failure = actor.failure or f"exit code {process.exitcode} (its stderr may say why)"
      release(actor)
      raise RuntimeError(f"actor {actor.actor_id} failed to start: {failure}")
    detail = reason + (f"; it reported: {actor.failure}" if actor.failure else "")
    live = list(actor.live.values())
    release(actor)
    if run is not None:
      for spec in live:
        run.drop(spec, f"dropped: {detail}", actor.actor_id)
      run.restarts += 1
      if run.restarts > self.max_restarts:
        raise RuntimeError(f"actors were replaced {run.restarts} times in this run, more than "
                           f"max_restarts={self.max_restarts}; the last time: {detail}")
    self._spawn(actor)

  def _revive(self, run: RunState) -> None:
    """Gives every slot a live process before a run (after an aborted run, or a death between runs)."""
    for actor in self._actors:
      if actor.process is None:
        self._spawn(actor)
      elif not actor.process.is_alive():
        self._replace(actor, run, f"actor {actor.actor_id} {exit_text(actor.process)} between runs")

  def _abort(self) -> None:
    """After a failed run: actors drop its episodes (a hung one is caught by the usual deadline)."""
    for actor in self._actors:
      if actor.process is not None and actor.hello is not None and not actor.cancelling and (
          actor.live or actor.owed):
        actor.live, actor.owed = {}, 0
        actor.cancelling = True
        self._hand_over(actor, CancelEpisodes())

  # ---- the loop ---------------------------------------------------------------------------------------

  def _assign(self, run: RunState) -> None:
    while run.pending:
      free = [a for a in self._actors if a.ready and len(a.live) < self.envs_per_actor]
      if not free:
        return
      actor = min(free, key=lambda a: (len(a.live), a.actor_id))
      spec = run.pending.popleft()
      actor.live[spec.episode_id] = spec
      self._hand_over(actor, spec)

  def _collect(self, run: RunState, wait_s: Optional[float] = None, window: bool = True) -> list[_Asked]:
    """Blocks for the first message (at most `wait_s`, None: until one comes or a deadline is due), then
    takes whatever else has arrived (within batch_wait_s, when `window`)."""
    timeout = self._next_timeout()
    if wait_s is not None:
      timeout = wait_s if timeout is None else min(timeout, wait_s)
    batch, _ = self._poll(run, timeout)
    window_end = None
    while True:
      timeout = 0.0
      if batch and window_end is None:
        window_end = time.monotonic() + self.batch_wait_s
      # More requests can only come from actors that still owe an answer.
      if window and batch and self.batch_wait_s > 0 and any(a.owed for a in self._actors if a.ready):
        timeout = max(0.0, window_end - time.monotonic())
        next_deadline = self._next_timeout()
        timeout = timeout if next_deadline is None else min(timeout, next_deadline)
      more, arrived = self._poll(run, timeout)
      batch += more
      if not arrived:
        return [(req, a, inc) for req, a, inc in batch if a.incarnation == inc and req.episode_id in a.live]

  def _answer(self, run: RunState, batch: list[_Asked], policy_fn: PolicyFn, embed_fn: Optional[EmbedFn]) -> None:
    prompts = self._embed_first(run, batch, embed_fn)
    if prompts:
      self._sample(run, prompts, policy_fn)

  def _embed_first(self, run: RunState, batch: list[_Asked], embed_fn: Optional[EmbedFn]) -> list[_Asked]:
    """Answers the batch's EmbedRequests and returns its PromptRequests, both in a canonical order: what the
    policy sees does not depend on which actor spoke first."""
    batch.sort(key=lambda entry: (entry[0].episode_id, entry[0].step))
    embeds = [entry for entry in batch if isinstance(entry[0], EmbedRequest)]
    if embeds:
      self._embed(run, embeds, embed_fn)
    return [entry for entry in batch if isinstance(entry[0], PromptRequest)]

  def _stream(self, run: RunState, policy: Any, embed_fn: Optional[EmbedFn]) -> None:
    """The single-process loop with a streaming policy (module docstring): prompts go into the policy as they
    arrive, and each response back to its actor as soon as it is done, while the policy decodes the others."""
    asked: dict[tuple[int, int], tuple[ActorSlot, int]] = {}
    while run.unfinished:
      self._assign(run)
      # While the policy decodes, take only what has arrived: the next round of decoding is what waits.
      batch = self._collect(run, 0.0 if policy.busy else None, window=not policy.busy)
      prompts = self._embed_first(run, batch, embed_fn)
      if prompts:
        policy.submit([req for req, _, _ in prompts])
        asked.update({(req.episode_id, req.step): (actor, incarnation) for req, actor, incarnation in prompts})
        run.requests += len(prompts)
      if not policy.busy:
        continue
      start = time.monotonic()
      responses = list(policy.advance())
      run.policy_seconds += time.monotonic() - start
      run.policy_calls += 1
      run.max_batch = max(run.max_batch, len(asked))
      for response in responses:
        key = (response.episode_id, response.step)
        if key not in asked:
          raise ValueError(f"the streaming policy answered (episode, step) {key}, which was not asked")
        actor, incarnation = asked.pop(key)
        # The actor may have been replaced while the policy ran; its episodes are dropped already.
        if actor.incarnation == incarnation and response.episode_id in actor.live:
          self._hand_over(actor, response)

  def _rounds(self, run: RunState, policy_fn: PolicyFn, embed_fn: Optional[EmbedFn]) -> None:
    """The multi-process loop (module docstring): collect locally, exchange, answer the union everywhere."""
    exchange = self._exchange
    while True:
      asked: list[_Asked] = []
      failure: Optional[Exception] = None
      try:
        self._assign(run)
        # A finished share has nothing to wait for: it only joins the others' rounds.
        asked = self._collect(run, self.round_wait_s if run.unfinished else 0.0)
      except Exception as e:  # every process must hear of it, or the others would wait in the next round
        failure = e
      start = time.monotonic()
      views = exchange.allgather(Round(requests=[req for req, _, _ in asked], finished=not run.unfinished,
                                        error=None if failure is None else f"{type(failure).__name__}: {failure}"))
      run.exchange_seconds += time.monotonic() - start
      run.rounds += 1
      if failure is not None:
        raise failure
      for index, view in enumerate(views):
        if view.error is not None:
          raise RuntimeError(f"process {index} of {len(views)} failed in this run: {view.error}")
      others = [(req, None, 0) for index, view in enumerate(views) if index != exchange.process_index
                for req in view.requests]
      if not asked and not others and all(view.finished for view in views):
        return
      if asked or others:
        self._answer(run, asked + others, policy_fn, embed_fn)

  def _gather_results(self, run: RunState, total: int) -> None:
    """After the rounds: every process's results (and fault counters) in this process's run too."""
    exchange = self._exchange
    shares = exchange.allgather(Share(list(run.results.values()), run.restarts, run.actor_drops))
    for index, share in enumerate(shares):
      if index != exchange.process_index:
        for result in share.results:
          run.finish(result)
    run.total = total
    run.restarts = sum(share.restarts for share in shares)
    run.actor_drops = sum(share.actor_drops for share in shares)

  def _embed(self, run: RunState, batch: list[_Asked], embed_fn: Optional[EmbedFn]) -> None:
    requests = [req for req, _, _ in batch]
    if embed_fn is None:
      raise ValueError(f"actors asked for embeddings (the prompt hook defines embedding_texts) of episodes "
                       f"{sorted({r.episode_id for r in requests})}, but run() got no embed_fn")
    start = time.monotonic()
    vectors = list(embed_fn(requests))
    run.embed_seconds += time.monotonic() - start
    run.embed_calls += 1
    run.embed_requests += len(requests)
    if len(vectors) != len(requests):
      raise ValueError(f"embed_fn must return one array per EmbedRequest: got {len(vectors)} for {len(requests)}")
    vectors = [np.asarray(rows, np.float32) for rows in vectors]
    for req, rows in zip(requests, vectors):
      if rows.ndim != 2 or rows.shape[0] != len(req.texts):
        raise ValueError(f"embed_fn must return an array [len(texts), E] per EmbedRequest: episode {req.episode_id} "
                         f"step {req.step} asked for {len(req.texts)} texts, got shape {rows.shape}")
    for (req, actor, incarnation), rows in zip(batch, vectors):
      # As for responses: a replaced actor's episodes are dropped already.
      if actor is not None and actor.incarnation == incarnation and req.episode_id in actor.live:
        self._hand_over(actor, Embeddings(req.episode_id, req.step, rows))

  def _sample(self, run: RunState, batch: list[_Asked], policy_fn: PolicyFn) -> None:
    requests = [req for req, _, _ in batch]
    start = time.monotonic()
    responses = list(policy_fn(requests))
    run.policy_seconds += time.monotonic() - start
    run.policy_calls += 1
    run.requests += len(requests)
    run.max_batch = max(run.max_batch, len(requests))
    by_key = {(r.episode_id, r.step): r for r in responses}
    wanted = [(r.episode_id, r.step) for r in requests]
    if len(responses) != len(requests) or set(by_key) != set(wanted):
      raise ValueError(f"policy_fn must return one Response per PromptRequest (same episode_id and step): "
                       f"asked {sorted(wanted)}, got {sorted((r.episode_id, r.step) for r in responses)}")
    for req, actor, incarnation in batch:
      # The actor may have been replaced while the policy ran; its episodes are dropped already.
      if actor is not None and actor.incarnation == incarnation and req.episode_id in actor.live:
        self._hand_over(actor, by_key[(req.episode_id, req.step)])

  def _hand_over(self, actor: ActorSlot, message: Any) -> None:
    if actor.owed == 0:
      actor.last_progress = time.monotonic()  # the silence clock starts now, not at its last message
    actor.owed += 1
    actor.inbox.put(message)

  def _next_timeout(self) -> Optional[float]:
    """Seconds until the nearest start or hang deadline (None: nothing is due)."""
    deadlines = []
    for a in self._actors:
      if a.process is None:
        continue
      if a.hello is None:
        deadlines.append(a.started_at + self.start_timeout_s)
      elif a.owed:
        deadlines.append(a.last_progress + self.episode_timeout_s)
    return None if not deadlines else max(0.0, min(deadlines) - time.monotonic())

  def _poll(self, run: Optional[RunState], timeout: Optional[float]) -> tuple[list[_Asked], int]:
    """Waits up to `timeout`, handles messages, deaths and deadlines; -> (requests, channels that spoke)."""
    watched = {}
    for a in self._actors:
      if a.process is not None:
        watched[a.conn] = a
        watched[a.process.sentinel] = a
    start = time.monotonic()
    ready = connection.wait(list(watched), timeout)
    if run is not None and timeout != 0:
      run.wait_seconds += time.monotonic() - start
    batch: list[_Asked] = []
    dead: dict[int, ActorSlot] = {}
    for obj in ready:
      actor = watched[obj]
      if obj is actor.conn:
        if not self._read(actor, run, batch):
          dead[actor.actor_id] = actor
      else:
        dead[actor.actor_id] = actor
    for actor in dead.values():
      self._replace(actor, run, f"actor {actor.actor_id} (pid {actor.process.pid}) "
                    f"{exit_text(actor.process, wait=True)}")
    self._check_deadlines(run)
    return batch, len(ready)

  def _read(self, actor: ActorSlot, run: Optional[RunState], batch: list) -> bool:
    """Handles every message waiting on an actor's pipe; False when the pipe has closed (it died)."""
    try:
      while actor.conn.poll():
        self._on_message(actor, actor.conn.recv(), run, batch)
    except (EOFError, OSError, pickle.UnpicklingError):
      return False
    return True

  def _drain(self, actor: ActorSlot, run: Optional[RunState]) -> None:
    """Reads the complete messages a dead actor left (its finished results count; requests do not)."""
    self._read(actor, run, [])

  def _on_message(self, actor: ActorSlot, message: Any, run: Optional[RunState], batch: list) -> None:
    actor.last_progress = time.monotonic()
    if isinstance(message, ActorHello):
      actor.hello = message
      if message.jax_imported and not self._warned_jax:
        self._warned_jax = True
        warnings.warn(f"actor {message.actor_id} imported jax: the prompt hook, the environments or the main "
                      f"module import it at module level", RuntimeWarning, stacklevel=2)
    elif isinstance(message, ActorFailure):
      actor.failure = message.error
    elif actor.cancelling:
      if isinstance(message, EpisodesCancelled):
        actor.cancelling = False
        actor.owed -= 1
    elif isinstance(message, (PromptRequest, EmbedRequest, EpisodeResult)):
      episode_id = message.spec.episode_id if isinstance(message, EpisodeResult) else message.episode_id
      if episode_id not in actor.live:
        raise RuntimeError(f"actor {actor.actor_id} sent a {type(message).__name__} for episode {episode_id}, "
                           f"which it does not hold")
      # A request hands the work back to the learner: the actor owes nothing for it until it is answered.
      actor.owed -= 1
      if not isinstance(message, EpisodeResult):
        batch.append((message, actor, actor.incarnation))
      else:
        del actor.live[episode_id]
        run.finish(message)
    else:
      raise RuntimeError(f"actor {actor.actor_id} sent an unknown message {type(message).__name__}")

  def _check_deadlines(self, run: Optional[RunState]) -> None:
    now = time.monotonic()
    for actor in self._actors:
      if actor.process is None:
        continue
      if actor.hello is None and now - actor.started_at > self.start_timeout_s:
        release(actor)
        raise RuntimeError(f"actor {actor.actor_id} did not start within start_timeout_s={self.start_timeout_s} s")
      if actor.hello is not None and actor.owed and now - actor.last_progress > self.episode_timeout_s:
        self._replace(actor, run, f"actor {actor.actor_id} (pid {actor.process.pid}) hung: nothing from it for "
                      f"{now - actor.last_progress:.1f} s with work in hand (episode_timeout_s="
                      f"{self.episode_timeout_s}); it was killed")
