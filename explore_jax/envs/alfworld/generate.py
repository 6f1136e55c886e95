"""Offline generation of ALFWorld household games, written in the official data layout.

The official ALFWorld games are a download. What the alfworld wheel ships is enough to make new
ones: the PDDL domain (alfworld/data/alfred.pddl), the text grammar (alfworld/data/alfred.twl2), the
object and receptacle lists of ALFRED's 120 rooms (alfworld/gen/layouts/FloorPlan<n>-objects.json:
the object types a room has; FloorPlan<n>-openable.json: its receptacle instances) and ALFRED's
tables of what may go where (alfworld.gen.constants: VAL_RECEPTACLE_OBJECTS, VAL_ACTION_OBJECTS,
OPENABLE_CLASS_LIST). A game here is a PDDL problem in that domain, and it plays, reads and is
solved exactly as an official one (env.py loads both the same way).

A game is a pure function of (room, task type, seed): `sample_game` draws it with its own
`random.Random` seeded from those three (string seeding hashes with SHA-512, so every process and
Python version draws the same game). In order:

1. The room's receptacles: the instances its openable.json lists (those ALFRED recorded a pose for
   reaching: cabinets, drawers, the fridge, countertops, the sink basin...), plus one instance of
   each static receptacle type the room lists in objects.json without such an instance (coffee
   machines, stove burners, toasters and most garbage cans and towel holders have none). Movable
   receptacles (bowl, cup, mug, plate, pan, pot, box) are objects. Fridges, cabinets, microwaves,
   drawers and safes are openable and start closed. Each receptacle has a location of its own and
   the agent starts at one of its own, "in the middle of the room".
2. The task's targets, among the pairs the room supports:
   - pick_and_place_simple and pick_two_obj_and_place: an object type the room has and a receptacle
     type the room has that may hold it (VAL_RECEPTACLE_OBJECTS); two to three instances for
     pick_two, one to three otherwise;
   - pick_clean/heat/cool_then_place_in_recep: the object must be cleanable/heatable/coolable
     (VAL_ACTION_OBJECTS) and the room must have the sink basin/microwave/fridge; the goal
     receptacle is not that appliance, and no instance of the target starts inside it;
   - look_at_obj_in_light: an object type and a desk lamp or floor lamp the room has; the lamp
     stands on a desk, side table, dresser, TV stand, coffee or dining table or shelf (a floor lamp
     stands by an armchair, sofa or bed where the room has none of those);
   - the task types' room kinds are ALFRED's (GOALS_VALID): heating and cooling in kitchens,
     cleaning in kitchens and bathrooms, looking in living rooms and bedrooms. A room that cannot
     host a task type (`can_host`) is never drawn for it.
   No instance of the target object starts in a receptacle of the goal's type.
3. Every other object type of the room that some receptacle of the room may hold: one or two
   instances, each in a receptacle drawn among those that may hold it.
4. The goal sentence: one of ALFRED's two templates for the task type (alfworld.gen.goal_library),
   e.g. "put a hot mug in coffeemachine"; the PDDL goal is the task type's, as ALFWorld states it.

Rooms: ALFRED's split of its 120 FloorPlans. HELD_IN_ROOMS (96: kitchens 7-30, living rooms
207-230, bedrooms 307-330, bathrooms 407-430, ALFRED's training scenes) host the train and
valid_seen games; HELD_OUT_ROOMS (24: FloorPlans 1-6, 201-206, 301-306, 401-406) host
valid_unseen's, as ALFWorld's valid_unseen uses rooms never seen in training.
`game_spec(split, task_type, j)` is a split's j-th game of a task type: its room is drawn among the
split's rooms that can host the type and its seed from a hash of (split, task type, j), so train and
valid_seen share rooms, never games, and the games of one type do not depend on which other types
an environment plays.

Files (the official layout, so that ALFWorld's own loader and expert take them too):
`<root>/json_2.1.1/<split>/<task type>-<object>-None-<receptacle or lamp>-<room>/trial_S<seed>/`
holding game.tw-pddl (JSON: pddl_domain, grammar with the goal sentence in it, pddl_problem,
solvable, walkthrough), initial_state.pddl (the problem) and traj_data.json (task_type, task_id,
pddl_params as ALFWorld's handcoded expert reads them, scene, the goal sentence as
turk_annotations, and a "generator" entry). `write_game` checks every game before writing it: the
planner (ALFWorld's planner expert: fast-downward through textworld's PDDL backend) must find a
plan, on the game pruned of what no plan needs (`Solver.walkthrough`), whose replay on the game
wins; that plan is the walkthrough. One process at a time checks a game (a lock file beside it): the
processes of a group, resetting to the same new game at once, wait for the first one's copy instead
of each planning it again. A game is written to a temporary folder and renamed into place, so no
reader ever sees half of one; a generated game is cached under `cache_root()` (EXPLORE_JAX_CACHE or
~/.cache/explore_jax) + alfworld/<GENERATOR_VERSION>, which is itself an ALFWORLD_DATA-style root.

`python -m explore_jax.envs.alfworld.generate --split train --num-games 60` fills the cache ahead
of training and prints the time per game (`--first 60` goes on from game 60: processes can split a range). Measured over one game of every (room, task type) pair
the 120 rooms can host (410 pairs, all generated and checked), one core: 1.5 s per game on average
(median 1.0 s, at most 7.4 s in a large kitchen), most of it textworld translating the game and
the planner; per type 0.9 s (pick_and_place_simple, look_at_obj_in_light) to 3.0 s (heat).

Nothing here imports textworld until a game is checked (`Solver`), nor jax ever. Importing alfworld
sets ALFWORLD_DATA in os.environ when it is unset; `alfworld_module` imports it without leaving that
behind.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import dataclasses
import fcntl
import functools
import hashlib
import importlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from typing import Any, Iterable, Iterator, Sequence

from explore_jax import cache

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
SPLITS = ("train", "valid_seen", "valid_unseen")
GENERATOR_VERSION = "gen1"  # part of the cache path: change it whenever generated games change
DATA_FOLDER = "json_2.1.1"  # the official data's folder under ALFWORLD_DATA
GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"
PROBLEM_FILE = "initial_state.pddl"

# ALFRED's scene split (alfworld.gen.constants.TRAIN_SCENE_NUMBERS / TEST_SCENE_NUMBERS).
HELD_IN_ROOMS = tuple(n for base in (0, 200, 300, 400) for n in range(base + 7, base + 31))
HELD_OUT_ROOMS = tuple(n for base in (0, 200, 300, 400) for n in range(base + 1, base + 7))
SPLIT_ROOMS = {"train": HELD_IN_ROOMS, "valid_seen": HELD_IN_ROOMS, "valid_unseen": HELD_OUT_ROOMS}
ROOM_KINDS = {0: "Kitchen", 2: "LivingRoom", 3: "Bedroom", 4: "Bathroom"}

# What a task needs: the appliance its action is done with (never the goal receptacle), and the
# VAL_ACTION_OBJECTS set its object must belong to.
_APPLIANCE = {"pick_clean_then_place_in_recep": "SinkBasin",
              "pick_heat_then_place_in_recep": "Microwave",
              "pick_cool_then_place_in_recep": "Fridge"}
_ABILITY = {"pick_clean_then_place_in_recep": "Cleanable",
            "pick_heat_then_place_in_recep": "Heatable",
            "pick_cool_then_place_in_recep": "Coolable"}
_ABILITY_FACT = {"Cleanable": "cleanable", "Heatable": "heatable", "Coolable": "coolable",
                 "Sliceable": "sliceable"}
LAMPS = ("DeskLamp", "FloorLamp")
# Where a lamp stands, by preference: furniture first, seats and beds only where there is none.
_LAMP_STANDS = ("Desk", "SideTable", "Dresser", "TVStand", "CoffeeTable", "DiningTable", "Shelf")
_FLOOR_LAMP_FALLBACK = ("ArmChair", "Sofa", "Bed")
# Types the domain's actions name as constants: always declared, present or not.
_DOMAIN_TYPES = ("SinkBasinType - rtype", "MicrowaveType - rtype", "FridgeType - rtype",
                 "KnifeType - otype", "ButterKnifeType - otype")


class GenerationError(RuntimeError):
  """A game could not be generated (a room that cannot host the task, or no winning plan)."""


# ---- the alfworld package's data -----------------------------------------------------------------


def alfworld_module(name: str) -> Any:
  """Import an alfworld module without leaving ALFWORLD_DATA set in os.environ.

  alfworld/info.py sets ALFWORLD_DATA (to ~/.cache/alfworld) on import when it is unset; the
  environment reads that variable as the user's choice of official games, so it is put back.
  """
  before = os.environ.get("ALFWORLD_DATA")
  try:
    return importlib.import_module(name)
  finally:
    if before is None:
      os.environ.pop("ALFWORLD_DATA", None)
    else:
      os.environ["ALFWORLD_DATA"] = before


@functools.lru_cache(maxsize=None)
def _tables() -> dict[str, Any]:
  constants = alfworld_module("alfworld.gen.constants")
  info = alfworld_module("alfworld.info")
  goals = alfworld_module("alfworld.gen.goal_library")
  movable = set(constants.MOVABLE_RECEPTACLES)
  holds = {r: set(objs) for r, objs in constants.VAL_RECEPTACLE_OBJECTS.items() if r not in movable}
  plain = set(constants.OBJECTS)  # no "...Sliced" types: ALFWorld's text games have no slices
  pickupable = set().union(*constants.VAL_RECEPTACLE_OBJECTS.values()) & plain
  return dict(
      holds=holds,  # static receptacle type -> the object types it may hold
      pickupable=pickupable,
      abilities={k: set(v) & plain for k, v in constants.VAL_ACTION_OBJECTS.items()},
      openable=set(constants.OPENABLE_CLASS_LIST),
      movable=movable,
      goals_valid={k: set(v) for k, v in constants.GOALS_VALID.items()},
      templates={t: list(goals.gdict[t]["templates"]) for t in TASK_TYPES},
      layouts=os.path.join(os.path.dirname(constants.__file__), "layouts"),
      domain_path=info.ALFRED_PDDL_PATH,
      grammar_path=info.ALFRED_TWL2_PATH,
  )


@functools.lru_cache(maxsize=None)
def _logic_texts() -> tuple[str, str]:
  tables = _tables()
  with open(tables["domain_path"]) as f:
    domain = f.read()
  with open(tables["grammar_path"]) as f:
    grammar = f.read()
  return domain, grammar


# ---- rooms ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Room:
  """One FloorPlan's metadata: its kind, object types and static receptacle instances.

  `receptacles` holds (ALFRED object id, receptacle type) pairs, sorted by id.
  """

  number: int
  kind: str
  object_types: frozenset[str]
  receptacles: tuple[tuple[str, str], ...]

  @property
  def receptacle_types(self) -> set[str]:
    return {rtype for _, rtype in self.receptacles}

  def receptacles_of(self, rtypes: Iterable[str]) -> list[str]:
    wanted = set(rtypes)
    return [rid for rid, rtype in self.receptacles if rtype in wanted]


def room_kind(number: int) -> str:
  kind = ROOM_KINDS.get(number // 100)
  if kind is None or not 1 <= number % 100 <= 30:
    raise ValueError(f"FloorPlan{number} is not one of ALFRED's 120 rooms")
  return kind


@functools.lru_cache(maxsize=None)
def load_room(number: int) -> Room:
  """The room's metadata from the FloorPlan files the alfworld wheel ships."""
  kind = room_kind(number)
  tables = _tables()
  prefix = os.path.join(tables["layouts"], f"FloorPlan{number}")
  with open(prefix + "-objects.json") as f:
    object_types = frozenset(json.load(f))
  with open(prefix + "-openable.json") as f:
    listed = sorted(json.load(f))
  receptacles = []
  for rid in listed:
    parts = rid.split("|")
    rtype = parts[-1] if len(parts) > 4 else parts[0]  # "Sink|x|y|z|SinkBasin": the basin
    if rtype in tables["holds"]:
      receptacles.append((rid, rtype))
  have = {rtype for _, rtype in receptacles}
  for rtype in sorted((object_types & set(tables["holds"])) - have):
    # A receptacle type the room has but whose instances have no recorded pose: one instance.
    receptacles.append((_synthetic_receptacle_id(rtype), rtype))
  return Room(number, kind, object_types, tuple(sorted(receptacles)))


