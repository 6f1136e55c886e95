"""SGE: strategy-guided exploration (METHODS.md "SGE"; the paper's Algorithm 1 and appendix A.1).

Three changes to plain group-relative RL, all on the sampling side:

  Strategy prompting     the response states a strategy ("### Strategy") before the action ("### Code");
                         every coding baseline shares this prompt (config `instruction`), so it is not
                         what distinguishes SGE.
  Mixed temperature      strategy tokens are sampled at tau_s, the rest at tau (Table 2, coding: 1.2 / 0.7).
                         The sampler switches segment when the delimiter "### Code" completes and records
                         each token's temperature; the learner recomputes log-probs at those temperatures.
  Strategy reflection    per-task FIFO buffers B_G (successful) and B_B (failed) of the strategy sequences
                         of finished episodes (size 32). Each training episode draws u ~ U(0,1): u < p_B and
                         B_B non-empty -> negative reflection on a failed sequence and the episode's textual
                         feedback (failing tests); else, with probability p_G, positive reflection on a
                         successful one. The chosen reflection replaces the strategy prompt at every step of
                         that episode. Evaluation never reflects.

The update is GRPO with DAPO's modifications minus clip-higher (token-mean, dynamic sampling, overlong
shaping, eps 0.2), set by the config (configs/coding.py). Buffers are keyed by the task's seed, so the
training loop must draw tasks from a finite pool (`rollout.task_pool`); they are saved with checkpoints.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Optional

import numpy as np

from explore_jax.actors.protocol import EpisodeResult, EpisodeSpec
from explore_jax.methods.base import Method, ObservationPrompt, join_text, register_method

# Appendix A.1, coding environment. {strats} receives the strategy sequence (and, for failures, feedback).
STRATEGY_PROMPT = ('First give a strategy of how to solve the question after "### Strategy". Then write the code '
                   'to solve the question based on the strategy and question in "### Code".')
POSITIVE_REFLECTION_PROMPT = (
    'First give a strategy of how to solve the question after "### Strategy" inspired by this successful '
    'strategy. {strats} Then write the code to solve the question based on the strategy and question in '
    '"### Code".')
NEGATIVE_REFLECTION_PROMPT = (
    'First, after "### Strategy" critique the failed strategy and how it can be fixed. Be precise. Then address '
    'this critique by writing a better strategy. Make sure the strategy is detailed, and the code is easy to '
    'implement from the strategy. {strats} Then write the code to solve the question based on the strategy and '
    'question in "### Code".')

# The solution without a strategy (RLAD's abstraction dropout).
DIRECT_PROMPT = 'Write the code to solve the question in "### Code".'

STRATEGY_HEADER = "### Strategy"


def extract_strategy(response: str, delimiter: str = "### Code", header: str = STRATEGY_HEADER,
                     max_chars: int = 400) -> str:
  """The strategy of a response: the text after `header` (or from the start) up to `delimiter`.

  A response without the delimiter is all strategy; the result is stripped and cut to `max_chars`.
  """
  text = response
  start = text.find(header)
  if start >= 0:
    text = text[start + len(header):]
  end = text.find(delimiter)
  if end >= 0:
    text = text[:end]
  return " ".join(text.split())[:max_chars]


def format_strategies(strategies: list[str], feedback: str = "") -> str:
  """{strats}: one strategy, or the per-step sequence numbered, then the episode's feedback if any."""
  if len(strategies) == 1:
    body = f"Strategy: {strategies[0]}"
  else:
    body = "\n".join(f"Step {i} strategy: {s}" for i, s in enumerate(strategies, 1))
  return join_text(body, f"Feedback: {feedback}" if feedback else "")


@dataclasses.dataclass(frozen=True)
class StrategyPrompt(ObservationPrompt):
  """The actors' prompt: the observation, then the strategy prompt or, when the episode's context carries a
  reflection, the positive or negative reflection prompt with its strategies filled in; a context with
  `direct` asks for the code alone (RLAD). Picklable."""
  instruction: str = STRATEGY_PROMPT
  positive: str = POSITIVE_REFLECTION_PROMPT
  negative: str = NEGATIVE_REFLECTION_PROMPT
  direct: str = DIRECT_PROMPT

  def instruction_for(self, context: dict[str, Any]) -> str:
    if context.get("direct"):
      return self.direct
    kind = context.get("reflection")
    if kind is None:
      return self.instruction
    template = {"positive": self.positive, "negative": self.negative}[kind]
    return template.replace("{strats}", format_strategies(context["strategies"], context.get("feedback", "")))


