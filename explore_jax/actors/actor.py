"""The actor process: it holds environments, builds and tokenises prompts, and steps on the learner's answers.

An actor is started by `ActorPool` with the multiprocessing spawn context and never imports jax: its
work is Python (environments, prompt hooks, the Hugging Face tokenizer), and a jax import would cost
every actor seconds and memory for nothing. `actor_main` is the process; `Actor` is its event loop
without any process around it, so it can also be driven in-process.

An actor interleaves up to `envs_per_actor` episodes. It handles messages in arrival order: a spec resets
an environment and asks for the first action; a response is decoded, steps its environment and either
asks for the next action or finishes the episode. While one episode waits for the learner the others
reset, step and ask. The learner answers a round's requests together, so they arrive together: the
resets and steps of such a run of messages go out at once, on `env_threads` threads, to environments
that declare their instances independent (`metadata["concurrent_instances"]`: each holds its own game
process, as ALFWorld's do, or its own JVM, as ScienceWorld's and TextWorld-Express's), and everything
else (prompts, records, messages out) follows in arrival order, so the episodes and what the learner
hears are those of one call after another.

Asking is one or two round trips: when the prompt hook has `embedding_texts`, the actor first asks for
their embeddings and builds the prompt once they arrive. Finishing is one more when the hook has a
`final_prompt`: its environment goes back to the cache, the final prompt is sampled, and the decoded text
travels with the finished episode. An exception from an environment or a prompt hook
(any of its parts) drops that episode only (the error text travels in its EpisodeResult); an environment
that raised is closed, never reused.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import queue
import sys
import time
import traceback
from typing import Any, Callable, Iterable, Iterator, Optional

import gymnasium
import numpy as np

from explore_jax.actors.protocol import (STOP, ActorFailure, ActorHello, CancelEpisodes, EmbedRequest,
                                         Embeddings, EpisodeResult, EpisodesCancelled, EpisodeSpec, Prompt,
                                         PromptHook, PromptRequest, Response, StepRecord, as_prompt)
from explore_jax.envs.base import state_key as observation_key
from explore_jax.images import IMAGE, ImageLayout

# How often an idle actor checks that its learner is still there.
_POLL_S = 1.0
# Error texts keep the end of the traceback, where the failing frame is.
_MAX_ERROR_CHARS = 4000


@dataclasses.dataclass(frozen=True)
class ActorConfig:
  """Everything an actor process needs (picklable: it crosses the spawn boundary)."""
  actor_id: int
  tokenizer_dir: str
  prompt_hook: PromptHook
  envs_per_actor: int = 4
  max_prompt_tokens: int = 2048
  request_timeout_s: Optional[float] = None  # exit when a request waits longer than this for its answer
  image_layout: Optional[ImageLayout] = None  # how the model lays images out (vision-language policies)
  # Environment settings (env id and kwargs) whose idle instances the actor keeps, envs_per_actor of each: 2
  # keeps training's and evaluation's, so that a periodic evaluation neither starts its environments afresh
  # nor evicts training's (an ALFWorld environment is a process that takes seconds to start), for twice the
  # idle environments' memory.
  kept_env_settings: int = 1
  # How many environment calls (resets, steps) the actor makes at once for environments whose instances are
  # independent (module docstring); 1 makes them one after another. The episodes are the same either way.
  env_threads: int = 1


class PromptTooLong(ValueError):
  """A prompt with images does not fit max_prompt_tokens: an image cannot be cut."""


class PromptTokenizer:
  """Chat messages (and their images) -> prompt token ids (cut from the left to a budget, or the first of a hook's
  shorter forms that fits: encode_fitting); response token ids -> text."""

  def __init__(self, tokenizer: Any, max_prompt_tokens: int, image_layout: Optional[ImageLayout] = None):
    if max_prompt_tokens < 1:
      raise ValueError(f"max_prompt_tokens must be at least 1, got {max_prompt_tokens}")
    self.tokenizer = tokenizer
    self.max_prompt_tokens = max_prompt_tokens
    self.image_layout = image_layout

  @classmethod
  def from_dir(cls, directory: str, max_prompt_tokens: int, image_layout: Optional[ImageLayout] = None
               ) -> "PromptTokenizer":
    """The tokenizer saved in a local checkpoint directory (never the network; explore_jax/tokenization.py)."""
    # Imported here, not at module level, so the pool's process never pays for transformers.
    from explore_jax import tokenization

    return cls(tokenization.load_tokenizer(directory), max_prompt_tokens, image_layout)

  def resize(self, images: Any) -> tuple[np.ndarray, ...]:
    """The images at the size the model reads them (explore_jax/images.py)."""
    if len(images) and self.image_layout is None:
      raise ValueError("the prompt has images, but the policy is not a vision-language model (no image layout)")
    return tuple(self.image_layout.resize(image) for image in images)

  def encode(self, messages: list[dict[str, str]], images: tuple[np.ndarray, ...] = ()) -> tuple[list[int], int]:
    """(prompt ids, tokens cut): the chat template with the generation prompt, or the joined contents. Each
    images.IMAGE marker becomes the model's image tokens for the next of `images` (resized already); an image
    is never cut, so a prompt whose images do not fit the budget is an error."""
    layout = self.image_layout
    if images or any(IMAGE in m["content"] for m in messages):
      if layout is None:
        raise ValueError("the prompt has images, but the policy is not a vision-language model (no image layout)")
      placeholder = layout.placeholder(self.tokenizer)
      messages = [{**m, "content": m["content"].replace(IMAGE, placeholder)} for m in messages]
    ids, cut = self._encode_text(messages)
    if layout is None or not (images or layout.pad_id in ids):
      return ids, cut
    if cut:
      raise PromptTooLong(f"the prompt with its {len(images)} image(s) has more than {len(ids) + cut} tokens, "
                          f"more than max_prompt_tokens={self.max_prompt_tokens}: an image cannot be cut")
    ids = layout.expand(ids, images)
    if len(ids) > self.max_prompt_tokens:
      raise PromptTooLong(f"the prompt with its {len(images)} image(s) has {len(ids)} tokens, more than "
                          f"max_prompt_tokens={self.max_prompt_tokens}: an image cannot be cut")
    return ids, 0

  def encode_fitting(self, forms: Iterable[list[dict[str, str]]], images: tuple[np.ndarray, ...] = ()
                     ) -> tuple[list[int], int, int]:
    """(prompt ids, tokens cut, which form): the first of `forms` (message lists, longest first) whose prompt
    fits max_prompt_tokens whole, else the last one, cut as `encode` cuts it (an image prompt that fits in no
    form is an error, as in `encode`)."""
    last: Any = None  # the last form's outcome: (ids, cut, index), or the error of an image prompt too long
    for index, messages in enumerate(forms):
      try:
        ids, cut = self.encode(messages, images)
      except PromptTooLong as e:
        last = e
        continue
      if not cut:
        return ids, 0, index
      last = (ids, cut, index)
    if last is None:
      raise ValueError("no prompt form to encode")
    if isinstance(last, PromptTooLong):
      raise last
    return last

  def _encode_text(self, messages: list[dict[str, str]]) -> tuple[list[int], int]:
    if getattr(self.tokenizer, "chat_template", None):
      text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
      # The template writes its own special tokens (BOS included, where the model has one).
      ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
      ids = self.tokenizer("\n".join(m["content"] for m in messages))["input_ids"]
    ids = [int(i) for i in ids]
    cut = max(0, len(ids) - self.max_prompt_tokens)
    # The end of a prompt (the current observation, the generation prompt) is what the action depends on.
    return ids[cut:], cut

  def decode(self, tokens: Any) -> str:
    return self.tokenizer.decode([int(t) for t in tokens], skip_special_tokens=True)


def _forms(prompt: Prompt, notes: list[dict[str, Any]]) -> Iterator[list[dict[str, str]]]:
  """The messages of a prompt's forms (Prompt.forms), each form's notes appended to `notes` as it is tried."""
  for messages, form_notes in prompt.forms():
    notes.append(form_notes)
    yield messages


def _text_of(observation: Any) -> str:
  """An observation's text (a GUI world's Dict observation: its "text")."""
  return str(observation.get("text", "")) if isinstance(observation, dict) else str(observation)


def _state_key(ep: "_Episode") -> int:
  """The state key of the episode's current observation: the environment's own (info["state_key"]), else
  the observation's hash."""
  key = ep.info.get("state_key")
  return int(observation_key(ep.observation) if key is None else key)


