"""ALFWorld-v0: generated games per task type, seeds, the room partition, the grammar, state keys,
admissible actions, parallel copies, instances stepped at once, official-layout games (data_dir and ALFWORLD_DATA), concurrent
generation, a killed game process, the game process's memoization, lazy imports."""

import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from explore_jax.envs import ParallelCopies, oracle_demonstrations, state_key
from explore_jax.envs.alfworld import games, generate
from explore_jax.envs.alfworld.env import ALFWorldEnv, generated_game
from explore_jax.envs.alfworld.generate import (HELD_IN_ROOMS, HELD_OUT_ROOMS, SPLITS,
                                                TASK_TYPES)
from explore_jax.envs.alfworld.process import ALFWorldError, GameProcess
from tests.envs.concurrent_play import assert_played_alike_at_once


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp("alfworld-cache"))


@pytest.fixture(scope="module")
def env(cache):
  env = ALFWorldEnv(split="train", data_dir="generated", cache_dir=cache, admissible=True)
  yield env
  env.close()


@pytest.fixture(scope="module")
def plain(cache):
  """Made through gymnasium, without admissible actions: another game process on the same cache,
  over the first six games only (those the oracle test generates)."""
  env = gymnasium.make("explore_jax/ALFWorld-v0", data_dir="generated", cache_dir=cache,
                       num_games=6, render_mode="ansi").unwrapped
  yield env
  env.close()


def play_oracle(env, **reset):
  observation, info = env.reset(**reset)
  total, done, steps = 0.0, False, 0
  while not done:
    action = env.oracle_action()
    if "admissible_actions" in info:
      assert action in info["admissible_actions"]
    observation, reward, terminated, truncated, info = env.step(action)
    assert info["format_ok"] and info["action"] == action
    total, done, steps = total + reward, terminated or truncated, steps + 1
  return total, terminated, info


@pytest.mark.parametrize("index,task_type", list(enumerate(TASK_TYPES)))
def test_the_oracle_wins_every_task_type(env, index, task_type):
  total, terminated, info = play_oracle(env, options={"task_index": index})  # types take turns
  assert terminated and info["success"] and total == 1.0
  assert info["task_type"] == task_type and info["task_id"].startswith(f"train/{task_type}-")
  assert info["feedback"] == f"Success: the task was completed in {info['step']} steps."
  room = int(info["task_id"].split("/")[1].rsplit("-", 1)[1])
  assert room in HELD_IN_ROOMS and info["floor_plan"] == f"FloorPlan{room}"
  assert env.observation_space.contains(env.raw_observation())


def test_equal_seeds_give_equal_games_and_observations_in_another_game_process(env, plain):
  assert env.game.pid != plain.game.pid
  for seed, other_seed in [(2, 2), (3553 + 2, 6 + 2)]:  # all play game 2
    observation, info = env.reset(seed=seed)
    other, other_info = plain.reset(seed=other_seed)
    assert other == observation and other_info["task_id"] == info["task_id"]
    assert other_info["state_key"] == info["state_key"]
    for action in info["admissible_actions"][:3] + ["inventory"]:
      stepped = env.step(action)
      assert plain.step(action)[0] == stepped[0]
  assert env.reset(options={"task_index": 4})[1]["task_id"] == env.game_spec(4).relative_path
  with pytest.raises(ValueError, match="task_index"):
    env.reset(options={"task_index": env.num_tasks})


def test_games_do_not_depend_on_the_process_or_its_hash_seed():
  code = ("from explore_jax.envs.alfworld import generate as g; import hashlib; "
          "print(hashlib.sha256(''.join(g.problem_text(g.game_spec(s, t, 3)) "
          "for s in g.SPLITS for t in g.TASK_TYPES).encode()).hexdigest())")
  digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, env=dict(os.environ, PYTHONHASHSEED=h)).stdout
             for h in ("1", "2")}
  assert len(digests) == 1


