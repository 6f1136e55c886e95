"""ScienceWorld-v0: gold paths, seeded variations and splits, admissible actions only when asked,
the grammar, inputs the world ignores, failure, parallel copies, instances stepped at once, a JVM killed
mid-episode."""

import os
import signal

import pytest

from explore_jax.envs import ParallelCopies, oracle_demonstrations, oracle_episode, state_key
from explore_jax.envs.java import JavaWorldError
from explore_jax.envs.scienceworld import (NO_MATCH, TASKS, ScienceWorldEnv, listed_things, resolve_task, shown_name,
                                           teleporting_path)
from tests.envs.concurrent_play import assert_played_alike_at_once

# Tasks whose gold paths are short and cheap to generate (a JVM starts in ~2 s of CPU).
FIND = "find-non-living-thing"


@pytest.fixture(scope="module")
def envs():
  made = {}

  def get(task=FIND, **kwargs):
    key = (task, tuple(sorted(kwargs.items())))
    if key not in made:
      made[key] = ScienceWorldEnv(task=task, **kwargs)
    return made[key]

  yield get
  for env in made.values():
    env.close()


@pytest.mark.parametrize("task", [FIND, "find-living-thing", "lifespan-longest-lived"])
def test_the_gold_path_succeeds_with_a_return_of_one(envs, task):
  env = envs(task)
  for seed in range(2):
    observation, info = env.reset(seed=seed)
    total, done, start = 0.0, False, info["score"]  # some variations start above 0
    while not done:
      observation, reward, terminated, truncated, info = env.step(env.oracle_action())
      assert info["format_ok"] and env.observation_space.contains(observation)
      total += reward
      done = terminated or truncated
    assert terminated and info["success"] and info["score"] == 1.0
    assert total == pytest.approx(1.0 - start) and info["feedback"].startswith("Success")


def test_equal_seeds_give_equal_variations_whichever_jvm_and_history(envs):
  first, second = envs(), envs(admissible=True)
  second.reset(seed=3)
  second.step("open door to kitchen")  # a different history in the second JVM
  for seed in [0, 1, 2, 149, 150]:
    observation, info = first.reset(seed=seed)
    other, other_info = second.reset(seed=seed)
    assert other == observation and other_info["task_id"] == info["task_id"]
    assert other_info["state_key"] == info["state_key"]
    for action in ["open door to kitchen", "go to kitchen", "look around"]:
      stepped, other_stepped = first.step(action), second.step(action)
      assert stepped[:4] == other_stepped[:4]
  assert first.reset(seed=150)[1]["task_id"] == first.reset(seed=0)[1]["task_id"] == f"{FIND}:0"
  assert [first.reset(seed=seed)[1]["task_id"] for seed in range(3, 6)] == [
      f"{FIND}:{v}" for v in range(3, 6)]


def test_splits_are_the_worlds_own_variation_lists(envs):
  train = envs()
  assert train.num_tasks == 150 and train.split_games == list(range(150))
  dev = envs(split="dev")
  assert dev.split_games == list(range(150, 225))
  assert dev.reset(seed=1)[1]["task_id"] == f"{FIND}:151"
  assert not set(dev.split_games) & set(train.split_games)


def test_admissible_actions_only_when_asked(envs):
  _, info = envs().reset(seed=0)
  assert "admissible_actions" not in info and envs().admissible_actions() is None
  asking = envs(admissible=True)
  _, info = asking.reset(seed=0)
  assert "open door to kitchen" in info["admissible_actions"]
  _, _, _, _, info = asking.step("open door to kitchen")
  assert "go to kitchen" in info["admissible_actions"]
  assert info["admissible_actions"] == sorted(info["admissible_actions"])


def test_the_observation_is_the_task_then_the_worlds_answer_and_equal_ones_share_a_key(envs):
  env = envs()
  observation, start = env.reset(seed=0)
  task, room = observation.split("\n", 1)
  assert task.startswith("Task: Your task is to find a(n) non-living thing.")
  assert room.startswith("This room is called the hallway.") and "\tthe agent" in room
  assert start["state_key"] == state_key(observation) and start["score"] == 0.0
  _, _, _, _, looked = env.step("look around")
  assert looked["state_key"] == start["state_key"]
  _, _, _, _, opened = env.step("open door to kitchen")
  assert opened["state_key"] != start["state_key"]


MALFORMED = ["", " \n ", "look around\nopen door to kitchen", "x" * 300, "посмотри", None,
             "\x07"]


