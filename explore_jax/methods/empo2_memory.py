"""EMPO²'s two memories, as plain numpy: the tips memory M (retrieval by cosine similarity, ranked by return) and
the state memory behind the novelty reward. No jax: the retrieval also runs in actor processes.

Every key is a unit embedding row stored as float16, in memory as in checkpoints, so that a run restored from a
checkpoint retrieves exactly what the uninterrupted run would have.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Optional

import numpy as np

KEY_DTYPE = np.float16


def retrieve(keys: np.ndarray, returns: np.ndarray, query: np.ndarray, *, threshold: float = 0.5,
             k: int = 10) -> np.ndarray:
  """Indices of the tips a memory-augmented step shows, best first (EMPO² section 3; the released server_mem.py):
  the entries whose cosine similarity to the query is above `threshold`, ranked by stored return (ties: the more
  similar first, then the newer), at most `k`.

  Args:
    keys: [n, E] unit rows (any float dtype).
    returns: [n] each entry's episode return.
    query: [E] a unit row.
  """
  keys = np.asarray(keys, np.float32)
  if keys.shape[0] == 0 or k <= 0:
    return np.zeros((0,), np.int64)
  similarity = keys @ np.asarray(query, np.float32)
  candidates = np.flatnonzero(similarity > threshold)
  newer = candidates.astype(np.float64)  # a larger index is a newer entry
  order = np.lexsort((-newer, -similarity[candidates], -np.asarray(returns, np.float64)[candidates]))
  return candidates[order][:k]


@dataclasses.dataclass
class TipEntry:
  tip: str
  key: np.ndarray   # [E] KEY_DTYPE
  ret: float        # the return of the episode that wrote it


class TipMemory:
  """Per task, the last `capacity` distinct tips with their keys and returns (oldest dropped, an exact duplicate
  of a stored tip skipped: the released memory server's rules)."""

  def __init__(self, capacity: int = 1000):
    if capacity < 1:
      raise ValueError(f"empo2.memory_size must be at least 1, got {capacity}")
    self.capacity = capacity
    self.tasks: dict[int, collections.deque] = {}
    self._snapshots: dict[int, dict[str, Any]] = {}  # per task, until its memory changes

  def add(self, task: int, tip: str, key: np.ndarray, ret: float) -> bool:
    """Stores a tip; False when the task already holds the same text."""
    entries = self.tasks.setdefault(task, collections.deque(maxlen=self.capacity))
    if not tip or any(e.tip == tip for e in entries):
      return False
    entries.append(TipEntry(tip, np.asarray(key, KEY_DTYPE), float(ret)))
    self._snapshots.pop(task, None)
    return True

  def snapshot(self, task: int) -> Optional[dict[str, Any]]:
    """The task's memory as an episode context carries it to the actors (None when it is empty). The group's
    episodes share one snapshot, built once per change of the memory; the caller must not mutate it."""
    entries = self.tasks.get(task)
    if not entries:
      return None
    if task not in self._snapshots:
      self._snapshots[task] = {"tips": [e.tip for e in entries], "keys": np.stack([e.key for e in entries]),
                               "returns": np.array([e.ret for e in entries], np.float32)}
    return self._snapshots[task]

  def size(self, task: int) -> int:
    return len(self.tasks.get(task, ()))

  # ---- checkpoints: the tips as JSON, keys and returns as fixed-shape arrays ----------------------------------
  def texts(self) -> dict[str, list[str]]:
    return {str(t): [e.tip for e in entries] for t, entries in self.tasks.items()}

  def arrays(self, slots: int, dim: int) -> dict[str, np.ndarray]:
    keys = np.zeros((slots, self.capacity, dim), KEY_DTYPE)
    returns = np.zeros((slots, self.capacity), np.float32)
    count = np.zeros((slots,), np.int32)
    for t, entries in self.tasks.items():
      count[t] = len(entries)
      for i, e in enumerate(entries):
        keys[t, i], returns[t, i] = e.key, e.ret
    return {"keys": keys, "returns": returns, "count": count}

  def restore(self, texts: dict[str, list[str]], arrays: dict[str, np.ndarray]) -> None:
    self.tasks, self._snapshots = {}, {}
    for t, tips in texts.items():
      t = int(t)
      if len(tips) != int(arrays["count"][t]):
        raise ValueError(f"EMPO2 checkpoint: task {t} has {len(tips)} tips but {int(arrays['count'][t])} keys")
      self.tasks[t] = collections.deque(
          (TipEntry(tip, np.asarray(arrays["keys"][t, i], KEY_DTYPE), float(arrays["returns"][t, i]))
           for i, tip in enumerate(tips)), maxlen=self.capacity)


class StateNovelty:
  """The novelty reward r = 1/n of EMPO² section 3 ("Intrinsic Rewards for Exploration"), per task.

  A list of distinct states is kept; a state whose cosine similarity to every stored one is below `threshold` is
  added to it. n is "the number of similar past states": each stored state counts the visits it stands for (its
  own and those of the later states that were similar to it), and a state's n is one (itself) plus the visits of
  the stored states it is similar to. A first visit earns 1, a state seen once before 1/2, and so on. (Were n
  the number of stored states alone, a revisited state would keep earning about 1: no novelty signal at all.)
  A visit that adds nothing is credited to the most similar stored state. When the list is full, new states are
  no longer added, and their visits are not counted.
  """

  def __init__(self, capacity: int = 1000, threshold: float = 0.95):
    self.capacity, self.threshold = capacity, threshold
    # Per task: the stored states' keys (float32 rows, the first `count` filled; the array doubles when full, up
    # to `capacity`), their visit counts and how many are stored.
    self.keys: dict[int, np.ndarray] = {}
    self.visits: dict[int, np.ndarray] = {}
    self.count: dict[int, int] = {}

  def reward(self, task: int, key: np.ndarray) -> float:
    """The reward of visiting a state (a unit row), and the memory updated with the visit."""
    key = np.asarray(key, KEY_DTYPE)
    if task not in self.keys:
      self._allocate(task, min(16, self.capacity), key.shape[-1])
    keys, visits, n_stored = self.keys[task], self.visits[task], self.count[task]
    if n_stored:
      similarity = keys[:n_stored] @ key.astype(np.float32)
      similar = similarity >= self.threshold
      if similar.any():
        n = 1 + int(visits[:n_stored][similar].sum())
        visits[int(np.argmax(similarity))] += 1
        return 1.0 / n
    if n_stored < self.capacity:
      if n_stored == len(keys):
        keys, visits = self._allocate(task, min(2 * n_stored, self.capacity), key.shape[-1])
      keys[n_stored], visits[n_stored] = key.astype(np.float32), 1
      self.count[task] = n_stored + 1
    return 1.0

  def _allocate(self, task: int, rows: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The task's arrays grown to `rows` rows, the stored ones kept."""
    n = self.count.get(task, 0)
    keys, visits = np.zeros((rows, dim), np.float32), np.zeros((rows,), np.int64)
    if n:
      keys[:n], visits[:n] = self.keys[task][:n], self.visits[task][:n]
    self.keys[task], self.visits[task], self.count[task] = keys, visits, n
    return keys, visits

  def arrays(self, slots: int, dim: int) -> dict[str, np.ndarray]:
    keys = np.zeros((slots, self.capacity, dim), KEY_DTYPE)
    visits = np.zeros((slots, self.capacity), np.int32)
    count = np.zeros((slots,), np.int32)
    for t, n in self.count.items():
      count[t] = n
      keys[t, :n] = self.keys[t][:n].astype(KEY_DTYPE)  # exact: the rows were float16 keys
      visits[t, :n] = self.visits[t][:n]
    return {"keys": keys, "visits": visits, "count": count}

  def restore(self, arrays: dict[str, np.ndarray]) -> None:
    count = np.asarray(arrays["count"])
    self.keys, self.visits, self.count = {}, {}, {}
    for t in np.flatnonzero(count).tolist():
      n = int(count[t])
      self.keys[t] = np.asarray(arrays["keys"][t, :n], KEY_DTYPE).astype(np.float32)
      self.visits[t] = np.asarray(arrays["visits"][t, :n], np.int64)
      self.count[t] = n
