"""EAPO's rollback transitions on recorded KeyDoor episodes: a step back to a visited room is mined and verified by
replay, admissible guesses are verified or rejected by replay, and a false candidate is rejected."""

import numpy as np

from explore_jax.actors.protocol import EpisodeResult, EpisodeSpec, Response, StepRecord
from explore_jax.envs import KeyDoorEnv
from explore_jax.methods.eapo_rollback import Rollback, mine_rollbacks, verified_rollbacks, verify

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


def test_a_false_candidate_is_rejected():
  result, _ = record(["go left", "go right"])
  false = Rollback(SEED, ("go left",), "", "go left", result.steps[0].state_key)  # further away, not back
  assert not verify(make_env(), false)
  assert not verify(make_env(), Rollback(SEED, (), "", "go left", result.steps[0].state_key))  # no move back at all
