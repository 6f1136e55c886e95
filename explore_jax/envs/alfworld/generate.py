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
turk_annotations, and a "generator" entry): `game_files`. games.py checks each game with the
planner and writes it into the cache (`write_game`), and its command line fills the cache.

Nothing here imports textworld, nor jax ever. Importing alfworld
sets ALFWORLD_DATA in os.environ when it is unset; `alfworld_module` imports it without leaving that
behind.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import os
import random
from typing import Any, Iterable, Sequence

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


def planning_problem(spec: GameSpec) -> tuple[GameSpec, set[str]]:
  """The game without what no plan needs, for the planner (games.Solver.walkthrough), and the receptacles it
  may reach: the objects of other types than the target go (receptacles have no capacity in this domain, so
  they are in nobody's way), and so do the receptacles that neither hold a target at the start, nor are of
  the goal's type, nor are the task's appliance or a lamp's stand (they stay in the problem, unreachable, so
  that every name is the same as in the game)."""
  kept = {spec.object_target, spec.toggle_target}
  objects = tuple(o for o in spec.objects if o[1] in kept)
  useful = {spec.parent_target, _APPLIANCE.get(spec.task_type)}
  reachable = {rid for _, _, rid in objects} | {rid for rid, rtype in spec.receptacles if rtype in useful}
  return dataclasses.replace(spec, objects=objects), reachable

def schedule(task_types: Sequence[str], index: int) -> tuple[str, int]:
  """An environment's game `index` over several task types: (task type, index within the type),
  the types taking turns, so the first 6k games hold k of each of six types."""
  return task_types[index % len(task_types)], index // len(task_types)
