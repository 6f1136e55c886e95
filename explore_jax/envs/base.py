"""TextEnv: the shared part of every agent environment (text in, text out, bad text never raises).

A concrete environment defines its task state, the raw observation of that state, its action grammar
and its transitions; `TextEnv` does the rest the same way everywhere:

- `step(response)` takes the model's raw response. `parse_action` turns it into an action or an
  error; a malformed response is an invalid action: the state does not change, one step is consumed,
  `info["format_ok"]` is False, `info["format_reward"]` is 0.0, and the observation says what was
  wrong and which form is expected. A parsed action gives `info["format_reward"] = 1.0`.
- `reward` is the task reward only; the format reward travels separately in `info`.
- Episodes end when the environment terminates them or truncate after `max_steps` steps.
- `info`, on reset and on every step, carries what the methods need:

  task_id             the task being played (same seed -> same task)
  state_key           `state_key(raw observation)`: equal raw observations (no history, no transient
                      messages) have equal keys in every process (GiGPO anchors, EAPO visitation)
  success             whether the episode has succeeded
  feedback            textual feedback at the episode's end ("" before), e.g. why it failed (SGE)
  step                steps taken in this episode
  admissible_actions  list[str], where the environment can list them
  format_ok, format_reward, action   (step only) whether the response parsed, its format reward, and
                      the canonical action text (None when it did not parse)

No jax here: environments run inside actor processes that never import it.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import numbers
import string
from typing import Any, Sequence

import gymnasium
from gymnasium import spaces

# Printable ASCII plus the whitespace characters: what observations contain and responses should.
TEXT_CHARSET = string.printable
_PRINTABLE = frozenset(TEXT_CHARSET)
MAX_TEXT_LENGTH = 16_384
MAX_ACTION_CHARS = 200         # the longest action a text world's one-line grammar accepts
_EXCERPT_LENGTH = 40


def text_space(max_length: int = MAX_TEXT_LENGTH) -> spaces.Text:
  """The Text space of observations and actions: printable text with newlines, possibly empty."""
  return spaces.Text(max_length, min_length=0, charset=TEXT_CHARSET)


def state_key(raw_observation: str) -> int:
  """Deterministic 63-bit key of a raw observation (blake2b; Python's hash() is salted per process).

  Non-negative and below 2**63, so it fits int64 as well as Python and JSON integers.
  """
  digest = hashlib.blake2b(raw_observation.encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(digest, "little") >> 1


def task_index(options: dict[str, Any], seed: int | None, num_tasks: int, rng: Any) -> int:
  """The task a reset plays: `options["task_index"]` exactly (checked), else `seed % num_tasks` for a
  seeded reset, else a draw from `rng` (the environment's np_random)."""
  index = options.get("task_index")
  if index is None:
    return seed % num_tasks if seed is not None else int(rng.integers(num_tasks))
  if isinstance(index, bool) or not isinstance(index, numbers.Integral) or not 0 <= index < num_tasks:
    raise ValueError(f"task_index must be an int in [0, {num_tasks}), got {index!r}")
  return int(index)


def world_text(text: Any, limit: int = 8_000) -> str:
  """A world's text as it goes into an observation: printable ASCII (others become "?"), no trailing
  spaces on its lines nor blank lines at its ends, at most `limit` characters."""
  lines = [line.rstrip() for line in str(text).replace("\r\n", "\n").split("\n")]
  flat = "\n".join(lines).strip("\n")
  safe = "".join(c if c in _PRINTABLE else "?" for c in flat[: limit + 1])
  return safe if len(safe) <= limit else safe[: limit - 3] + "..."


def one_line_action(text: str, noun: str = "action") -> tuple[str | None, str]:
  """The text worlds' response grammar: exactly one non-empty line of printable ASCII, at most
  MAX_ACTION_CHARS characters once runs of whitespace become one space and letters lower case.
  Returns (that canonical action, "") or (None, what was wrong, calling the action `noun`)."""
  lines = [line for line in text.splitlines() if line.strip()]
  if not lines:
    return None, "The response is empty."
  if len(lines) > 1:
    return None, f"The response has {len(lines)} lines; one {noun} takes one line."
  action = " ".join(lines[0].split()).lower()
  if len(action) > MAX_ACTION_CHARS:
    return None, f"The {noun} is too long ({len(action)} characters, at most {MAX_ACTION_CHARS})."
  if any(c not in _PRINTABLE for c in action):
    return None, f'The {noun} "{excerpt(action)}" has characters outside printable ASCII.'
  return action, ""


def next_gold_action(path: Sequence[str], position: int | None, task_id: Any, name: str = "gold path") -> str:
  """An oracle's next action: `path[position]`, where `position` is how far the episode has followed the
  world's gold path (its `name`, e.g. "walkthrough") from the start, None once it has left it."""
  if position is None:
    raise RuntimeError(f"the episode has left the {name} of {task_id}; the oracle only follows it from the start")
  if position >= len(path):
    raise RuntimeError(f"the {name} of {task_id} ended without success")
  return path[position]


ACTIONS_LINE = "Actions: "  # how a raw observation lists the admissible actions, on its last line


def with_actions(text: str, actions: Sequence[str]) -> str:
  """`text` with the admissible actions on a last line, as every world lists them: "...\nActions: a, b, c."."""
  return f"{text}\n{ACTIONS_LINE}{', '.join(actions)}."


def listed_actions(observation: str) -> set[str] | None:
  """The actions an observation lists on its last line (with_actions' inverse), or None where it lists none."""
  last = observation.rstrip().rsplit("\n", 1)[-1]
  if not last.startswith(ACTIONS_LINE):
    return None
  return {a.strip() for a in last[len(ACTIONS_LINE):].rstrip(".").split(", ") if a.strip()}


def excerpt(text: str, limit: int = _EXCERPT_LENGTH) -> str:
  """A short, one-line, printable quotation of a model response for an error message.

  Observations must stay inside `TEXT_CHARSET` (the observation space), so characters outside it
  become "?" and the quotation is cut to `limit` characters.
  """
  flat = " ".join(text.split())
  safe = "".join(c if c in TEXT_CHARSET else "?" for c in flat[: limit + 1])
  return safe if len(safe) <= limit else safe[:limit] + "..."


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What one parsed action did: the task reward, whether the episode ends, and a message to show.

  `truncated` ends the episode as a time limit would (an environment's own clock); the step limit
  `max_steps` is applied by `TextEnv` itself.
  """

  reward: float = 0.0
  success: bool = False
  terminated: bool = False
  truncated: bool = False
  message: str = ""


class TextEnv(gymnasium.Env, abc.ABC):
  """A gymnasium environment with text observations and raw model responses as actions.

  Subclasses implement `_reset_task`, `raw_observation`, `parse_action` and `_apply`, and may
  override `admissible_actions`, `_feedback`, `_observation` and `_extra_info`. The class
  attribute `response_format` is a sentence telling the model what a response must look like.
  A world whose instances share no state (each its own process or JVM) and whose answers do not
  depend on how busy the machine is adds `"concurrent_instances": True` to its `metadata`: an
  actor then resets and steps several of them at once (actors/actor.py). The coding world does
  not: its verdicts hold a wall-clock time limit. One whose oracle episode from a seed is the same on
  any instance, whatever that instance played before, adds `"seeded_oracle": True` as well: an SFT
  warm start's demonstrations are then played on several instances at once (train/sft_data.py).
  """

  metadata = {"render_modes": ["ansi"], "render_fps": 1}  # a frame rate only to quiet check_env
  response_format = "Reply with one action."

  def __init__(self, *, max_steps: int, render_mode: str | None = None):
    if max_steps < 1:
      raise ValueError(f"max_steps must be at least 1, got {max_steps}")
    if render_mode not in (None, *self.metadata["render_modes"]):
      raise ValueError(
          f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
    self.max_steps = max_steps
    self.render_mode = render_mode
    self.observation_space = text_space()
    self.action_space = text_space()
    self.task_id: Any = None
    self.steps = 0
    self.success = False
    self._ended = True  # no episode runs before the first reset
    self._last_observation = ""

  # ---- what a concrete environment defines ------------------------------------------------------

  @abc.abstractmethod
  def _reset_task(self, options: dict[str, Any]) -> Any:
    """Set up a new episode's state (drawing from `self.np_random`) and return its task id."""

  @abc.abstractmethod
  def raw_observation(self) -> str:
    """The current state as text, without history or transient messages (hashed for state_key)."""

  @abc.abstractmethod
  def parse_action(self, text: Any) -> tuple[Any | None, str]:
    """(action, "") for a well-formed response, else (None, what was wrong); never raises."""

  @abc.abstractmethod
  def _apply(self, action: Any) -> Outcome:
    """Apply a parsed action to the state."""

  def action_text(self, action: Any) -> str:
    """The canonical text of a parsed action (the form an oracle or a model would write)."""
    return str(action)

  def admissible_actions(self) -> list[str] | None:
    """The actions that make sense in the current state, or None where there is no such list."""
    return None

  def _feedback(self, truncated: bool) -> str:
    """Textual feedback on the episode that has just ended."""
    if self.success:
      return f"Success in {self.steps} steps."
    return "Out of steps." if truncated else "The episode ended without success."

  def _observation(self, message: str) -> str:
    """What the agent sees after a valid step: the outcome's message (if any), then the state."""
    raw = self.raw_observation()
    return f"{message}\n{raw}" if message else raw

  def _extra_info(self) -> dict[str, Any]:
    """Environment-specific info entries, added on reset and on every step."""
    return {}

  # ---- the shared machinery ---------------------------------------------------------------------

  def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
    super().reset(seed=seed)
    self.task_id = self._reset_task(dict(options or {}))
    self.steps = 0
    self.success = False
    self._ended = False
    self._last_observation = self.raw_observation()
    return self._last_observation, self._info(feedback="")

  def step(self, response: Any):
    if self._ended:
      raise RuntimeError("no episode is running (it has ended or never began); call reset()")
    action, error = self._safe_parse(response)
    self.steps += 1
    if action is None:
      outcome = Outcome()
      observation = f"Invalid action: {error} {self.response_format}\n{self.raw_observation()}"
    else:
      outcome = self._apply(action)
      self.success = self.success or outcome.success
      observation = self._observation(outcome.message)
    terminated = bool(outcome.terminated)
    truncated = not terminated and (outcome.truncated or self.steps >= self.max_steps)
    self._ended = terminated or truncated
    self._last_observation = observation
    info = self._info(feedback=self._feedback(truncated) if self._ended else "")
    info.update(
        format_ok=action is not None,
        format_reward=0.0 if action is None else 1.0,
        action=None if action is None else self.action_text(action),
    )
    return observation, float(outcome.reward), terminated, truncated, info

  def render(self) -> str | None:
    return self._last_observation if self.render_mode == "ansi" else None

  def _safe_parse(self, response: Any) -> tuple[Any | None, str]:
    if not isinstance(response, str):
      return None, f"The response must be text, got {type(response).__name__}."
    try:
      action, error = self.parse_action(response)
    except Exception as e:  # a grammar bug must cost the step, not the actor process
      return None, f"The response could not be parsed ({type(e).__name__})."
    if action is None:
      return None, error or "The response could not be parsed."
    return action, ""

  def _info(self, *, feedback: str) -> dict[str, Any]:
    info: dict[str, Any] = dict(
        task_id=self.task_id,
        state_key=state_key(self.raw_observation()),
        success=self.success,
        feedback=feedback,
        step=self.steps,
    )
    admissible = self.admissible_actions()
    if admissible is not None:
      info["admissible_actions"] = list(admissible)
    info.update(self._extra_info())
    return info


@dataclasses.dataclass(frozen=True)
class Demonstration:
  """One oracle episode: the observation shown before each action and the action's exact text."""

  task_id: Any
  seed: int | None
  observations: list[str]
  actions: list[str]
  success: bool
  final_observation: str = ""  # what the episode ended on (after the last action)
  # The info each observation came with (the reset's, then each step's): what an actor's prompt hook is given.
  infos: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  final_info: dict[str, Any] = dataclasses.field(default_factory=dict)  # the info the last step returned


def oracle_episode(env: gymnasium.Env, *, seed: int | None = None,
                   options: dict[str, Any] | None = None) -> Demonstration:
  """Play one episode with the environment's `oracle_action()`: the outermost layer's that has one (the env may
  be wrapped; ScreenReading-v0's oracle answers around its world's)."""
  oracle = env.get_wrapper_attr("oracle_action")
  observation, info = env.reset(seed=seed, options=options)
  observations, actions, infos = [], [], []
  done = False
  while not done:
    action = oracle()
    observations.append(observation)
    actions.append(action)
    infos.append(info)
    observation, _, terminated, truncated, info = env.step(action)
    done = terminated or truncated
  return Demonstration(info["task_id"], seed, observations, actions, bool(info["success"]),
                       final_observation=observation if isinstance(observation, str) else str(observation.get("text", "")),
                       infos=infos, final_info=info)


def oracle_demonstrations(env: gymnasium.Env, seeds: Sequence[int],
                          options: dict[str, Any] | None = None) -> list[Demonstration]:
  """Oracle episodes for the given seeds, e.g. the SFT warm start's (observation, action) pairs."""
  return [oracle_episode(env, seed=seed, options=options) for seed in seeds]
