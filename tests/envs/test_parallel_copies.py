"""DPEPO's parallel copies: identical starts, only named copies step, any success wins."""

import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from explore_jax.envs import KeyDoorEnv, ParallelCopies, oracle_demonstrations, state_key


def parallel(*actions):
  return "<parallel>" + "".join(f"<env_{i}>{a}</env_{i}>" for i, a in actions) + "</parallel>"


def make(num_copies=4, **kwargs):
  return ParallelCopies("explore_jax/KeyDoor-v0", num_copies=num_copies, **kwargs)


def test_every_copy_starts_from_the_state_a_single_env_gets_from_the_seed():
  env = make()
  for seed in range(5):
    observation, info = env.reset(seed=seed)
    single, single_info = KeyDoorEnv().reset(seed=seed)
    assert [copy.raw_observation() for copy in env.copies] == [single] * 4
    assert info["copy_state_keys"] == [single_info["state_key"]] * 4
    assert info["task_id"] == single_info["task_id"]
    assert observation == "\n".join(f"<env_{i}>\n{single}\n</env_{i}>" for i in range(1, 5))
    assert info["histories"] == [[], [], [], []] and info["acted"] == []
  env.reset()  # unseeded: the copies still share one draw
  assert len({copy.raw_observation() for copy in env.copies}) == 1


def test_only_the_named_copies_step_and_their_histories_grow():
  env = make()
  _, first = env.reset(seed=3)
  observation, reward, terminated, truncated, info = env.step(
      "<think>try two things</think>\n<parallel> <env_2>go left</env_2>\n"
      "<env_4> take  KEY </env_4> </parallel>")
  assert info["format_ok"] and info["format_reward"] == 1.0
  assert info["acted"] == [1, 3]
  assert info["actions"] == [None, "go left", None, "take key"]
  assert info["histories"] == [[], ["go left"], [], ["take key"]]
  assert [copy.steps for copy in env.copies] == [0, 1, 0, 1]
  assert info["copy_state_keys"][0] == info["copy_state_keys"][2] == first["copy_state_keys"][0]
  assert info["state_key"] == state_key(env.raw_observation())
  assert "<env_2>\n" in observation and (reward, terminated, truncated) == (0.0, False, False)
  _, _, _, _, info = env.step(parallel((2, "go right")))
  assert info["acted"] == [1] and info["histories"][1] == ["go left", "go right"]
  assert info["copy_rewards"] == [0.0] * 4


def test_success_in_any_copy_ends_the_episode_with_the_best_reward():
  env = make(num_copies=2)
  env.reset(seed=8)
  oracle = env.copies[0]
  for step in range(1, env.max_steps + 1):
    # The oracle plays copy 1; copy 2 keeps trying a locked or absent door.
    _, reward, terminated, truncated, info = env.step(
        parallel((1, oracle.oracle_action()), (2, "open door")))
    if terminated:
      break
    assert reward == 0.0 and not info["success"]
  assert (reward, terminated, truncated) == (1.0, True, False)
  assert info["success"] and info["copy_success"] == [True, False]
  assert info["copy_rewards"] == [1.0, 0.0]
  assert info["feedback"] == f"Success in env_1 after {step} steps."
  assert len(info["histories"][0]) == len(info["histories"][1]) == step
  assert set(info["histories"][1]) == {"open door"}


def test_without_success_the_episode_truncates_at_its_step_limit_with_each_copys_feedback():
  env = make(num_copies=2, max_steps=3)
  env.reset(seed=0)
  results = [env.step(parallel((1, "take key"), (2, "open door"))) for _ in range(3)]
  assert [r[2:4] for r in results] == [(False, False), (False, False), (False, True)]
  feedback = results[-1][4]["feedback"]
  assert feedback.startswith("env_1: Failure") and " env_2: Failure" in feedback


def test_copies_that_ran_out_are_skipped_and_all_ended_truncates():
  env = ParallelCopies(lambda: KeyDoorEnv(max_steps=2), num_copies=2, max_steps=10)
  env.reset(seed=0)
  env.step(parallel((1, "open door")))
  _, _, _, _, info = env.step(parallel((1, "open door")))
  assert info["copy_ended"] == [True, False]
  observation, _, terminated, truncated, info = env.step(parallel((1, "go left")))
  assert info["acted"] == [] and info["format_ok"]
  assert observation.startswith("<env_1>\nThis copy's episode has ended.")
  assert not (terminated or truncated)
  env.step(parallel((2, "open door")))
  _, _, terminated, truncated, info = env.step(parallel((2, "open door")))
  assert (terminated, truncated) == (False, True) and info["copy_ended"] == [True, True]