def _env_key(env_id: str, env_kwargs: dict[str, Any]) -> tuple[str, str]:
  # kwargs may hold lists or nested dicts; their canonical JSON is hashable and equal for equal kwargs.
  return env_id, json.dumps(env_kwargs, sort_keys=True, default=repr)


class EnvCache:
  """Idle environment instances by (env_id, kwargs), reused across episodes; at most `capacity` kept."""

  def __init__(self, capacity: int):
    self.capacity = capacity
    self._idle: collections.OrderedDict[tuple[str, str], list[gymnasium.Env]] = collections.OrderedDict()
    self.created = 0

  def acquire(self, env_id: str, env_kwargs: dict[str, Any]) -> gymnasium.Env:
    key = _env_key(env_id, env_kwargs)
    idle = self._idle.get(key)
    if idle:
      env = idle.pop()
      if not idle:
        del self._idle[key]
      return env
    self.created += 1
    return gymnasium.make(env_id, **env_kwargs)

  def release(self, env_id: str, env_kwargs: dict[str, Any], env: gymnasium.Env) -> None:
    key = _env_key(env_id, env_kwargs)
    self._idle.setdefault(key, []).append(env)
    self._idle.move_to_end(key)
    while sum(len(envs) for envs in self._idle.values()) > self.capacity:
      oldest_key, oldest = next(iter(self._idle.items()))
      discard(oldest.pop(0))
      if not oldest:
        del self._idle[oldest_key]

  def close(self) -> None:
    for envs in self._idle.values():
      for env in envs:
        discard(env)
    self._idle.clear()