def test_splits_draw_from_held_in_and_held_out_rooms():
  constants = generate.alfworld_module("alfworld.gen.constants")
  assert set(HELD_IN_ROOMS) == set(constants.TRAIN_SCENE_NUMBERS)
  assert set(HELD_OUT_ROOMS) == set(constants.TEST_SCENE_NUMBERS)
  assert not set(HELD_IN_ROOMS) & set(HELD_OUT_ROOMS) and len(HELD_IN_ROOMS + HELD_OUT_ROOMS) == 120
  seen = {}
  for split in SPLITS:
    rooms = set(HELD_OUT_ROOMS if split == "valid_unseen" else HELD_IN_ROOMS)
    for task_type in TASK_TYPES:
      assert generate.host_rooms(split, task_type)
      for j in range(20):
        spec = generate.game_spec(split, task_type, j)
        assert spec.room in rooms and spec.split == split and spec.task_type == task_type
        seen[spec.relative_path.split("/", 1)[1]] = split
  assert len(seen) == 3 * 6 * 20  # no game of one split is another's (train and valid_seen too)
  env = ALFWorldEnv(split="valid_unseen", task_types=[2, "pick_and_place_simple"],
                    data_dir="generated")
  try:
    assert env.task_types == ("pick_and_place_simple", "look_at_obj_in_light")
    assert env.num_tasks == 134
    specs = [env.game_spec(i) for i in range(40)]
    assert [s.task_type for s in specs[:4]] == ["pick_and_place_simple", "look_at_obj_in_light"] * 2
    assert all(s.room in HELD_OUT_ROOMS for s in specs)
    # The same games without an environment (launch/alfworld_targets.py reads configs this way).
    assert specs == [generated_game("valid_unseen", [2, "pick_and_place_simple"], i) for i in range(40)]
  finally:
    env.close()


def test_max_receptacles_draws_games_from_the_smaller_rooms_only_and_they_play(cache):
  for split in SPLITS:
    small = generate.host_rooms(split, "pick_and_place_simple", 10)
    assert small and set(small) < set(generate.host_rooms(split, "pick_and_place_simple"))
    assert all(len(generate.load_room(n).receptacles) <= 10 for n in small)
    assert {generate.game_spec(split, "pick_and_place_simple", j, 10).room for j in range(40)} <= set(small)
  # No limit is the default world, game for game.
  assert generate.game_spec("train", "look_at_obj_in_light", 3, None) == generate.game_spec(
      "train", "look_at_obj_in_light", 3)
  env = ALFWorldEnv(split="valid_unseen", task_types=["pick_and_place_simple"], data_dir="generated",
                    cache_dir=cache, max_receptacles=10, oracle="search", max_steps=30)
  try:
    observation, info = env.reset(seed=2)
    assert int(info["floor_plan"].removeprefix("FloorPlan")) in generate.host_rooms("valid_unseen",
                                                                                    "pick_and_place_simple", 10)
    assert len(env.receptacles) <= 10
    total, terminated, info = play_oracle(env, seed=2)
    assert terminated and total > 0 and info["success"]
  finally:
    env.close()
  with pytest.raises(ValueError, match="max_receptacles must be a positive int"):
    generate.host_rooms("train", "pick_and_place_simple", 0)
  # The environment takes 0 for no limit (a command-line flag cannot write None): the same games as None.
  every = [ALFWorldEnv(split="train", data_dir="generated", cache_dir=cache, max_receptacles=limit)
           for limit in (0, None)]
  try:
    assert every[0].max_receptacles is None
    assert [every[0].game_spec(i) for i in range(12)] == [every[1].game_spec(i) for i in range(12)]
    assert [every[0].game_spec(i) for i in range(12)] == [generated_game("train", None, i, 0) for i in range(12)]
  finally:
    for e in every:
      e.close()
  with pytest.raises(ValueError, match="max_receptacles must be a positive int"):
    ALFWorldEnv(split="train", data_dir="generated", cache_dir=cache, max_receptacles=False)
  with pytest.raises(ValueError, match="max_receptacles must be a positive int"):
    generated_game("train", None, 0, False)
  with pytest.raises(ValueError, match="no train room with at most 1 receptacles can host"):
    ALFWorldEnv(split="train", data_dir="generated", cache_dir=cache, max_receptacles=1)


