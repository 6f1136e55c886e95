"""The game process: one textworld PDDL game at a time, driven by env.py over a pipe.

Started as `python -m explore_jax.envs.alfworld.worker [--exact]` with PYTHONHASHSEED=0. It reads
one JSON request per line on stdin and answers each with one JSON line on the stdout it was started
with; anything else the libraries print goes to stderr (fd 1 is pointed there). It leaves when stdin
closes, so it never outlives its environment's process.

The game is ALFWorld's: textworld's PddlEnv under ALFWorld's AlfredDemangler and AlfredInfos
wrappers, which is how alfworld's AlfredTWEnv plays its games (it goes through textworld.gym, which
makes the same environment). One PddlEnv serves every game: textworld loads a private copy of
fast-downward's 34 MB library for each PddlEnv it makes, and never unloads it. Unless started with
--exact, `games.memoize_textworld()` makes it skip the parsing and translating it repeats.

Requests ({"op": ..., ...}) and answers ({"ok": true, ...} or {"ok": false, "error": "..."}):

  load      path, admissible: load the game file (unless it is the one loaded) and reset it;
            answers the state, with "receptacles" (all of the room's, sorted)
  step      command: send a command; answers the state
  plan      the planner's plan from the game's initial state (the episode is replayed after it)
  generate  root, split, task_type, room, seed: write that generated game under root (games.py);
            answers its path
  exit      leave

A state is: feedback (the game's text for the last command, or the game's intro after a reset),
won, changed (whether the command changed the world: "Nothing happens.", look, inventory, examine
and help do not), location (the receptacle the agent is at, or null in the middle of the room),
openable and opened (of that receptacle), contents (what is in or on it, when it can be seen),
holding, and admissible (the game's admissible commands, when the load asked for them). Objects are
described as "apple 1", "hot apple 1", "clean sliced potato 2", "desklamp 1 (on)".
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from typing import Any

# Facts that record what the agent has looked at: they change with look/examine but not the world.
_BOOKKEEPING = frozenset({"checked", "examined"})
_NUMBERED = re.compile(r"^(.*?)(?: ([0-9]+))?$")


def _name(variable: Any) -> str:
  return str(variable.name).strip()


def natural_key(name: str) -> tuple[str, int]:
  """Sort "cabinet 2" before "cabinet 10"."""
  match = _NUMBERED.match(name)
  return match.group(1), int(match.group(2) or 0)


def describe(name: str, flags: set[str]) -> str:
  """An object's phrase from its state facts (lowercase predicate names)."""
  states = [word for word, fact in (("hot", "ishot"), ("cool", "iscool"), ("clean", "isclean"))
            if fact in flags]
  phrase = ("sliced " if "issliced" in flags else "") + name
  if states:
    phrase = " and ".join(states) + " " + phrase
  return phrase + (" (on)" if "ison" in flags else "")


