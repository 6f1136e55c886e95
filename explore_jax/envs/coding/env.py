"""Coding-v0: write a program that passes a task's tests, in a few attempts with feedback.

The observation is the problem statement; after a failed attempt it also carries a short failure
section ("Your previous code failed: assert f(5) == 8 (got 15)", cut to `feedback_chars`), so the
raw observation, and with it the state key, differs per outcome. A response gives a strategy after
"### Strategy" and the code after the last line starting with "### Code"; ``` or ```python fences
around the code are removed (with anything after the closing fence). A response without a
"### Code" section, with an empty one or with code longer than the text space is an invalid action:
format reward 0, and it still uses up an attempt.

Each valid attempt runs the task's setup and the code in the sandbox, and the tests outside it (they
call the code through proxies and compare plain data; see sandbox.py). All tests pass:
reward 1, success, the episode terminates. Otherwise the next attempt follows; after `attempts`
attempts the episode truncates. `info` adds, on every step:

  outcome   the failing tests' names, sorted ([] when all pass, ["<invalid>"] for an invalid
            action): the outcome key of pass@k's distinct-outcome count
  status    the sandbox's status ("passed", "failed", "timeout", ..., or "invalid")

and `feedback` at the episode's end is the last failure message (what SGE's reflection reads) or
"All tests passed.". A seeded reset plays task `seed % num_tasks`; `reset(options={"task_index":
i})` plays task i exactly (pass@k runs every task).
"""

from __future__ import annotations

from typing import Any

from explore_jax.envs.base import MAX_TEXT_LENGTH, Outcome, TextEnv, excerpt, task_index
from explore_jax.envs.coding.sandbox import ExecutionResult, run_program
from explore_jax.envs.coding.tasks import CodingTask, make_tasks

CODE_HEADER = "### Code"
STRATEGY_HEADER = "### Strategy"
GENERIC_STRATEGY = "Implement the specification directly."
SUCCESS_FEEDBACK = "All tests passed."


def extract_code(response: str) -> str:
  """The code of a response: the text after the last line starting with "### Code", unfenced.

  Returns "" when there is no such line or nothing after it.
  """
  lines = response.split("\n")
  starts = [i for i, line in enumerate(lines) if line.lstrip().startswith(CODE_HEADER)]
  if not starts:
    return ""
  body = lines[starts[-1] + 1:]
  while body and not body[0].strip():
    body.pop(0)
  if body and body[0].strip().startswith("```"):
    body.pop(0)
    for i, line in enumerate(body):
      if line.strip().startswith("```"):
        body = body[:i]
        break
  elif any(line.strip() == "```" for line in body):  # a closing fence without an opening one
    body = body[:next(i for i, line in enumerate(body) if line.strip() == "```")]
  return "\n".join(body).rstrip() + "\n" if "\n".join(body).strip() else ""


class CodingEnv(TextEnv):
  """Solve a coding task in at most `attempts` attempts; the sandbox runs every attempt.

  Args:
    dataset: "procedural", "humaneval" or a .jsonl path (see tasks.make_tasks).
    split: the procedural split ("train", "test" or "sft").
    num_tasks: how many procedural tasks.
    family_seed: the procedural family's seed.
    path: a JSONL file of tasks (MBPP, LeetCodeDataset, APPS, HumanEval); overrides `dataset`.
    attempts: attempts per episode (the step limit).
    time_limit_s: wall-clock limit of one attempt (program and all its tests).
    memory_mb: address-space limit of one attempt.
    feedback_chars: the longest failure message shown in the observation and the feedback.
    render_mode: None or "ansi".
  """

  response_format = 'First give a strategy after "### Strategy", then the code after "### Code".'

  def __init__(self, dataset: str = "procedural", split: str = "train", num_tasks: int = 64,
               family_seed: int = 0, path: str | None = None, attempts: int = 2,
               time_limit_s: float = 2.0, memory_mb: int = 1024, feedback_chars: int = 300,
               render_mode: str | None = None):
    super().__init__(max_steps=attempts, render_mode=render_mode)
    if feedback_chars < 16:
      raise ValueError(f"feedback_chars must be at least 16, got {feedback_chars}")
    self.tasks: list[CodingTask] = make_tasks(dataset, split=split, num_tasks=num_tasks,
                                              family_seed=family_seed, path=path)
    if not self.tasks:
      raise ValueError("the dataset has no tasks")
    self.time_limit_s = time_limit_s
    self.memory_mb = memory_mb
    self.feedback_chars = feedback_chars
    self.task_index = 0
    self.task: CodingTask = self.tasks[0]
    self.failure = ""          # the failure section of the observation ("" before any failure)
    self.last_result: ExecutionResult | None = None
    self._seed: int | None = None
    self._last_message = ""    # the last failure's message, for the episode's feedback
    self._outcome: list[str] = []
    self._status = ""

  @property
  def num_tasks(self) -> int:
    return len(self.tasks)

  def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
    self._seed = seed
    return super().reset(seed=seed, options=options)

  def step(self, response: Any):
    self._outcome, self._status = ["<invalid>"], "invalid"  # unless the response parses
    return super().step(response)

  def _reset_task(self, options: dict[str, Any]) -> str:
    self.task_index = task_index(options, self._seed, self.num_tasks, self.np_random)
    self.task = self.tasks[self.task_index]
    self.failure = ""
    self.last_result = None
    self._last_message = ""
    return self.task.task_id

  def raw_observation(self) -> str:
    return f"{self.task.prompt}\n{self.failure}" if self.failure else self.task.prompt

  def parse_action(self, text: Any) -> tuple[str | None, str]:
    if not isinstance(text, str):
      return None, f"The response must be text, got {type(text).__name__}."
    if not any(line.lstrip().startswith(CODE_HEADER) for line in text.split("\n")):
      return None, f'The response has no "{CODE_HEADER}" section.'
    code = extract_code(text)
    if not code:
      return None, f'The "{CODE_HEADER}" section is empty.'
    if len(code) > MAX_TEXT_LENGTH:
      return None, f"The code is too long ({len(code)} characters, at most {MAX_TEXT_LENGTH})."
    return code, ""

  def _apply(self, code: str) -> Outcome:
    result = run_program(code, self.task.tests, setup=self.task.setup,
                         time_limit_s=self.time_limit_s, memory_mb=self.memory_mb,
                         max_output_chars=max(self.feedback_chars, 16))
    self.last_result = result
    self._outcome, self._status = list(result.failing), result.status
    if result.passed:
      return Outcome(reward=1.0, success=True, terminated=True, message=SUCCESS_FEEDBACK)
    self._last_message = excerpt(result.message or result.status, self.feedback_chars)
    self.failure = f"Your previous code failed: {self._last_message}"
    return Outcome()

  def _feedback(self, truncated: bool) -> str:
    if self.success:
      return SUCCESS_FEEDBACK
    if self._last_message:
      return self._last_message
    return "No attempt gave code to run."

  def _extra_info(self) -> dict[str, Any]:
    if self.steps == 0:
      return {}
    return {"outcome": list(self._outcome), "status": self._status}

  def oracle_action(self) -> str:
    """The canonical solution as a response (no fences, so the tiny model's responses stay short)."""
    if self.task.canonical_solution is None:
      raise RuntimeError(f"task {self.task.task_id} has no canonical solution")
    strategy = self.task.strategy or GENERIC_STRATEGY
    return f"{STRATEGY_HEADER}\n{strategy}\n{CODE_HEADER}\n{self.task.canonical_solution}"
