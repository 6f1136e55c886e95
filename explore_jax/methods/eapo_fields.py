"""EAPO's answer fields and its exploration reward's arithmetic (METHODS.md "EAPO"; the paper's eqs. 9-10), as
plain functions: no jax, so actors can parse answers with them.

An EAPO step answers

  <think>...</think><explore>e_t</explore><memory>m_t</memory><action>... \\boxed{a} ...</action>

in that order (whitespace between the blocks ignored; <think> may be empty, the others must not be): e_t are the
candidate actions the agent is unsure of, m_t what it has seen; the action is the text of the last \\boxed{...}
inside <action>. The next step's input carries e_{t-1} and m_{t-1}. Anything else is malformed (an invalid
action, format reward 0).

q_phi scores two targets of the previous step from the current state s_t (eq. 9):

  plain     "<explore>e_{t-1}</explore>\\n<memory>m_{t-1}</memory>"
  explored  the same with the next state appended to the memory, [m_{t-1}, s_{t+1}]

  q(target | s) = exp(log q), log q = the target tokens' summed log-probs clamped to [-60, 0] ("sequence", the
  released default) or their mean clamped so ("token_mean", the released option)
  R_explore = max{ q(plain | s_t), gamma^2 q(explored | s_t) }, gamma = 0.9

and the step's reward is R = R_task + alpha1 R_format + alpha2 R_explore (eq. 10; alpha1 = 0.5, alpha2 = 1). The
released reward manager adds 0.5 R_format and 0.81 R_explore to a per-token total that already holds them, so both
terms count twice there; `step_reward` adds each once, as eq. 10 does.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Optional, Sequence

CLAMPS = ("sequence", "token_mean")
LOG_Q_RANGE = (-60.0, 0.0)  # the released clamp of log q

_BLOCK = {name: re.compile(rf"\s*<{name}>(.*?)</{name}>", re.DOTALL) for name in ("think", "explore", "memory", "action")}
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


@dataclasses.dataclass(frozen=True)
class Fields:
  """One well-formed EAPO answer."""
  think: str
  explore: str
  memory: str
  action: str


def parse_fields(text: str) -> tuple[Optional[Fields], str]:
  """(fields, "") of a well-formed answer, else (None, what was wrong); never raises."""
  if not isinstance(text, str):
    return None, f"The answer must be text, got {type(text).__name__}."
  values, pos = {}, 0
  for name in ("think", "explore", "memory", "action"):
    found = _BLOCK[name].match(text, pos)
    if found is None:
      return None, f"Expected <{name}>...</{name}> after {'the start' if not values else '</' + list(values)[-1] + '>'}."
    values[name], pos = found.group(1).strip(), found.end()
    if name != "think" and not values[name]:
      return None, f"The <{name}> block is empty."
  if text[pos:].strip():
    return None, "Nothing may follow </action>."
  boxed = _BOXED.findall(values["action"])
  if not boxed or not boxed[-1].strip():
    return None, "The <action> block needs the action in \\boxed{...}."
  return Fields(values["think"], values["explore"], values["memory"], " ".join(boxed[-1].split())), ""


def answer_text(fields: Fields) -> str:
  """The well-formed answer of `fields` (the oracle's and the rollback demonstrations' responses)."""
  return (f"<think>{fields.think}</think><explore>{fields.explore}</explore><memory>{fields.memory}</memory>"
          f"<action>\\boxed{{{fields.action}}}</action>")


def target_text(explore: str, memory: str) -> str:
  """q_phi's plain target of a step's fields."""
  return f"<explore>{explore}</explore>\n<memory>{memory}</memory>"


def explored_target_text(explore: str, memory: str, next_state: str) -> str:
  """q_phi's explored target: the memory with the next state appended, [m_{t-1}, s_{t+1}]."""
  return target_text(explore, f"{memory}\n{next_state}")


def log_q(token_logprobs: Sequence[float], clamp: str = "sequence") -> float:
  """log q(target | s) from the target tokens' log-probs: their sum ("sequence") or mean ("token_mean"), clamped
  to LOG_Q_RANGE."""
  if clamp not in CLAMPS:
    raise ValueError(f"clamp must be one of {CLAMPS}, got {clamp!r}")
  if len(token_logprobs) == 0:
    raise ValueError("a target has at least one token")
  value = math.fsum(token_logprobs)
  if clamp == "token_mean":
    value /= len(token_logprobs)
  return min(max(value, LOG_Q_RANGE[0]), LOG_Q_RANGE[1])


def explore_reward(plain_logprobs: Sequence[float], explored_logprobs: Sequence[float], *, gamma: float = 0.9,
                   clamp: str = "sequence") -> float:
  """R_explore (eq. 9) from the two targets' token log-probs under q_phi."""
  return max(math.exp(log_q(plain_logprobs, clamp)), gamma**2 * math.exp(log_q(explored_logprobs, clamp)))


def step_reward(task: float, format_reward: float, explore: float, *, alpha1: float = 0.5,
                alpha2: float = 1.0) -> float:
  """Eq. 10, each term once (the module docstring says how the released manager differs)."""
  return task + alpha1 * format_reward + alpha2 * explore
