"""EAPO's rollback transitions on recorded KeyDoor episodes: a step back to a visited room is mined and verified by
replay, admissible guesses and a teacher's answers are verified or rejected by replay, and a false candidate is
rejected."""

import numpy as np

from explore_jax.actors.protocol import EpisodeResult, EpisodeSpec, Response, StepRecord
from explore_jax.envs import KeyDoorEnv
from explore_jax.methods.eapo_rollback import (TEACHER_INSTRUCTION, Rollback, mine_rollbacks, teacher_rollbacks,
                                               verified_rollbacks, verify, verify_all)

SEED = 3  # 4 rooms: the agent starts in room 3


def record(actions):
  """An episode played in KeyDoor from SEED, recorded as an actor records it."""
  env = KeyDoorEnv()
  observation, info = env.reset(seed=SEED)
  resp = Response(0, 0, np.zeros(1, np.int32), np.zeros(1, np.float32), np.ones(1, np.float32), np.zeros(1, np.int32), 0)
  steps = []
  for t, action in enumerate(actions):
    key, shown = info["state_key"], observation
    observation, reward, terminated, truncated, info = env.step(action)
    # As an actor records a step: its info is the one the step returned (the next state's admissible actions).
    steps.append(StepRecord(0, 0, 0, t, 0, [1], resp, action, reward, 1.0, key, terminated or truncated,
                            info["success"], dict(info), observation=shown))
  return EpisodeResult(EpisodeSpec(0, 0, 0, "explore_jax/KeyDoor-v0", seed=SEED), steps, info["success"], 0.0, "",
                       final_state_key=info["state_key"]), env


def make_env():
  return KeyDoorEnv()  # a fresh world; a replay resets it first, so any instance serves


def test_a_step_back_to_a_visited_state_is_mined_and_verified_by_replay():
  result, env = record(["go left", "go right"])
  start = result.steps[0].state_key
  returns = mine_rollbacks([result], admissible=False)
  assert returns == [Rollback(SEED, ("go left",), result.steps[1].observation, "go right", start, 1)]
  assert verify(make_env(), returns[0])
  assert verified_rollbacks(make_env(), [result], admissible=False) == returns


def test_admissible_guesses_are_kept_only_where_the_replay_returns():
  result, _ = record(["go left", "go left"])  # rooms 3 -> 2 -> 1: "go right" from room 2 leads back to room 3
  kept = verified_rollbacks(make_env(), [result])
  assert [(c.prefix, c.action, c.target_key) for c in kept] == [(("go left",), "go right", result.steps[0].state_key)]
  guesses = mine_rollbacks([result])
  assert len(guesses) > len(kept)  # the others went elsewhere and were rejected


def test_staying_at_a_revisited_state_is_no_way_back():
  result, _ = record(["go left", "go right", "go left"])  # rooms 3 -> 2 -> 3 -> 2: steps 2 and 3 revisit
  keys = [s.state_key for s in result.steps]
  assert keys[2] == keys[0]
  candidates = mine_rollbacks([result])
  assert candidates and all(c.target_key != keys[c.step] for c in candidates)


def test_a_false_candidate_is_rejected():
  result, _ = record(["go left", "go right"])
  false = Rollback(SEED, ("go left",), "", "go left", result.steps[0].state_key)  # further away, not back
  assert not verify(make_env(), false)
  assert not verify(make_env(), Rollback(SEED, (), "", "go left", result.steps[0].state_key))  # no move back at all


def test_a_teachers_answers_are_asked_with_both_states_and_kept_only_where_the_replay_returns():
  result, _ = record(["go left", "go left", "go right"])  # rooms 3 -> 2 -> 1 -> 2: two steps that left a room
  asked = []

  def teacher(questions):
    asked.extend(questions)
    return ["go right\nbecause the last room is to the right", "go left"]  # right, then wrong

  proposed = teacher_rollbacks([result], teacher)
  assert [(c.prefix, c.action, c.target_key) for c in proposed] == [
      (("go left",), "go right", result.steps[0].state_key), (("go left", "go left"), "go left",
                                                              result.steps[1].state_key)]
  first = asked[0][0]["content"]
  assert first.startswith(TEACHER_INSTRUCTION)
  assert f"You are here:\n{result.steps[1].observation}" in first
  assert f"You were here just before:\n{result.steps[0].observation}" in first
  assert "Actions you can take: " + ", ".join(result.steps[0].info["admissible_actions"]) in first
  assert verify_all(make_env(), proposed) == proposed[:1]  # the second answer goes further left, not back: rejected
  # Beside the episode's own step back (room 1 -> 2), first in the order replays take.
  assert verified_rollbacks(make_env(), [result], admissible=False, proposed=proposed) == [
      proposed[0], *mine_rollbacks([result], admissible=False)]
