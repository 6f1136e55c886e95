"""A polite stop: on SIGTERM the run finishes the iteration it is in, saves a checkpoint there and leaves.

`kill PID`, a sweep taken down (launch/sweep.py), a preemptible VM's shutdown and a cluster's time limit all send
SIGTERM before they kill. Dying at once loses every iteration since the last checkpoint (`checkpoint.every`):
with iterations of minutes, up to an hour of work. Instead the loop (train/loop.py) asks at the end
of each iteration whether a stop was requested, and if the run can resume exactly from there (any iteration of a
synchronous run; an overlapped run's synchronisation points only, train/pipeline.py) saves and raises `Stopped`.
It asks again before each task set of a pass@k (the warm start's before iteration 1, the trained policy's after
the last: minutes of sampling each), and leaves at the iteration last saved; the sets not finished are sampled
when the run resumes. The same command resumes it. A second SIGTERM ends the process at once, as if no handler
were there.

  with StopRequest() as stop:      # the handler lives for the `with` (main thread only)
    for it in ...:
      ...
      if resumable(n) and stop.agreed():
        save(n)
        raise Stopped(n)

In a multi-process run the signal may reach some processes only: `agreed()` is a collective (one flag from
each process), so every process must call it at the same point, and all of them stop at the same step or none.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils


class Stopped(Exception):
  """The run stopped on request after saving iteration `iteration`; the same command resumes it."""

  def __init__(self, iteration: int):
    super().__init__(f"stopped on request at iteration {iteration}, its checkpoint saved; the same command "
                     "resumes the run from there")
    self.iteration = iteration


class StopRequest:
  """Notes a SIGTERM while the `with` block runs (module docstring). Off the main thread, where Python cannot
  install a handler, no signal is caught and `requested` is only what the caller sets."""

  def __init__(self):
    self.requested = False
    self._previous: Any = None
    self._installed = False

  def __enter__(self) -> "StopRequest":
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
      self._installed = True
    return self

  def __exit__(self, *exc: Any) -> None:
    if self._installed:
      signal.signal(signal.SIGTERM, self._previous)
      self._installed = False

  def _on_sigterm(self, signum: int, frame: Any) -> None:
    self.requested = True
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    print("[stop] SIGTERM: the run stops after this iteration, with a checkpoint there (a second SIGTERM "
          "stops it now)", file=sys.stderr, flush=True)

  def agreed(self) -> bool:
    """Whether any process of the run was asked to stop. A collective when there are several processes."""
    if jax.process_count() == 1:
      return self.requested
    flags = multihost_utils.process_allgather(np.asarray([int(self.requested)], np.int32))
    return bool(np.asarray(flags).any())
