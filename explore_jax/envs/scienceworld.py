"""ScienceWorld: 30 elementary-science tasks (boil water, grow a plant, ...) in a JVM.

Tasks (`task`): a name as the world spells it ("boil", "find-plant", ...), its paper id ("1-1"), or
an index into TASKS (the paper's order, 1-1 boil to 10-2 mendelian-genetics-unknown-plant). Each
task has 10 to 1,386 variations (7,207 in all), which the world splits into train, dev and test
(about half, a quarter and a quarter); a reset seed s plays the split's variation number s % len
(java.py).
`simplifications` is the world's own: "easy", or a comma-separated subset of teleportAction,
openDoors, openContainers, selfWateringFlowerPots, noElectricalAction. The task id is
"<task>:<variation>", or "<task>(<simplifications>):<variation>".

Observation (java.py: the task, then the world's answer to the last action), e.g. find-plant:

  Task: Your task is to find a(n) plant. First, focus on the thing. Then, move it to the ...
  This room is called the hallway. In it, you see:
  	the agent
  	a substance called air
  ...

Actions are free text in the world's grammar ("open door to kitchen", "focus on soap", "wait1").
Every well-formed action goes to the world, which answers in its own way: when it recognises no
action in the input it answers "No known action matches that input.", and that input changes
nothing (the answer is shown above the unchanged raw observation); an ambiguous input makes it list
numbered choices, and the next response picks one by its number ("0"). Listing the valid actions
costs the world 60-190 ms per state (it checks 400 to 3,000 action-object combinations), so
`info["admissible_actions"]` exists only for an environment made with `admissible=True`, and even
then actions are not checked against it (the world's parser accepts more forms than it lists).

Score, success and reward: the world's score (0-100) divided by 100 is `info["score"]`, 1.0 at
success and -1.0 after a failure (e.g. focusing on the wrong thing); some variations start above 0
(an optional subgoal, such as standing in a room with an open door, holds from the start). The
episode terminates when the world has completed the task (success: completed with the full score)
or the score turned negative. The reward is the change in the score floored at 0 (java.py), so a
failure takes back the progress paid out before. The oracle plays the world's gold path (generating
it costs 0.1 to 10 s, paid on the oracle's first call in an episode, never by a reset), or with
`oracle="teleport"` the same path with each walk between rooms (a run of "open door to R" and "go to R"
actions) made one "teleport to R" of its last room, and a look around after it where the path acts in the
room (a teleport's answer does not show it): find-plant's gold paths take 8 to 16 steps, 6 or 7 so (the
world's teleportAction simplification, which "easy" includes, must be on). The gold paths name things in
the world's own words ("focus on egg parrot" where the room shows "a parrot egg"); with
`oracle_names="shown"` the oracle focuses on things by the names the room lists (`shown_name`), which a
policy can copy from its observation. Measured: a
step takes 14-19 ms (80-200 ms with admissible actions), a reset 70-110 ms; a JVM holds 260-380 MB.
"""

from __future__ import annotations

import json
import re

from scienceworld.constants import ID2TASK, JAR_PATH
from scienceworld.utils import infer_task

from explore_jax.envs.base import world_text
from explore_jax.envs.java import DEFAULT_HEAP, JavaTextEnv, JavaWorld

TASKS = tuple(ID2TASK.values())
SIMPLIFICATIONS = ("teleportAction", "openDoors", "openContainers", "selfWateringFlowerPots",
                   "noElectricalAction")
NO_MATCH = "No known action matches that input."
_VARIATION_LISTS = {"train": "getVariationsTrain", "dev": "getVariationsDev",
                    "test": "getVariationsTest"}
_ELECTRICAL_TASKS = ("power-component", "conductivity")
ORACLES = ("gold", "teleport")
ORACLE_NAMES = ("world", "shown")
_WALK = re.compile(r"(?:open door to|go to) (.+)")
# A thing in a room listing: one tab, an article, the name, then maybe what it holds or its state.
_LISTED = re.compile(r"^\t(?:an?|the) (?:substance called )?([^(.,:\n]+?)\s*(?:[(.,:].*)?$", re.M)


def teleporting_path(gold: list[str]) -> list[str]:
  """A gold path with each walk between rooms (consecutive "open door to R" / "go to R" actions) made one
  "teleport to R" of the room the walk ends in (a walk that only opens doors is dropped).

  A teleport's answer ("You teleport to the outside.") does not show the room, and the gold path acts on what
  is there without looking (lifespan's "focus on egg parrot" among the three animals outside), which a policy
  could only guess. So a teleport that an action in the room follows is followed by "look around", unless the
  gold path looks itself."""
  path: list[str] = []
  room = None
  for action in gold:
    walk = _WALK.fullmatch(action)
    if walk:
      room = walk.group(1) if action.startswith("go to ") else room
      continue
    if room is not None:
      path.append(f"teleport to {room}")
      if action != "look around":
        path.append("look around")
      room = None
    path.append(action)
  if room is not None:
    path.append(f"teleport to {room}")
  return path


def listed_things(observation: str) -> list[str]:
  """The names of the things a room listing shows ("\ta baby brown bear" -> "baby brown bear", "\ta fountain
  (containing a substance called water)" -> "fountain"); not its doors, nor what the things hold."""
  return _LISTED.findall(observation)


def shown_name(action: str, observation: str) -> str:
  """`action` with the thing it focuses on named as `observation` lists it. The gold paths name things in the
  world's own words ("focus on egg parrot", "focus on baby baby brown bear", "focus on crocodile") where the room
  shows "a parrot egg", "a baby brown bear", "a crocodile egg": the one listed name that has every word of the
  gold name replaces it. Any other action, or a name that no listed name (or more than one) matches, is kept."""
  if not action.startswith("focus on "):
    return action
  thing = action.removeprefix("focus on ")
  listed = listed_things(observation)
  if thing in listed:
    return action
  matches = [name for name in listed if set(thing.split()) <= set(name.split())]
  return f"focus on {matches[0]}" if len(matches) == 1 else action


