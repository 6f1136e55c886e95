"""How an ALFWorld policy fails: a breakdown of the transcripts that launch/eval.py writes (--transcripts=N).

Per episode, how far it got (the first that holds): won; held the task's object but did not put it where the
task says; took only other objects; saw the task's object and took none; never saw it. Per action kind (go to,
take, move, open, ...), how many changed nothing (the game answered "Nothing happens.") and how many `go to`s
named a receptacle the room does not have. Where the observation lists the admissible actions
(`env.kwargs.list_actions=True`: a last line "Actions: a, b, c."), how many actions were not among them. Where the
policy first saw the task's object (at the first receptacle it went to, or a later one), whether its next action
took it. An action's answer is the first line of the next step's observation, so an episode's last action counts
only when it won.

  python launch/eval.py --config=configs/gigpo_alfworld.py --policy=warm_start --splits=held-out --samples=2 \\
      --transcripts=2 --output=runs/eval-alfworld-ws
  python launch/alfworld_failures.py runs/eval-alfworld-ws/transcripts-held-out.jsonl
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import sys
from typing import Any, Iterable, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from explore_jax.envs.alfworld.env import NOTHING_HAPPENS  # noqa: E402
from explore_jax.envs.base import listed_actions  # noqa: E402

OUTCOMES = ("won", "held the task's object, did not place it", "took only other objects",
            "saw the task's object, took none", "never saw the task's object")
_GOAL = re.compile(r"Your task is to: (?:put|clean|heat|cool|examine|look at|find) (?:some |a |an |two )?(\w+)")
_ROOM = re.compile(r"Looking around the room, you see (.*?)\.(?:\n|$)")
_ARRIVED = re.compile(r"^(?:You arrive at|You open) ")
STOPS = ("first stop", "a later stop")
SIGHTING_REPLIES = ("took it", "a take that failed", "no take")


def task_object(observation: str) -> Optional[str]:
  """The object type the goal names ("Your task is to: put some mug in ..." -> "mug"), or None."""
  match = _GOAL.search(observation)
  return match.group(1) if match else None


def room_receptacles(observation: str) -> set[str]:
  """The receptacles the room lists ("a cabinet 1, a cabinet 2, and a toaster 1" -> {"cabinet 1", ...})."""
  match = _ROOM.search(observation)
  if not match:
    return set()
  items = re.split(r",\s*(?:and\s+)?|\s+and\s+", match.group(1))
  return {re.sub(r"^(?:a|an)\s+", "", item.strip()) for item in items if item.strip()}


def action_kind(action: str) -> str:
  words = action.split()
  if not words:
    return "(empty)"
  return " ".join(words[:2]) if words[0] == "go" and len(words) > 1 else words[0]


@dataclasses.dataclass
class Breakdown:
  episodes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  actions: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  unchanged: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  missing_receptacles: int = 0  # `go to`s naming a receptacle the room does not have
  # Per action kind, where the observation listed the admissible actions: how many were chosen, and how many of
  # those were not in the list.
  listed: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  unlisted: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  # What the policy did where it first saw the task's object: (stop, reply) counts, the stop being the episode's
  # first receptacle or a later one, the reply one of SIGHTING_REPLIES.
  sightings: collections.Counter = dataclasses.field(default_factory=collections.Counter)


def breakdown(episodes: Iterable[dict[str, Any]]) -> Breakdown:
  """Counts over transcript episodes (evaluation.write_transcripts' lines)."""
  out = Breakdown()
  for episode in episodes:
    steps = episode["steps"]
    first = steps[0]["observation"] if steps else ""
    wanted, room = task_object(first), room_receptacles(first)
    held = took = saw = False
    stops = 0
    for i, step in enumerate(steps):
      answer = steps[i + 1]["observation"].split("\n", 1)[0] if i + 1 < len(steps) else None
      here = step["observation"].split("\n", 1)[0]
      stops += here.startswith("You arrive at")
      action = step["response"].strip()
      kind = action_kind(action)
      picked_up = kind == "take" and answer is not None and answer.startswith("You pick up")
      took_wanted = picked_up and bool(wanted) and action.split()[1:2] == [wanted]
      if wanted and _ARRIVED.match(here) and re.search(rf"\b{re.escape(wanted)} \d", here):
        if not saw and not (kind == "take" and answer is None):  # (a take the episode ended on: no answer)
          reply = (SIGHTING_REPLIES[0] if took_wanted else SIGHTING_REPLIES[1] if kind == "take"
                   else SIGHTING_REPLIES[2])
          out.sightings[(STOPS[0] if stops <= 1 else STOPS[1], reply)] += 1
        saw = True
      out.actions[kind] += 1
      if kind == "go to" and room and action[len("go to "):] not in room:
        out.missing_receptacles += 1
      admissible = listed_actions(step["observation"])
      if admissible is not None:
        out.listed[kind] += 1
        if action not in admissible:
          out.unlisted[kind] += 1
      if answer is None:
        continue
      if answer == NOTHING_HAPPENS:
        out.unchanged[kind] += 1
      took, held = took or picked_up, held or took_wanted
    outcome = (OUTCOMES[0] if episode.get("success") else OUTCOMES[1] if held else OUTCOMES[2] if took
               else OUTCOMES[3] if saw else OUTCOMES[4])
    out.episodes[outcome] += 1
  return out


def report(b: Breakdown) -> str:
  total = sum(b.episodes.values())
  lines = [f"| episode outcome | episodes (of {total}) |", "|---|---|"]
  lines += [f"| {name} | {b.episodes[name]} |" for name in OUTCOMES]
  listed = sum(b.listed.values()) > 0  # a column for it only where the observations listed the actions
  lines += ["", "| action | count | changed nothing |" + (" not among the listed |" if listed else ""),
            "|---|---|---|" + ("---|" if listed else "")]
  for kind, n in b.actions.most_common():
    lines.append(f"| {kind} | {n} | {b.unchanged[kind]} |" + (f" {b.unlisted[kind]} of {b.listed[kind]} |"
                                                               if listed else ""))
  lines += ["", f"`go to`s naming a receptacle the room does not have: {b.missing_receptacles} of "
            f"{b.actions['go to']}"]
  lines += ["", "| where the task's object was first seen | episodes | " + " | ".join(SIGHTING_REPLIES) + " |",
            "|---|---|" + "---|" * len(SIGHTING_REPLIES)]
  for stop in STOPS:
    counts = [b.sightings[(stop, reply)] for reply in SIGHTING_REPLIES]
    lines.append(f"| {stop} | {sum(counts)} | " + " | ".join(map(str, counts)) + " |")
  return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument("transcripts", nargs="+", help="transcripts-<split>.jsonl files of launch/eval.py")
  args = parser.parse_args(argv)
  episodes = []
  for path in args.transcripts:
    with open(path) as f:
      episodes += [json.loads(line) for line in f if line.strip()]
  print(report(breakdown(episodes)))


if __name__ == "__main__":
  main()
