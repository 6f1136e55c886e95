"""KeyDoor: determinism, the oracle against a random policy, the grammar, gymnasium registration."""

import functools
import pathlib
import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from explore_jax.envs import KEYDOOR_ACTIONS, KeyDoorEnv, oracle_demonstrations, state_key

SEEDS = range(50)
TINY_TOKENIZER = pathlib.Path(__file__).parents[2] / "explore_jax/hf/assets/tiny/tokenizer.json"


def _random_episode(env, seed, rng):
  _, info = env.reset(seed=seed)
  while True:
    _, _, terminated, truncated, info = env.step(str(rng.choice(info["admissible_actions"])))
    if terminated or truncated:
      return info["success"]


def test_equal_seeds_give_equal_episodes_and_different_seeds_mostly_differ():
  first, second = KeyDoorEnv(), KeyDoorEnv()
  starts = []
  for seed in SEEDS:
    a, b = first.reset(seed=seed), second.reset(seed=seed)
    assert a == b
    starts.append((first.task_id, first.room, first.key_room, first.door_room))
    assert [first.step(first.oracle_action()) for _ in range(3)] == [
        second.step(second.oracle_action()) for _ in range(3)]
  assert len(set(starts)) >= 40  # layouts, not just task ids, vary with the seed


def test_a_task_id_fixes_the_layout_whatever_the_seed():
  env = KeyDoorEnv()
  observation, info = env.reset(seed=1, options={"task_id": 77})
  assert info["task_id"] == 77
  assert env.reset(seed=2, options={"task_id": np.int64(77)}) == (observation, info)
  with pytest.raises(ValueError, match="task_id"):
    env.reset(options={"task_id": "77"})


@pytest.mark.parametrize(
    "kwargs", [dict(), dict(num_rooms=6, num_distractors=4), dict(hints=False)])
def test_the_oracle_always_succeeds_within_the_step_limit(kwargs):
  env = KeyDoorEnv(**kwargs)
  demos = oracle_demonstrations(env, SEEDS)
  assert all(d.success for d in demos)
  assert max(len(d.actions) for d in demos) <= env.max_steps - 2
  assert all(len(d.observations) == len(d.actions) for d in demos)
  assert all(a in KEYDOOR_ACTIONS for d in demos for a in d.actions)


@pytest.mark.parametrize("kwargs", [dict(num_rooms=5, num_distractors=1, max_steps=12), dict(),
                                    dict(num_rooms=6, num_distractors=4), dict(num_rooms=2)])
def test_the_search_oracle_wins_every_game_without_hints_within_its_worst_case(kwargs):
  env = KeyDoorEnv(hints=False, oracle="search", **kwargs)
  demos = oracle_demonstrations(env, range(500))
  assert all(d.success for d in demos)
  n = env.num_rooms
  worst = 2 * n + (n - 1) // 2  # to the nearer end, to the other, back to the door, take and open
  assert max(len(d.actions) for d in demos) == worst <= env.max_steps
  # It searches: longer on average than the planner, which walks straight to the key.
  planner = oracle_demonstrations(KeyDoorEnv(hints=False, **kwargs), range(500))
  assert np.mean([len(d.actions) for d in demos]) >= np.mean([len(d.actions) for d in planner])


def test_the_search_oracle_sees_only_the_observations_and_the_planner_does_not():
  # Two layouts that have shown the same observations so far get the same search action; the planner,
  # which sees the layout, answers differently after the same observations (its first move goes to the key).
  def chosen(oracle):
    env, by_history, differ = KeyDoorEnv(num_rooms=5, num_distractors=1, hints=False, oracle=oracle), {}, 0
    for demo in oracle_demonstrations(env, range(300)):
      for t, action in enumerate(demo.actions):
        seen = tuple(demo.observations[:t + 1])
        differ += by_history.setdefault(seen, action) != action
    return differ

  assert chosen("search") == 0
  assert chosen("planner") > 0


def test_the_search_oracle_takes_up_from_where_another_policy_left_it():
  # Parallel copies (envs/parallel.py) let a copy explore, then follow its own oracle again.
  env = KeyDoorEnv(num_rooms=5, num_distractors=1, hints=False, max_steps=30, oracle="search")
  rng = np.random.default_rng(0)
  for seed in range(100):
    _, info = env.reset(seed=seed)
    for _ in range(3):
      _, _, terminated, _, info = env.step(str(rng.choice(info["admissible_actions"])))
    while not terminated:
      _, _, terminated, truncated, info = env.step(env.oracle_action())
      assert not truncated
    assert info["success"]


def test_an_unknown_oracle_is_refused_by_name():
  with pytest.raises(ValueError, match="oracle"):
    KeyDoorEnv(oracle="gold")


def test_a_random_admissible_policy_succeeds_far_less_often_than_the_oracle():
  # Measured over 2000 seeds: 15% (4 rooms, 2 distractors, 10 steps); the oracle: 100%.
  env = KeyDoorEnv()
  rng = np.random.default_rng(0)
  rate = np.mean([_random_episode(env, seed, rng) for seed in range(300)])
  assert 0.05 < rate < 0.3


def test_with_hints_the_oracle_action_is_a_function_of_the_observation():
  env = KeyDoorEnv(num_rooms=5, num_distractors=3)
  chosen = {}
  for demo in oracle_demonstrations(env, range(200)):
    for observation, action in zip(demo.observations, demo.actions):
      assert chosen.setdefault(observation, action) == action