def test_generated_games_follow_the_rooms_metadata_and_the_plausibility_rules():
  tables = generate._tables()
  kinds = {"pick_heat_then_place_in_recep": {"Kitchen"},
           "pick_cool_then_place_in_recep": {"Kitchen"},
           "pick_clean_then_place_in_recep": {"Kitchen", "Bathroom"},
           "look_at_obj_in_light": {"LivingRoom", "Bedroom"}}
  appliance = {"pick_heat_then_place_in_recep": "Microwave",
               "pick_cool_then_place_in_recep": "Fridge",
               "pick_clean_then_place_in_recep": "SinkBasin"}
  for task_type in TASK_TYPES:
    for j in range(15):
      spec = generate.game_spec("train", task_type, j)
      room = generate.load_room(spec.room)
      assert room.kind in kinds.get(task_type, {room.kind})
      rtype = dict(spec.receptacles)
      assert set(rtype) == {rid for rid, _ in room.receptacles}
      assert spec.object_target in room.object_types
      targets = [o for o in spec.objects if o[1] == spec.object_target]
      assert len(targets) >= (2 if task_type == "pick_two_obj_and_place" else 1)
      for oid, otype, rid in spec.objects:
        assert otype in room.object_types  # only what the FloorPlan has
        if otype in generate.LAMPS:
          assert rtype[rid] in generate._LAMP_STANDS + generate._FLOOR_LAMP_FALLBACK
        else:
          assert otype in tables["holds"][rtype[rid]]  # a receptacle that may hold it
      for _, _, rid in targets:
        assert rtype[rid] not in (spec.parent_target, appliance.get(task_type))
      if task_type in appliance:
        assert appliance[task_type] in rtype.values() and spec.parent_target != appliance[task_type]
      if task_type == "look_at_obj_in_light":
        assert spec.toggle_target in generate.LAMPS and not spec.parent_target
        assert any(o[1] == spec.toggle_target for o in spec.objects)
      else:
        assert spec.object_target in tables["holds"][spec.parent_target]
  problem = generate.problem_text(generate.game_spec("train", "pick_cool_then_place_in_recep", 0))
  assert "(openable Fridge_bar_" in problem and "(isCool ?o)" in problem
  assert not generate.can_host(301, "pick_heat_then_place_in_recep")  # a bedroom has no microwave
  with pytest.raises(generate.GenerationError, match="cannot host"):
    generate.sample_game(401, "look_at_obj_in_light", 0)


MALFORMED = [("", "empty"), ("   \n\t", "empty"), ("go to fridge 1\nopen fridge 1", "2 lines"),
             ("x" * 300, "too long"), ("take café", "printable ASCII"),
             ("ключ 🗝️", "printable ASCII"), (None, "must be text"), (7, "must be text")]


@pytest.mark.parametrize("response,error", MALFORMED, ids=lambda r: repr(r)[:20])
def test_a_malformed_response_is_an_invalid_action_that_changes_nothing(env, response, error):
  _, before = env.reset(seed=0)
  raw = env.raw_observation()
  observation, reward, terminated, truncated, info = env.step(response)
  assert (reward, terminated, truncated) == (0.0, False, False)
  assert not info["format_ok"] and info["format_reward"] == 0.0 and info["action"] is None
  assert observation.startswith("Invalid action: ") and error in observation
  assert observation.endswith(raw) and env.response_format in observation
  assert info["state_key"] == before["state_key"] and info["step"] == 1
  assert env.observation_space.contains(observation)


def test_a_well_formed_inadmissible_action_reaches_the_game_and_nothing_happens(env):
  _, before = env.reset(seed=0)
  raw = env.raw_observation()
  observation, reward, terminated, truncated, info = env.step("Fly  to the MOON")
  assert observation == f"Nothing happens.\n{raw}"
  assert info["format_ok"] and info["format_reward"] == 1.0 and info["action"] == "fly to the moon"
  assert (reward, terminated, truncated) == (0.0, False, False)
  assert info["state_key"] == before["state_key"] and env.history == []
  target = env.receptacles[0]
  observation, *_ = env.step(f"  GO TO   {target.upper()} ")  # case and spaces are forgiven
  assert observation.startswith(f"You arrive at {target}.") and env.history == [f"go to {target}"]


