"""A few of each iteration's training episodes as text, in workdir/samples.jsonl: what the policy actually writes
(an EAPO answer's explore and memory fields, an SGE strategy, a DPEPO parallel response), beside the metrics.

  {"iteration": i, "episode": traj_id, "group": group_id, "seed": ..., "success": ..., "return": ...,
   "steps": [{"observation": ..., "response": ..., "reward": ..., "format_reward": ...}, ...]}

`config.train.log_samples` = N episodes per iteration (0: none), the first N by trajectory id. Texts are cut to
`MAX_CHARS` each. A resumed run drops the lines past the iteration it restored, as metrics.jsonl does.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from explore_jax import storage
from explore_jax.actors.protocol import EpisodeResult

MAX_CHARS = 2_000


def _text(value: Any) -> str:
  text = str(value.get("text", "")) if isinstance(value, dict) else str(value)
  return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + "..."


def episode_row(iteration: int, result: EpisodeResult) -> dict[str, Any]:
  """One episode as a samples.jsonl row."""
  return {"iteration": iteration, "episode": result.spec.traj_id, "group": result.spec.group_id,
          "seed": result.spec.seed, "success": bool(result.success), "return": float(result.total_reward),
          "steps": [{"observation": _text(s.observation), "response": _text(s.response_text),
                     "reward": float(s.task_reward), "format_reward": float(s.format_reward)} for s in result.steps]}


class SampleWriter:
  """Appends the first `per_iteration` episodes of each training iteration to workdir/samples.jsonl."""

  def __init__(self, workdir: str, per_iteration: int, *, resume_from: Optional[int] = None, write: bool = True):
    self.path = os.path.join(workdir, "samples.jsonl")
    self.per_iteration = int(per_iteration)
    self._on = write and self.per_iteration > 0
    if self._on and storage.exists(self.path):
      with storage.open(self.path) as f:
        kept = [line for line in f if line.strip() and resume_from is not None
                and json.loads(line)["iteration"] <= resume_from]
      with storage.open(self.path, "w") as f:
        f.writelines(kept)

  def write(self, iteration: int, results: list[EpisodeResult]) -> None:
    if not self._on:
      return
    chosen = sorted(results, key=lambda r: r.spec.traj_id)[:self.per_iteration]
    lines = "".join(json.dumps(episode_row(iteration, r)) + "\n" for r in chosen)
    if storage.is_remote(self.path):  # a bucket's objects cannot be appended to
      old = storage.open(self.path).read() if storage.exists(self.path) else ""
      with storage.open(self.path, "w") as f:
        f.write(old + lines)
    else:
      with open(self.path, "a") as f:
        f.write(lines)
