"""ScreenReading-v0 around MiniWoB-v0 in Chromium: the screens before and after each step, read once per
screenshot, the oracle's JSON replies with their intents, and the config's mapping to the wrapper."""

import json

import gymnasium
import numpy as np
import pytest

import explore_jax.envs  # noqa: F401  (registers the ids)
from explore_jax.envs import oracle_episode, screen_reading
from explore_jax.envs.screen_actions import ScreenAction, format_action, parse_response
from explore_jax.envs.screen_reader import (SCREEN_READING_ID, click_hit_text, intent_for, screen_reading_env,
                                            screen_text)

TASK = "click-button"


@pytest.fixture(scope="module")
def env():
  env = gymnasium.make(SCREEN_READING_ID, env="explore_jax/MiniWoB-v0",
                       env_kwargs={"task": TASK, "split": "train", "max_steps": 4})
  yield env
  env.close()


def test_screens_before_and_after_each_step_are_the_worlds_screenshots_read(env):
  observation, info = env.reset(seed=3)
  first = info["screen"]["after"]
  assert set(info["screen"]) == {"after"}
  np.testing.assert_array_equal(first["latent"], screen_reading.image_latent("patch_stats", observation["screenshot"]))
  words = " ".join(b[4] for b in first["boxes"]).lower()
  assert "click" in words  # the utterance is on the page: "Click on the "..." button."
  for x0, y0, x1, y1, _ in first["boxes"]:
    assert 0 <= x0 <= x1 < 160 and 0 <= y0 <= y1 < 210
  # A click on the empty bottom of the task area changes nothing: the same reading, not read again.
  calls = []
  real = screen_reading.ocr_boxes
  screen_reading.ocr_boxes = lambda *a, **k: calls.append(1) or real(*a, **k)
  try:
    observation, _, _, _, info = env.step("Click(80, 205)")
    same = lambda s: np.array_equal(s["latent"], first["latent"]) and s["boxes"] == first["boxes"]
    assert same(info["screen"]["before"]) and same(info["screen"]["after"]) and not calls
    assert info["screen"]["after"]["latent"] is not first["latent"]  # each info its own copy
    # An invalid action leaves the screen too.
    _, _, _, _, info = env.step("no action at all")
    assert info["format_reward"] == 0.0 and same(info["screen"]["after"]) and not calls
  finally:
    screen_reading.ocr_boxes = real


def test_a_solving_step_reads_the_new_screen_and_the_json_reply_carries_its_intent(env):
  _, info = env.reset(seed=4)
  before = info["screen"]["after"]
  reply = env.get_wrapper_attr("oracle_action")()
  decoded = json.loads(reply)
  action, error = parse_response(reply, 160, 210)
  assert action is not None, error
  # The intent names the text OCR read under the click (small button labels are not always read).
  assert decoded["intent"] == intent_for(action, before["boxes"]) and decoded["action"] == format_action(action)
  observation, reward, terminated, _, info = env.step(reply)
  assert terminated and reward > 0 and info["intent"] == decoded["intent"]
  assert info["screen"]["before"]["boxes"] == before["boxes"]
  assert not np.array_equal(info["screen"]["after"]["latent"], before["latent"])  # the task's success screen


def test_the_oracle_episode_plays_the_wrappers_oracle_through_gymnasiums_layers(env):
  demo = oracle_episode(env, seed=5)
  assert demo.success and all(json.loads(a)["intent"] for a in demo.actions)


def test_the_boxes_oracle_clicks_text_on_the_screen_and_is_seeded():
  env = gymnasium.make(SCREEN_READING_ID, env="explore_jax/MiniWoB-v0", oracle="boxes",
                       env_kwargs={"task": TASK, "split": "train", "max_steps": 4})
  try:
    replies = []
    for _ in range(2):
      _, info = env.reset(seed=6)
      replies.append(env.get_wrapper_attr("oracle_action")())
    assert replies[0] == replies[1]
    action, _ = parse_response(replies[0], 160, 210)
    assert click_hit_text(info["screen"]["after"]["boxes"], action.kind, action.x, action.y) is not None
  finally:
    env.close()


def test_texts_and_hits_of_boxes_and_intents():
  boxes = [[0, 0, 9, 9, "File"], [5, 5, 20, 8, " Edit "], [30, 30, 40, 40, "Help"]]
  assert screen_text(boxes) == "Screen OCR: File  Edit  Help"
  assert click_hit_text(boxes, "Click", 9, 9) == "Screen OCR: File"           # inclusive corner
  assert click_hit_text(boxes, "DoubleClick", 6, 6) == "Screen OCR: File Edit"  # both boxes, stripped
  assert click_hit_text(boxes, "Click", 10, 9) is None
  assert click_hit_text(boxes, "Move", 1, 1) is None
  assert intent_for(ScreenAction("RightClick", 35, 35), boxes) == 'RightClick "Help" to see what it does'
  assert intent_for(ScreenAction("Click", 50, 50), boxes) == "Click at (50, 50) to see what changes"


def test_the_config_maps_to_the_wrapper_and_names_a_bad_option():
  assert screen_reading_env("w", {"a": 1}, {}) == ("w", {"a": 1})
  assert screen_reading_env("w", {"a": 1}, {"latent": "patch_stats", "ocr_options": {"psm": 11}}) == (
      SCREEN_READING_ID, {"env": "w", "env_kwargs": {"a": 1}, "latent": "patch_stats", "ocr_options": {"psm": 11}})
  with pytest.raises(ValueError, match="unknown option.*'latnt'"):
    screen_reading_env("w", {}, {"latnt": "patch_stats"})
  with pytest.raises(TypeError, match="Dict observation"):
    gymnasium.make(SCREEN_READING_ID, env="explore_jax/KeyDoor-v0")