def _synthetic_receptacle_id(rtype: str) -> str:
  if rtype.endswith("Basin"):  # ALFWorld names a basin after its sink: "Sink|...|SinkBasin"
    return f"{rtype[:-len('Basin')]}|00|{rtype}"
  return f"{rtype}|00"


# ---- what a room can host ------------------------------------------------------------------------


def _object_choices(room: Room, task_type: str) -> list[tuple[str, list[str]]]:
  """(object type, goal receptacle types) pairs the room supports for the task, sorted.

  For look_at_obj_in_light the second element lists the room's lamp types instead.
  """
  tables = _tables()
  if room.kind not in tables["goals_valid"][task_type]:
    return []
  rtypes = room.receptacle_types
  appliance = _APPLIANCE.get(task_type)
  if appliance is not None and appliance not in rtypes:
    return []
  candidates = sorted(room.object_types & tables["pickupable"])
  if task_type in _ABILITY:
    candidates = [o for o in candidates if o in tables["abilities"][_ABILITY[task_type]]]
  if task_type == "look_at_obj_in_light":
    lamps = [lamp for lamp in LAMPS if lamp in room.object_types and _lamp_stands(room, lamp)]
    if not lamps:
      return []
    return [(o, lamps) for o in candidates if _start_receptacles(room, o, ())]
  choices = []
  for otype in candidates:
    goals = sorted(r for r in rtypes if otype in tables["holds"][r] and r != appliance)
    # The target must be able to start somewhere that is neither the goal's type nor the appliance.
    goals = [r for r in goals if _start_receptacles(room, otype, (r, appliance))]
    if goals:
      choices.append((otype, goals))
  return choices