def test_admissible_actions_only_when_asked(env, plain):
  _, info = env.reset(seed=1)
  assert info["admissible_actions"] == sorted(info["admissible_actions"])
  assert "inventory" in info["admissible_actions"]
  assert all(f"go to {r}" in info["admissible_actions"] for r in env.receptacles)
  _, info = plain.reset(seed=1)
  assert "admissible_actions" not in info and plain.admissible_actions() is None
  _, _, _, _, info = plain.step("look")
  assert "admissible_actions" not in info


def test_listed_actions_end_the_raw_observation_and_imply_admissible(cache):
  env = ALFWorldEnv(split="train", data_dir="generated", cache_dir=cache, num_games=6, list_actions=True)
  try:
    observation, info = env.reset(seed=1)
    assert env.admissible and observation.endswith(f"\nActions: {', '.join(info['admissible_actions'])}.")
    observation, _, _, _, info = env.step(env.oracle_action())
    assert observation.endswith(f"\nActions: {', '.join(info['admissible_actions'])}.")
    assert info["state_key"] == state_key(env.raw_observation())
  finally:
    env.close()


def test_equal_states_have_equal_keys(env):
  observation, start = env.reset(seed=5)
  assert observation.splitlines()[2] == "You are in the middle of the room."
  assert start["state_key"] == state_key(observation)
  first, second = env.receptacles[:2]
  there = env.step(f"go to {first}")[4]["state_key"]
  elsewhere = env.step(f"go to {second}")[4]["state_key"]
  observation, _, _, _, back = env.step(f"go to {first}")
  assert back["state_key"] == there != elsewhere and there != start["state_key"]
  assert observation.startswith(f"You arrive at {first}.")
  assert observation.splitlines()[-2].startswith(f"You are at {first}.")
  for action in ("look", "inventory", f"examine {first}", "help"):
    assert env.step(action)[4]["state_key"] == there  # answers only: the state is the same
  assert env.history == [f"go to {first}", f"go to {second}", f"go to {first}"]


def test_the_oracle_follows_only_the_walkthrough_and_running_out_of_steps_explains_it(env, cache):
  env.reset(seed=2)
  gold = env.oracle_action()
  env.step("look")  # changes nothing: still on the walkthrough
  env.step("take the moon")  # nothing happens: still on it
  assert env.oracle_action() == gold
  env.step(gold)
  wrong = next(f"go to {r}" for r in env.receptacles
               if f"go to {r}" != env.oracle_action() and r != env.view["location"])
  env.step(wrong)
  with pytest.raises(RuntimeError, match="left the walkthrough"):
    env.oracle_action()
  short = ALFWorldEnv(split="train", data_dir="generated", cache_dir=cache, max_steps=2)
  try:
    short.reset(seed=2)
    short.step("look")
    _, reward, terminated, truncated, info = short.step("look")
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, True, False)
    assert info["feedback"].startswith("Failure: out of steps with the task unfinished")
  finally:
    short.close()


def test_parallel_copies_start_identical_and_stay_identical_under_equal_actions(cache):
  env = ParallelCopies("explore_jax/ALFWorld-v0", num_copies=2,
                       env_kwargs=dict(data_dir="generated", cache_dir=cache, admissible=True))
  try:
    _, info = env.reset(seed=0)
    assert len(set(info["copy_state_keys"])) == 1
    assert info["copy_admissible_actions"][0] == info["copy_admissible_actions"][1]
    action = f"go to {env.copies[0].receptacles[-1]}"
    _, _, _, _, info = env.step(f"<parallel><env_1>{action}</env_1><env_2>{action}</env_2>"
                                "</parallel>")
    assert info["acted"] == [0, 1] and len(set(info["copy_state_keys"])) == 1
    assert all(d.success for d in oracle_demonstrations(env, [0, 1]))
    processes = [copy.game.process for copy in env.copies]
    assert len({p.pid for p in processes}) == 2
    assert env.metadata["concurrent_instances"]  # an actor may step several such envs at once
  finally:
    env.close()
  assert all(process.poll() is not None for process in processes)  # closing stops them


