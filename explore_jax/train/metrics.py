"""Run metrics: one JSON line per iteration, TensorBoard event files, PNG learning curves at the end; in a local
run directory or a bucket (explore_jax/storage.py)."""

from __future__ import annotations

import io
import json
import math
import os
from typing import Any, Mapping, Optional, Sequence

from explore_jax import storage


class MetricsWriter:
  """Appends `{"iteration": i, **scalars}` to workdir/metrics.jsonl and mirrors it to TensorBoard.

  Reopening a workdir after a resume drops lines past the restored iteration, so a resumed run's file
  reads as if it had never stopped. With `write=False` (the processes of a multi-host run other than process
  0) it keeps the history in memory and writes nothing. In a bucket, whose objects cannot be appended to,
  each row rewrites metrics.jsonl whole (the same lines: the history) and the event file is uploaded whole
  at each flush; both are small next to an iteration.
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
    self._tb = None
    if tensorboard and write:
      from tensorboardX import SummaryWriter
      if self._remote:
        _events_through_storage(storage.scheme(workdir))
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

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
    if self._tb is not None:
      for k, v in row.items():
        if k != "iteration" and isinstance(v, (int, float)) and math.isfinite(v):
          self._tb.add_scalar(k, v, iteration)
      self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


class _WholeObjectEventFile:
  """A TensorBoard event file in a bucket for tensorboardX's record writer: its bytes are kept here and the
  object is uploaded whole at every flush (and on close), as objects cannot be appended to."""

  def __init__(self, path: str):
    self.path, self._buffer = path, io.BytesIO()

  def write(self, data: bytes) -> None:
    self._buffer.write(data)

  def flush(self) -> None:
    with storage.open(self.path, "wb") as f:
      f.write(self._buffer.getvalue())

  def close(self) -> None:
    self.flush()


class _WholeObjectEventFiles:
  """tensorboardX's writer factory interface (record_writer.register_writer_factory)."""

  def open(self, path: str) -> _WholeObjectEventFile:
    return _WholeObjectEventFile(path)

  def directory_check(self, path: str) -> None:
    """Objects need no directory."""


def _events_through_storage(scheme: str) -> None:
  """Event files under `scheme`:// go through explore_jax.storage, the client every other run file uses (and
  the one an emulator is configured for), rather than tensorboardX's own gs:// / s3:// clients."""
  from tensorboardX import record_writer

  record_writer.register_writer_factory(scheme, _WholeObjectEventFiles())


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

