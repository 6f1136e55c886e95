"""Run metrics: one JSON line per iteration, TensorBoard event files, PNG learning curves at the end; in a local
run directory or a bucket (explore_jax/storage.py)."""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping, Optional, Sequence

from explore_jax import storage
from explore_jax.train import events


class MetricsWriter:
  """Appends `{"iteration": i, **scalars}` to workdir/metrics.jsonl and mirrors it to TensorBoard.

  Reopening a workdir after a resume drops lines past the restored iteration, so a resumed run's file
  reads as if it had never stopped. With `write=False` (the processes of a multi-host run other than process
  0) it keeps the history in memory and writes nothing. In a bucket, whose objects cannot be appended to,
  each row rewrites metrics.jsonl whole (the same lines: the history) and the event file is uploaded whole
  at each flush; both are small next to an iteration. TensorBoard's event file is explore_jax/train/events.py's.
  """

  def __init__(self, workdir: str, *, resume_from: Optional[int] = None, tensorboard: bool = True,
               write: bool = True):
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.history: list[dict[str, Any]] = []
    self._write = write
    self._remote = storage.is_remote(workdir)
    if write and storage.exists(self.path):
      with storage.open(self.path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
      self.history = [r for r in rows if resume_from is not None and r["iteration"] <= resume_from]
      self._rewrite()
    self._events = events.EventFile(os.path.join(workdir, "tensorboard")) if tensorboard and write else None

  def _rewrite(self) -> None:
    """metrics.jsonl as the history, whole (a resume's truncation; every row in a bucket)."""
    with storage.open(self.path, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in self.history)

  def write(self, iteration: int, scalars: Mapping[str, float]) -> None:
    row = {"iteration": int(iteration), **{k: _plain(v) for k, v in scalars.items()}}
    self.history.append(row)
    if not self._write:
      return
    if self._remote:
      self._rewrite()
    else:
      with open(self.path, "a") as f:
        f.write(json.dumps(row) + "\n")
    if self._events is not None:
      self._events.add_scalars(iteration, {k: v for k, v in row.items() if k != "iteration"
                                           and isinstance(v, (int, float)) and math.isfinite(v)})
      self._events.flush()

  def close(self) -> None:
    if self._events is not None:
      self._events.close()


def _plain(v: Any) -> Any:
  try:
    return float(v)
  except (TypeError, ValueError):
    return v


def plot_curves(history: Sequence[Mapping[str, Any]], keys: Sequence[str], path: str, title: str = "") -> str:
  """Writes a PNG with one panel per metric in `keys` against the iteration; returns its path."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  keys = [k for k in keys if any(k in r for r in history)]
  fig, axes = plt.subplots(len(keys), 1, figsize=(6, 2.2 * max(len(keys), 1)), squeeze=False)
  for ax, k in zip(axes[:, 0], keys):
    pts = [(r["iteration"], r[k]) for r in history if k in r]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".")
    ax.set_ylabel(k)
    ax.grid(alpha=0.3)
  axes[-1, 0].set_xlabel("iteration")
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  storage.save_figure(fig, path, dpi=100)
  plt.close(fig)
  return path