def _start_receptacles(room: Room, otype: str, excluded: Iterable[str | None]) -> list[str]:
  holds = _tables()["holds"]
  banned = set(excluded)
  return [rid for rid, rtype in room.receptacles if otype in holds[rtype] and rtype not in banned]


def _lamp_stands(room: Room, lamp: str) -> list[str]:
  stands = room.receptacles_of(_LAMP_STANDS)
  if not stands and lamp == "FloorLamp":
    stands = room.receptacles_of(_FLOOR_LAMP_FALLBACK)
  return stands


def can_host(room: int, task_type: str) -> bool:
  """Whether the room has what the task type needs (see the module docstring)."""
  _check_task_type(task_type)
  return bool(_object_choices(load_room(room), task_type))


@functools.lru_cache(maxsize=None)
def host_rooms(split: str, task_type: str, max_receptacles: int | None = None) -> tuple[int, ...]:
  """The split's rooms (held-in or held-out) that can host the task type; with `max_receptacles`, only those
  with at most that many receptacles (a smaller world: fewer places to search, shorter observations)."""
  _check_split(split)
  if max_receptacles is not None and (isinstance(max_receptacles, bool) or not isinstance(max_receptacles, int)
                                      or max_receptacles < 1):
    raise ValueError(f"max_receptacles must be a positive int or None, got {max_receptacles!r}")
  return tuple(n for n in SPLIT_ROOMS[split] if can_host(n, task_type) and (
      max_receptacles is None or len(load_room(n).receptacles) <= max_receptacles))