@pytest.mark.parametrize("response", MALFORMED, ids=lambda r: repr(r)[:20])
def test_a_malformed_response_is_an_invalid_action_that_changes_nothing(envs, response):
  env = envs()
  _, before = env.reset(seed=2)
  raw = env.raw_observation()
  observation, reward, terminated, truncated, info = env.step(response)
  assert (reward, terminated, truncated) == (0.0, False, False)
  assert not info["format_ok"] and info["format_reward"] == 0.0 and info["action"] is None
  assert observation.startswith("Invalid action: ") and observation.endswith(raw)
  assert env.response_format in observation and env.observation_space.contains(observation)
  assert info["state_key"] == before["state_key"] and info["step"] == 1 and env.history == []


def test_an_input_the_world_does_not_recognise_changes_nothing(envs):
  env = envs()
  _, before = env.reset(seed=2)
  raw = env.raw_observation()
  observation, reward, terminated, truncated, info = env.step("Fly to the MOON")
  assert observation == f"{NO_MATCH}\n{raw}"
  assert info["format_ok"] and info["format_reward"] == 1.0 and info["action"] == "fly to the moon"
  assert (reward, terminated, truncated) == (0.0, False, False)
  assert info["state_key"] == before["state_key"] and env.history == []


def test_an_ambiguous_input_is_answered_by_the_number_of_a_choice(envs):
  env = envs()
  env.reset(seed=0)
  observation, _, _, _, info = env.step("open door")
  assert "Ambiguous request" in observation and "0:" in observation
  observation, _, _, _, _ = env.step("0")
  assert "The door is now open." in observation


def test_a_wrong_focus_fails_the_task_and_takes_back_the_reward(envs):
  env = envs("find-living-thing")
  env.reset(seed=0)  # variation 0 starts in the hallway, beside a picture
  observation, reward, terminated, truncated, info = env.step("focus on picture")
  assert (terminated, truncated, info["success"], info["score"]) == (True, False, False, -1.0)
  assert reward == 0.0  # nothing had been paid out yet; the floored score stays at 0
  assert info["feedback"].startswith("Failure: the task failed after 1 steps.")


def test_the_teleporting_oracle_wins_find_plant_in_fewer_steps(envs):
  """find-plant's gold path, teleporting where it walks (and looking where it lands), wins in 6-7 steps."""
  gold, short = envs("find-plant", simplifications="easy"), envs("find-plant", simplifications="easy",
                                                                 oracle="teleport")
  for seed in range(3):
    lengths = []
    for env in (gold, short):
      env.reset(seed=seed)
      actions, done = [], False
      while not done:
        actions.append(env.oracle_action())
        _, _, terminated, truncated, info = env.step(actions[-1])
        done = terminated or truncated
      assert terminated and info["success"], (seed, actions)
      lengths.append(len(actions))
    assert lengths[1] in (6, 7) and lengths[0] >= lengths[1] + 1
    assert actions[0].startswith("teleport to ") and not any(a.startswith(("go to", "open door")) for a in actions)


def test_the_teleporting_oracle_sees_the_animals_it_focuses_on(envs):
  """The tiny config's demonstrations (lifespan-longest-lived): the gold path focuses on one of the three animals
  outside without looking; teleporting, the oracle looks first, so the animal it names is in its observation."""
  env = envs("lifespan-longest-lived", simplifications="easy", oracle="teleport")
  for seed in range(3):
    episode = oracle_episode(env, seed=seed)
    assert episode.success, (seed, episode.actions)  # ScienceWorld's success is the full score
    for observation, action in zip(episode.observations, episode.actions):
      if action.startswith("focus on "):
        assert "This outside location is called the outside" in observation, (seed, observation)
        animal = action.removeprefix("focus on ").split()[-1]  # the world names "a parrot egg" "egg parrot"
        assert f" {animal}" in observation, (seed, action, observation)


@pytest.mark.parametrize("task", ["lifespan-longest-lived", "find-animal"])
def test_the_oracle_names_what_it_focuses_on_as_the_room_lists_it(envs, task):
  """With oracle_names="shown" the focus names a thing of the room listing verbatim ("focus on parrot egg", not
  the gold path's "focus on egg parrot"), the world takes it for the same thing, and the oracle goes on along
  its path after it (find-animal then picks the animal up and carries it to a box)."""
  env = envs(task, simplifications="easy", oracle="teleport", oracle_names="shown")
  world = envs(task, simplifications="easy", oracle="teleport")
  renamed = 0
  for seed in range(3):
    episode, gold = oracle_episode(env, seed=seed), oracle_episode(world, seed=seed)
    assert episode.success and len(episode.actions) == len(gold.actions), (seed, episode.actions)
    focus = [(observation, action.removeprefix("focus on "))
             for observation, action in zip(episode.observations, episode.actions) if action.startswith("focus on ")]
    assert focus and all(thing in listed_things(observation) for observation, thing in focus), (seed, focus)
    renamed += episode.actions != gold.actions
  assert renamed == 3  # the world's words differ from the listing's in these games