MALFORMED = {
    "": "Expected a <parallel> block",
    "go left": "Expected a <parallel> block",
    None: "must be text",
    "<think>go": "not closed with </think>",
    "<parallel><env_1>go left</env_1>": "must end with </parallel>",
    "<parallel></parallel>": "names no copy",
    "<parallel>  \n </parallel>": "names no copy",
    parallel((0, "go left")): "There is no env_0",
    parallel((5, "go left")): "There is no env_5",
    parallel((1, "go left"), (1, "go right")): "env_1 is named twice",
    parallel((2, "fly")): 'env_2: Unknown action "fly"',
    parallel((2, "")): "env_2: The response is empty",
    "<parallel><env_1>go left</env_2></parallel>": "not closed with </env_1>",
    "<parallel>go left</parallel>": "Expected <env_i> inside <parallel>",
    "<parallel><env_1>go left</env_1>and more</parallel>": "Expected <env_i> inside <parallel>",
    parallel((1, "go left")) + " thanks": "must end with </parallel>",
    "<parallel><env_١>go left</env_١></parallel>": "Expected <env_i> inside <parallel>",
    "<parallel>" + "<env_1>" * 50_000 + "</parallel>": "not closed with </env_1>",
}


@pytest.mark.parametrize("response,reason", MALFORMED.items(), ids=lambda r: repr(r)[:24])
def test_a_malformed_parallel_response_is_one_invalid_action_for_all_copies(response, reason):
  env = make()
  _, before = env.reset(seed=1)
  raw = env.raw_observation()
  observation, reward, terminated, truncated, info = env.step(response)
  assert reason in observation.splitlines()[0]
  assert observation.startswith("Invalid action: ") and observation.endswith(raw)
  assert env.observation_space.contains(observation)
  assert (reward, terminated, truncated) == (0.0, False, False)
  assert not info["format_ok"] and info["format_reward"] == 0.0 and info["action"] is None
  assert info["acted"] == [] and info["histories"] == [[], [], [], []]
  assert [copy.steps for copy in env.copies] == [0] * 4
  assert info["state_key"] == before["state_key"] and info["step"] == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 5), st.sampled_from(["go left", "take key", "x", ""])),
                max_size=4).map(lambda acts: parallel(*acts)) | st.text(max_size=80))
def test_any_response_steps_without_raising(response):
  env = make(num_copies=3)
  env.reset(seed=2)
  observation, _, _, _, info = env.step(response)
  assert env.observation_space.contains(observation)
  assert info["format_reward"] == float(info["format_ok"])
  assert len(info["acted"]) == (len(set(info["acted"])) if info["format_ok"] else 0)


def test_the_parallel_oracle_demonstrates_successful_episodes():
  env = make(num_copies=2)
  demos = oracle_demonstrations(env, range(20))
  assert all(d.success for d in demos)
  assert demos[0].actions[0].startswith("<parallel><env_1>")


def test_gymnasium_make_and_check_env():
  env = gymnasium.make("explore_jax/Parallel-v0", env="explore_jax/KeyDoor-v0", num_copies=2,
                       env_kwargs=dict(num_rooms=3))
  assert env.reset(seed=0)[1]["copy_admissible_actions"][0] == KeyDoorEnv(num_rooms=3).reset(
      seed=0)[1]["admissible_actions"]
  assert not env.metadata["concurrent_instances"]  # KeyDoor does not declare it (ALFWorld's copies do)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    check_env(env.unwrapped)


# ---- the authors' lenient parser ----------------------------------------------------------------------------

def test_the_lenient_parser_renumbers_blocks_by_order_and_needs_no_parallel_block():
  env = make(num_copies=3, parser="lenient")
  env.reset(seed=3)  # room 3 of 4, key and door to the left
  _, _, _, _, info = env.step("I will try <env_7>go left</env_7> and then <env_2> go right </env_2>")
  assert info["format_ok"] and info["acted"] == [0, 1]  # the written indices are ignored
  assert info["actions"] == ["go left", "go right", None]
  assert info["parsed_actions"] == [[1, "go left"], [2, "go right"]]
  assert [copy.room for copy in env.copies] == [1, 3, 2]


