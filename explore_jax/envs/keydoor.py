"""KeyDoor: a small procedurally generated corridor that the tiny model learns in minutes.

Rooms 1..N lie in a row. The key is in one room, a locked door in another, a few distractor items
lie around, and the agent starts somewhere. Success is opening the door while holding the key.

Response format: the response is exactly one action, nothing else. Surrounding whitespace, runs of
whitespace inside it and letter case are forgiven; anything outside the action set is an invalid
action (format reward 0). The action set is fixed: "go left", "go right", "take key", "open door"
and "take <item>" for every item in ITEMS. An action from the set that does nothing here (going left
from room 1, opening a door that is elsewhere) is well formed (format reward 1) but only costs the
step; the observation says why. The observation lists the admissible actions, e.g.

  Room 2/4. Here: key, apple. Held: nothing. Key: here. Door: right.
  Actions: go left, go right, take key, take apple.

(about 40 tokens of the tiny tokenizer; "Key:" is left out once the key is held).

With `hints=True` (the default) the observation says in which direction the key and the door lie,
so the oracle's action is a function of the observation alone and a reactive policy can match it;
with `hints=False` the agent must search the corridor. The task id (an int) fixes the whole layout; a
seeded reset draws it from `task_range`, so equal seeds give equal episodes.

Two oracles play the demonstrations an SFT warm start imitates (`oracle`):

  planner  (default) sees the layout and walks straight to the key, then to the door. Without hints no
           observation shows where the key is, so a policy cannot imitate its first moves: it learns the
           moves, not when to make which.
  search   plays what an agent that sees only the observations can: it sweeps the corridor, first towards
           the nearer end (the left on a tie), then back to the other, takes the key where it sees it,
           and goes to the door once it has seen it (or sweeps on until it does). Its action is a function
           of the episode's observations so far. Its worst case is 2N + floor((N-1)/2) steps in N rooms:
           12 in the protocols' 5 rooms, the step limit there.
"""

from __future__ import annotations

import numbers
import random
from typing import Any

from explore_jax.envs.base import Outcome, TextEnv, excerpt, with_actions

ORACLES = ("planner", "search")
ITEMS = ("apple", "book", "coin", "cup", "lamp", "map", "ring", "shoe")
ACTIONS = ("go left", "go right", "take key", "open door") + tuple(f"take {item}" for item in ITEMS)
_ACTION_SET = frozenset(ACTIONS)