def no_host_room(split: str, task_type: str, max_receptacles: int | None = None) -> str:
  """Why no game of the task type can be drawn from the split's rooms (host_rooms is empty)."""
  limit = "" if max_receptacles is None else f" with at most {max_receptacles} receptacles"
  return f"no {split} room{limit} can host {task_type}"


def _check_task_type(task_type: str) -> None:
  if task_type not in TASK_TYPES:
    raise ValueError(f"task type must be one of {TASK_TYPES}, got {task_type!r}")


def _check_split(split: str) -> None:
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


# ---- one game ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GameSpec:
  """One generated game: everything its files are written from.

  `receptacles` are (id, type) pairs; `objects` are (id, type, id of the receptacle it starts in).
  `parent_target` is "" for look_at_obj_in_light and `toggle_target` "" for the other types.
  """

  split: str
  task_type: str
  room: int
  seed: int
  object_target: str
  parent_target: str
  toggle_target: str
  goal_text: str
  receptacles: tuple[tuple[str, str], ...]
  objects: tuple[tuple[str, str, str], ...]

  @property
  def task_dir(self) -> str:
    """The official task folder's name: <task type>-<object>-<movable recep>-<parent>-<room>."""
    parent = self.parent_target or self.toggle_target
    return f"{self.task_type}-{self.object_target}-None-{parent}-{self.room}"

  @property
  def trial_dir(self) -> str:
    return f"trial_S{self.seed:09d}"

  @property
  def relative_path(self) -> str:
    """<split>/<task dir>/<trial dir>: the game's folder under json_2.1.1, and its task id."""
    return f"{self.split}/{self.task_dir}/{self.trial_dir}"


