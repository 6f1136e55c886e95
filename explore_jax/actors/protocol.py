"""What the learner and the actor processes say to each other (plain picklable data, no jax).

The learner assigns episodes; an actor resets the environment, asks for a response whenever one of its
episodes needs an action, steps the environment with the decoded text, and streams each finished
episode's steps back. Randomness never depends on timing: an episode's environment seed is in its spec,
and the sampler keys each response by (episode, step), so a run is reproducible however the actors
interleave.

Learner -> actor: EpisodeSpec (play it), Response (the next action of one episode), CancelEpisodes
(abandon them all), STOP (exit).
Actor -> learner: ActorHello (once, when ready), PromptRequest, EpisodeResult, EpisodesCancelled,
ActorFailure (before exiting on an error that belongs to no episode).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import numpy as np


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
  """One episode to play: which environment, which seed/task, and the ids its records carry."""
  episode_id: int            # unique in the run; also the sampler's random stream for this episode
  group_id: int              # task group: the G episodes of one task share it (and the seed)
  traj_id: int               # index of the trajectory inside the iteration
  env_id: str                # a gymnasium id, e.g. "explore_jax/KeyDoor-v0"
  env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
  seed: int = 0
  reset_options: dict[str, Any] = dataclasses.field(default_factory=dict)
  context: dict[str, Any] = dataclasses.field(default_factory=dict)  # method data for the prompt hook


@dataclasses.dataclass(frozen=True)
class PromptRequest:
  """An episode needs its next action: the tokenised prompt of step `step`."""
  episode_id: int
  step: int
  prompt_ids: list[int]
  actor_id: int = -1         # the actor asking (the learner answers through that actor's channel)


@dataclasses.dataclass(frozen=True)
class Response:
  """The sampler's answer to a PromptRequest (arrays cut to the response's length)."""
  episode_id: int
  step: int
  tokens: np.ndarray        # [L] int32
  logprobs: np.ndarray      # [L] float32
  temperatures: np.ndarray  # [L] float32
  segments: np.ndarray      # [L] int32
  policy_version: int
  features: Optional[np.ndarray] = None  # [E] final hidden state at the last token, when the method asks (RND)


@dataclasses.dataclass
class StepRecord:
  """One finished agent step as the actor saw it (numpy; the learner packs these into Records)."""
  episode_id: int
  group_id: int
  traj_id: int
  step_index: int
  actor_id: int
  prompt_ids: list[int]
  response: Response
  response_text: str
  task_reward: float
  format_reward: float
  state_key: int
  done: bool
  success: bool
  info: dict[str, Any]      # what the environment reported (admissible actions, feedback, histories...)
  truncated_tokens: int = 0  # prompt tokens cut from the left to fit max_prompt_tokens


# A method's prompt hook, run in the actor (so it must be picklable: a module-level function or a small
# dataclass with __call__): (observation, history of (observation, response text) pairs, the episode's
# spec context, the environment's info) -> chat messages [{"role": ..., "content": ...}]. The actor applies
# the tokenizer's chat template with the generation prompt, or joins the contents when there is none.
PromptHook = Callable[[str, list[tuple[str, str]], dict[str, Any], dict[str, Any]], list[dict[str, str]]]


@dataclasses.dataclass
class EpisodeResult:
  """A finished episode, or a dropped one: no steps, and `error` says why (env raised, actor died or hung)."""
  spec: EpisodeSpec
  steps: list[StepRecord]
  success: bool
  total_reward: float
  feedback: str
  error: Optional[str] = None
  actor_id: int = -1
  truncated_prompts: int = 0  # steps whose prompt was cut to fit max_prompt_tokens

  @property
  def dropped(self) -> bool:
    return self.error is not None


@dataclasses.dataclass(frozen=True)
class ActorHello:
  """An actor process is ready (tokenizer loaded, prompt hook imported) and reports what it loaded."""
  actor_id: int
  pid: int
  jax_imported: bool  # must stay False: actors never import jax


@dataclasses.dataclass(frozen=True)
class ActorFailure:
  """An actor process is about to exit on an error outside any one episode (e.g. no tokenizer)."""
  actor_id: int
  pid: int
  error: str


@dataclasses.dataclass(frozen=True)
class CancelEpisodes:
  """The learner abandons every episode an actor holds (its run failed); the actor answers EpisodesCancelled."""


@dataclasses.dataclass(frozen=True)
class EpisodesCancelled:
  """An actor has abandoned its episodes: what it sent before this message belongs to the failed run."""
  actor_id: int
  episode_ids: tuple[int, ...]


# The learner tells an actor to close its environments and exit by sending this instead of a message.
STOP = None
