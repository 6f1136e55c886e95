"""Exploration metrics over a fixed task set: pass@k, success, distinct outcomes and distinct states per task.

pass@k uses the unbiased estimator of Chen et al. (2021): with n samples of a task of which c succeed,

  pass@k = 1 - C(n - c, k) / C(n, k)          (computed as 1 - prod_{i=n-c+1}^{n} (1 - k / i))

averaged over tasks; it needs n >= k. Over a task's n samples:
  distinct outcomes  the distinct outcome keys: where an environment names an `outcome` in its step info
                     (coding: the set of failing tests of every submission, SGE's measure), those; elsewhere
                     (the text worlds) an attempt's outcome is where it ended: its final observation and success
  distinct states    the distinct state keys of every observation a prompt was built from, the final one
                     included: how much of the world the attempts saw (EMPO2's exploration measure)
  steps to success   the steps of the attempts that succeeded (DPEPO's shorter episodes), summed per task
Summaries written before the states were counted read back without them (`states`, `success_steps` None).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Sequence

import numpy as np

from explore_jax import storage
from explore_jax.actors.protocol import EpisodeResult
from explore_jax.envs.base import state_key as observation_key


# The policies a run's pass@k compares, and the label of one policy's pass@k on one task set.
WARM_START, TRAINED = "warm start", "trained"


def task_set_label(policy: str, task_set: str) -> str:
  """The label of `policy`'s pass@k on `task_set` ("warm start / held-out"): summary.json's keys."""
  return f"{policy} / {task_set}"


def split_task_set_label(label: str) -> tuple[str, str]:
  """(policy, task set) of a task_set_label."""
  policy, _, task_set = label.partition(" / ")
  return policy, task_set


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k of one task: n samples, c correct."""
  if not 0 <= c <= n:
    raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
  if not 1 <= k <= n:
    raise ValueError(f"pass@{k} needs at least {k} samples per task, got n={n}")
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def outcome_key(step_info: dict[str, Any], state_key: int) -> str:
  """The outcome of one attempt: the environment's `outcome` (e.g. failing tests) or the state it led to."""
  if "outcome" in step_info:
    return json.dumps(step_info["outcome"], sort_keys=True)
  return str(state_key)


def attempt_outcomes(result: EpisodeResult) -> set[str]:
  """The outcome keys of one attempt (see the module docstring)."""
  named = {outcome_key(s.info, s.state_key) for s in result.steps if "outcome" in s.info}
  if named:
    return named
  return {json.dumps([_final_key(result), bool(result.success)])}


def attempt_states(result: EpisodeResult) -> set[int]:
  """The state keys one attempt saw: every step's, and the observation it ended on."""
  return {int(s.state_key) for s in result.steps} | {_final_key(result)}


def _final_key(result: EpisodeResult) -> int:
  if result.final_state_key is not None:
    return int(result.final_state_key)
  return int(observation_key(result.final_observation))


