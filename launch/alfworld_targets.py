"""Whether an ALFWorld config's evaluation games ask for what its warm start was shown: per held-out game, its room
and the task's object and receptacle, with how many of the SFT demonstrations' games had the same room, object and
receptacle; with a pass@k record, each game's successes beside them and success by how familiar the object is.

  python launch/alfworld_targets.py --config=configs/gigpo_alfworld.py --config.sft.oracle_episodes=2048 \\
      --pass_at_k=docs/results/protocol/alfworld/warm_starts/cecb32b57ece.pass_at_k/50b77e55759d.json

Generated games only (the official ones are the user's data). Nothing is played or generated: the games are drawn
from their specs (explore_jax/envs/alfworld/generate.py), as the environment would play them.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import sys
from typing import Any, Iterable, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from explore_jax.envs.alfworld.env import DEFAULT_NUM_GAMES, generated_game  # noqa: E402
from explore_jax.envs.base import task_index  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "An ALFWorld config file[:variant].", lock_config=True)
_PASS_AT_K = flags.DEFINE_string("pass_at_k", None, "A pass@k record (a warm start's <key>.pass_at_k/*.json, or a "
                                 "run's summary.json) whose per-game successes go beside the games.")
_POLICY = flags.DEFINE_string("policy", "warm start", "Whose successes: the label's first part in the record "
                               "(\"warm start\" or, in a run's summary.json, \"trained\").")
_FAMILIAR = flags.DEFINE_integer("familiar", 20, "An object is familiar when at least this many demonstration "
                                 "games asked for it.")
flags.mark_flags_as_required(["config"])


@dataclasses.dataclass(frozen=True)
class Game:
  index: int
  room: int
  object_type: str
  receptacle: str


def games(env_kwargs: dict[str, Any], seeds: Iterable[int]) -> list[Game]:
  """The generated games that seeded resets of an ALFWorld-v0 with `env_kwargs` play (seed % the split's size)."""
  split = env_kwargs.get("split", "train")
  count = env_kwargs.get("num_games") or DEFAULT_NUM_GAMES[split]
  out = []
  for seed in seeds:
    index = task_index({}, seed, count, None)
    spec = generated_game(split, env_kwargs.get("task_types"), index, env_kwargs.get("max_receptacles"))
    out.append(Game(index, spec.room, spec.object_target, spec.parent_target or spec.toggle_target))
  return out


def split_kwargs(config: Any) -> dict[str, dict[str, Any]]:
  """The env kwargs of each task set a config evaluates on pass@k: "held-out" and each of eval.more_splits."""
  base = {**config.env.kwargs, **config.eval.env_kwargs}
  sets = {"held-out": base}
  for split in config.eval.get("more_splits", ()):
    sets[split] = {**base, "split": split}
  return sets


def _per_task(record: Any) -> Iterable[dict[str, Any]]:
  """Every per-task pass@k set in a record, however nested (a list of sets, or summary.json's per_task)."""
  if isinstance(record, dict):
    if "successes" in record and "label" in record:
      yield record
    for value in record.values():
      yield from _per_task(value)
  elif isinstance(record, list):
    for value in record:
      yield from _per_task(value)


def successes(record: Any, policy: str, task_set: str) -> Optional[dict[int, tuple[int, int]]]:
  """{task id: (successes, samples)} of the set labelled "<policy> / <task_set>" in a pass@k record (the warm
  start's pass@k file, or a run's summary.json), or None where it has none."""
  for s in _per_task(record):
    if s["label"] == f"{policy} / {task_set}":
      return {int(t): (int(k), int(n)) for t, k, n in zip(s["task_ids"], s["successes"], s["samples"])}
  return None


def report(config: Any, record: Any = None, policy: str = "warm start", familiar: int = 20) -> str:
  """The tables (markdown) of every task set the config evaluates on pass@k, with `policy`'s per-game successes
  from `record` where given; an object is familiar when at least `familiar` demonstration games asked for it."""
  c = config
  demo_kwargs = {**c.env.kwargs, **c.sft.get("env_kwargs", {})}
  demos = games(demo_kwargs, range(c.sft.oracle_seed_offset, c.sft.oracle_seed_offset + c.sft.oracle_episodes))
  rooms = collections.Counter(g.room for g in demos)
  objects = collections.Counter(g.object_type for g in demos)
  receptacles = collections.Counter(g.receptacle for g in demos)
  lines = [f"{len(demos)} demonstration games (seeds {c.sft.oracle_seed_offset}-"
           f"{c.sft.oracle_seed_offset + c.sft.oracle_episodes - 1}), {len(rooms)} rooms, {len(objects)} object types"]
  seeds = range(c.eval.seed_offset, c.eval.seed_offset + c.eval.passk_held_out_tasks)
  for task_set, kwargs in split_kwargs(c).items():
    won = successes(record, policy, task_set) if record is not None else None
    if record is not None and won is None:
      labels = sorted({str(s["label"]) for s in _per_task(record)})
      raise ValueError(f"the pass@k record has no set labelled {f'{policy} / {task_set}'!r}; it has {labels} "
                       "(--policy is the part before ' / ')")
    lines += ["", f"## {task_set} ({kwargs['split']})", "",
              "| game | room (demos there) | object (demos asking for it) | receptacle (demos) |"
              + (" successes |" if won else ""),
              "|---|---|---|---|" + ("---|" if won else "")]
    groups: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
    evaluated = games(kwargs, seeds)
    for seed, g in zip(seeds, evaluated):
      row = (f"| {g.index} | {g.room} ({rooms[g.room]}) | {g.object_type} ({objects[g.object_type]}) | "
             f"{g.receptacle} ({receptacles[g.receptacle]}) |")
      if won and seed in won:
        row += f" {won[seed][0]} of {won[seed][1]} |"
        groups[objects[g.object_type] >= familiar].append(won[seed])
      lines.append(row)
    unseen = sum(rooms[g.room] == 0 for g in evaluated)
    lines += ["", f"games in rooms no demonstration played: {unseen} of {len(seeds)}"]
    for is_familiar, label in ((True, f"at least {familiar}"), (False, f"fewer than {familiar}")):
      rows = groups[is_familiar]
      if rows:
        rate = sum(k for k, _ in rows) / sum(n for _, n in rows)
        lines.append(f"games whose object {label} demonstrations asked for: {len(rows)}, pass@1 {rate:.3f}")
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if config.env.id != "explore_jax/ALFWorld-v0":
    raise app.UsageError(f"--config plays {config.env.id}, not explore_jax/ALFWorld-v0")
  record = None
  if _PASS_AT_K.value:
    with open(_PASS_AT_K.value) as f:
      record = json.load(f)
  try:
    print(report(config, record, _POLICY.value, _FAMILIAR.value))
  except ValueError as e:
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  app.run(main)
