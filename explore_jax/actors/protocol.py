"""What the learner and the actor processes say to each other (plain picklable data, no jax).

The learner assigns episodes; an actor resets the environment, asks for a response whenever one of its
episodes needs an action, steps the environment with the decoded text, and streams each finished
episode's steps back. Randomness never depends on timing: an episode's environment seed is in its spec,
and the sampler keys each response by (episode, step), so a run is reproducible however the actors
interleave.

Two optional parts of a prompt hook add round trips: `embedding_texts` has the learner embed texts
before a step's prompt is built (EmbedRequest -> Embeddings: the encoder lives with the learner), and
`final_prompt` asks for one more generation once the episode is over (a PromptRequest with final=True
whose text is no action: it comes back as EpisodeResult.final_text, e.g. EMPO2's tip).

Learner -> actor: EpisodeSpec (play it), Response (the next action of one episode, or its final text),
Embeddings (the vectors of an EmbedRequest), CancelEpisodes (abandon them all), STOP (exit).
Actor -> learner: ActorHello (once, when ready), PromptRequest, EmbedRequest, EpisodeResult,
EpisodesCancelled, ActorFailure (before exiting on an error that belongs to no episode).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Iterator, Optional, Union

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
  """An episode needs its next action: the tokenised prompt of step `step`.

  With `final` the episode is over and this is the prompt hook's final_prompt (step = the number of steps
  taken): the answer is decoded into EpisodeResult.final_text and never steps the environment, so the
  policy may sample it differently (another temperature, a longer budget).
  """
  episode_id: int
  step: int
  prompt_ids: list[int]
  actor_id: int = -1         # the actor asking (the learner answers through that actor's channel)
  final: bool = False
  # The prompt's images in order, uint8 [H, W, 3] at the size the model reads them (explore_jax/images.py):
  # prompt_ids hold each one's image tokens.
  images: tuple[np.ndarray, ...] = ()


@dataclasses.dataclass(frozen=True)
class EmbedRequest:
  """Before building step `step`'s prompt, an episode needs `texts` embedded (the hook's embedding_texts).

  The encoder is a network on the learner's accelerator, so actors ask for vectors as they ask for actions,
  and the learner batches the requests of all actors into one call.
  """
  episode_id: int
  step: int
  texts: list[str]
  actor_id: int = -1         # the actor asking (the learner answers through that actor's channel)


@dataclasses.dataclass(frozen=True)
class Embeddings:
  """The learner's answer to an EmbedRequest: one row per text, in the order asked."""
  episode_id: int
  step: int
  vectors: np.ndarray       # [len(texts), E] float32


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
  observation: str = ""      # the observation this step's prompt was built from (before the step)
  # The hook's Prompt.variants, tokenised (and cut) as prompt_ids is: other prompts of the same step that
  # were not sampled from, for updates that score the response under them (EMPO2's prompt without tips).
  prompt_variants: dict[str, list[int]] = dataclasses.field(default_factory=dict)
  images: tuple[np.ndarray, ...] = ()  # the prompt's images, as its PromptRequest carried them
  prompt_notes: dict[str, Any] = dataclasses.field(default_factory=dict)  # the hook's Prompt.notes for this step


@dataclasses.dataclass
class Prompt:
  """What a prompt hook may return instead of plain messages: the prompt to sample from, and variants.

  Each variant is tokenised like `messages` into StepRecord.prompt_variants under its name; only
  `messages` is sent to the policy.
  """
  messages: list[dict[str, str]]
  variants: dict[str, list[dict[str, str]]] = dataclasses.field(default_factory=dict)
  # Images of the prompt, uint8 [H, W, 3], one per explore_jax.images.IMAGE marker in the messages' text, in
  # order (variants show the same images); the actor resizes them to what the model reads.
  images: list[np.ndarray] = dataclasses.field(default_factory=list)
  # Small picklable facts the hook found while building the prompt, kept with the step (StepRecord.prompt_notes)
  # for the learner: EMPO2's number of tips retrieved.
  notes: dict[str, Any] = dataclasses.field(default_factory=dict)
  # Shorter forms of `messages`, longest first, for a prompt past the actor's max_prompt_tokens: the actor samples
  # from the first form that fits whole (counted in EpisodeResult.shortened_prompts) and cuts the last one from the
  # left only when none fits. An iterable (a generator builds the forms only when the prompt does not fit); it
  # says what a long prompt loses first (DPEPO's parallel prompt: older observations, then older actions; EMPO2's:
  # its lowest-ranked tips), where the left cut would take the system message and the task. A form is a message
  # list, or a Prompt whose notes replace these when it is the one sampled (EMPO2: the tips it shows); its own
  # variants, images and forms are not read. Variants are tokenised as given.
  shorter: Iterable[Union[list[dict[str, str]], "Prompt"]] = ()

  def forms(self) -> Iterator[tuple[list[dict[str, str]], dict[str, Any]]]:
    """(messages, notes) of the prompt, then of each shorter form."""
    yield self.messages, self.notes
    for form in self.shorter:
      yield (form.messages, form.notes) if isinstance(form, Prompt) else (form, self.notes)


def as_prompt(prompt: Union[list[dict[str, str]], Prompt]) -> Prompt:
  """A prompt hook's output as a Prompt: itself, or its plain messages in one."""
  return prompt if isinstance(prompt, Prompt) else Prompt(prompt)


# A method's prompt hook, run in the actor (so it must be picklable: a module-level function or a small
# dataclass with __call__): (observation, history of (observation, response text) pairs, the episode's
# spec context, the environment's info) -> chat messages [{"role": ..., "content": ...}], or a Prompt. The
# actor applies the tokenizer's chat template with the generation prompt, or joins the contents when there
# is none. A hook object may also define, with the same arguments:
#   embedding_texts(...) -> list[str]: texts the learner embeds before each step's prompt is built; a
#     non-empty list makes the actor send an EmbedRequest and call the hook with info["embeddings"] set
#     to the answer's vectors [len(texts), E] (e.g. to retrieve the tips nearest the observation).
#   final_prompt(...) -> chat messages, a Prompt (its messages and shorter forms are read) or None: called once
#     when the episode is done (history holds every step; observation and info are the final ones); the
#     messages are sampled as a final PromptRequest and the decoded answer is the episode's final_text.
PromptHook = Callable[[str, list[tuple[str, str]], dict[str, Any], dict[str, Any]],
                      Union[list[dict[str, str]], Prompt]]


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
  truncated_prompts: int = 0  # prompts (the steps' and the final one) cut to fit max_prompt_tokens
  shortened_prompts: int = 0  # prompts (the steps' and the final one) sampled in a shorter form (Prompt.shorter)
  final_text: str = ""        # the decoded answer to the hook's final_prompt ("" when it asked none)
  final_response: Optional[Response] = None  # that answer as the policy sampled it
  final_observation: str = ""  # the text of the observation the episode ended on (what a final prompt sees)
  final_state_key: Optional[int] = None  # that observation's state key, as the steps' keys are made

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
