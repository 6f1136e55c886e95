"""launch/alfworld_failures.py on episodes played in the real world (a generated game, its oracle and detours
from it), as launch/eval.py's transcripts hold them."""

import collections
import json

import pytest

from explore_jax.envs.alfworld.env import ALFWorldEnv
from launch import alfworld_failures as failures


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("alfworld-cache"))


@pytest.fixture(scope="module")
def env(cache_dir):
  env = ALFWorldEnv(split="train", task_types=["pick_and_place_simple"], data_dir="generated", cache_dir=cache_dir)
  yield env
  env.close()


def play(env, seed, actions):
  """A transcript episode (evaluation.write_transcripts' fields): `actions` is a list of commands, or a
  function of the env giving the next command (None: the episode ends)."""
  observation, _ = env.reset(seed=seed)
  steps, success = [], False
  for i in range(40):
    action = actions(env) if callable(actions) else (actions[i] if i < len(actions) else None)
    if action is None:
      break
    steps.append({"observation": observation, "response": action, "task_reward": 0.0, "format_reward": 1.0,
                  "feedback": ""})
    observation, _, terminated, truncated, info = env.step(action)
    success = bool(info["success"])
    if terminated or truncated:
      break
  return {"task": seed, "episode": seed, "success": success, "return": float(success), "error": None,
          "steps": steps}


def oracle_until_take(take: bool):
  """The oracle's commands up to its `take`, then that take (or, with take=False, a look instead), then a look."""
  state = {"at_take": False, "done": False}

  def next_action(env):
    if state["done"]:
      return None
    if state["at_take"]:
      state["done"] = True
      return "look"
    action = env.oracle_action()
    if action.startswith("take "):
      state["at_take"] = True
      return action if take else "look"
    return action
  return next_action


def test_goal_and_room_parsing_on_the_worlds_text(env):
  observation, _ = env.reset(seed=0)
  wanted = failures.task_object(observation)
  assert wanted and (f"put some {wanted} " in observation or f"put a {wanted} " in observation)
  room = failures.room_receptacles(observation)
  assert room == set(env.receptacles) and len(room) >= 2
  assert failures.task_object("Your task is to: heat some mug and put it in coffeemachine.") == "mug"
  assert failures.room_receptacles("Looking around the room, you see a cabinet 1, an armchair 2, and a sofa 1.\n") \
      == {"cabinet 1", "armchair 2", "sofa 1"}


def test_outcomes_and_actions_of_played_episodes(env, tmp_path):
  episodes = [play(env, 0, lambda e: e.oracle_action()),    # won
              play(env, 1, oracle_until_take(True)),   # held the object, then stopped
              play(env, 2, oracle_until_take(False)),  # stood by the object, took nothing
              play(env, 3, ["go to nowhere 9", "take nothing 9 from nowhere 9", "look"])]
  assert episodes[0]["success"] and not any(e["success"] for e in episodes[1:])
  b = failures.breakdown(episodes)
  assert b.episodes == {"won": 1, "held the task's object, did not place it": 1,
                        "saw the task's object, took none": 1, "never saw the task's object": 1}
  assert b.missing_receptacles == 1  # the oracle only goes where the room has something
  assert b.unchanged["go to"] == 1 and b.unchanged["take"] == 1  # the answer to each of the bogus commands
  assert b.actions["take"] == 3 and b.unchanged["look"] == 0
  # Where each saw the object first: the two oracle episodes took it there, the third looked instead.
  replies = collections.Counter()
  for (stop, reply), n in b.sightings.items():
    assert stop in failures.STOPS
    replies[reply] += n
  assert replies == {"took it": 2, "no take": 1}

  path = tmp_path / "transcripts-train.jsonl"
  path.write_text("".join(json.dumps(e) + "\n" for e in episodes))
  failures.main([str(path)])


