"""A world answered in EAPO's fields: each response is a structured answer whose boxed action the world plays.

  <think>...</think><explore>e_t</explore><memory>m_t</memory><action>... \\boxed{a} ...</action>

`FieldAnswers` wraps one TextEnv. A response parses as EAPO's four fields (methods/eapo_fields.py) and then its
boxed action with the world's own grammar; a response that fails either is an invalid action (no change, one step,
format reward 0, the observation says what was wrong), as any TextEnv's malformed response is. A parsed answer
steps the world on the action's canonical text, and the observation, the task reward, the episode's end and the
state key are the world's own; a GUI world's refused answer keeps its screenshot, with the refusal as the text. `info["action"]` is the world's canonical action, so what reads actions
(rollback mining, GiGPO's anchors) sees the world's actions, not the answers around them.

The oracle answers in the fields too (`oracle_action`), which is how a policy learns to write them in its warm
start:

  explore  up to `explore_items` of the state's admissible actions other than the oracle's, drawn from the
           episode's seeded stream: the candidates an agent that knows the way could still be unsure of
           ("none" where the world lists no others);
  memory   what it has seen: the last `memory_items` distinct observations of the episode, each its first line
           cut short (envs/base.excerpt), oldest first;
  think    empty; the action is the world's oracle action, boxed.

Open to every method through `config.env.answer = "fields"` (train/rollout.environment); EAPO sets it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import gymnasium

from explore_jax.envs.base import Outcome, TextEnv, excerpt
from explore_jax.methods.eapo_fields import Fields, answer_text, parse_fields

FIELDS_ID = "explore_jax/Fields-v0"
ANSWERS = ("plain", "fields")


def fields_env(env_id: str, env_kwargs: dict[str, Any], answer: str = "plain") -> tuple[str, dict[str, Any]]:
  """(id, kwargs) of the world a run plays when its responses are `answer`s: "plain" leaves it as it is,
  "fields" wraps it in FieldAnswers."""
  if answer not in ANSWERS:
    raise ValueError(f"env.answer must be one of {ANSWERS}, got {answer!r}")
  if answer == "plain":
    return env_id, dict(env_kwargs)
  return FIELDS_ID, {"env": env_id, "env_kwargs": dict(env_kwargs)}


@dataclasses.dataclass(frozen=True)
class _Answer:
  fields: Fields
  action: Any  # the world's parsed action


class FieldAnswers(TextEnv):
  """One TextEnv answered in EAPO's fields (module docstring).

  Args:
    env: a registered gymnasium id (made with `env_kwargs`) or a function returning a new TextEnv.
    env_kwargs: keyword arguments for `gymnasium.make` when `env` is an id.
    max_steps: the episode's step limit; default the world's own.
    render_mode: None or "ansi".
    explore_items, memory_items: the sizes of the oracle's fields.
  """

  response_format = ('Reply "<think>...</think><explore>...</explore><memory>...</memory><action>... '
                     '\\boxed{action} ...</action>".')

  def __init__(self, env: str | Callable[[], TextEnv], env_kwargs: dict[str, Any] | None = None,
               max_steps: int | None = None, render_mode: str | None = None, explore_items: int = 3,
               memory_items: int = 3):
    if isinstance(env, str):
      env_id, kwargs = env, dict(env_kwargs or {})
      env = lambda: gymnasium.make(env_id, **kwargs).unwrapped
    elif env_kwargs:
      raise ValueError("env_kwargs applies only when env is a gymnasium id")
    self.env = env()
    if not isinstance(self.env, TextEnv):
      raise TypeError(f"FieldAnswers needs a TextEnv (its grammar and raw observation), got {type(self.env).__name__}")
    if explore_items < 1 or memory_items < 1:
      raise ValueError(f"explore_items and memory_items must be at least 1, got {explore_items}, {memory_items}")
    super().__init__(max_steps=self.env.max_steps if max_steps is None else max_steps, render_mode=render_mode)
    self.metadata = {**self.metadata, **{k: v for k, v in self.env.metadata.items()
                                         if k in ("concurrent_instances", "seeded_oracle")}}
    self.observation_space = self.env.observation_space
    self.explore_items, self.memory_items = explore_items, memory_items
    self._seed: int | None = None
    self._shown: Any = ""
    self._seen: list[str] = []

  def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
    self._seed = seed
    _, info = super().reset(seed=seed, options=options)
    return self._shown, info  # the world's own first observation (a GUI world's Dict)

  def step(self, response: Any):
    observation, reward, terminated, truncated, info = super().step(response)
    if isinstance(observation, str) and isinstance(self._shown, dict):
      # A refused answer changed nothing: a GUI world's screenshot stays, with the refusal as its text.
      observation = {**self._shown, "text": observation}
      self._last_observation = observation
    return observation, reward, terminated, truncated, info

  def _reset_task(self, options: dict[str, Any]) -> Any:
    self._shown, _ = self.env.reset(seed=self._seed, options=options or None)
    self._seen = []
    self._remember(self._shown)
    return self.env.task_id

  def _remember(self, observation: Any) -> None:
    text = observation.get("text", "") if isinstance(observation, dict) else str(observation)
    text = excerpt(next((line for line in text.splitlines() if line.strip()), ""), 60)
    if text in self._seen:
      self._seen.remove(text)
    self._seen.append(text)

  def raw_observation(self) -> str:
    return self.env.raw_observation()

  def parse_action(self, text: Any) -> tuple[_Answer | None, str]:
    fields, error = parse_fields(text)
    if fields is None:
      return None, error
    action, error = self.env._safe_parse(fields.action)
    if action is None:
      return None, f"The boxed action is not one this world takes: {error}"
    return _Answer(fields, action), ""

  def action_text(self, action: _Answer) -> str:
    return self.env.action_text(action.action)

  def _apply(self, action: _Answer) -> Outcome:
    observation, reward, terminated, truncated, info = self.env.step(self.env.action_text(action.action))
    self._shown = observation
    self._remember(observation)
    return Outcome(reward=float(reward), success=bool(info["success"]), terminated=bool(terminated),
                   truncated=bool(truncated))

  def _observation(self, message: str) -> Any:
    return self._shown

  def admissible_actions(self) -> list[str] | None:
    return self.env.admissible_actions()

  def _feedback(self, truncated: bool) -> str:
    return self.env._feedback(truncated)

  def _extra_info(self) -> dict[str, Any]:
    return self.env._extra_info()

  def oracle_action(self) -> str:
    """The world's oracle action answered in the fields (module docstring)."""
    action = self.env.oracle_action()
    others = [a for a in self.env.admissible_actions() or () if a != action]
    if others:
      picks = self.np_random.choice(len(others), size=min(self.explore_items, len(others)), replace=False)
      explore = "; ".join(others[i] for i in sorted(int(p) for p in picks))
    else:
      explore = "none"
    memory = " | ".join(self._seen[-self.memory_items:]) or "nothing yet"
    return answer_text(Fields(think="", explore=explore, memory=memory, action=action))

  def close(self) -> None:
    self.env.close()