def test_shown_names():
  room = ("This outside location is called the outside. Here you see:\n\tthe agent\n\ta substance called air\n"
          "\ta crocodile egg\n\ta chameleon egg\n\ta baby brown bear\n\ta fountain (containing a substance called "
          "water)\n\ta table. On the table is: a bowl (containing nothing).\nYou also see:\n\tA door to the foundry "
          "(that is open)")
  assert listed_things(room) == ["agent", "air", "crocodile egg", "chameleon egg", "baby brown bear", "fountain",
                                 "table"]
  assert shown_name("focus on crocodile", room) == "focus on crocodile egg"
  assert shown_name("focus on baby baby brown bear", room) == "focus on baby brown bear"
  assert shown_name("focus on fountain", room) == "focus on fountain"
  assert shown_name("focus on egg", room) == "focus on egg"  # two listed eggs: kept
  assert shown_name("focus on bowl", room) == "focus on bowl"  # what a thing holds is not listed
  assert shown_name("pick up crocodile", room) == "pick up crocodile"  # only what the oracle focuses on
  assert shown_name("focus on crocodile", "You focus on the crocodile egg.") == "focus on crocodile"


def test_teleporting_paths():
  assert teleporting_path(["open door to hallway", "go to hallway", "open door to greenhouse", "go to greenhouse",
                           "look around", "focus on pea plant", "open door to kitchen", "go to kitchen",
                           "open door to oven"]) == \
      ["teleport to greenhouse", "look around", "focus on pea plant", "teleport to kitchen"]
  assert teleporting_path(["look around"]) == ["look around"]
  # A teleport's answer does not show the room: the path looks before it acts there.
  assert teleporting_path(["open door to kitchen", "go to kitchen", "open door to outside", "go to outside",
                           "focus on egg parrot"]) == ["teleport to outside", "look around", "focus on egg parrot"]
  with pytest.raises(ValueError, match="teleportAction"):
    ScienceWorldEnv(task="find-plant", simplifications="openDoors", oracle="teleport")
  with pytest.raises(ValueError, match="oracle must be one of"):
    ScienceWorldEnv(task="find-plant", oracle="search")
  with pytest.raises(ValueError, match="oracle_names must be one of"):
    ScienceWorldEnv(task="find-plant", oracle_names="listed")


def test_tasks_are_named_by_name_paper_id_or_index():
  assert resolve_task("boil") == resolve_task("1-1") == resolve_task(0) == TASKS[0] == "boil"
  assert resolve_task("task-10-mendelian-genetics-unknown-plant") == TASKS[-1]
  for bad in ["sing", 30, -1, None]:
    with pytest.raises(ValueError):
      resolve_task(bad)
  with pytest.raises(ValueError, match="simplifications"):
    ScienceWorldEnv(simplifications="fast")
  with pytest.raises(ValueError, match="electrical"):
    ScienceWorldEnv(task="power-component", simplifications="noElectricalAction")


def test_parallel_copies_start_identical_and_equal_actions_keep_them_equal():
  env = ParallelCopies("explore_jax/ScienceWorld-v0", num_copies=2,
                       env_kwargs=dict(task="lifespan-shortest-lived"))
  try:
    _, info = env.reset(seed=4)
    assert len(set(info["copy_state_keys"])) == 1
    assert info["task_id"] == "lifespan-shortest-lived:4" and "copy_admissible_actions" not in info
    _, _, _, _, info = env.step(
        "<parallel><env_1>inventory</env_1><env_2>inventory</env_2></parallel>")
    assert info["acted"] == [0, 1] and len(set(info["copy_state_keys"])) == 1
    assert all(d.success for d in oracle_demonstrations(env, [4]))
  finally:
    env.close()


def test_a_killed_jvm_fails_the_step_clearly_and_the_next_reset_restarts_it(envs):
  env = envs()
  first, _ = env.reset(seed=5)
  env.step("open door to kitchen")
  process = env.java.process
  os.kill(process.pid, signal.SIGKILL)
  process.wait(timeout=10)
  with pytest.raises(JavaWorldError, match="JVM died"):
    env.step("go to kitchen")
  observation, info = env.reset(seed=5)
  assert observation == first and info["task_id"] == f"{FIND}:5" and env.java.pid != process.pid
  assert oracle_demonstrations(env, [5])[0].success


def test_instances_stepped_from_threads_at_once_play_as_one_after_another(envs):
  # Each instance has its JVM: an actor may step several at once (actors/actor.py).
  others = [ScienceWorldEnv(task=FIND) for _ in range(2)]
  try:
    trails = assert_played_alike_at_once([envs(), *others], [{"seed": seed} for seed in (0, 1, 2)],
                                         lambda e, info: e.oracle_action())
    assert all(len(trail) > 2 for trail in trails)
  finally:
    for other in others:
      other.close()
