"""TextWorld-v0: generated games and their cache, walkthroughs, seeds and splits, the grammar,
commands the game answers or that are refused, state keys, parallel copies, a failed game, lazy
imports."""

import filecmp
import json
import os
import subprocess
import sys
import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from explore_jax.envs import ParallelCopies, oracle_demonstrations, state_key
from explore_jax.envs.textworld import TextWorldEnv
from explore_jax.envs.textworld_games import (CHALLENGES, SPLIT_FIRST_SEED, TextWorldError, challenge_settings,
                                              generate_games)

# The games the tests play, generated once into a module cache two at a time:
# (challenge, settings, split, game indices). Harder settings than the defaults get one game each.
GOLD_CASES = [(c, "", (0, 1)) for c in CHALLENGES] + [
    ("tw-simple", "rewards=sparse,goal=brief", (0,)),
    ("tw-cooking", "recipe=2,take=2,go=6,open=1,cook=1,cut=1", (0,)),
    ("tw-coin_collector", "level=110", (0,)),  # distractor rooms beside the chain
    ("tw-treasure_hunter", "level=21", (0,)),  # 20 rooms, locked doors and containers
]
EXTRA_GAMES = [("tw-coin_collector", "", "dev", (0,)), ("tw-coin_collector", "", "test", (0,))]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("cache"))
  jobs = [TextWorldEnv(c, s, split=split, num_games=2, cache_dir=directory).game_job(i)
          for c, s, split, indices in [(c, s, "train", i) for c, s, i in GOLD_CASES] + EXTRA_GAMES
          for i in indices]
  assert generate_games(jobs, workers=2) == [True] * len(jobs)
  return directory


def make(cache, challenge="tw-coin_collector", settings="", **kwargs):
  return TextWorldEnv(challenge, settings, num_games=2, cache_dir=cache, **kwargs)


@pytest.fixture(scope="module")
def coin(cache):
  env = make(cache)
  yield env
  env.close()


@pytest.mark.parametrize("challenge,settings,indices", GOLD_CASES,
                         ids=[f"{c}({s})" for c, s, _ in GOLD_CASES])
def test_the_walkthrough_wins_with_admissible_commands_and_a_return_of_one(
    cache, challenge, settings, indices):
  env = make(cache, challenge, settings, admissible=True)
  try:
    for index in indices:
      observation, info = env.reset(options={"task_index": index})
      walkthrough = list(env._gold)
      total, done = 0.0, False
      while not done:
        action = env.oracle_action()
        assert action in info["admissible_actions"]
        observation, reward, terminated, truncated, info = env.step(action)
        assert info["format_ok"] and info["action"] == action and reward >= 0.0
        assert env.observation_space.contains(observation)
        total += reward
        done = terminated or truncated
      assert terminated and info["success"] and info["score"] == 1.0 and total == pytest.approx(1.0)
      assert env.raw_score == env.max_score and env.history == walkthrough
      assert info["feedback"] == f"Success: the game was won in {info['step']} steps."
      assert "*** The End ***" in observation and "RESTART" not in observation
      assert not any(line.startswith(">") for line in observation.splitlines())
  finally:
    env.close()


def test_equal_seeds_give_equal_games_and_seeds_map_onto_the_split_in_order(cache, coin):
  other = make(cache)
  try:
    starts = {}
    for seed in range(4):
      observation, info = coin.reset(seed=seed)
      assert other.reset(seed=seed) == (observation, info)
      assert info["task_id"] == f"tw-coin_collector(level=5):{seed % 2}"
      for action in [coin.oracle_action(), "look", "xyzzy", "go up", "inventory"]:
        stepped = coin.step(action)
        assert other.step(action) == stepped  # the same commands lead to the same states
      starts[info["task_id"]] = observation
    assert len(set(starts.values())) == 2  # the two games, not just their ids, differ
    assert coin.prepare() == 0  # both games are in the cache already
    assert coin.reset(options={"task_index": 1})[1]["task_id"].endswith(":1")
    with pytest.raises(ValueError, match="task_index"):
      coin.reset(options={"task_index": 2})
  finally:
    other.close()