def test_an_episode_that_takes_only_other_objects():
  """Text as the world writes it: the task wants a mug; the policy picks up a cup, then a wrong mug number."""
  first = ("Your task is to: put some mug in cabinet.\nLooking around the room, you see a cabinet 1, a countertop 1, "
           "and a sinkbasin 1.\nYou are in the middle of the room.\nYou are not carrying anything.")
  at = "You arrive at countertop 1. On the countertop 1, you see a cup 1, and a mug 2.\n" + first.split("\n", 1)[1]
  steps = [{"observation": first, "response": "go to countertop 1"},
           {"observation": at, "response": "take mug 1 from countertop 1"},
           {"observation": "Nothing happens.\n" + first, "response": "take cup 1 from countertop 1"},
           {"observation": "You pick up the cup 1 from the countertop 1.\n" + first, "response": "go to cabinet 1"}]
  b = failures.breakdown([{"success": False, "steps": steps}])
  assert b.episodes == {"took only other objects": 1}
  assert b.unchanged == {"take": 1} and b.actions == {"go to": 2, "take": 2} and b.missing_receptacles == 0


def test_what_the_policy_did_where_it_first_saw_the_object():
  """The first receptacle reached (opened or not) is the first stop; only the first sighting counts."""
  first = ("Your task is to: put some mug in sinkbasin.\nLooking around the room, you see a cabinet 1, a "
           "countertop 1, and a sinkbasin 1.\nYou are in the middle of the room.\nYou are not carrying anything.")
  rest = "\n" + first.split("\n", 1)[1]
  empty = "You arrive at cabinet 1. On the cabinet 1, you see nothing." + rest
  mug = "You arrive at countertop 1. On the countertop 1, you see a mug 2." + rest
  closed = "You arrive at cabinet 1. The cabinet 1 is closed." + rest
  opened = "You open the cabinet 1. The cabinet 1 is open. In it, you see a mug 1." + rest

  def episode(*pairs):
    return {"success": False, "steps": [{"observation": o, "response": r} for o, r in pairs]}

  later_took = episode((first, "go to cabinet 1"), (empty, "go to countertop 1"),
                       (mug, "take mug 2 from countertop 1"),
                       ("You pick up the mug 2 from the countertop 1." + rest, "look"))
  sink = "You arrive at sinkbasin 1. On the sinkbasin 1, you see nothing." + rest
  first_walked_on = episode((first, "go to countertop 1"), (mug, "go to sinkbasin 1"), (sink, "go to countertop 1"),
                            (mug, "take mug 2 from countertop 1"), ("Nothing happens." + rest, "look"))
  opened_took = episode((first, "go to nowhere 1"), ("Nothing happens." + first, "go to cabinet 1"),
                        (closed, "open cabinet 1"), (opened, "take mug 1 from cabinet 1"),
                        ("You pick up the mug 1 from the cabinet 1." + rest, "look"))
  wrong_number = episode((first, "go to countertop 1"), (mug, "take mug 1 from countertop 1"),
                         ("Nothing happens." + rest, "look"))
  ended_on_take = episode((first, "go to countertop 1"), (mug, "take mug 2 from countertop 1"))
  b = failures.breakdown([later_took, first_walked_on, opened_took, wrong_number, ended_on_take])
  assert b.sightings == {("a later stop", "took it"): 1, ("first stop", "no take"): 1,
                         ("first stop", "took it"): 1, ("first stop", "a take that failed"): 1}
  assert "| first stop | 3 | 1 | 1 | 1 |" in failures.report(b)
  assert "| a later stop | 1 | 1 | 0 | 0 |" in failures.report(b)


def test_actions_outside_the_listed_ones_where_the_world_lists_them(env, cache_dir):
  listing = ALFWorldEnv(split="train", task_types=["pick_and_place_simple"], data_dir="generated",
                        cache_dir=cache_dir, list_actions=True)
  try:
    observation, _ = listing.reset(seed=0)
    assert failures.listed_actions(observation) == set(listing.admissible_actions())
    won = play(listing, 0, lambda e: e.oracle_action())
    bogus = play(listing, 1, ["go to nowhere 9", "look", "take nothing 9 from nowhere 9"])
  finally:
    listing.close()
  assert won["success"]
  b = failures.breakdown([won, bogus])
  assert sum(b.listed.values()) == len(won["steps"]) + 3  # every step of both episodes showed the list
  assert b.unlisted == {"go to": 1, "take": 1}  # the oracle chooses from the list; "look" is listed
  assert "| take |" in failures.report(b) and "not among the listed" in failures.report(b)
  # Without the list nothing is counted, and the report has no such column.
  assert failures.listed_actions(env.reset(seed=1)[0]) is None
  plain = failures.breakdown([play(env, 1, ["go to nowhere 9", "look"])])
  assert not plain.listed and "not among the listed" not in failures.report(plain)
