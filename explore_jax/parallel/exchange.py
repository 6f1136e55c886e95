"""Host objects between the processes of a multi-host run: every process gets every process's object.

  exchange = ProcessExchange()              # after distributed.initialize, in every process
  views = exchange.allgather(obj)           # [process 0's obj, process 1's obj, ...] on every process

The actor pool's rounds (actors/pool.py) are built on this: each process's pending requests (which may
carry uint8 images) and, after a run, its episode results. An object travels pickled, as a uint8 row padded
to a width every process agrees on, through jax's own collective (`multihost_utils.process_allgather`, over
the accelerators' interconnect, or gloo between CPU processes): one gather of the byte counts, one of the
padded rows. Widths are powers of two (at least 1 KiB), so the gathers compile for a few shapes only.

`allgather` is a collective: every process must call it the same number of times, in the same order, and
from the thread that issues the run's other collectives.
"""

from __future__ import annotations

import pickle
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

_MIN_WIDTH = 1024


class ProcessExchange:
  """allgather of picklable objects among jax's processes (module docstring); the actor pool's `exchange`."""

  def __init__(self):
    self.process_index = jax.process_index()
    self.process_count = jax.process_count()

  def allgather(self, obj: Any) -> list[Any]:
    """Every process's `obj`, in process order (this process's own comes back as a copy)."""
    payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    if payload.size >= 2**31:
      raise ValueError(f"an exchanged object may be at most 2 GiB pickled, got {payload.size} bytes")
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([payload.size], np.int32))).reshape(-1)
    width = max(_MIN_WIDTH, 1 << (int(sizes.max()) - 1).bit_length())
    row = np.zeros((width,), np.uint8)
    row[:payload.size] = payload
    rows = np.asarray(multihost_utils.process_allgather(row))
    return [pickle.loads(rows[i, :int(n)].tobytes()) for i, n in enumerate(sizes)]