def sample_game(room: int, task_type: str, seed: int, split: str = "train") -> GameSpec:
  """Draw the game of (room, task type, seed). Raises GenerationError if the room cannot host it."""
  _check_task_type(task_type)
  _check_split(split)
  layout = load_room(room)
  choices = _object_choices(layout, task_type)
  if not choices:
    raise GenerationError(f"FloorPlan{room} cannot host {task_type}")
  tables = _tables()
  rng = random.Random(f"{GENERATOR_VERSION}/{room}/{task_type}/{seed}")
  otype, second = choices[rng.randrange(len(choices))]
  objects: list[tuple[str, str, str]] = []
  parent = toggle = ""
  excluded: tuple[str | None, ...]
  if task_type == "look_at_obj_in_light":
    toggle = second[rng.randrange(len(second))]
    for lamp in LAMPS:  # every lamp the room has stands somewhere; the target is one of them
      if lamp in second:
        stands = _lamp_stands(layout, lamp)
        objects.append((f"{lamp}|01", lamp, stands[rng.randrange(len(stands))]))
    excluded = ()
  else:
    parent = second[rng.randrange(len(second))]
    excluded = (parent, _APPLIANCE.get(task_type))
  low, high = (2, 3) if task_type == "pick_two_obj_and_place" else (1, 3)
  starts = _start_receptacles(layout, otype, excluded)
  for k in range(rng.randint(low, high)):
    objects.append((f"{otype}|{k + 1:02d}", otype, starts[rng.randrange(len(starts))]))
  for other in sorted(layout.object_types & tables["pickupable"] - {otype}):
    spots = _start_receptacles(layout, other, ())
    if not spots:
      continue
    for k in range(rng.randint(1, 2)):
      objects.append((f"{other}|{k + 1:02d}", other, spots[rng.randrange(len(spots))]))
  templates = tables["templates"][task_type]
  goal_text = templates[rng.randrange(len(templates))].format(
      obj=otype.lower(), recep=parent.lower(), toggle=toggle.lower())
  return GameSpec(split, task_type, room, seed, otype, parent, toggle, goal_text,
                  layout.receptacles, tuple(objects))


def _hash_int(text: str) -> int:
  return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def game_spec(split: str, task_type: str, index: int, max_receptacles: int | None = None) -> GameSpec:
  """The split's index-th game of a task type (index >= 0): room and seed hashed from the three, the room among
  `host_rooms(split, task_type, max_receptacles)`."""
  rooms = host_rooms(split, task_type, max_receptacles)
  if not rooms:
    raise GenerationError(no_host_room(split, task_type, max_receptacles))
  if isinstance(index, bool) or not isinstance(index, int) or index < 0:
    raise ValueError(f"index must be a non-negative int, got {index!r}")
  h = _hash_int(f"{GENERATOR_VERSION}/{split}/{task_type}/{index}")
  return sample_game(rooms[h % len(rooms)], task_type, (h >> 32) % 10**9, split)


# ---- PDDL ----------------------------------------------------------------------------------------


def pddl_name(alfred_id: str) -> str:
  """An ALFRED id in ALFWorld's PDDL ("Cabinet|+00.68" -> "Cabinet_bar__plus_00_dot_68")."""
  out = alfred_id
  for char, word in (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"),
                     (",", "_comma_")):
    out = out.replace(char, word)
  return out


def _goal(spec: GameSpec) -> str:
  obj = f"{spec.object_target}Type"
  if spec.task_type == "look_at_obj_in_light":
    return (f"(:goal (and\n"
            f"  (exists (?ot - object ?r - receptacle ?a - agent ?l - location)\n"
            f"    (and (objectType ?ot {spec.toggle_target}Type) (toggleable ?ot) (isToggled ?ot)\n"
            f"         (receptacleAtLocation ?r ?l) (atLocation ?a ?l) (inReceptacle ?ot ?r)))\n"
            f"  (exists (?o - object ?a - agent) (and (objectType ?o {obj}) (holds ?a ?o)))))")
  recep = f"{spec.parent_target}Type"
  if spec.task_type == "pick_two_obj_and_place":
    return (f"(:goal (exists (?r - receptacle ?o1 - object ?o2 - object)\n"
            f"  (and (receptacleType ?r {recep}) (not (= ?o1 ?o2))\n"
            f"       (objectType ?o1 {obj}) (inReceptacle ?o1 ?r)\n"
            f"       (objectType ?o2 {obj}) (inReceptacle ?o2 ?r))))")
  state = {"pick_clean_then_place_in_recep": "(cleanable ?o) (isClean ?o)",
           "pick_heat_then_place_in_recep": "(heatable ?o) (isHot ?o)",
           "pick_cool_then_place_in_recep": "(coolable ?o) (isCool ?o)"}.get(spec.task_type, "")
  return (f"(:goal (exists (?r - receptacle ?o - object)\n"
          f"  (and (objectType ?o {obj}) (receptacleType ?r {recep}) (inReceptacle ?o ?r)"
          f"{' ' + state if state else ''})))")