def test_instances_stepped_from_threads_at_once_play_as_one_after_another(env, cache):
  assert gymnasium.make("explore_jax/ALFWorld-v0", data_dir="generated", cache_dir=cache,
                        num_games=6).metadata["concurrent_instances"]  # seen through gymnasium's wrappers too
  envs = [env] + [ALFWorldEnv(split="train", data_dir="generated", cache_dir=cache, admissible=True,
                              num_games=6) for _ in range(2)]
  try:
    trails = assert_played_alike_at_once(envs, [{"options": {"task_index": i + 3}} for i in range(3)],
                                         lambda e, info: e.oracle_action())
    assert all(trail[-1][1] == 1.0 for trail in trails)
  finally:
    for other in envs[1:]:
      other.close()


def test_sft_demonstrations_played_on_several_instances_at_once_are_those_of_one(cache, monkeypatch):
  """ALFWorld declares a seeded oracle: the warm start's demonstrations are played on 3 instances at once (3
  game processes, one thread each), and are exactly those one instance plays seed after seed, in seed order."""
  from explore_jax.methods.base import ObservationPrompt
  from explore_jax.train import sft_data

  made = []
  make = gymnasium.make
  monkeypatch.setattr(sft_data.gymnasium, "make", lambda *a, **k: made.append(a) or make(*a, **k))
  kwargs = {"data_dir": "generated", "cache_dir": cache, "num_games": 6}
  hook, seeds = ObservationPrompt(action_history=15), [4, 0, 5, 1, 3, 2]
  at_once = sft_data.oracle_sft_demos("explore_jax/ALFWorld-v0", kwargs, seeds, hook, workers=3)
  assert len(made) == 3
  one = sft_data.oracle_sft_demos("explore_jax/ALFWorld-v0", kwargs, seeds, hook, workers=1)
  assert len(made) == 4 and at_once == one and len({d["messages"][-1]["content"] for d in one}) == len(one)


def _edit_game(folder, **changes):
  with open(folder / "game.tw-pddl", "r+") as f:
    game = json.load(f)
    game.update({k: change(game[k]) for k, change in changes.items()})
    f.seek(0), f.truncate(), json.dump(game, f)


@pytest.fixture(scope="module")
def official(env, tmp_path_factory):
  """ALFWorld's layout, written by the generator: two train games, two valid_unseen games, and what
  ALFWorld's loader skips (an unsolvable game, a "movable" one, a folder without traj_data.json).
  One train game has no walkthrough (the planner makes one), the other's holds commands that change
  nothing, as the official walkthroughs (ALFWorld's handcoded expert's) do."""
  data = tmp_path_factory.mktemp("alfworld-data")
  for split, task_type in [("train", "pick_and_place_simple"), ("train", "pick_two_obj_and_place"),
                           ("valid_unseen", "pick_and_place_simple"),
                           ("valid_unseen", "pick_heat_then_place_in_recep")]:
    spec = generate.game_spec(split, task_type, 0)
    env.game.call("generate", root=str(data), split=split, task_type=task_type, room=spec.room,
                  seed=spec.seed)
  folder = data / "json_2.1.1" / "train"
  game = next(folder.glob("pick_and_place_simple-*/trial_*"))
  for name in ("pick_and_place_simple-Bowl-None-Shelf-9/trial_Unsolvable",
               "pick_and_place_with_movable_recep-Pen-Mug-Desk-310/trial_M",
               "pick_and_place_simple-Pen-None-Desk-311/trial_NoTraj"):
    shutil.copytree(game, folder / name)
  _edit_game(folder / "pick_and_place_simple-Bowl-None-Shelf-9/trial_Unsolvable",
             solvable=lambda _: False)
  os.remove(folder / "pick_and_place_simple-Pen-None-Desk-311/trial_NoTraj/traj_data.json")
  _edit_game(game, walkthrough=lambda _: None)
  _edit_game(next(folder.glob("pick_two_obj_and_place-*/trial_*")),
             walkthrough=lambda w: ["look"] + w[:2] + ["inventory"] + w[2:])
  return data