class KeyDoorEnv(TextEnv):
  """Find the key, carry it to the locked door, open the door (reward 1, then the episode ends).

  Args:
    num_rooms: rooms in the corridor (at least 2; the key and the door are in different rooms).
    num_distractors: items besides the key lying in random rooms (taking them wastes a step).
    max_steps: step limit; default 2 * num_rooms + 2, two more than the oracle's worst case.
    hints: whether the observation tells the direction of the key and of the door.
    oracle: "planner" or "search" (the module docstring): who plays `oracle_action`.
    task_range: [low, high) range from which a seeded reset draws the task id.
    render_mode: None or "ansi" (render() returns the last observation).
  """

  response_format = 'Reply with exactly one of the listed actions, e.g. "go right".'

  def __init__(self, num_rooms: int = 4, num_distractors: int = 2, max_steps: int | None = None,
               hints: bool = True, task_range: tuple[int, int] = (0, 1_000_000), oracle: str = "planner",
               render_mode: str | None = None):
    if num_rooms < 2:
      raise ValueError(f"num_rooms must be at least 2, got {num_rooms}")
    if not 0 <= num_distractors <= len(ITEMS):
      raise ValueError(f"num_distractors must be in [0, {len(ITEMS)}], got {num_distractors}")
    if task_range[0] >= task_range[1]:
      raise ValueError(f"task_range must be a non-empty [low, high), got {task_range}")
    if oracle not in ORACLES:
      raise ValueError(f"oracle must be one of {ORACLES}, got {oracle!r}")
    super().__init__(max_steps=2 * num_rooms + 2 if max_steps is None else max_steps,
                     render_mode=render_mode)
    self.num_rooms = num_rooms
    self.num_distractors = num_distractors
    self.hints = hints
    self.oracle = oracle
    self.task_range = (int(task_range[0]), int(task_range[1]))
    self.room = 0
    self.key_room: int | None = 0  # None once the key is held
    self.door_room = 1
    self.items: list[list[str]] = []
    self.held: list[str] = []
    self.visited: set[int] = set()  # the rooms this episode has shown (the search oracle's memory)
    self._first_end = 0             # the end of the corridor the search sweeps towards first

  def _reset_task(self, options: dict[str, Any]) -> int:
    task_id = options.get("task_id")
    if task_id is None:
      task_id = int(self.np_random.integers(*self.task_range))
    elif isinstance(task_id, bool) or not isinstance(task_id, numbers.Integral):
      raise ValueError(f"task_id must be an int, got {task_id!r}")
    task_id = int(task_id)
    # A string-seeded random.Random is stable across processes, platforms and Python versions.
    rng = random.Random(f"KeyDoor:{self.num_rooms}:{self.num_distractors}:{task_id}")
    self.room = rng.randrange(self.num_rooms)
    self.key_room = rng.randrange(self.num_rooms)
    self.door_room = rng.choice([r for r in range(self.num_rooms) if r != self.key_room])
    self.items = [[] for _ in range(self.num_rooms)]
    for item in rng.sample(ITEMS, self.num_distractors):
      self.items[rng.randrange(self.num_rooms)].append(item)
    for room_items in self.items:
      room_items.sort(key=ITEMS.index)
    self.held = []
    self.visited = {self.room}
    self._first_end = 0 if self.room <= self.num_rooms - 1 - self.room else self.num_rooms - 1
    return task_id

  def raw_observation(self) -> str:
    seen = (["key"] if self.key_room == self.room else []) + (
        ["door"] if self.door_room == self.room else []) + self.items[self.room]
    text = (f"Room {self.room + 1}/{self.num_rooms}. Here: {', '.join(seen) or 'nothing'}. "
            f"Held: {', '.join(self.held) or 'nothing'}.")
    if self.hints:
      if self.key_room is not None:
        text += f" Key: {self._direction(self.key_room)}."
      text += f" Door: {self._direction(self.door_room)}."
    return with_actions(text, self.admissible_actions())

  def _direction(self, room: int) -> str:
    return "here" if room == self.room else ("left" if room < self.room else "right")

  def admissible_actions(self) -> list[str]:
    actions = []
    if self.room > 0:
      actions.append("go left")
    if self.room < self.num_rooms - 1:
      actions.append("go right")
    if self.key_room == self.room:
      actions.append("take key")
    actions += [f"take {item}" for item in self.items[self.room]]
    if self.door_room == self.room:
      actions.append("open door")
    return actions

  def parse_action(self, text: Any) -> tuple[str | None, str]:
    if not isinstance(text, str):
      return None, f"The response must be text, got {type(text).__name__}."
    words = text.split()
    if not words:
      return None, "The response is empty."
    action = " ".join(words).lower()
    if action in _ACTION_SET:
      return action, ""
    return None, f'Unknown action "{excerpt(text)}".'

  def _apply(self, action: str) -> Outcome:
    if action in ("go left", "go right"):
      step = -1 if action == "go left" else 1
      if not 0 <= self.room + step < self.num_rooms:
        return Outcome(message=f"You cannot {action} from room {self.room + 1}.")
      self.room += step
      self.visited.add(self.room)
      return Outcome()
    if action == "open door":
      if self.door_room != self.room:
        return Outcome(message="There is no door here.")
      if self.key_room is not None:
        return Outcome(message="The door is locked. You need the key.")
      return Outcome(reward=1.0, success=True, terminated=True, message="You open the door.")
    thing = action.removeprefix("take ")
    if thing == "key" and self.key_room == self.room:
      self.key_room = None
      self.held.append("key")
      return Outcome()
    if thing in self.items[self.room]:
      self.items[self.room].remove(thing)
      self.held.append(thing)
      return Outcome()
    return Outcome(message=f"There is no {thing} here.")

  def _feedback(self, truncated: bool) -> str:
    if self.success:
      return f"Success: you opened the door in {self.steps} steps."
    if self.key_room is not None:
      return f"Failure: out of steps before taking the key; it was in room {self.key_room + 1}."
    return f"Failure: out of steps holding the key; the door was in room {self.door_room + 1}."

  def oracle_action(self) -> str:
    """The oracle's next action (`oracle`), as the exact response text: fetch the key, then open the door."""
    target = self.door_room if self.key_room is None else self.key_room
    if self.oracle == "search" and target not in self.visited:
      # Not seen yet: sweep towards the first end until it has been seen, then towards the other.
      target = self._first_end if self._first_end not in self.visited else self.num_rooms - 1 - self._first_end
    if target == self.room:
      return "open door" if self.key_room is None else "take key"
    return "go left" if target < self.room else "go right"