def problem_text(spec: GameSpec, reachable: Iterable[str] | None = None) -> str:
  """The game's PDDL problem in ALFWorld's alfred domain.

  With `reachable`, the other receptacles have no location (nothing can go to them); only
  `Solver.walkthrough` asks for that, to plan on a smaller problem.
  """
  tables = _tables()
  location = {rid: f"loc|{i + 1}" for i, (rid, _) in enumerate(spec.receptacles)}
  otypes = sorted({otype for _, otype, _ in spec.objects})
  rtypes = sorted({rtype for _, rtype in spec.receptacles})
  declared = [f"{t}Type - otype" for t in otypes] + [f"{t}Type - rtype" for t in rtypes]
  declared += [d for d in _DOMAIN_TYPES if d not in declared]
  objects = ([("agent1", "agent"), ("loc|0", "location")]
             + [(location[rid], "location") for rid, _ in spec.receptacles]
             + [(rid, "receptacle") for rid, _ in spec.receptacles]
             + [(oid, "object") for oid, _, _ in spec.objects])
  facts: list[tuple[str, ...]] = [("atLocation", "agent1", "loc|0")]
  kept = None if reachable is None else set(reachable)
  for rid, rtype in spec.receptacles:
    facts.append(("receptacleType", rid, f"{rtype}Type"))
    if kept is None or rid in kept:
      facts.append(("receptacleAtLocation", rid, location[rid]))
    if rtype in tables["openable"]:
      facts.append(("openable", rid))
  for rtype in rtypes:
    facts.extend(("canContain", f"{rtype}Type", f"{otype}Type") for otype in otypes
                 if otype in tables["holds"][rtype])
  for oid, otype, rid in spec.objects:
    facts.append(("objectType", oid, f"{otype}Type"))
    facts.append(("inReceptacle", oid, rid))
    facts.append(("objectAtLocation", oid, location[rid]))
    if otype in LAMPS:
      facts.append(("toggleable", oid))
      continue
    facts.append(("pickupable", oid))
    if otype in tables["movable"]:
      facts.append(("isReceptacleObject", oid))
    for ability, fact in _ABILITY_FACT.items():
      if otype in tables["abilities"][ability]:
        facts.append((fact, oid))
  lines = [f"(define (problem plan_gen_{spec.room}_{spec.seed})", "(:domain alfred)", "(:objects"]
  lines += [f"{pddl_name(name)} - {kind}" for name, kind in objects] + declared
  lines += [")", "(:init"]
  lines += ["(" + " ".join([fact[0], *map(pddl_name, fact[1:])]) + ")" for fact in facts]
  lines += [")", _goal(spec), ")", ""]
  return "\n".join(lines)


def game_files(spec: GameSpec, walkthrough: Sequence[str] | None = None,
               reachable: Iterable[str] | None = None) -> dict[str, str]:
  """The game's three files (name -> text), as the official data names them."""
  domain, grammar = _logic_texts()
  problem = problem_text(spec, reachable)
  game = {
      "pddl_domain": domain,
      "grammar": grammar.replace("UNKNOWN GOAL", spec.goal_text),
      "pddl_problem": problem,
      "solvable": walkthrough is not None,
      "walkthrough": list(walkthrough) if walkthrough is not None else None,
  }
  traj = {
      "task_type": spec.task_type,
      "task_id": f"gen_{spec.room}_{spec.task_type}_{spec.seed}",
      "pddl_params": {
          "object_target": spec.object_target,
          "parent_target": spec.parent_target,
          "toggle_target": spec.toggle_target,
          "mrecep_target": "",
          "object_sliced": False,
      },
      "scene": {"floor_plan": f"FloorPlan{spec.room}", "scene_num": spec.room,
                "random_seed": spec.seed},
      "turk_annotations": {"anns": [{"task_desc": spec.goal_text, "high_descs": [],
                                     "votes": []}]},
      "generator": {"name": "explore_jax", "version": GENERATOR_VERSION, "split": spec.split},
  }
  return {GAME_FILE: json.dumps(game), TRAJ_FILE: json.dumps(traj, indent=1),
          PROBLEM_FILE: problem}


# ---- checking and writing ------------------------------------------------------------------------


