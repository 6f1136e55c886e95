"""DPEPO's parallel copies: K identical copies of a text environment stepped by one response.

Response format (copies are numbered from 1 in the text, from 0 in `info`):

  <think>...</think><parallel><env_1>go left</env_1><env_3>take key</env_3></parallel>

The <think> block is optional; whitespace around and between the blocks is ignored. Each named copy
parses its action with its own grammar and steps; the others wait. Two parsers (`parser`):

  strict   (default) any defect (no <parallel> block, text outside the blocks, an unknown or repeated
           copy, an action a copy cannot parse) makes the whole response an invalid action: no copy
           steps, format reward 0, and the observation says what was wrong.
  lenient  the authors' parser: every <env_N>...</env_N> block (any number N) anywhere in the response, renumbered
           by order (the written index is ignored, <parallel> is not required); block i goes to copy i,
           which steps on its text even where its grammar refuses it (the copy's own invalid action);
           a block past the K-th is answered "The i-th environment is invalid..." and steps nothing. The
           response is malformed (format reward 0) when no block names an action the copy parses.

A copy whose own episode has already ended is skipped when named, and the observation says so.

Per step (DPEPO, METHODS.md, from the authors' code): the task reward is the maximum reward over
the copies that acted; the episode succeeds if any copy succeeds and ends at the first success, when
every copy has ended, or after `max_steps` steps. The observation shows every copy's observation in
<env_i> blocks. `info` adds to TextEnv's keys:

  histories         list[list[str]]: each copy's canonical actions so far (DPEPO's diversity weight)
  copy_observations list[list[str]]: what each copy showed after each of those actions
  initial_observation  str: the copies' shared first observation (the task)
  acted             list[int]: the copies (0-based) that stepped this step ([] on reset or invalid)
  actions           list[str | None]: this step's canonical action per copy (None: did not act)
  parsed_actions    list[[int, str]]: (copy number from 1, action) of every action this step names that
                    DPEPO's weight W_t counts: the copies that acted and, with the lenient parser, the
                    blocks past the K-th ([] when nothing parsed)
  copy_rewards      list[float]: this step's task reward per copy (0.0 where it did not act)
  copy_success      list[bool]; copy_ended list[bool]; copy_state_keys list[int]
  copy_admissible_actions  list[list[str]], where the copies list admissible actions
"""

from __future__ import annotations

import re
from typing import Any, Callable

import gymnasium

from explore_jax.envs.base import MAX_TEXT_LENGTH, Outcome, TextEnv, excerpt, state_key, text_space

_ENV_OPEN = re.compile(r"<env_([0-9]{1,4})>")
_ENV_BLOCK = re.compile(r"<env_[0-9]+>(.*?)</env_[0-9]+>", re.DOTALL)  # the lenient parser's
PARSERS = ("strict", "lenient")
ORACLES = ("same", "diverse")


PARALLEL_ID = "explore_jax/Parallel-v0"


def parallel_env(env_id: str, env_kwargs: dict[str, Any], parallel: Any = None, *,
                 demonstrations: bool = False) -> tuple[str, dict[str, Any]]:
  """(id, kwargs) of the world a run plays: `env_id` itself, or with `parallel.copies` = K >= 1 (a config's
  `env.parallel`) K copies of it (Parallel-v0) read by `parallel.parser`; for the SFT warm start's
  demonstrations, played by `parallel.sft_oracle` with `parallel.explore`."""
  copies = int(parallel.get("copies", 0)) if parallel else 0
  if copies <= 0:
    return env_id, dict(env_kwargs)
  kwargs = {"env": env_id, "num_copies": copies, "env_kwargs": dict(env_kwargs),
            "parser": parallel.get("parser", "strict")}
  if demonstrations:
    kwargs.update(oracle=parallel.get("sft_oracle", "diverse"), explore=float(parallel.get("explore", 0.5)))
  return PARALLEL_ID, kwargs


class Unparsed(str):
  """A lenient block's text that its copy's grammar refuses: the copy still steps on it (an invalid action)."""


