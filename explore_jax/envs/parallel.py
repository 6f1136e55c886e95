"""DPEPO's parallel copies: K identical copies of a text environment stepped by one response.

Response format (copies are numbered from 1 in the text, from 0 in `info`):

  <think>...</think><parallel><env_1>go left</env_1><env_3>take key</env_3></parallel>

The <think> block is optional; whitespace around and between the blocks is ignored. Each named copy
parses its action with its own grammar and steps; the others wait. Any defect (no <parallel> block,
text outside the blocks, an unknown or repeated copy, an action a copy cannot parse) makes the whole
response an invalid action: no copy steps, format reward 0, and the observation says what was wrong.
A copy whose own episode has already ended is skipped when named, and the observation says so.

Per step (DPEPO, METHODS.md, from the authors' code): the task reward is the maximum reward over
the copies that acted; the episode succeeds if any copy succeeds and ends at the first success, when
every copy has ended, or after `max_steps` steps. The observation shows every copy's observation in
<env_i> blocks. `info` adds to TextEnv's keys:

  histories         list[list[str]]: each copy's canonical actions so far (DPEPO's diversity weight)
  acted             list[int]: the copies (0-based) that stepped this step ([] on reset or invalid)
  actions           list[str | None]: this step's canonical action per copy (None: did not act)
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


class ParallelCopies(TextEnv):
  """K parallel copies of one TextEnv with identical initial states, acted on by one response.

  Args:
    env: a registered gymnasium id (made with `env_kwargs`) or a function returning a new TextEnv.
    num_copies: K, the number of copies (DPEPO uses up to 4).
    env_kwargs: keyword arguments for `gymnasium.make` when `env` is an id.
    max_steps: the episode's step limit; default the copies' own `max_steps`.
    render_mode: None or "ansi".
  """

  def __init__(self, env: str | Callable[[], TextEnv], num_copies: int = 4,
               env_kwargs: dict[str, Any] | None = None, max_steps: int | None = None,
               render_mode: str | None = None):
    if num_copies < 1:
      raise ValueError(f"num_copies must be at least 1, got {num_copies}")
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
    self.copy_ended = [False] * len(self.copies)
    self.copy_success = [False] * len(self.copies)
    self._begin_step()

  def _begin_step(self) -> None:
    n = len(self.copies)
    self.acted: list[int] = []
    self.actions: list[str | None] = [None] * n
    self.copy_rewards = [0.0] * n
    # A copy's observation this step where it is more than its raw observation (a message).
    self._shown: list[str | None] = [None] * n

  def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
    self._seed = seed
    return super().reset(seed=seed, options=options)

  def step(self, response: Any):
    if not self._ended:
      self._begin_step()
    return super().step(response)

  def _reset_task(self, options: dict[str, Any]) -> Any:
    # Every copy gets the same seed, so all start from one state; without a seed, draw one to share.
    seed = self._seed if self._seed is not None else int(self.np_random.integers(2**31))
    self._clear_step()
    for copy in self.copies:
      copy.reset(seed=seed, options=options or None)
    return self.copies[0].task_id

  def raw_observation(self) -> str:
    return "\n".join(self._block(i, copy.raw_observation()) for i, copy in enumerate(self.copies))

  @staticmethod
  def _block(index: int, text: str) -> str:
    return f"<env_{index + 1}>\n{text}\n</env_{index + 1}>"

  def _observation(self, message: str) -> str:
    blocks = [self._block(i, shown if shown is not None else copy.raw_observation())
              for i, (copy, shown) in enumerate(zip(self.copies, self._shown))]
    return "\n".join(blocks)

  def parse_action(self, text: Any) -> tuple[dict[int, Any] | None, str]:
    if not isinstance(text, str):
      return None, f"The response must be text, got {type(text).__name__}."
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

  def action_text(self, action: dict[int, Any]) -> str:
    inner = "".join(f"<env_{i + 1}>{self.copies[i].action_text(a)}</env_{i + 1}>"
                    for i, a in sorted(action.items()))
    return f"<parallel>{inner}</parallel>"

  def _apply(self, action: dict[int, Any]) -> Outcome:
    for i, inner_action in action.items():
      copy = self.copies[i]
      if self.copy_ended[i]:
        self._shown[i] = f"This copy's episode has ended.\n{copy.raw_observation()}"
        continue
      text = copy.action_text(inner_action)
      observation, reward, terminated, truncated, info = copy.step(text)
      self.acted.append(i)
      self.actions[i] = text
      self.histories[i].append(text)
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
    return Outcome(reward=reward, success=success,
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
        acted=list(self.acted),
        actions=list(self.actions),
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
    """The copies' oracle actions in every live copy (needs copies with `oracle_action`)."""
    inner = "".join(f"<env_{i + 1}>{copy.oracle_action()}</env_{i + 1}>"
                    for i, copy in enumerate(self.copies) if not self.copy_ended[i])
    return f"<parallel>{inner}</parallel>"

  def close(self) -> None:
    for copy in self.copies:
      copy.close()