class Solver:
  """ALFWorld's planner expert (fast-downward through textworld's PDDL backend, what
  AlfredExpertType.PLANNER asks for) and a replay check. Imports textworld on creation.

  `env` may be a textworld PDDL environment wrapped in ALFWorld's AlfredDemangler (the game process
  passes the one it plays with); otherwise one is made.
  """

  def __init__(self, env: Any = None):
    if env is None:
      textworld = importlib.import_module("textworld")
      pddl = importlib.import_module("textworld.envs.pddl")
      alfred = alfworld_module("alfworld.agents.environment.alfred_tw_env")
      env = alfred.AlfredDemangler(pddl.PddlEnv(textworld.EnvInfos(won=True)))
    self.env = env

  def plan(self, game: dict[str, Any] | str) -> list[str]:
    """The planner's plan for a game (its data or its file's path) from its initial state."""
    with preserved_argv():
      self.env.load(game)
      infos = self.env.request_infos
      wanted = infos.policy_commands
      infos.policy_commands = True  # for the reset only: on every step it would replan each time
      try:
        state = self.env.reset()
      finally:
        infos.policy_commands = wanted
    return list(state["policy_commands"] or [])

  def wins(self, game: dict[str, Any] | str, commands: Sequence[str]) -> bool:
    """Whether playing `commands` from the game's initial state wins it."""
    with preserved_argv():
      self.env.load(game)
      state = self.env.reset()
    for command in commands:
      state, _, _ = self.env.step(command)
    return bool(state["won"])

  def walkthrough(self, spec: GameSpec) -> list[str]:
    """A winning plan for the game, checked on the game itself.

    The planner's search grows quickly with the objects and receptacles it could use (over a
    minute for some kitchens), so it is run on the game without what a plan never needs: the
    objects of other types than the target (receptacles have no capacity in this domain, so they
    are in nobody's way) and the receptacles that neither hold a target at the start, nor are of
    the goal's type, nor are the task's appliance or a lamp's stand (they stay in the problem,
    unreachable, so that every name is the same as in the game). The plan, optimal on that game
    and so on the full one, is then replayed on the full game, which it must win.
    """
    kept = {spec.object_target, spec.toggle_target}
    objects = tuple(o for o in spec.objects if o[1] in kept)
    useful = {spec.parent_target, _APPLIANCE.get(spec.task_type)}
    reachable = {rid for _, _, rid in objects} | {rid for rid, rtype in spec.receptacles
                                                  if rtype in useful}
    pruned = dataclasses.replace(spec, objects=objects)
    plan = self.plan(json.loads(game_files(pruned, reachable=reachable)[GAME_FILE]))
    if not plan or not self.wins(json.loads(game_files(spec)[GAME_FILE]), plan):
      raise GenerationError(f"no winning plan for {spec.relative_path} ({len(plan)} steps)")
    return plan


class preserved_argv:
  """fast-downward's PDDL translation overwrites sys.argv (textworld translates on every load and
  reset); this puts it back."""

  def __enter__(self):
    self._argv = list(sys.argv)

  def __exit__(self, *exc):
    sys.argv[:] = self._argv
    return False


_MEMO_TRANSLATIONS = 16  # translations kept by memoize_textworld (two per game, ~1-5 MB each)


def memoize_textworld() -> None:
  """Make textworld's PDDL backend skip work it repeats, with unchanged results (a test compares).

  Meant for processes that play or generate games (the game process, this module's command line);
  idempotent. textworld re-parses the grammar's templates and queries with tatsu for every command
  it lists at every step, and translates the PDDL problem twice with fast-downward's translator at
  every load and every reset (about 1 s for a kitchen). Here the parses are kept per text (a parsed
  template is copied before use: deriving it changes it) and the last few translations per
  (domain, problem) text. Measured on a kitchen: a step 66 -> 21 ms, a reset 950 -> 80 ms.
  """
  textgen = importlib.import_module("textworld.envs.pddl.textgen")
  logic = importlib.import_module("textworld.logic")
  fast_downward = importlib.import_module("fast_downward")
  if getattr(fast_downward.pddl2sas, "_explore_jax_memo", False):
    return
  parse_template = textgen._parse_and_convert
  templates: dict[tuple[str, str], Any] = {}

  def parse_template_once(text, rule_name, **kwargs):
    key = (text, rule_name)
    if key not in templates:
      templates[key] = parse_template(text, rule_name=rule_name)
    return copy.deepcopy(templates[key])

  parse_query = logic.Rule.parse_conjunctive_query.__func__
  queries: dict[str, Any] = {}

  def parse_query_once(cls, expr):
    if expr not in queries:
      queries[expr] = parse_query(cls, expr)
    return queries[expr]

  translate = fast_downward.pddl2sas
  translations: collections.OrderedDict[tuple[str, str, bool], Any] = collections.OrderedDict()

  def translate_once(domain, problem, verbose=False, optimize=False):
    key = (domain, problem, bool(optimize))
    if key in translations:
      translations.move_to_end(key)
    else:
      translations[key] = translate(domain, problem, verbose=verbose, optimize=optimize)
      while len(translations) > _MEMO_TRANSLATIONS:
        translations.popitem(last=False)
    return translations[key]

  translate_once._explore_jax_memo = True
  textgen._parse_and_convert = parse_template_once
  logic.Rule.parse_conjunctive_query = classmethod(parse_query_once)
  fast_downward.pddl2sas = translate_once