class Game:
  """The process's game: a textworld PDDL environment and what the requests need of it."""

  def __init__(self, memoize: bool = True):
    import textworld  # here only: the environment's process never imports textworld
    from textworld.envs.pddl import PddlEnv

    from explore_jax.envs.alfworld import games, generate

    self.games, self.generate = games, generate
    if memoize:
      games.memoize_textworld()
    alfred = generate.alfworld_module("alfworld.agents.environment.alfred_tw_env")
    infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=True,
                               extras=["gamefile"])
    self.env = alfred.AlfredInfos(alfred.AlfredDemangler(PddlEnv(infos)))
    self.path: str | None = None
    self.admissible = False
    self.history: list[str] = []
    self.state: Any = None
    self._facts: frozenset[tuple[str, ...]] = frozenset()

  # ---- requests ---------------------------------------------------------------------------------

  def load(self, path: str, admissible: bool = False) -> dict[str, Any]:
    with self.games.preserved_argv():
      if path != self.path:
        self.path = None  # a failed load leaves no game loaded
        self.env.load(path)
        self.path = path
      self.state = self.env.reset()
    self.admissible = bool(admissible)
    self.history = []
    self._facts = frozenset()
    answer = self._answer(changed=True)
    answer["receptacles"] = sorted(
        {_name(f.arguments[0]) for f in self.state["facts"] if f.name == "receptacleatlocation"},
        key=natural_key)
    return answer

  def step(self, command: str) -> dict[str, Any]:
    if self.path is None:
      raise RuntimeError("no game is loaded")
    before = self._facts
    self.state, _, _ = self.env.step(command)
    self.history.append(command)
    return self._answer(changed=None, before=before)

  def plan(self) -> dict[str, Any]:
    if self.path is None:
      raise RuntimeError("no game is loaded")
    infos = self.env.request_infos
    wanted = infos.policy_commands
    infos.policy_commands = True
    try:
      with self.games.preserved_argv():
        state = self.env.reset()
    finally:
      infos.policy_commands = wanted
    plan = list(state["policy_commands"] or [])
    with self.games.preserved_argv():
      self.state = self.env.reset()
    for command in self.history:  # back to where the episode was
      self.state, _, _ = self.env.step(command)
    self._facts = self._world_facts()
    return {"plan": plan}

  def make(self, root: str, split: str, task_type: str, room: int, seed: int) -> dict[str, Any]:
    spec = self.generate.sample_game(room, task_type, seed, split)
    self.path = None  # generating loads other games into the environment
    solver = self.games.Solver(self.env)
    return {"path": self.games.write_game(root, spec, solver)}

  # ---- the state --------------------------------------------------------------------------------

  def _world_facts(self) -> frozenset[tuple[str, ...]]:
    return frozenset((f.name, *map(_name, f.arguments)) for f in self.state["facts"]
                     if f.name not in _BOOKKEEPING)

  def _answer(self, changed: bool | None, before: frozenset | None = None) -> dict[str, Any]:
    facts = self._world_facts()
    if changed is None:
      changed = facts != before
    self._facts = facts
    at, place, inside, flags, held, opened, openable = None, {}, {}, {}, [], set(), set()
    for name, *args in facts:
      if name == "atlocation":
        at = args[1]
      elif name == "receptacleatlocation":
        place[args[1]] = args[0]
      elif name == "inreceptacle":
        inside.setdefault(args[1], []).append(args[0])
      elif name == "holds":
        held.append(args[1])
      elif name == "opened":
        opened.add(args[0])
      elif name == "openable":
        openable.add(args[0])
      elif len(args) == 1:
        flags.setdefault(args[0], set()).add(name)
    location = place.get(at)
    answer: dict[str, Any] = dict(
        feedback=str(self.state["feedback"]),
        won=bool(self.state["won"]),
        changed=bool(changed),
        location=location,
        openable=location in openable,
        opened=location in opened,
        contents=None,
        holding=[describe(o, flags.get(o, set())) for o in sorted(held, key=natural_key)],
    )
    if location is not None and (location not in openable or location in opened):
      answer["contents"] = [describe(o, flags.get(o, set()))
                            for o in sorted(inside.get(location, []), key=natural_key)]
    if self.admissible:
      answer["admissible"] = list(self.state["admissible_commands"])
    return answer


def serve(memoize: bool) -> None:
  channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
  os.dup2(2, 1)  # what the libraries print must not mix with the answers
  sys.stdout = sys.stderr
  game = None
  for line in sys.stdin:
    if not line.strip():
      continue
    try:
      request = json.loads(line)
      op = request.pop("op")
      if op == "exit":
        break
      if game is None:
        game = Game(memoize)
      handler = {"load": game.load, "step": game.step, "plan": game.plan,
                 "generate": game.make}[op]
      answer = {"ok": True, **handler(**request)}
    except Exception as e:  # the parent raises it; the process goes on
      traceback.print_exc(file=sys.stderr)
      answer = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
    channel.write(json.dumps(answer) + "\n")
    channel.flush()


if __name__ == "__main__":
  serve(memoize="--exact" not in sys.argv[1:])
