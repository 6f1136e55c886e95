"""Generated ALFWorld games on disk: each one checked with ALFWorld's planner before it is written, atomically, into
the cache, and the command line that fills the cache ahead of training. What a game is, and its files' text, is
generate.py's (a pure function of room, task type and seed); this module is the part that runs textworld.

`write_game` checks every game before writing it: the planner (ALFWorld's planner expert: fast-downward through
textworld's PDDL backend) must find a plan, on the game pruned of what no plan needs (`Solver.walkthrough`), whose
replay on the game wins; that plan is the walkthrough. One process at a time checks a game (a lock file beside it):
the processes of a group, resetting to the same new game at once, wait for the first one's copy instead of each
planning it again. A game is written to a temporary folder and renamed into place, so no reader ever sees half of
one; a generated game is cached under `cache_root()` (EXPLORE_JAX_CACHE or ~/.cache/explore_jax) +
alfworld/<GENERATOR_VERSION>, which is itself an ALFWORLD_DATA-style root.

`python -m explore_jax.envs.alfworld.games --split train --num-games 60` fills the cache ahead of training and
prints the time per game (`--first 60` goes on from game 60: processes can split a range). Measured over one game
of every (room, task type) pair the 120 rooms can host (410 pairs, all generated and checked), one core: 1.5 s per
game on average (median 1.0 s, at most 7.4 s in a large kitchen), most of it textworld translating the game and the
planner; per type 0.9 s (pick_and_place_simple, look_at_obj_in_light) to 3.0 s (heat).

Nothing here imports textworld until a game is checked (`Solver`, `memoize_textworld`), nor jax ever.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import fcntl
import importlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Iterator, Sequence

from explore_jax import cache
from explore_jax.envs.alfworld.generate import (DATA_FOLDER, GAME_FILE, GENERATOR_VERSION, SPLITS, TASK_TYPES,
                                                GameSpec, GenerationError, alfworld_module, game_files, game_spec,
                                                planning_problem, schedule)


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

    The planner's search grows quickly with the objects and receptacles it could use (over a minute for some
    kitchens), so it is run on the game without what a plan never needs (generate.planning_problem). The plan,
    optimal on that game and so on the full one, is then replayed on the full game, which it must win.
    """
    pruned, reachable = planning_problem(spec)
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