def discard(env: gymnasium.Env) -> None:
  """Closes an environment whose state can no longer be trusted; a failing close changes nothing."""
  try:
    env.close()
  except Exception:  # the instance is being thrown away either way
    pass


def _error_text(where: str, error: BaseException) -> str:
  text = f"{where} raised {type(error).__name__}: {error}\n" + "".join(traceback.format_exception(error))
  return text if len(text) <= _MAX_ERROR_CHARS else text[:200] + "\n...\n" + text[-(_MAX_ERROR_CHARS - 205):]


# What a live episode waits for from the learner (every live episode waits for one of them), or, while a
# run of messages is handled, for its environment.
_EMBEDDINGS, _RESPONSE, _FINAL, _ENV = "embeddings", "response", "final response", "environment call"


@dataclasses.dataclass
class _Episode:
  spec: EpisodeSpec
  env: Optional[gymnasium.Env]  # None once the episode is over and only its final response is awaited
  observation: str
  info: dict[str, Any]
  step: int = 0
  history: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  steps: list[StepRecord] = dataclasses.field(default_factory=list)
  prompt_ids: list[int] = dataclasses.field(default_factory=list)
  prompt_variants: dict[str, list[int]] = dataclasses.field(default_factory=dict)
  prompt_notes: dict[str, Any] = dataclasses.field(default_factory=dict)
  truncated_tokens: int = 0
  truncated_prompts: int = 0
  shortened_prompts: int = 0
  images: tuple[Any, ...] = ()  # the current prompt's images, resized
  awaiting: str = _RESPONSE
  requested_at: float = 0.0


@dataclasses.dataclass(frozen=True)
class _EnvCall:
  """An environment's reset or step (`call`, which may run on a worker thread) and what the actor does with
  its outcome (`then(value, error)`, on the actor's thread, in arrival order). No `env`: nothing to call."""
  env: Optional[gymnasium.Env]
  call: Callable[[], Any]
  then: Callable[[Any, Optional[Exception]], None]

  @classmethod
  def later(cls, then: Callable[[], None]) -> "_EnvCall":
    """No environment call: only `then`, in its turn."""
    return cls(None, lambda: None, lambda value, error: then())

  def run(self) -> tuple[Any, Optional[Exception]]:
    try:
      return self.call(), None
    except Exception as e:
      return None, e


def concurrent_instances(env: gymnasium.Env) -> bool:
  """Whether `env` declares that its instances may be reset and stepped from several threads at once."""
  return bool(getattr(env, "metadata", None) and env.metadata.get("concurrent_instances", False))


