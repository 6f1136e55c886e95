"""ALFWorld: household tasks in text (put a hot mug in the coffee machine), played with textworld.

Games: ALFWorld's six task types (TASK_TYPES), in three splits: "train", "valid_seen" (new games in
the training rooms) and "valid_unseen" (rooms never seen in training). Where they come from:

- generated (the default): generate.py makes games in ALFWorld's own PDDL domain from the rooms'
  metadata the alfworld wheel ships, train and valid_seen in 96 held-in rooms, valid_unseen in 24
  held-out ones; a game is generated on its first use and cached (`cache_dir`, default
  EXPLORE_JAX_CACHE or ~/.cache/explore_jax). The split's game i of an environment playing task
  types T1..Tk is game i // k of type T(i % k), so the types take turns; `num_games` defaults to
  ALFWorld's split sizes (3,553, 140 and 134). The task id is
  "<split>/<task folder>/<trial folder>", e.g.
  "train/pick_heat_then_place_in_recep-Mug-None-CoffeeMachine-30/trial_S843964890".
- official: with `data_dir` (or the ALFWORLD_DATA variable, when the user set it) naming a folder
  that holds json_2.1.1/ (or json_2.1.1/ itself), the split's games there, listed as ALFWorld lists
  them (those with a traj_data.json and a game.tw-pddl not marked unsolvable, no "movable" or
  "Sliced" ones, the task type from the task folder's name) in sorted order; the first `num_games`
  (default all) are played. `data_dir="generated"` insists on generated games. Importing alfworld
  sets ALFWORLD_DATA to ~/.cache/alfworld when it is unset, so that value counts only when the
  folder holds json_2.1.1/.

Both kinds play the same way: the game file is loaded by textworld's PDDL backend under ALFWorld's
AlfredDemangler and AlfredInfos wrappers, as ALFWorld's AlfredTWEnv does, in a game process of the
environment's own (worker.py, driven through process.py). A seeded reset plays the split's game `seed % num_games`;
`reset(options={"task_index": i})` plays game i exactly; an unseeded reset draws one.

Observation. ALFWorld answers an action with its result only ("You arrive at countertop 1. On the
countertop 1, you see a mug 1.", "Nothing happens."), so the raw observation (hashed for
`state_key`) is built from the game's facts, without history. E.g. the heat game above, after
"go to cabinet 6", "open cabinet 6", "take mug 2 from cabinet 6" and "go to microwave 1" (the list
of receptacles is cut here: FloorPlan30 has 51):

  You arrive at microwave 1. The microwave 1 is closed.
  Your task is to: heat some mug and put it in coffeemachine.
  Looking around the room, you see a cabinet 1, a cabinet 2, ..., a stoveburner 1, and a toaster 1.
  You are at microwave 1. The microwave 1 is closed.
  You are carrying: a mug 2.

The first line is the game's answer to the action, shown above the raw observation; the raw
observation is the rest: the goal (ALFWorld's sentence), the room's receptacles (the list of
ALFWorld's intro, sorted: it never changes, and an agent without history needs the names), where the
agent is and what it sees there ("You are in the middle of the room." at the start; "The fridge 1 is
closed."; "On the sofa 1, you see nothing.") and what it holds ("You are not carrying anything.").
Objects carry the state the agent gave them, as examining them would tell ("a hot mug 2", "a clean
apple 1", "a desklamp 1 (on)"), so that states that differ only in that have different keys;
objects are listed in name order. Going somewhere, leaving and coming back gives the same raw
observation, hence the same key, as long as nothing changed there; so do look, inventory, examine
and help, whose answers are only shown.

Actions are ALFWorld's commands ("go to fridge 1", "open fridge 1", "take mug 2 from countertop 1",
"move mug 2 to coffeemachine 1", "heat mug 2 with microwave 1", "clean ... with sinkbasin 1",
"cool ... with fridge 1", "use desklamp 1", "examine ...", "look", "inventory"). The response is
exactly one action on one line, as in java.py: surrounding whitespace, runs of whitespace inside
it and letter case are forgiven; an empty response, more than one non-empty line, characters outside
printable ASCII or more than MAX_ACTION_CHARS characters make an invalid action (TextEnv: nothing
changes, format reward 0, the observation names the expected form). Every well-formed action goes
to the game, as in ALFWorld: one that is not admissible gets the game's "Nothing happens." and
changes nothing (format reward 1). `info["admissible_actions"]` (the game's own sorted list) exists
only for an environment made with `admissible=True` (textworld computes the list at every step
either way: it is how it matches a command to an action; the list costs only its transfer).

Reward 1.0 when the game is won (ALFWorld's `won`), which terminates the episode; episodes truncate
after `max_steps` (ALFWorld's usual 50). `info` adds task_type and floor_plan ("FloorPlan30").

Oracle: the game's walkthrough. A generated game's is ALFWorld's planner expert (fast-downward,
textworld's `policy_commands`, what AlfredExpertType.PLANNER plays) run when the game was generated
(on the game pruned of the objects and receptacles no plan needs, where it takes milliseconds
instead of up to minutes, then replayed on the game: games.Solver), so it is short and checked.
An official game's is the walkthrough ALFWorld stored in it; a game without one is planned on the
oracle's first call (which can take long on a large room). The handcoded expert is not used: it
draws with the unseeded global `random`, explores, and in alfworld 0.4.2 misses its own "move"
commands (it looks for "put"), so that it failed all four pick_two_obj_and_place games tried (within
50 steps; it won the other types' 20 but one). `oracle_action()` gives the walkthrough's next
command as long as the episode has followed it; other commands that changed nothing in the world
("Nothing happens.", look, inventory, examine, help) are skipped when checking that.

The game process: one per environment (so copies never share a game), started with the environment
and again by a reset that finds it dead. A request that fails in the game raises `ALFWorldError`; a
step on a dead process raises it too, saying so (exit code, last stderr lines), which ends the
episode; the next reset() starts a new process and works again.

Measured on one core (random commands, 12 generated games): 45 steps/s with admissible actions and
without alike (textworld lists them either way); a reset 0.2-3.5 s the first time a process plays a
game (median ~0.4 s: textworld translates the PDDL problem with fast-downward's translator),
0.1-0.2 s when it plays the game again (the game process keeps its last translations); making a game
~1.5 s (once per cache).

Nothing here imports jax, and the environment's process never imports textworld (the game process
does).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Sequence

from explore_jax.envs.alfworld import games, generate
from explore_jax.envs.alfworld.generate import (DATA_FOLDER, GAME_FILE, SPLITS, TASK_TYPES,
                                                TRAJ_FILE)
from explore_jax.envs.alfworld.process import ALFWorldError, GameProcess
from explore_jax.envs.base import (Outcome, TextEnv, next_gold_action, one_line_action, task_index,
                                   with_actions, world_text)

# ALFWorld's split sizes (its train, valid_seen and valid_unseen games of these six types).
DEFAULT_NUM_GAMES = {"train": 3553, "valid_seen": 140, "valid_unseen": 134}
NOTHING_HAPPENS = "Nothing happens."
GENERATED = "generated"
_ALFWORLD_DEFAULT_DATA = os.path.expanduser("~/.cache/alfworld")  # what importing alfworld sets


ORACLES = ("walkthrough", "search")
# A pick & place goal as ALFRED's templates write it: "put a mug in coffeemachine", "put some candle on countertop".
_PICK_AND_PLACE = re.compile(r"put (?:a|an|some) ([a-z]+) (?:in|on|in/on) ([a-z]+)")

# ---- game lists ----------------------------------------------------------------------------------


def official_root(data_dir: str) -> str:
  """The json_2.1.1 folder of an ALFWorld data folder (or the folder itself if it is that)."""
  path = os.path.abspath(os.path.expanduser(data_dir))
  if os.path.isdir(os.path.join(path, DATA_FOLDER)):
    return os.path.join(path, DATA_FOLDER)
  if any(os.path.isdir(os.path.join(path, split)) for split in SPLITS):
    return path
  raise ValueError(f"{data_dir} holds neither {DATA_FOLDER}/ nor a split folder "
                   f"({', '.join(SPLITS)})")


def user_data_dir() -> str | None:
  """ALFWORLD_DATA where the user set it (alfworld's own default counts only if it holds games)."""
  value = os.environ.get("ALFWORLD_DATA")
  if not value:
    return None
  if os.path.abspath(os.path.expanduser(value)) == os.path.abspath(_ALFWORLD_DEFAULT_DATA):
    if not os.path.isdir(os.path.join(value, DATA_FOLDER)):
      return None
  return value


_LISTINGS: dict[tuple[str, str], list[tuple[str, str]]] = {}


def list_official_games(root: str, split: str) -> list[tuple[str, str]]:
  """(game file, task type) of a split's playable games under a json_2.1.1 folder, sorted by path
  (kept per process: ALFWorld's data has thousands of games)."""
  key = (root, split)
  if key not in _LISTINGS:
    games = []
    for folder, _, files in os.walk(os.path.join(root, split)):
      if TRAJ_FILE not in files or GAME_FILE not in files:
        continue
      if "movable" in folder or "Sliced" in folder:  # ALFWorld skips these too
        continue
      task_type = os.path.basename(os.path.dirname(folder)).split("-", 1)[0]
      if task_type not in TASK_TYPES:
        with open(os.path.join(folder, TRAJ_FILE)) as f:
          task_type = json.load(f).get("task_type", "")
      if task_type not in TASK_TYPES:
        continue
      with open(os.path.join(folder, GAME_FILE)) as f:
        if not json.load(f).get("solvable"):  # false, or never checked: ALFWorld skips both
          continue
      games.append((os.path.join(folder, GAME_FILE), task_type))
    _LISTINGS[key] = sorted(games)
  return _LISTINGS[key]


def _task_types(task_types: Any) -> tuple[str, ...]:
  if task_types is None:
    return TASK_TYPES
  if isinstance(task_types, (str, int)):
    task_types = [task_types]
  chosen = set()
  for t in task_types:
    if isinstance(t, int) and not isinstance(t, bool) and 1 <= t <= len(TASK_TYPES):
      t = TASK_TYPES[t - 1]  # ALFWorld's numbering (config files use 1-6)
    if t not in TASK_TYPES:
      raise ValueError(f"task types must be among {TASK_TYPES} (or 1-6), got {t!r}")
    chosen.add(t)
  if not chosen:
    raise ValueError("task_types is empty")
  return tuple(t for t in TASK_TYPES if t in chosen)  # ALFWorld's order, whatever the given one


def _list_phrase(items: Sequence[str]) -> str:
  items = [f"a {item}" for item in items]
  if not items:
    return "nothing"
  if len(items) <= 2:
    return " and ".join(items)
  return ", ".join(items[:-1]) + ", and " + items[-1]


# ---- the environment -----------------------------------------------------------------------------


def _receptacle_limit(max_receptacles: Any) -> Any:
  """`max_receptacles` as generate.py takes it: 0 (what a command-line flag can write) is None, every room;
  anything else goes on as given (generate.host_rooms refuses what is not a positive int, False included)."""
  return None if max_receptacles == 0 and not isinstance(max_receptacles, bool) else max_receptacles


def generated_game(split: str, task_types: Any, index: int, max_receptacles: int | None = None) -> generate.GameSpec:
  """The generated game number `index` of a split over `task_types` (ALFWorldEnv's argument), in the rooms of at
  most `max_receptacles` (None or 0: every room): what an environment with these settings plays as game `index`,
  without starting one."""
  task_type, j = generate.schedule(_task_types(task_types), index)
  return generate.game_spec(split, task_type, j, _receptacle_limit(max_receptacles))


class ALFWorldEnv(TextEnv):
  """ALFWorld's household games (generated or official), one game per episode.

  Args:
    split: "train", "valid_seen" or "valid_unseen".
    task_types: a subset of TASK_TYPES (names, or ALFWorld's numbers 1-6); None for all six.
    num_games: how many of the split's games to play (None: ALFWorld's split size for generated
      games, all of them for official ones).
    data_dir: None (official games if the user set ALFWORLD_DATA, else generated ones), a folder of
      official games (holding json_2.1.1/, or json_2.1.1/ itself), or "generated".
    max_steps: step limit (ALFWorld's usual 50).
    admissible: whether `info["admissible_actions"]` lists the game's admissible commands.
    list_actions: whether the raw observation ends with them ("Actions: a, b, c."; implies
      `admissible`), as the prompts of verl-agent's ALFWorld agents list them.
    cache_dir: where generated games are cached (default EXPLORE_JAX_CACHE or ~/.cache/explore_jax).
    max_receptacles: generated games only: draw rooms with at most this many receptacles (None or 0: every
      room, 0 being what a command-line flag can write; rooms hold 6-51, median 15; at 10, 18 held-in and 5
      held-out rooms host pick & place).
    oracle: "walkthrough" (the planner's path, which knows where the object is) or "search" (what an agent
      that sees only the observation can do, pick & place goals only: go to the room's receptacles in the
      listed order, opening closed ones, until the object shows, take it, then go to the goal's receptacle
      and put it there): the demonstrations an SFT warm start imitates.
    render_mode: None or "ansi".
  """

  response_format = 'Reply with exactly one action on one line, e.g. "go to countertop 1".'
  # Each instance's game runs in a process of its own: an actor may reset and step several at once. A game's
  # oracle reads only that game (its walkthrough, the planner's plan or the search over what the game shows).
  metadata = {**TextEnv.metadata, "concurrent_instances": True, "seeded_oracle": True}

  def __init__(self, split: str = "train", task_types: Any = None, num_games: int | None = None,
               data_dir: str | None = None, max_steps: int = 50, admissible: bool = False,
               list_actions: bool = False, cache_dir: str | None = None, oracle: str = "walkthrough",
               max_receptacles: int | None = None, render_mode: str | None = None):
    if split not in SPLITS:
      raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if oracle not in ORACLES:
      raise ValueError(f"oracle must be one of {ORACLES}, got {oracle!r}")
    self.oracle = oracle
    super().__init__(max_steps=max_steps, render_mode=render_mode)
    self.split = split
    self.task_types = _task_types(task_types)
    self.max_receptacles = max_receptacles = _receptacle_limit(max_receptacles)
    self.list_actions = bool(list_actions)
    self.admissible = bool(admissible) or self.list_actions
    if data_dir is None:
      data_dir = user_data_dir()
    self.generated = data_dir is None or data_dir == GENERATED
    self.official_games: list[tuple[str, str]] = []
    if self.generated:
      self.root = games.generated_root(cache_dir)
      total = DEFAULT_NUM_GAMES[split] if num_games is None else num_games
      for task_type in self.task_types:
        if not generate.host_rooms(split, task_type, max_receptacles):
          raise ValueError(generate.no_host_room(split, task_type, max_receptacles))
    elif max_receptacles is not None:
      raise ValueError("max_receptacles chooses the rooms of generated games; the official games' rooms are "
                       f"fixed (data_dir={data_dir!r})")
    else:
      self.root = official_root(data_dir)
      self.official_games = [g for g in list_official_games(self.root, split)
                             if g[1] in self.task_types]
      if not self.official_games:
        raise ValueError(f"no {split} games of types {self.task_types} under {self.root}")
      total = len(self.official_games) if num_games is None else min(num_games,
                                                                      len(self.official_games))
      self.official_games = self.official_games[:total]
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
      raise ValueError(f"num_games must be a positive int, got {num_games!r}")
    self.num_games = total
    self.game = GameProcess(name=f"ALFWorld {split}")
    self.game_index = 0
    self.game_path = ""
    self.task_type = ""
    self.floor_plan = ""
    self.goal = ""
    self.receptacles: list[str] = []
    self.view: dict[str, Any] = {}
    self.won = False
    self.history: list[str] = []  # the commands that changed the world this episode
    self._taken: list[tuple[str, bool]] = []  # every command sent, and whether it changed it
    self._gold: list[str] | None = None
    self._gold_pos: int | None = 0
    self._seed: int | None = None
    self.game.start()

  @property
  def num_tasks(self) -> int:
    return self.num_games

  # ---- games ------------------------------------------------------------------------------------

  def game_spec(self, index: int) -> generate.GameSpec:
    """The generated game number `index` of this environment's split and task types."""
    return generated_game(self.split, self.task_types, index, self.max_receptacles)

  def _game_file(self, index: int) -> tuple[str, str]:
    """(game file, task id) of game `index`, generating it if needed."""
    if not self.generated:
      path = self.official_games[index][0]
      return path, os.path.relpath(os.path.dirname(path), self.root)
    spec = self.game_spec(index)
    path = os.path.join(games.game_dir(self.root, spec), GAME_FILE)
    if not os.path.isfile(path):
      path = self.game.call("generate", root=self.root, split=spec.split,
                            task_type=spec.task_type, room=spec.room, seed=spec.seed)["path"]
    return path, spec.relative_path

  # ---- TextEnv ----------------------------------------------------------------------------------

  def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
    self._seed = seed
    return super().reset(seed=seed, options=options)

  def _reset_task(self, options: dict[str, Any]) -> str:
    self.game_index = task_index(options, self._seed, self.num_games, self.np_random)
    self.history, self._taken, self._gold, self._gold_pos = [], [], None, 0
    for attempt in range(2):  # a process found dead (now or during the calls) is restarted once
      self.game.ensure_running()
      try:
        path, task_id = self._game_file(self.game_index)
        answer = self.game.call("load", path=path, admissible=self.admissible)
        break
      except ALFWorldError:
        if attempt or self.game.alive:
          raise
    self.game_path = path
    with open(os.path.join(os.path.dirname(path), TRAJ_FILE)) as f:
      traj = json.load(f)
    self.task_type = traj.get("task_type", "")
    self.floor_plan = str(traj.get("scene", {}).get("floor_plan", ""))
    intro = str(answer["feedback"])
    marker = "Your task is to:"
    self.goal = world_text(intro[intro.rfind(marker) + len(marker):]).strip() if marker in intro \
        else ""
    self.receptacles = list(answer["receptacles"])
    self._update(answer)
    return task_id

  def _update(self, answer: dict[str, Any]) -> None:
    self.view = answer
    self.won = bool(answer["won"])

  def raw_observation(self) -> str:
    view = self.view
    lines = [f"Your task is to: {self.goal}" if self.goal else "Your task is unknown.",
             f"Looking around the room, you see {_list_phrase(self.receptacles)}."]
    place = view.get("location")
    if place is None:
      lines.append("You are in the middle of the room.")
    elif view.get("openable") and not view.get("opened"):
      lines.append(f"You are at {place}. The {place} is closed.")
    elif view.get("openable"):
      lines.append(f"You are at {place}. The {place} is open. In it, you see "
                   f"{_list_phrase(view['contents'])}.")
    else:
      lines.append(f"You are at {place}. On the {place}, you see {_list_phrase(view['contents'])}.")
    holding = view.get("holding") or []
    lines.append(f"You are carrying: {_list_phrase(holding)}." if holding
                 else "You are not carrying anything.")
    text = "\n".join(lines)
    return world_text(with_actions(text, view.get("admissible", [])) if self.list_actions else text, limit=12_000)

  def parse_action(self, text: str) -> tuple[str | None, str]:
    return one_line_action(text)

  def _apply(self, action: str) -> Outcome:
    was_won = self.won
    answer = self.game.call("step", command=action)
    changed = bool(answer["changed"])
    self._taken.append((action, changed))
    if changed:
      self.history.append(action)
    if self._gold is not None:
      self._gold_pos = self._follow(self._gold_pos, action, changed)
    self._update(answer)
    won = self.won and not was_won
    return Outcome(reward=1.0 if won else 0.0, success=self.won, terminated=self.won,
                   message=world_text(answer["feedback"]) or NOTHING_HAPPENS)

  def admissible_actions(self) -> list[str] | None:
    return list(self.view.get("admissible", [])) if self.admissible else None

  def _feedback(self, truncated: bool) -> str:
    if self.success:
      return f"Success: the task was completed in {self.steps} steps."
    return f"Failure: out of steps with the task unfinished ({self.goal})."

  def _extra_info(self) -> dict[str, Any]:
    return {"task_type": self.task_type, "floor_plan": self.floor_plan}

  # ---- the oracle -------------------------------------------------------------------------------

  def oracle_action(self) -> str:
    """The oracle's next command, as the exact response text: the walkthrough's (while the episode follows
    it) or the searching agent's (the `oracle` argument)."""
    if self.oracle == "search":
      return self.search_action()
    if self._gold is None:
      with open(self.game_path) as f:
        walkthrough = json.load(f).get("walkthrough")
      if not walkthrough:
        walkthrough = self.game.call("plan")["plan"]
      self._gold = [" ".join(str(c).split()).lower() for c in walkthrough]
      pos: int | None = 0
      for action, changed in self._taken:
        pos = self._follow(pos, action, changed)
      self._gold_pos = pos
    return next_gold_action(self._gold, self._gold_pos, self.task_id, "walkthrough")

  def search_action(self) -> str:
    """The next command of an agent that knows only what the observation says (class docstring)."""
    goal = _PICK_AND_PLACE.fullmatch(self.goal.rstrip("."))
    if goal is None:
      raise ValueError(f"the search oracle plays pick & place goals (put a/some X in/on Y); {self.task_id} "
                       f"asks: {self.goal!r}")
    thing, target = goal.group(1), goal.group(2)
    view = self.view
    place = view.get("location")
    holding = [h for h in view.get("holding") or [] if h.split()[0] == thing]
    goal_places = [r for r in self.receptacles if r.split()[0] == target]
    if not goal_places:
      raise ValueError(f"{self.task_id}: the room has no {target} for the goal {self.goal!r}")
    if place is not None and view.get("openable") and not view.get("opened"):
      return f"open {place}"
    if holding:
      if place is not None and place.split()[0] == target:
        return f"move {holding[0]} to {place}"
      return f"go to {goal_places[0]}"
    here = [c for c in view.get("contents") or [] if c.split()[0] == thing]
    if here and place is not None:
      return f"take {here[0]} from {place}"
    visited = {a[len("go to "):] for a in self.history if a.startswith("go to ")}
    for receptacle in self.receptacles:
      if receptacle not in visited and receptacle.split()[0] != target:
        return f"go to {receptacle}"
    return "look"  # everything searched: the object is nowhere the agent could see it

  def _follow(self, pos: int | None, action: str, changed: bool) -> int | None:
    """The walkthrough's position after `action` (None once the episode has left it): the next
    command moves it on (even one that changes nothing: official walkthroughs hold "look"s);
    another command that changed nothing leaves it where it was."""
    if pos is None:
      return None
    if pos < len(self._gold) and self._gold[pos] == action:
      return pos + 1
    return None if changed else pos

  def close(self) -> None:
    self.game.close()