@register_method("sge")
class SGE(Method):
  """Strategy-guided exploration: strategy prompt, mixed-temperature sampling, strategy reflection."""

  name = "sge"

  def __init__(self, config: Any):
    super().__init__(config)
    s = config.sge
    if not 0.0 <= s.p_failure <= 1.0 or not 0.0 <= s.p_success <= 1.0:
      raise ValueError(f"sge.p_failure and sge.p_success must be probabilities, got {s.p_failure}, {s.p_success}")
    if s.buffer_size < 1:
      raise ValueError(f"sge.buffer_size must be at least 1, got {s.buffer_size}")
    self.buffer_size = int(s.buffer_size)
    self.good: dict[str, collections.deque] = {}
    self.bad: dict[str, collections.deque] = {}

  # ---- sampling ------------------------------------------------------------------------------------
  def prompt_hook(self) -> StrategyPrompt:
    s = self.config.sge
    return StrategyPrompt(system=self.config.get("system_prompt", ""), instruction=self.config.instruction,
                          positive=s.positive_prompt, negative=s.negative_prompt,
                          history_steps=self.config.get("history_steps", 0))

  def temperatures(self) -> list[float]:
    return [float(self.config.sge.strategy_temperature), float(self.config.sge.temperature)]

  def delimiters(self) -> list[str]:
    return [self.config.sge.strategy_delimiter]

  def episode_context(self, spec: EpisodeSpec, rng: np.random.Generator) -> dict[str, Any]:
    """Algorithm 1, line 6: negative reflection with p_B, else positive with p_G, else none."""
    s = self.config.sge
    key = task_key(spec)
    u_bad, u_good = rng.random(), rng.random()  # both drawn always: the stream does not depend on buffers
    pick: Optional[tuple[str, collections.deque]] = None
    if u_bad < s.p_failure and self.bad.get(key):
      pick = ("negative", self.bad[key])
    elif u_good < s.p_success and self.good.get(key):
      pick = ("positive", self.good[key])
    if pick is None:
      return {}
    kind, buffer = pick
    entry = buffer[int(rng.integers(len(buffer)))]
    context = {"reflection": kind, "strategies": list(entry["strategies"])}
    if kind == "negative":
      context["feedback"] = entry["feedback"]
    return context

  def observe(self, results: list[EpisodeResult], *, training: bool) -> dict[str, float]:
    """Algorithm 1, line 11: each finished training episode's strategies enter B_G or B_B of its task."""
    if not training:
      return {}
    s = self.config.sge
    counts = collections.Counter()
    for r in results:
      if r.dropped or not r.steps:
        continue
      counts[r.spec.context.get("reflection", "none")] += 1
      buffers = self.good if r.success else self.bad
      entry = {"strategies": [extract_strategy(step.response_text, s.strategy_delimiter, max_chars=s.max_strategy_chars)
                              for step in r.steps],
               "feedback": r.feedback[:s.max_feedback_chars]}
      buffers.setdefault(task_key(r.spec), collections.deque(maxlen=self.buffer_size)).append(entry)
    n = max(sum(counts.values()), 1)
    return {"sge/negative_reflections": counts["negative"] / n, "sge/positive_reflections": counts["positive"] / n,
            "sge/tasks_with_success": float(sum(1 for b in self.good.values() if b)),
            "sge/tasks_with_failure": float(sum(1 for b in self.bad.values() if b))}

  # ---- checkpoints ---------------------------------------------------------------------------------
  def state_dict(self) -> dict[str, Any]:
    return {"good": {k: list(v) for k, v in self.good.items()}, "bad": {k: list(v) for k, v in self.bad.items()}}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    self.good = {k: collections.deque(v, maxlen=self.buffer_size) for k, v in state.get("good", {}).items()}
    self.bad = {k: collections.deque(v, maxlen=self.buffer_size) for k, v in state.get("bad", {}).items()}


def task_key(spec: EpisodeSpec) -> str:
  """Which task an episode plays: its environment, options and seed (the loop draws seeds from a finite
  task pool, so a task's episodes share the key across iterations)."""
  return f"{spec.env_id}:{spec.seed}"