class Actor:
  """One actor's live episodes: `handle` reacts to a learner message, `send` carries the answers out."""

  def __init__(self, config: ActorConfig, tokenizer: PromptTokenizer, send: Callable[[Any], None]):
    self.config = config
    self.tokenizer = tokenizer
    self.send = send
    self.envs = EnvCache(config.envs_per_actor * config.kept_env_settings)
    self.episodes: dict[int, _Episode] = {}
    if config.env_threads < 1:
      raise ValueError(f"env_threads must be at least 1, got {config.env_threads}")
    self._threads = None if config.env_threads == 1 else concurrent.futures.ThreadPoolExecutor(
        config.env_threads, thread_name_prefix=f"actor{config.actor_id}-env")

  def oldest_request(self) -> Optional[float]:
    """When the longest-waiting request (prompt or embedding) was sent (time.monotonic), or None if none waits."""
    return min((ep.requested_at for ep in self.episodes.values()), default=None)

  def handle_all(self, messages: list[Any]) -> None:
    """Handles `messages` in order, as `handle` would one by one; the environment calls of each run of specs
    and responses go out together (module docstring)."""
    calls: list[_EnvCall] = []
    for message in messages:
      if isinstance(message, (EpisodeSpec, Response)):
        calls.append(self._start_call(message) if isinstance(message, EpisodeSpec) else self._step_call(message))
      else:
        self._make(calls)
        calls = []
        self.handle(message)
    self._make(calls)

  def handle(self, message: Any) -> None:
    if isinstance(message, (EpisodeSpec, Response)):
      self.handle_all([message])
    elif isinstance(message, Embeddings):
      self._embedded(message)
    elif isinstance(message, CancelEpisodes):
      cancelled = tuple(self.episodes)
      for ep in self.episodes.values():
        # Mid-episode but sound: the next episode's reset starts it afresh.
        if ep.env is not None:
          self.envs.release(ep.spec.env_id, ep.spec.env_kwargs, ep.env)
      self.episodes.clear()
      self.send(EpisodesCancelled(self.config.actor_id, cancelled))
    else:
      raise TypeError(f"actor {self.config.actor_id} cannot handle a {type(message).__name__}")

  def close(self) -> None:
    for ep in self.episodes.values():
      if ep.env is not None:
        discard(ep.env)
    self.episodes.clear()
    self.envs.close()
    if self._threads is not None:
      self._threads.shutdown(wait=True)

  def _make(self, calls: list[_EnvCall]) -> None:
    """Makes the environment calls (concurrently where allowed), then finishes each in order."""
    if self._threads is None or sum(concurrent_instances(c.env) for c in calls) < 2:
      outcomes = [c.run() for c in calls]
    else:
      futures = {i: self._threads.submit(c.run) for i, c in enumerate(calls) if concurrent_instances(c.env)}
      outcomes = [futures[i].result() if i in futures else c.run() for i, c in enumerate(calls)]
    for c, (value, error) in zip(calls, outcomes):
      c.then(value, error)

  def _start_call(self, spec: EpisodeSpec) -> _EnvCall:
    if spec.episode_id in self.episodes:
      raise ValueError(f"episode {spec.episode_id} is already running on actor {self.config.actor_id}")
    try:
      env = self.envs.acquire(spec.env_id, spec.env_kwargs)
    except Exception as e:
      error = _error_text(f"gymnasium.make({spec.env_id!r})", e)
      return _EnvCall.later(lambda: self._send_dropped(spec, error))
    ep = _Episode(spec, env, "", {}, awaiting=_ENV)
    # Held from now on, so that a second spec of the same id in this run of calls is refused too.
    self.episodes[spec.episode_id] = ep
    return _EnvCall(env, lambda: env.reset(seed=spec.seed, options=dict(spec.reset_options)),
                    lambda value, error: self._started(ep, value, error))

  def _started(self, ep: _Episode, value: Any, error: Optional[Exception]) -> None:
    if error is not None:
      del self.episodes[ep.spec.episode_id]
      discard(ep.env)
      self._send_dropped(ep.spec, _error_text("env.reset", error))
      return
    observation, info = value
    ep.observation, ep.info = observation, dict(info)
    self._ask(ep)

  def _ask(self, ep: _Episode) -> None:
    """Asks for the embeddings the hook wants for this step, or (none wanted) for the step's action."""
    embedding_texts = getattr(self.config.prompt_hook, "embedding_texts", None)
    if embedding_texts is not None:
      try:
        texts = list(embedding_texts(ep.observation, list(ep.history), ep.spec.context, ep.info))
      except Exception as e:
        self._drop(ep, _error_text("the prompt hook's embedding_texts", e), env_broken=False)
        return
      if texts:
        self._wait(ep, _EMBEDDINGS)
        self.send(EmbedRequest(ep.spec.episode_id, ep.step, texts, self.config.actor_id))
        return
    self._prompt(ep, ep.info)

  def _embedded(self, embeddings: Embeddings) -> None:
    ep = self._waiting(embeddings, _EMBEDDINGS)
    self._prompt(ep, {**ep.info, "embeddings": embeddings.vectors})

  def _prompt(self, ep: _Episode, info: dict[str, Any]) -> None:
    try:
      prompt = as_prompt(self.config.prompt_hook(ep.observation, list(ep.history), ep.spec.context, info))
      ep.images = self.tokenizer.resize(prompt.images)
      notes: list[dict[str, Any]] = []
      ep.prompt_ids, ep.truncated_tokens, form = self.tokenizer.encode_fitting(_forms(prompt, notes), ep.images)
      # Cut like the sampled prompt, so an update can score the response under either.
      ep.prompt_variants = {name: self.tokenizer.encode(messages, ep.images)[0]
                            for name, messages in prompt.variants.items()}
      ep.prompt_notes = dict(notes[form])
    except Exception as e:
      self._drop(ep, _error_text("the prompt hook or the tokenizer", e), env_broken=False)
      return
    ep.truncated_prompts += int(ep.truncated_tokens > 0)
    ep.shortened_prompts += int(form > 0)
    self._wait(ep, _RESPONSE)
    self.send(PromptRequest(ep.spec.episode_id, ep.step, ep.prompt_ids, self.config.actor_id, images=ep.images))

  def _wait(self, ep: _Episode, what: str) -> None:
    ep.awaiting = what
    ep.requested_at = time.monotonic()

  def _waiting(self, message: Any, what: str) -> _Episode:
    """The episode `message` answers; a message it does not wait for is the learner's bug, not the episode's."""
    ep = self.episodes.get(message.episode_id)
    if ep is None or ep.awaiting != what or message.step != ep.step:
      waiting = "nothing (this actor does not hold it)" if ep is None else f"step {ep.step}'s {ep.awaiting}"
      raise ValueError(f"actor {self.config.actor_id} got the {what} for episode {message.episode_id} step "
                       f"{message.step}, but that episode waits for {waiting}")
    return ep

  def _step_call(self, response: Response) -> _EnvCall:
    ep = self.episodes.get(response.episode_id)
    if ep is not None and ep.awaiting == _FINAL:
      self._waiting(response, _FINAL)
      ep.awaiting = _ENV  # answered: a second final response in this run of calls is refused
      return _EnvCall.later(lambda: self._finish(ep, response))
    ep = self._waiting(response, _RESPONSE)
    # Answered: a second response to this step in the same run of calls is refused.
    ep.awaiting = _ENV
    text = self.tokenizer.decode(response.tokens)
    env = ep.env
    return _EnvCall(env, lambda: env.step(text),
                    lambda value, error: self._stepped(ep, response, text, value, error))

  def _stepped(self, ep: _Episode, response: Response, text: str, value: Any, error: Optional[Exception]) -> None:
    if error is not None:
      self._drop(ep, _error_text("env.step", error), env_broken=True)
      return
    observation, reward, terminated, truncated, info = value
    done = bool(terminated or truncated)
    ep.steps.append(StepRecord(
        episode_id=ep.spec.episode_id, group_id=ep.spec.group_id, traj_id=ep.spec.traj_id, step_index=ep.step,
        actor_id=self.config.actor_id, prompt_ids=ep.prompt_ids, response=response, response_text=text,
        task_reward=float(reward),
        # An environment that does not grade the format is taken as never malformed.
        format_reward=float(info.get("format_reward", 1.0)),
        state_key=_state_key(ep),
        done=done, success=bool(info.get("success", False)), info=dict(info),
        truncated_tokens=ep.truncated_tokens, observation=ep.observation, prompt_variants=ep.prompt_variants,
        images=ep.images, prompt_notes=ep.prompt_notes))
    ep.history.append((ep.observation, text))
    ep.observation, ep.info = observation, dict(info)
    ep.step += 1
    if not done:
      self._ask(ep)
      return
    # The environment is no longer needed, whatever the final prompt does.
    self.envs.release(ep.spec.env_id, ep.spec.env_kwargs, ep.env)
    ep.env = None
    final_prompt = getattr(self.config.prompt_hook, "final_prompt", None)
    messages, truncated = None, 0
    if final_prompt is not None:
      try:
        messages = final_prompt(ep.observation, list(ep.history), ep.spec.context, ep.info)
        if messages is not None:
          final = as_prompt(messages)
          ep.prompt_ids, truncated, form = self.tokenizer.encode_fitting(m for m, _ in final.forms())
          ep.shortened_prompts += int(form > 0)
      except Exception as e:
        self._drop(ep, _error_text("the prompt hook's final_prompt or the tokenizer", e), env_broken=False)
        return
    if messages is None:
      self._finish(ep)
      return
    ep.truncated_prompts += int(truncated > 0)
    self._wait(ep, _FINAL)
    self.send(PromptRequest(ep.spec.episode_id, ep.step, ep.prompt_ids, self.config.actor_id, final=True))

  def _finish(self, ep: _Episode, final_response: Optional[Response] = None) -> None:
    del self.episodes[ep.spec.episode_id]
    self.send(EpisodeResult(
        spec=ep.spec, steps=ep.steps, success=ep.steps[-1].success,
        total_reward=sum(s.task_reward for s in ep.steps), feedback=str(ep.info.get("feedback", "")),
        actor_id=self.config.actor_id, truncated_prompts=ep.truncated_prompts,
        shortened_prompts=ep.shortened_prompts,
        final_text="" if final_response is None else self.tokenizer.decode(final_response.tokens),
        final_response=final_response, final_observation=_text_of(ep.observation),
        final_state_key=_state_key(ep)))

  def _drop(self, ep: _Episode, error: str, *, env_broken: bool) -> None:
    del self.episodes[ep.spec.episode_id]
    if ep.env is None:
      pass  # an episode that is over has given its environment back already
    elif env_broken:
      discard(ep.env)
    else:
      self.envs.release(ep.spec.env_id, ep.spec.env_kwargs, ep.env)
    self._send_dropped(ep.spec, error, ep.truncated_prompts, ep.shortened_prompts)

  def _send_dropped(self, spec: EpisodeSpec, error: str, truncated_prompts: int = 0,
                    shortened_prompts: int = 0) -> None:
    self.send(EpisodeResult(spec=spec, steps=[], success=False, total_reward=0.0, feedback="", error=error,
                            actor_id=self.config.actor_id, truncated_prompts=truncated_prompts,
                            shortened_prompts=shortened_prompts))