def test_a_lenient_block_past_the_kth_is_an_invalid_environment_that_steps_nothing():
  env = make(num_copies=2, parser="lenient")
  env.reset(seed=3)
  observation, reward, _, _, info = env.step("<env_1>go left</env_1><env_2>go left</env_2><env_3>take key</env_3>")
  assert info["acted"] == [0, 1] and reward == 0.0
  assert "The 3-th environment is invalid: there are 2 environments, ranging from 1 to 2." in observation
  # W_t's width term counts the out-of-range action, as the authors' code does.
  assert info["parsed_actions"] == [[1, "go left"], [2, "go left"], [3, "take key"]]
  assert info["histories"] == [["go left"], ["go left"]]


def test_a_lenient_block_its_copy_refuses_steps_that_copy_as_its_own_invalid_action():
  env = make(num_copies=2, parser="lenient")
  env.reset(seed=3)
  observation, _, _, _, info = env.step("<env_1>dance</env_1><env_2>go left</env_2>")
  assert info["format_ok"] and info["acted"] == [0, 1]
  assert info["copy_observations"][0][0].startswith("Invalid action:")
  assert [copy.room for copy in env.copies] == [2, 1]
  _, _, _, _, info = env.step("<env_1>dance</env_1>")  # no block its copy parses: a malformed response
  assert not info["format_ok"] and info["format_reward"] == 0.0 and info["acted"] == [0]


@pytest.mark.parametrize("response", ["go left", "<env_1>go left", "<parallel></parallel>", ""])
def test_a_lenient_response_without_a_closed_block_is_invalid_and_steps_nothing(response):
  env = make(num_copies=2, parser="lenient")
  env.reset(seed=3)
  observation, _, _, _, info = env.step(response)
  assert not info["format_ok"] and info["acted"] == [] and info["parsed_actions"] == []
  assert "No <env_i>...</env_i> block" in observation


def test_bad_parser_or_oracle_names_the_choices():
  with pytest.raises(ValueError, match="parser must be one of"):
    make(parser="loose")
  with pytest.raises(ValueError, match="oracle must be one of"):
    make(oracle="best")


# ---- what a DPEPO prompt is built from, and the cold start's oracle -------------------------------------------

def test_info_holds_each_copys_actions_and_what_it_showed_after_each():
  env = make(num_copies=2)
  env.reset(seed=3)
  env.step(parallel((1, "go left")))
  _, _, _, _, info = env.step(parallel((1, "go left"), (2, "go right")))
  assert info["histories"] == [["go left", "go left"], ["go right"]]
  assert [len(o) for o in info["copy_observations"]] == [2, 1]
  assert info["copy_observations"][1][0] == env.copies[1].raw_observation()
  assert info["initial_observation"] == KeyDoorEnv().reset(seed=3)[0]


def test_the_diverse_oracle_explores_in_the_other_copies_and_still_wins():
  env = make(num_copies=3, oracle="diverse", explore=1.0)
  demos = oracle_demonstrations(env, range(20))
  assert all(d.success for d in demos)
  distinct_steps = 0
  for d in demos:
    lead = []
    for response in d.actions:
      actions = env.parse_action(response)[0]
      assert set(actions) <= {0, 1, 2}
      lead.append(env.copies[0].action_text(actions[0]))
      distinct_steps += len({env.copies[0].action_text(a) for a in actions.values()}) > 1
    # Copy 1 plays the world's own oracle episode, which wins; the episode ends at its win (or earlier).
    single = oracle_demonstrations(KeyDoorEnv(), [d.seed])[0].actions
    assert lead == single[:len(lead)]
  assert distinct_steps > len(demos)  # the other copies did explore
  # Replayed from its seed, a demonstration wins again: the oracle's draws come from the episode's stream.
  for d in demos[:5]:
    env.reset(seed=d.seed)
    for response in d.actions:
      *_, info = env.step(response)
    assert info["success"]


def test_the_same_oracle_takes_the_oracle_action_in_every_copy():
  env = make(num_copies=2, oracle="same")
  env.reset(seed=3)
  assert env.oracle_action() == parallel((1, "go left"), (2, "go left"))