@dataclasses.dataclass
class TaskSetEval:
  """Per-task samples (n), successes (c), distinct outcomes and states for one policy on one task set."""
  label: str
  task_ids: list[Any]
  samples: np.ndarray      # [T] int
  successes: np.ndarray    # [T] int
  outcomes: np.ndarray     # [T] int: distinct outcome keys over all attempts
  states: np.ndarray | None = None  # [T] int: distinct state keys over all attempts (None: an older summary)
  success_steps: np.ndarray | None = None  # [T] int: steps summed over the successful attempts (None: older)
  # A GUI world read by ScreenReading-v0: eqs. 5-6 over the visual latents of the screens after each step,
  # {"d_seq_vis": mean over episodes, "d_grp_vis": mean over tasks of all their attempts' screens} (screen_diversity).
  diversity: dict[str, float] | None = None

  @property
  def min_samples(self) -> int:
    return int(self.samples.min()) if len(self.samples) else 0

  def pass_at(self, k: int) -> float:
    return float(np.mean([pass_at_k(int(n), int(c), k) for n, c in zip(self.samples, self.successes)]))

  def curve(self, ks: Sequence[int]) -> dict[int, float]:
    return {k: self.pass_at(k) for k in ks}

  def to_json(self) -> dict[str, Any]:
    """The raw counts (what `from_json` reads back)."""
    d = {"label": self.label, "task_ids": list(self.task_ids), "samples": self.samples.tolist(),
         "successes": self.successes.tolist(), "outcomes": self.outcomes.tolist()}
    for name in ("states", "success_steps"):
      if getattr(self, name) is not None:
        d[name] = getattr(self, name).tolist()
    if self.diversity is not None:
      d["diversity"] = dict(self.diversity)
    return d

  @classmethod
  def from_json(cls, d: dict[str, Any]) -> "TaskSetEval":
    optional = {name: None if d.get(name) is None else np.asarray(d[name], int) for name in ("states", "success_steps")}
    return cls(d["label"], list(d["task_ids"]), np.asarray(d["samples"], int), np.asarray(d["successes"], int),
               np.asarray(d["outcomes"], int), **optional, diversity=d.get("diversity"))

  def to_dict(self, ks: Sequence[int]) -> dict[str, Any]:
    d = {"label": self.label, "tasks": len(self.task_ids), "samples_per_task": self.min_samples,
         "success_rate": float(self.successes.sum() / max(self.samples.sum(), 1)),
         "pass_at_k": {str(k): v for k, v in self.curve(ks).items()},
         "distinct_outcomes_per_task": float(self.outcomes.mean()) if len(self.outcomes) else 0.0,
         "tasks_solved_at_least_once": int((self.successes > 0).sum())}
    if self.states is not None:
      d["distinct_states_per_task"] = float(self.states.mean()) if len(self.states) else 0.0
    if self.success_steps is not None:  # None where nothing succeeded
      wins = int(self.successes.sum())
      d["steps_to_success"] = float(self.success_steps.sum() / wins) if wins else None
    if self.diversity is not None:
      d.update(self.diversity)
    return d


def summarize(label: str, results: Sequence[EpisodeResult]) -> TaskSetEval:
  """Groups finished episodes by task (their seed) into a TaskSetEval; dropped episodes do not count."""
  by_task: dict[Any, list[EpisodeResult]] = {}
  for r in results:
    if not r.dropped:
      by_task.setdefault(r.spec.seed, []).append(r)
  tasks = sorted(by_task)
  return TaskSetEval(label=label, task_ids=tasks,
                     samples=np.array([len(by_task[t]) for t in tasks], int),
                     successes=np.array([sum(r.success for r in by_task[t]) for t in tasks], int),
                     outcomes=np.array([len(set().union(*map(attempt_outcomes, by_task[t]))) for t in tasks], int),
                     states=np.array([len(set().union(*map(attempt_states, by_task[t]))) for t in tasks], int),
                     success_steps=np.array([sum(len(r.steps) for r in by_task[t] if r.success) for t in tasks], int),
                     diversity=screen_diversity([by_task[t] for t in tasks]))


def screen_diversity(tasks: Sequence[Sequence[EpisodeResult]]) -> dict[str, float] | None:
  """d_seq and D_grp (rl/screen_rewards.py, eqs. 5-6) of the visual latents of info["screen"]["after"] (a world
  in ScreenReading-v0): d_seq averaged over episodes, D_grp over each task's attempts together, averaged over
  tasks; None when the steps carry no screens."""
  from explore_jax.rl import screen_rewards

  def latents(r: EpisodeResult) -> list[np.ndarray]:
    return [np.asarray(s.info["screen"]["after"]["latent"], np.float32) for s in r.steps if "screen" in s.info]

  per_task = [[latents(r) for r in attempts] for attempts in tasks]
  if not any(e for attempts in per_task for e in attempts):
    return None

  def diversity(rows: list[np.ndarray]) -> float:
    if len(rows) < 2:
      return 0.0
    x = np.stack(rows)[None]
    return float(screen_rewards.group_diversity(x, np.ones(x.shape[:2], bool))[0])

  seq = [diversity(e) for attempts in per_task for e in attempts]
  grp = [diversity([x for e in attempts for x in e]) for attempts in per_task]
  return {"d_seq_vis": float(np.mean(seq)), "d_grp_vis": float(np.mean(grp))}