def test_official_layout_games_are_listed_and_played_through_data_dir(official, monkeypatch):
  monkeypatch.delenv("ALFWORLD_DATA", raising=False)
  env = ALFWorldEnv(split="train", data_dir=str(official), admissible=True)
  try:
    assert not env.generated and env.num_tasks == 2
    assert [t for _, t in env.official_games] == ["pick_and_place_simple", "pick_two_obj_and_place"]
    for index in range(2):
      total, terminated, info = play_oracle(env, options={"task_index": index})
      assert terminated and info["success"] and total == 1.0
      assert info["task_id"] == os.path.relpath(os.path.dirname(env.official_games[index][0]),
                                                official / "json_2.1.1")
    only = ALFWorldEnv(split="train", data_dir=str(official / "json_2.1.1"),
                       task_types=["pick_two_obj_and_place"])
    only.close()
    assert [t for _, t in only.official_games] == ["pick_two_obj_and_place"]
  finally:
    env.close()
  with pytest.raises(ValueError, match="neither"):
    ALFWorldEnv(split="train", data_dir=str(official / "json_2.1.1" / "train" / "nothing"))


def test_official_layout_games_are_played_through_alfworld_data(official, monkeypatch, cache):
  monkeypatch.setenv("ALFWORLD_DATA", str(official))
  env = ALFWorldEnv(split="valid_unseen")
  try:
    assert not env.generated and env.num_tasks == 2
    _, info = env.reset(seed=1)
    assert info["task_id"].startswith("valid_unseen/pick_heat_then_place_in_recep-")
    total, terminated, info = play_oracle(env, seed=1)
    assert terminated and info["success"] and total == 1.0
  finally:
    env.close()
  generated = ALFWorldEnv(split="valid_unseen", data_dir="generated", cache_dir=cache)
  generated.close()
  assert generated.generated and generated.num_tasks == 134
  # What importing alfworld leaves behind (its own default, without games) is not a user's choice.
  monkeypatch.setenv("ALFWORLD_DATA", os.path.expanduser("~/.cache/alfworld"))
  if not os.path.isdir(os.path.expanduser("~/.cache/alfworld/json_2.1.1")):
    defaulted = ALFWorldEnv(split="valid_unseen", cache_dir=cache)
    defaulted.close()
    assert defaulted.generated


def test_concurrent_generation_writes_each_game_once_and_whole(tmp_path):
  command = [sys.executable, "-m", "explore_jax.envs.alfworld.games", "--split", "valid_unseen",
             "--num-games", "2", "--task-types", "pick_and_place_simple", "look_at_obj_in_light",
             "--cache-dir", str(tmp_path)]
  runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for _ in range(3)]
  outputs = [run.communicate(timeout=300) for run in runs]
  assert all(run.returncode == 0 for run in runs), [err[-2000:] for _, err in outputs]
  listed = [sorted(line.split()[1] for line in out.splitlines() if "trial_S" in line)
            for out, _ in outputs]
  assert listed[0] == listed[1] == listed[2] and len(listed[0]) == 2
  root = games.generated_root(str(tmp_path))
  trials = sorted(p for p, _, files in os.walk(root) if "game.tw-pddl" in files)
  assert [os.path.relpath(os.path.join(t, "game.tw-pddl"), root) for t in trials] == listed[0]
  for trial in trials:
    assert sorted(os.listdir(trial)) == ["game.tw-pddl", "initial_state.pddl", "traj_data.json"]
    with open(os.path.join(trial, "game.tw-pddl")) as f:
      game = json.load(f)
    assert game["solvable"] and game["walkthrough"]
  leftovers = [n for _, dirs, files in os.walk(root) for n in dirs + files if n.startswith(".tmp")]
  assert leftovers == []
  # --first: a process can take a range of its own; game 1 of the two types is the second type's first game.
  second = subprocess.run([*command[:command.index("--num-games")], "--first", "1", "--num-games", "1",
                           *command[command.index("--num-games") + 2:]], capture_output=True, text=True, timeout=300)
  assert second.returncode == 0, second.stderr[-2000:]
  assert [line.split()[1] for line in second.stdout.splitlines() if "trial_S" in line] == [
      os.path.join(generate.DATA_FOLDER, generate.game_spec("valid_unseen", "look_at_obj_in_light", 0).relative_path,
                   "game.tw-pddl")]