def test_observations_are_short_for_the_tiny_tokenizer_and_list_the_admissible_actions():
  env = KeyDoorEnv()
  observation, info = env.reset(seed=3, options={"task_id": 5})
  assert observation.splitlines()[1] == f"Actions: {', '.join(info['admissible_actions'])}."
  assert info["state_key"] == state_key(observation)
  tokenizer = Tokenizer.from_file(str(TINY_TOKENIZER))
  lengths = [len(tokenizer.encode(o).ids)
             for d in oracle_demonstrations(env, SEEDS) for o in d.observations]
  # Measured over 5000 seeds: mean 41, longest 60 tokens (key, door, both distractors in a room).
  assert np.mean(lengths) < 46 and max(lengths) <= 60


def test_inadmissible_but_well_formed_actions_cost_the_step_and_say_why():
  env = KeyDoorEnv()
  env.reset(options={"task_id": 5})
  while env.room > 0:
    env.step("go left")
  raw = env.raw_observation()
  observation, reward, _, _, info = env.step("go left")
  assert observation == f"You cannot go left from room 1.\n{raw}"
  assert info["format_ok"] and info["format_reward"] == 1.0 and reward == 0.0
  assert info["state_key"] == state_key(raw)


def test_a_locked_door_stays_shut_until_the_key_is_held():
  env = KeyDoorEnv()
  env.reset(options={"task_id": 11})
  while env.room != env.door_room:
    env.step("go left" if env.door_room < env.room else "go right")
  observation, reward, terminated, _, info = env.step("open door")
  assert observation.startswith("The door is locked. You need the key.")
  assert (reward, terminated, info["success"]) == (0.0, False, False)


def test_running_out_of_steps_explains_the_failure():
  env = KeyDoorEnv(max_steps=2)
  env.reset(options={"task_id": 3})
  env.step("take ring")
  _, _, terminated, truncated, info = env.step("take ring")
  assert (terminated, truncated, info["success"]) == (False, True, False)
  assert info["feedback"] == (
      f"Failure: out of steps before taking the key; it was in room {env.key_room + 1}.")


def test_the_grammar_forgives_whitespace_and_case_only():
  env = KeyDoorEnv()
  assert env.parse_action("  Go   LEFT \n") == ("go left", "")
  for text in ["go left.", "Action: go left", "go", "take sword", "goleft"]:
    action, error = env.parse_action(text)
    assert action is None and error.startswith("Unknown action")


MALFORMED = ["", "   \n\t", "asdf qwer", "x" * 200_000, "ключ 🗝️ открой", "open the door",
             "take key please", "go up", None, "None", "\x00"]


@pytest.mark.parametrize("response", MALFORMED, ids=lambda r: repr(r)[:20])
def test_a_malformed_response_is_an_invalid_action_that_changes_nothing(response):
  env = KeyDoorEnv()
  env.reset(seed=4)
  state = (env.room, env.key_room, env.door_room, [list(i) for i in env.items], list(env.held))
  raw = env.raw_observation()
  observation, reward, terminated, truncated, info = env.step(response)
  assert (reward, terminated, truncated) == (0.0, False, False)
  assert not info["format_ok"] and info["format_reward"] == 0.0
  assert (env.room, env.key_room, env.door_room, env.items, env.held) == state
  assert observation.startswith("Invalid action: ") and observation.endswith(raw)
  assert env.response_format in observation and len(observation) < 400
  assert env.observation_space.contains(observation)
  assert info["state_key"] == state_key(raw) and info["step"] == 1


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80) | st.sampled_from(KEYDOOR_ACTIONS).map(lambda a: f" {a.upper()} "))
def test_any_text_steps_without_raising_and_keeps_the_observation_in_its_space(text):
  env = KeyDoorEnv()
  env.reset(seed=0)
  observation, reward, _, _, info = env.step(text)
  assert env.observation_space.contains(observation)
  assert info["format_reward"] == float(info["format_ok"])
  assert reward in (0.0, 1.0)


def test_gymnasium_make_and_check_env_accept_the_text_spaces():
  env = gymnasium.make("explore_jax/KeyDoor-v0", num_rooms=3, render_mode="ansi")
  observation, _ = env.reset(seed=0)
  assert env.render() == observation
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # check_env reports problems as warnings
    check_env(env.unwrapped)
  assert gymnasium.make("explore_jax.envs:explore_jax/KeyDoor-v0").reset(seed=0)[0] == (
      KeyDoorEnv().reset(seed=0)[0])


def test_an_async_vector_env_without_shared_memory_returns_fresh_observations():
  # spawn, not fork: forking a process in which jax runs threads can deadlock the child.
  make = functools.partial(gymnasium.make, "explore_jax.envs:explore_jax/KeyDoor-v0")
  vector = gymnasium.vector.AsyncVectorEnv([make, make], shared_memory=False, context="spawn")
  try:
    observations, _ = vector.reset(seed=[1, 2])
    assert list(observations) == [KeyDoorEnv().reset(seed=s)[0] for s in (1, 2)]
    stepped, *_ = vector.step(("go right", "take key"))
    assert list(stepped) != list(observations)
  finally:
    vector.close()