def actor_main(config: ActorConfig, inbox: Any, outbox: Any) -> None:
  """The actor process: say hello, then serve `inbox` (a Queue) until STOP, answering on `outbox` (a Connection)."""
  pid = os.getpid()
  try:
    import explore_jax.envs  # noqa: F401  (registers the environment ids)

    actor = Actor(config, PromptTokenizer.from_dir(config.tokenizer_dir, config.max_prompt_tokens,
                                                   config.image_layout), outbox.send)
    outbox.send(ActorHello(config.actor_id, pid, jax_imported="jax" in sys.modules))
  except BaseException as e:
    _report_failure(outbox, ActorFailure(config.actor_id, pid, _error_text("starting the actor", e)))
    sys.exit(1)
  try:
    failure = _serve(actor, inbox)
  except (BrokenPipeError, ConnectionResetError, EOFError):
    failure = None  # the learner closed our channels: nobody is left to tell
  except BaseException as e:
    failure = _error_text(f"actor {config.actor_id}", e)
  finally:
    actor.close()
  if failure is not None:
    _report_failure(outbox, ActorFailure(config.actor_id, pid, failure))
    sys.exit(1)


def _serve(actor: Actor, inbox: Any) -> Optional[str]:
  """Handles messages until STOP (-> None) or until the learner is gone (-> why, when it may still listen)."""
  parent = multiprocessing.parent_process()
  timeout = actor.config.request_timeout_s
  poll_s = _POLL_S if timeout is None else min(_POLL_S, timeout)
  while True:
    try:
      message = inbox.get(timeout=poll_s)
    except queue.Empty:
      # A learner that died cannot stop us, and one that stopped answering is as good as gone.
      if parent is not None and not parent.is_alive():
        return None
      oldest = actor.oldest_request()
      if timeout is not None and oldest is not None and time.monotonic() - oldest > timeout:
        return f"a request waited more than request_timeout_s={timeout} s for its answer"
      continue
    # What else has arrived goes with it: a round's responses come together, and their steps can too.
    messages = [message]
    while messages[-1] is not STOP:
      try:
        messages.append(inbox.get_nowait())
      except queue.Empty:
        break
    stop = messages[-1] is STOP
    actor.handle_all(messages[:-1] if stop else messages)
    if stop:
      return None


def _report_failure(outbox: Any, failure: ActorFailure) -> None:
  print(failure.error, file=sys.stderr, flush=True)
  try:
    outbox.send(failure)
  except OSError:
    pass