def resolve_task(task: str | int) -> str:
  """The world's name of a task given by name, paper id ("1-1") or index into TASKS."""
  if isinstance(task, int) and not isinstance(task, bool):
    if not 0 <= task < len(TASKS):
      raise ValueError(f"task index must be in [0, {len(TASKS)}), got {task}")
    return TASKS[task]
  name = infer_task(task) if isinstance(task, str) else None
  if name not in TASKS:
    raise ValueError(f"unknown ScienceWorld task {task!r}; the tasks are {TASKS}")
  return name


class ScienceWorldEnv(JavaTextEnv):
  """One ScienceWorld task, played one variation of a split per episode.

  Args:
    task: a task name, paper id ("1-1") or index into TASKS.
    split: "train", "dev" or "test": which of the task's variations resets draw from.
    simplifications: the world's simplification string ("", "easy", "openDoors,teleportAction").
    admissible: whether `info["admissible_actions"]` lists the valid actions (60-190 ms a step).
    max_steps: step limit (gold paths take 5 to ~180 steps, most under 60).
    oracle: "gold" (the world's gold path) or "teleport" (the gold path teleporting where it walks; needs
      the teleportAction simplification): the demonstrations an SFT warm start imitates.
    oracle_names: "world" (the oracle names what it focuses on as the gold path does) or "shown" (as the
      room lists it; `shown_name`).
    heap: the JVM's heap cap.
    render_mode: None or "ansi".
  """

  def __init__(self, task: str | int = "boil", split: str = "train", simplifications: str = "",
               admissible: bool = False, max_steps: int = 100, heap: str = DEFAULT_HEAP,
               oracle: str = "gold", oracle_names: str = "world", render_mode: str | None = None):
    name = resolve_task(task)
    parts = simplifications.split(",") if isinstance(simplifications, str) else [None]
    if any(p not in ("", "easy", *SIMPLIFICATIONS) for p in parts):
      raise ValueError(f'simplifications must be "easy" or a comma-separated subset of '
                       f"{SIMPLIFICATIONS}, got {simplifications!r}")
    if oracle not in ORACLES:
      raise ValueError(f"oracle must be one of {ORACLES}, got {oracle!r}")
    if oracle_names not in ORACLE_NAMES:
      raise ValueError(f"oracle_names must be one of {ORACLE_NAMES}, got {oracle_names!r}")
    if oracle == "teleport" and not {"easy", "teleportAction"} & set(parts):
      raise ValueError(f'the teleporting oracle needs the teleportAction simplification ("easy" has it); '
                       f"simplifications={simplifications!r}")
    if "noElectricalAction" in parts and any(t in name for t in _ELECTRICAL_TASKS):
      raise ValueError(f"{name} needs electrical actions; noElectricalAction cannot apply")
    world = JavaWorld(JAR_PATH, "scienceworld.runtime.pythonapi.PythonInterface", heap,
                      name=f"ScienceWorld {name}")
    super().__init__(world, split, max_steps, render_mode)
    self.task = name
    self.simplifications = simplifications
    self.oracle = oracle
    self.oracle_names = oracle_names
    self.admissible = admissible
    self._admissible: list[str] | None = None  # this state's valid actions, once asked for
    self._start()

  def _load(self, variation: int, with_gold: bool) -> None:
    error = self.java.call("load", self.task, variation, self.simplifications, with_gold)
    if error:
      raise ValueError(f"ScienceWorld rejects {self.task} variation {variation}: {error.strip()}")

  def _prepare(self) -> None:
    if not self.split_games:
      self._load(0, False)
      # The variation list's toString is "[0, 1, ...]": one call instead of one per variation.
      self.split_games = json.loads(str(self.java.call(_VARIATION_LISTS[self.split])))

  def _new_game(self, with_gold: bool) -> list[str] | None:
    # A load starts the variation afresh (generating the gold path plays it, then restarts it);
    # the world's reset would generate the gold path again, so every episode loads.
    self._load(self.game_id, with_gold)
    self.task_text = world_text(self.java.call("freeActionTaskDesc")).removeprefix(
        "Task Description:").strip()
    self._answer(self.java.call("step", "look around"))
    if not with_gold:
      return None
    gold = list(self.java.call("getGoldActionSequence"))
    return teleporting_path(gold) if self.oracle == "teleport" else gold

  def _answer(self, answer: str) -> None:
    self.world_observation = world_text(answer)
    self.score = float(self.java.call("getScore"))
    completed = bool(self.java.call("getCompleted"))
    self.world_success = completed and round(100 * self.score) >= 100
    self.world_done = completed or self.score < 0
    self._admissible = None

  def _demonstrated(self, gold_action: str) -> str:
    return shown_name(gold_action, self.world_observation) if self.oracle_names == "shown" else gold_action

  def _send(self, action: str) -> str:
    answer = self.java.call("step", action)
    if answer.strip() == NO_MATCH:
      return NO_MATCH
    self._answer(answer)
    return ""

  def task_name(self) -> str:
    simplifications = f"({self.simplifications})" if self.simplifications else ""
    return f"{self.task}{simplifications}:{self.game_id}"

  def admissible_actions(self) -> list[str] | None:
    if not self.admissible:
      return None
    if self._admissible is None:
      self._admissible = sorted(self.java.call("getValidActionObjectCombinations"))
    return list(self._admissible)