def test_a_new_game_reset_by_a_group_at_once_is_planned_once(tmp_path):
  """A group's environments reset to the same new game together: one of them plans it, the others wait for
  its copy (without the lock each of them planned it: the fake planner below overlaps them)."""
  spec = generate.game_spec("valid_unseen", "pick_and_place_simple", 0)
  root = games.generated_root(str(tmp_path))

  class SlowPlanner:
    calls = 0

    def walkthrough(self, game):
      assert game == spec
      SlowPlanner.calls += 1
      time.sleep(0.5)
      return ["a plan"]

  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    paths = list(pool.map(lambda _: games.write_game(root, spec, SlowPlanner()), range(4)))
  assert SlowPlanner.calls == 1
  assert len(set(paths)) == 1 and sorted(os.listdir(os.path.dirname(paths[0]))) == [
      "game.tw-pddl", "initial_state.pddl", "traj_data.json"]
  with open(paths[0]) as f:
    assert json.load(f)["walkthrough"] == ["a plan"]
  assert games.write_game(root, spec, SlowPlanner()) == paths[0] and SlowPlanner.calls == 1


def test_a_killed_game_process_fails_the_step_clearly_and_the_next_reset_restarts_it(env):
  first, _ = env.reset(seed=3)
  env.step("look")
  process = env.game.process
  os.kill(process.pid, signal.SIGKILL)
  process.wait(timeout=10)
  with pytest.raises(ALFWorldError, match="game process died"):
    env.step("look")
  starts = env.game.starts
  observation, info = env.reset(seed=3)
  assert observation == first and env.game.starts == starts + 1 and env.game.pid != process.pid
  total, terminated, info = play_oracle(env, seed=3)
  assert terminated and total == 1.0


def test_the_memoized_game_process_answers_as_textworld_does(env):
  env.reset(seed=0)
  with open(env.game_path) as f:
    commands = json.load(f)["walkthrough"]
  commands = ["look", f"examine {env.receptacles[0]}", "inventory", "take the moon", "help",
              *commands]
  exact = GameProcess(memoize=False)
  exact.start()
  try:
    answers = []
    for game in (env.game, exact):
      trace = [game.call("load", path=env.game_path, admissible=True)]
      trace += [game.call("step", command=c) for c in commands]
      trace.append(game.call("load", path=env.game_path, admissible=True))  # a second reset
      answers.append(trace)
    assert answers[0] == answers[1] and answers[0][-2]["won"]
  finally:
    exact.close()


def test_gymnasium_make_and_check_env(plain):
  observation, _ = plain.reset(seed=0)
  assert plain.render() == observation
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # check_env reports problems as warnings
    check_env(plain)


def test_importing_the_envs_package_loads_neither_alfworld_nor_textworld():
  code = ("import os, sys, explore_jax.envs, gymnasium; "
          "assert 'explore_jax/ALFWorld-v0' in gymnasium.registry; "
          "heavy = ['alfworld', 'textworld', 'fast_downward', 'jax']; "
          "print([m for m in heavy if m in sys.modules]); "
          "import explore_jax.envs.alfworld.env, explore_jax.envs.alfworld.generate as g; "
          "g.load_room(1); "
          "print([m for m in ['textworld', 'fast_downward', 'jax'] if m in sys.modules], "
          "'ALFWORLD_DATA' in os.environ)")
  env = {k: v for k, v in os.environ.items() if k != "ALFWORLD_DATA"}
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=env)
  assert result.stdout.split("\n")[:2] == ["[]", "[] False"]