def test_the_splits_have_disjoint_seeds_and_their_own_games(cache, coin):
  envs = {split: TextWorldEnv("tw-coin_collector", split=split, num_games=10_000, cache_dir=cache)
          for split in ("train", "dev", "test")}
  seeds = {split: set(env.split_games) for split, env in envs.items()}
  assert not (seeds["train"] & seeds["dev"] or seeds["train"] & seeds["test"]
              or seeds["dev"] & seeds["test"])
  observations = {coin.reset(seed=0)[0]}
  for split in ("dev", "test"):
    env = make(cache, split=split)
    observation, info = env.reset(seed=0)
    assert info["task_id"] == f"tw-coin_collector(level=5):{SPLIT_FIRST_SEED[split]}"
    assert env.game_dir(0) != coin.game_dir(0) and env.oracle_action()
    observations.add(observation)
    env.close()
  assert len(observations) == 3
  # Cooking's own held-out foods follow the split: its dev games have a cache folder of their own.
  cooking = {s: TextWorldEnv("tw-cooking", split=s, cache_dir=cache) for s in ("train", "dev")}
  assert cooking["dev"].made_settings["split"] == "valid"
  assert cooking["train"].games_dir != cooking["dev"].games_dir
  for bad in (0, 10_001, 2.0, True):
    with pytest.raises(ValueError, match="num_games"):
      TextWorldEnv("tw-coin_collector", num_games=bad, cache_dir=cache)


def test_settings_are_checked_and_named_in_errors(cache):
  assert challenge_settings("tw-cooking", "recipe=2, take=0,cut=true") == dict(
      recipe=2, take=0, go=1, open=False, cook=False, cut=True, drop=False)
  assert challenge_settings("tw-coin_collector", {"level": "7"}) == {"level": 7}
  env = TextWorldEnv("tw-simple", {"goal": "brief"}, cache_dir=cache)
  assert env.settings == {"rewards": "dense", "goal": "brief"}
  assert not os.path.exists(env.games_dir)  # making an environment generates nothing by itself
  for challenge, settings, name in [
      ("tw-coin_collector", "bogus=3", "bogus"), ("tw-coin_collector", "level=0", "level"),
      ("tw-coin_collector", "level=151", "level 151 makes 102 rooms"),
      ("tw-treasure_hunter", {"level": 31}, "level"), ("tw-simple", "rewards=often", "rewards"),
      ("tw-simple", {"goal": 3}, "goal"), ("tw-cooking", "recipe=2,take=3", "take"),
      ("tw-cooking", "go=2", "go"), ("tw-cooking", "open=maybe", "open"),
      ("tw-cooking", "recipe=six", "recipe"), ("tw-cooking", "level=3", "'level'"),
      ("tw-cooking", "recipe", "name=value"), ("tw-chess", "", "challenge"),
      ("tw-cooking", ["recipe"], "settings")]:
    with pytest.raises(ValueError, match=name):
      TextWorldEnv(challenge, settings, cache_dir=cache)
  with pytest.raises(ValueError, match="split"):
    TextWorldEnv(split="validation", cache_dir=cache)


def test_the_observation_is_objective_room_inventory_and_score(coin):
  observation, info = coin.reset(seed=0)
  objective, room, rest = observation.split("\n\n", 2)
  assert objective == "Objective: " + coin._game_meta(0)["objective"]
  assert room.startswith("-= ") and rest.endswith("You are carrying nothing.\nScore: 0 of 1.")
  assert info["state_key"] == state_key(observation) and observation == coin.raw_observation()
  assert info["score"] == 0.0 and info["step"] == 0 and info["feedback"] == ""
  assert "admissible_actions" not in info and coin.admissible_actions() is None


def test_returning_to_a_state_repeats_its_state_key(coin):
  start, first = coin.reset(seed=1)
  going = coin.oracle_action()  # coin collector's walkthroughs start with a move
  back = {"north": "south", "south": "north", "east": "west", "west": "east"}[going.split()[1]]
  moved, _, _, _, info = coin.step(going)
  assert info["state_key"] != first["state_key"] and moved == coin.raw_observation()
  returned, _, _, _, info = coin.step(back)
  assert returned == start and info["state_key"] == first["state_key"]
  # "look" answers with the room description, already in the raw observation: nothing is added.
  looked, _, _, _, info = coin.step("look")
  assert looked == start and info["state_key"] == first["state_key"]
  shown, _, _, _, info = coin.step("inventory")
  assert shown == f"You are carrying nothing.\n{start}" and info["state_key"] == first["state_key"]


MALFORMED = {
    "": "The response is empty.",
    "   \n\t": "The response is empty.",
    "go east\ngo west": "The response has 2 lines",
    "x" * 300: "too long",
    "ключ 🗝️": "outside printable ASCII",
    "\x00": "outside printable ASCII",
    None: "must be text, got NoneType",
    7: "must be text, got int",
    "go east. take coin": 'chains commands with "." or "then"',
    "go east then go west": 'chains commands with "." or "then"',
}