def _invalid_copy(number: int, num_copies: int) -> str:
  return (f"The {number}-th environment is invalid: there are {num_copies} environments, ranging from 1 to "
          f"{num_copies}.")


class ParallelCopies(TextEnv):
  """K parallel copies of one TextEnv with identical initial states, acted on by one response.

  Args:
    env: a registered gymnasium id (made with `env_kwargs`) or a function returning a new TextEnv.
    num_copies: K, the number of copies (DPEPO uses up to 4).
    env_kwargs: keyword arguments for `gymnasium.make` when `env` is an id.
    max_steps: the episode's step limit; default the copies' own `max_steps`.
    render_mode: None or "ansi".
    parser: "strict" or "lenient" (the module docstring).
    oracle: what `oracle_action` plays: "same", every live copy's own oracle action; "diverse", DPEPO's
      cold start: copy 1 follows its oracle, and each other live copy, with probability `explore`, an
      admissible action no other copy takes this step (drawn from the episode's seeded stream), else its
      own oracle's; a copy whose oracle cannot go on from where it strayed (a gold path) keeps exploring.
    explore: that probability.
  """

  def __init__(self, env: str | Callable[[], TextEnv], num_copies: int = 4,
               env_kwargs: dict[str, Any] | None = None, max_steps: int | None = None,
               render_mode: str | None = None, parser: str = "strict", oracle: str = "same",
               explore: float = 0.5):
    if num_copies < 1:
      raise ValueError(f"num_copies must be at least 1, got {num_copies}")
    if parser not in PARSERS:
      raise ValueError(f"parser must be one of {PARSERS}, got {parser!r}")
    if oracle not in ORACLES:
      raise ValueError(f"oracle must be one of {ORACLES}, got {oracle!r}")
    if not 0.0 <= explore <= 1.0:
      raise ValueError(f"explore must be a probability, got {explore}")
    self.parser, self.oracle, self.explore = parser, oracle, float(explore)
    self._last_action: dict[int, Any] = {}
    if isinstance(env, str):
      env_id, kwargs = env, dict(env_kwargs or {})
      env = lambda: gymnasium.make(env_id, **kwargs).unwrapped
    elif env_kwargs:
      raise ValueError("env_kwargs applies only when env is a gymnasium id")
    self.copies: list[TextEnv] = [env() for _ in range(num_copies)]
    for copy in self.copies:
      if not isinstance(copy, TextEnv):
        raise TypeError(f"ParallelCopies needs TextEnv copies (their grammar and raw observation), "
                        f"got {type(copy).__name__}")
    super().__init__(max_steps=self.copies[0].max_steps if max_steps is None else max_steps,
                     render_mode=render_mode)
    self.num_copies = num_copies
    # Copies of a world whose instances are independent make independent instances of this one too.
    self.metadata = {**self.metadata, "concurrent_instances": all(
        copy.metadata.get("concurrent_instances", False) for copy in self.copies)}
    self.observation_space = text_space(num_copies * (MAX_TEXT_LENGTH + 32))
    self.response_format = (
        'Reply "<think>...</think><parallel><env_1>action</env_1>...</parallel>", naming the '
        f"copies to act in, env_1 to env_{num_copies}.")
    self._seed: int | None = None
    self._clear_step()

  def _clear_step(self) -> None:
    self.histories: list[list[str]] = [[] for _ in range(len(self.copies))]
    self.copy_observations: list[list[str]] = [[] for _ in range(len(self.copies))]
    self.copy_ended = [False] * len(self.copies)
    self.copy_success = [False] * len(self.copies)
    self.initial_observation = ""
    self._strayed = [False] * len(self.copies)  # the diverse oracle: copies that left their oracle's path
    self._begin_step()

  def _begin_step(self) -> None:
    n = len(self.copies)
    self.acted: list[int] = []
    self.actions: list[str | None] = [None] * n
    self.parsed_actions: list[list[Any]] = []
    self.copy_rewards = [0.0] * n
    # A copy's observation this step where it is more than its raw observation (a message).
    self._shown: list[str | None] = [None] * n

  def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
    self._seed = seed
    return super().reset(seed=seed, options=options)

  def step(self, response: Any):
    if not self._ended:
      self._begin_step()
    observation, reward, terminated, truncated, info = super().step(response)
    if info["format_ok"] and not any(i < len(self.copies) and not isinstance(a, Unparsed)
                                     for i, a in self._last_action.items()):
      info.update(format_ok=False, format_reward=0.0)  # lenient: no block held an action its copy parses
    return observation, reward, terminated, truncated, info

  def _reset_task(self, options: dict[str, Any]) -> Any:
    # Every copy gets the same seed, so all start from one state; without a seed, draw one to share.
    seed = self._seed if self._seed is not None else int(self.np_random.integers(2**31))
    self._clear_step()
    for copy in self.copies:
      copy.reset(seed=seed, options=options or None)
    self.initial_observation = self.copies[0].raw_observation()
    return self.copies[0].task_id

  def raw_observation(self) -> str:
    return "\n".join(self._block(i, copy.raw_observation()) for i, copy in enumerate(self.copies))

  @staticmethod
  def _block(index: int, text: str) -> str:
    return f"<env_{index + 1}>\n{text}\n</env_{index + 1}>"

  def _observation(self, message: str) -> str:
    blocks = [self._block(i, shown if shown is not None else copy.raw_observation())
              for i, (copy, shown) in enumerate(zip(self.copies, self._shown))]
    return "\n".join(blocks + ([message] if message else []))

  def parse_action(self, text: Any) -> tuple[dict[int, Any] | None, str]:
    self._last_action: dict[int, Any] = {}
    if not isinstance(text, str):
      return None, f"The response must be text, got {type(text).__name__}."
    action, error = self._parse_lenient(text) if self.parser == "lenient" else self._parse_strict(text)
    self._last_action = action or {}
    return action, error

  def _parse_lenient(self, text: str) -> tuple[dict[int, Any] | None, str]:
    blocks = [m.group(1) for m in _ENV_BLOCK.finditer(text)]
    if not blocks:
      return None, "No <env_i>...</env_i> block names an action."
    actions: dict[int, Any] = {}
    for i, inner in enumerate(blocks):
      parsed = self.copies[i].parse_action(inner)[0] if i < len(self.copies) else None
      actions[i] = Unparsed(inner) if parsed is None else parsed
    return actions, ""

  def _parse_strict(self, text: str) -> tuple[dict[int, Any] | None, str]:
    rest = text.strip()
    if rest.startswith("<think>"):
      end = rest.find("</think>")
      if end < 0:
        return None, "The <think> block is not closed with </think>."
      rest = rest[end + len("</think>"):].lstrip()
    if not rest.startswith("<parallel>"):
      return None, "Expected a <parallel> block after the optional <think>...</think>."
    if not rest.endswith("</parallel>"):
      return None, "The response must end with </parallel>."
    body = rest[len("<parallel>"):-len("</parallel>")]
    actions: dict[int, Any] = {}
    pos = 0
    while True:
      while pos < len(body) and body[pos].isspace():
        pos += 1
      if pos == len(body):
        break
      opening = _ENV_OPEN.match(body, pos)
      if opening is None:
        return None, f'Expected <env_i> inside <parallel>, found "{excerpt(body[pos:])}".'
      number = int(opening.group(1))
      closing_tag = f"</env_{opening.group(1)}>"
      close = body.find(closing_tag, opening.end())
      if close < 0:
        return None, f"<env_{opening.group(1)}> is not closed with {closing_tag}."
      if not 1 <= number <= len(self.copies):
        return None, f"There is no env_{number}; the copies are env_1 to env_{len(self.copies)}."
      if number - 1 in actions:
        return None, f"env_{number} is named twice."
      action, error = self.copies[number - 1].parse_action(body[opening.end():close])
      if action is None:
        return None, f"env_{number}: {error}"
      actions[number - 1] = action
      pos = close + len(closing_tag)
    if not actions:
      return None, "The <parallel> block names no copy."
    return dict(sorted(actions.items())), ""

  def _copy_text(self, i: int, action: Any) -> str:
    if isinstance(action, Unparsed) or i >= len(self.copies):
      return " ".join(str(action).split())
    return self.copies[i].action_text(action)

  def action_text(self, action: dict[int, Any]) -> str:
    inner = "".join(f"<env_{i + 1}>{self._copy_text(i, a)}</env_{i + 1}>" for i, a in sorted(action.items()))
    return f"<parallel>{inner}</parallel>"

  def _apply(self, action: dict[int, Any]) -> Outcome:
    invalid = []
    for i, inner_action in action.items():
      text = self._copy_text(i, inner_action)
      if i >= len(self.copies):  # the lenient parser's block past the K-th
        invalid.append(_invalid_copy(i + 1, len(self.copies)))
        self.parsed_actions.append([i + 1, text])
        continue
      copy = self.copies[i]
      if self.copy_ended[i]:
        self._shown[i] = f"This copy's episode has ended.\n{copy.raw_observation()}"
        continue
      observation, reward, terminated, truncated, info = copy.step(text)
      self.acted.append(i)
      self.actions[i] = text
      self.parsed_actions.append([i + 1, text])
      self.histories[i].append(text)
      self.copy_observations[i].append(observation)
      self.copy_rewards[i] = float(reward)
      self.copy_success[i] = bool(info["success"])
      self.copy_ended[i] = terminated or truncated
      self._shown[i] = observation
    reward = max((self.copy_rewards[i] for i in self.acted), default=0.0)
    success = any(self.copy_success)
    all_ended = all(self.copy_ended)
    # Copies that ran out of time make the whole episode a truncation, not a termination.
    timed_out = all_ended and any(copy.steps >= copy.max_steps and not copy.success
                                  for copy in self.copies)
    return Outcome(reward=reward, success=success, message="\n".join(invalid),
                   terminated=success or (all_ended and not timed_out), truncated=timed_out)

  def _feedback(self, truncated: bool) -> str:
    if self.success:
      winners = ", ".join(f"env_{i + 1}" for i, ok in enumerate(self.copy_success) if ok)
      return f"Success in {winners} after {self.steps} steps."
    return " ".join(f"env_{i + 1}: {copy._feedback(truncated=True)}"
                    for i, copy in enumerate(self.copies))

  def _extra_info(self) -> dict[str, Any]:
    info: dict[str, Any] = dict(
        histories=[list(h) for h in self.histories],
        copy_observations=[list(o) for o in self.copy_observations],
        initial_observation=self.initial_observation,
        acted=list(self.acted),
        actions=list(self.actions),
        parsed_actions=[list(p) for p in self.parsed_actions],
        copy_rewards=list(self.copy_rewards),
        copy_success=list(self.copy_success),
        copy_ended=list(self.copy_ended),
        copy_state_keys=[state_key(copy.raw_observation()) for copy in self.copies],
    )
    admissible = [copy.admissible_actions() for copy in self.copies]
    if all(a is not None for a in admissible):
      info["copy_admissible_actions"] = [list(a) for a in admissible]
    return info

  def oracle_action(self) -> str:
    """The oracle's response (`oracle`, in the class docstring; needs copies with `oracle_action`)."""
    chosen: dict[int, str] = {}
    for i, copy in enumerate(self.copies):
      if self.copy_ended[i]:
        continue
      if self.oracle == "same" or i == 0:
        chosen[i] = copy.oracle_action()
        continue
      own = None
      if not self._strayed[i]:
        try:
          own = copy.oracle_action()
        except RuntimeError:  # a gold path it has left: it keeps exploring
          self._strayed[i] = True
      others = [a for a in (copy.admissible_actions() or []) if a != own and a not in chosen.values()]
      if others and (own is None or self.np_random.random() < self.explore):
        chosen[i] = others[int(self.np_random.integers(len(others)))]
      elif own is not None:
        chosen[i] = own
    inner = "".join(f"<env_{i + 1}>{a}</env_{i + 1}>" for i, a in chosen.items())
    return f"<parallel>{inner}</parallel>"

  def close(self) -> None:
    for copy in self.copies:
      copy.close()