def write_transcripts(path: str, results: Sequence[EpisodeResult], per_task: int = 1) -> int:
  """Writes the first `per_task` episodes of every task (by seed) as JSONL, one line per episode: the task, its
  outcome, and per step the observation the prompt was built from, the reply, its rewards and the
  environment's feedback -- what a reader needs to see *how* a policy fails. Returns the episodes written."""
  seen: dict[Any, int] = {}
  n = 0
  storage.makedirs(os.path.dirname(storage.resolve(path)))
  with storage.open(path, "w") as f:
    for r in sorted(results, key=lambda r: r.spec.episode_id):
      if seen.get(r.spec.seed, 0) >= per_task:
        continue
      seen[r.spec.seed] = seen.get(r.spec.seed, 0) + 1
      steps = [{"observation": _readable(s.observation), "response": s.response_text, "task_reward": s.task_reward,
                "format_reward": s.format_reward, "feedback": str(s.info.get("feedback", ""))} for s in r.steps]
      f.write(json.dumps({"task": r.spec.seed, "episode": r.spec.episode_id, "success": bool(r.success),
                          "return": float(r.total_reward), "error": r.error, "steps": steps}, default=str) + "\n")
      n += 1
  return n


def _readable(observation: Any) -> Any:
  """An observation as a transcript shows it: text as is; arrays (a GUI world's screenshot) by their shape."""
  if isinstance(observation, dict):
    return {k: _readable(v) for k, v in observation.items()}
  if isinstance(observation, np.ndarray):
    return f"<array {'x'.join(map(str, observation.shape))} {observation.dtype}>"
  return observation


def powers_of_two(n: int) -> list[int]:
  """1, 2, 4, ... up to n."""
  ks, k = [], 1
  while k <= n:
    ks.append(k)
    k *= 2
  return ks


def table(evals: Sequence[TaskSetEval], ks: Sequence[int]) -> str:
  """A markdown table: one row per evaluation, pass@k columns, success, distinct outcomes and states."""
  screens = any(e.diversity is not None for e in evals)
  head = ["policy / tasks", "tasks", "n"] + [f"pass@{k}" for k in ks] + ["solved≥1", "distinct outcomes",
                                                                          "distinct states"]
  head += ["d_seq (screens)", "D_grp (screens)"] if screens else []
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for e in evals:
    row = [e.label, str(len(e.task_ids)), str(e.min_samples)]
    row += [f"{e.pass_at(k):.3f}" for k in ks]
    row += [f"{int((e.successes > 0).sum())}", f"{e.outcomes.mean():.2f}" if len(e.outcomes) else "-",
            f"{e.states.mean():.2f}" if e.states is not None and len(e.states) else "-"]
    if screens:
      row += [f"{e.diversity[k]:.4f}" if e.diversity is not None else "-" for k in ("d_seq_vis", "d_grp_vis")]
    lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines)


def plot_pass_at_k(evals: Sequence[TaskSetEval], ks: Sequence[int], path: str, title: str = "") -> str:
  """pass@k against k (log2 axis), one line per evaluation; returns the PNG's path."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 4))
  for e in evals:
    ax.plot(list(ks), [e.pass_at(k) for k in ks], marker="o", label=e.label)
  ax.set_xscale("log", base=2)
  ax.set_xlabel("k")
  ax.set_ylabel("pass@k")
  ax.set_ylim(0, 1)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  if title:
    ax.set_title(title)
  fig.tight_layout()
  storage.save_figure(fig, path, dpi=100)
  plt.close(fig)
  return path