@pytest.mark.parametrize("response,error", MALFORMED.items(), ids=lambda r: repr(r)[:20])
def test_a_malformed_response_is_an_invalid_action_that_changes_nothing(coin, response, error):
  _, before = coin.reset(seed=0)
  raw, moves = coin.raw_observation(), coin.moves
  observation, reward, terminated, truncated, info = coin.step(response)
  assert (reward, terminated, truncated) == (0.0, False, False)
  assert not info["format_ok"] and info["format_reward"] == 0.0 and info["action"] is None
  first_line = observation.splitlines()[0]
  assert first_line.startswith("Invalid action: ") and error in first_line
  assert coin.response_format in observation and observation.endswith(raw)
  assert coin.observation_space.contains(observation)
  assert info["state_key"] == before["state_key"] and info["step"] == 1
  assert coin.history == [] and coin.moves == moves


def test_the_grammar_forgives_whitespace_and_case_only(coin):
  assert coin.parse_action("  Go   WEST \n\n") == ("go west", "")
  assert coin.parse_action("\nTake the Coin\n") == ("take the coin", "")
  assert coin.parse_action("go west.")[0] is None
  assert coin.parse_action("go to the theater")[0] == "go to the theater"  # "then" only as a word


def test_commands_go_to_the_game_which_answers_and_inputs_it_ignores_change_nothing(coin):
  _, before = coin.reset(seed=0)
  raw = coin.raw_observation()
  observation, reward, terminated, truncated, info = coin.step("Xyzzy")
  assert observation == f"That's not a verb I recognise.\n{raw}"
  assert info["format_ok"] and info["format_reward"] == 1.0 and info["action"] == "xyzzy"
  assert (reward, terminated, truncated) == (0.0, False, False)
  assert info["state_key"] == before["state_key"] and coin.history == [] and coin.moves == 0
  assert coin.oracle_action() == coin._gold[0]  # an input the game ignored keeps the walkthrough
  observation, _, _, _, info = coin.step("go up")  # understood: a turn taken, nothing changed
  assert observation == f"You can't go that way.\n{raw}" and coin.history == ["go up"]
  with pytest.raises(RuntimeError, match="left the walkthrough"):
    coin.oracle_action()


OUT_OF_GAME = ["restart", "quit", "save", "restore", "undo", "again", "verbose", "script on",
               "tw-print max_score", "tw-extra-infos description"]


def test_out_of_game_commands_are_refused_and_the_game_plays_on(coin):
  _, before = coin.reset(seed=0)
  raw = coin.raw_observation()
  for command in OUT_OF_GAME:
    observation, reward, terminated, truncated, info = coin.step(command)
    assert observation == (f'"{command}" is not passed to the game: out-of-game commands '
                           f"(restart, save, undo, ...) are not available.\n{raw}")
    assert info["format_ok"] and info["action"] == command and reward == 0.0
    assert not (terminated or truncated) and info["state_key"] == before["state_key"]
  assert coin.history == [] and coin.moves == 0
  done = False
  while not done:  # the walkthrough still wins: the game never saw those commands
    _, _, terminated, truncated, info = coin.step(coin.oracle_action())
    done = terminated or truncated
  assert info["success"] and info["step"] == len(OUT_OF_GAME) + len(coin._gold)


def test_admissible_commands_only_when_asked(cache):
  env = make(cache, admissible=True)
  try:
    _, info = env.reset(seed=0)
    first = info["admissible_actions"]
    assert first == sorted(first) and env.oracle_action() in first and "look" in first
    _, _, _, _, info = env.step(env.oracle_action())
    assert info["admissible_actions"] != first and env.oracle_action() in info["admissible_actions"]
  finally:
    env.close()


def test_listed_actions_end_the_raw_observation_and_imply_admissible(cache):
  env = make(cache, list_actions=True)
  try:
    observation, info = env.reset(seed=0)
    assert env.admissible and observation.endswith(f"\nActions: {', '.join(info['admissible_actions'])}.")
    assert env.oracle_action() in info["admissible_actions"]
    observation, _, _, _, info = env.step(env.oracle_action())
    assert observation.endswith(f"\nActions: {', '.join(info['admissible_actions'])}.")
    assert info["state_key"] == state_key(env.raw_observation())
  finally:
    env.close()


def test_a_lost_game_terminates_without_success_and_running_out_of_steps_truncates(cache):
  env = make(cache, "tw-simple")
  try:
    env.reset(seed=0)
    food = None
    while food is None:  # up to taking the food the objective names
      action = env.oracle_action()
      env.step(action)
      if action.startswith("take ") and "key" not in action:
        food = action[len("take "):].split(" from ")[0]
    observation, reward, terminated, truncated, info = env.step(f"eat {food}")
    assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)
    assert "*** You lost! ***" in observation and info["score"] < 1.0
    assert info["feedback"].startswith(f"Failure: the game was lost after {info['step']} steps.")
  finally:
    env.close()
  short = make(cache, max_steps=2)
  try:
    short.reset(seed=0)
    short.step("look")
    _, _, terminated, truncated, info = short.step("look")
    assert (terminated, truncated, info["success"]) == (False, True, False)
    assert info["feedback"] == "Failure: out of steps with the game unfinished (score 0 of 1)."
  finally:
    short.close()