def cache_root() -> str:
  """The project's cache folder: EXPLORE_JAX_CACHE, else ~/.cache/explore_jax."""
  return cache.root()


def generated_root(cache_dir: str | None = None) -> str:
  """Where generated games live: an ALFWORLD_DATA-style root (its games are under json_2.1.1/)."""
  return os.path.join(os.path.abspath(cache_dir) if cache_dir else cache_root(), "alfworld",
                      GENERATOR_VERSION)


def game_dir(root: str, spec: GameSpec) -> str:
  return os.path.join(root, DATA_FOLDER, *spec.relative_path.split("/"))


@contextlib.contextmanager
def _generating(target: str) -> Iterator[None]:
  """Held while one process checks and writes the game `target`: the game's group-mates (processes resetting
  to the same new game at once) wait for its copy instead of each planning it again. An flock, so a holder
  that dies releases it; the small lock file stays beside the game."""
  fd = os.open(os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.lock"),
               os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)  # releases the lock


def write_game(root: str, spec: GameSpec, solver: Solver | None = None) -> str:
  """Check the game with the planner and write its files under `root` (atomically); returns the
  game file's path. A game already there is left as it is; one being written by another process is
  waited for."""
  target = game_dir(root, spec)
  path = os.path.join(target, GAME_FILE)
  if os.path.isfile(path):
    return path
  parent = os.path.dirname(target)
  os.makedirs(parent, exist_ok=True)
  with _generating(target):
    if os.path.isfile(path):  # written while this process waited
      return path
    files = game_files(spec, (solver or Solver()).walkthrough(spec))
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    try:
      for name, text in files.items():
        with open(os.path.join(tmp, name), "w") as f:
          f.write(text)
      os.chmod(tmp, 0o755)
      try:
        os.rename(tmp, target)
      except OSError:
        if not os.path.isfile(path):  # not another writer's complete copy: a real failure
          raise
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
  return path


def generate(split: str, task_type: str, index: int, cache_dir: str | None = None,
             solver: Solver | None = None, max_receptacles: int | None = None) -> str:
  """The split's index-th game of a task type, generated into the cache unless already there."""
  return write_game(generated_root(cache_dir), game_spec(split, task_type, index, max_receptacles), solver)


def schedule(task_types: Sequence[str], index: int) -> tuple[str, int]:
  """An environment's game `index` over several task types: (task type, index within the type),
  the types taking turns, so the first 6k games hold k of each of six types."""
  return task_types[index % len(task_types)], index // len(task_types)


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description="Generate ALFWorld games into the cache.")
  parser.add_argument("--split", default="train", choices=SPLITS)
  parser.add_argument("--num-games", type=int, default=12)
  parser.add_argument("--first", type=int, default=0, help="the first game's index (processes can split a range)")
  parser.add_argument("--task-types", nargs="*", default=list(TASK_TYPES), choices=TASK_TYPES)
  parser.add_argument("--cache-dir", default=None)
  parser.add_argument("--max-receptacles", type=int, default=None, help="only rooms with at most this many")
  args = parser.parse_args(argv)
  memoize_textworld()
  solver = Solver()
  root = generated_root(args.cache_dir)
  times = []
  for i in range(args.first, args.first + args.num_games):
    task_type, j = schedule(args.task_types, i)
    spec = game_spec(args.split, task_type, j, args.max_receptacles)
    start = time.perf_counter()
    path = write_game(root, spec, solver)
    times.append(time.perf_counter() - start)
    print(f"{times[-1]:6.3f}s  {os.path.relpath(path, root)}", flush=True)
  if times:
    print(f"{len(times)} games, {sum(times) / len(times):.3f} s per game on average "
          f"(max {max(times):.3f} s), under {root}")


if __name__ == "__main__":
  main()