def test_parallel_copies_start_identical_and_equal_actions_keep_them_equal(cache):
  kwargs = dict(challenge="tw-coin_collector", num_games=2, cache_dir=cache)
  env = ParallelCopies("explore_jax/TextWorld-v0", num_copies=2, env_kwargs=kwargs)
  try:
    _, info = env.reset(seed=1)
    assert len(set(info["copy_state_keys"])) == 1 and info["task_id"].endswith(":1")
    assert "copy_admissible_actions" not in info
    action = env.copies[0].oracle_action()
    _, _, _, _, info = env.step(f"<parallel><env_1>{action}</env_1><env_2>{action}</env_2>"
                                "</parallel>")
    assert info["acted"] == [0, 1] and len(set(info["copy_state_keys"])) == 1
    _, _, _, _, info = env.step("<parallel><env_2>xyzzy</env_2></parallel>")
    assert info["acted"] == [1] and len(set(info["copy_state_keys"])) == 1
    assert all(d.success for d in oracle_demonstrations(env, [0, 1]))
  finally:
    env.close()
  listed = ParallelCopies("explore_jax/TextWorld-v0", num_copies=2,
                          env_kwargs=dict(kwargs, admissible=True))
  try:
    _, info = listed.reset(seed=0)
    first, second = info["copy_admissible_actions"]
    assert first == second and listed.copies[0].oracle_action() in first
  finally:
    listed.close()


def test_a_failed_game_fails_the_step_clearly_and_the_next_reset_loads_it_again(coin):
  first, _ = coin.reset(seed=1)
  coin.step(coin.oracle_action())
  coin._game.close()  # the interpreter gone under the environment
  with pytest.raises(TextWorldError, match="failed during step"):
    coin.step("look")
  with pytest.raises(TextWorldError, match="no game is running"):
    coin.step("look")
  observation, info = coin.reset(seed=1)
  assert observation == first and info["task_id"].endswith(":1")
  assert oracle_demonstrations(coin, [1])[0].success


def test_gymnasium_make_and_check_env(cache):
  env = gymnasium.make("explore_jax/TextWorld-v0", challenge="tw-coin_collector", num_games=2,
                       cache_dir=cache, render_mode="ansi")
  try:
    observation, _ = env.reset(seed=0)
    assert env.render() == observation
    with warnings.catch_warnings():
      warnings.simplefilter("error")  # check_env reports problems as warnings
      check_env(env.unwrapped)
  finally:
    env.close()


_CHILD = """
import json, sys
from explore_jax.envs.textworld import TextWorldEnv
from explore_jax.envs.textworld_games import generate_games
env = TextWorldEnv("tw-coin_collector", num_games=2, cache_dir=sys.argv[1])
[won] = generate_games([env.game_job(0)])  # generates even where the game exists
observations = [env.reset(seed=0)[0]]
while not env._ended:
  observations.append(env.step(env.oracle_action())[0])
print(json.dumps([won, observations]))
"""


def test_processes_generating_one_game_at_once_leave_one_copy_identical_to_any_other(cache, coin,
                                                                                    tmp_path):
  fresh = str(tmp_path / "fresh")
  children = [subprocess.Popen([sys.executable, "-c", _CHILD, fresh], stdout=subprocess.PIPE,
                               text=True, env=dict(os.environ, PYTHONHASHSEED=str(seed)))
              for seed in (1, 2)]
  results = [json.loads(child.communicate(timeout=240)[0]) for child in children]
  assert all(child.returncode == 0 for child in children)
  assert sorted(won for won, _ in results) == [False, True]  # one rename won, the other gave way
  games = os.path.dirname(coin.game_dir(0).replace(cache, fresh))
  assert os.listdir(games) == ["0"]  # no temporary folder left behind
  for name in ("game.z8", "game.json"):  # byte-identical to this process's generation
    assert filecmp.cmp(os.path.join(games, "0", name), os.path.join(coin.game_dir(0), name),
                       shallow=False)
  observations = [coin.reset(seed=0)[0]]
  while not coin._ended:
    observations.append(coin.step(coin.oracle_action())[0])
  assert results[0][1] == results[1][1] == observations  # the same play in every process


def test_importing_the_envs_package_loads_no_textworld_and_no_jax():
  heavy = ["jax", "textworld", "jericho", "explore_jax.envs.textworld"]
  code = ("import sys, explore_jax.envs, gymnasium; "
          "assert 'explore_jax/TextWorld-v0' in gymnasium.registry; "
          f"print([m for m in {heavy!r} if m in sys.modules])")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert result.stdout.strip() == "[]"
