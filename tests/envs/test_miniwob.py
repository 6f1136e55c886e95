"""MiniWoB-v0: ScreenExplorer's action grammar (pure), and MiniWoB++ in a real headless Chromium: the oracle's
gold path, seeded determinism, invalid actions, every action kind in the browser, a browser killed mid-episode,
and no browser outliving its process.

The grammar tests need no browser. The others need Chromium and chromedriver (`make browser`); one module
environment (a browser takes about half a second to start) serves the tests that do not kill it.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import gymnasium
import numpy as np
import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import explore_jax.envs  # noqa: F401  (registers the ids)
from explore_jax.envs import oracle_episode
from explore_jax.envs.miniwob import ORACLE_TASKS, TASKS, MiniWoBBrowserError, MiniWoBEnv
from explore_jax.envs.screen_actions import (MAX_TYPED_CHARS, ScreenAction, format_action, parse_response,
                                             quote)
from tests.polling import wait_until

W, H = 160, 210


def parsed(text, width=W, height=H):
  action, error = parse_response(text, width, height)
  assert action is not None, error
  assert error == ""
  return action


def rejected(text, width=W, height=H):
  action, error = parse_response(text, width, height)
  assert action is None, f"{text!r} parsed as {action}"
  assert error and error.isprintable()
  return error


# ---- the grammar (no browser) -------------------------------------------------------------------------------


@pytest.mark.parametrize("text, canonical", [
    ("Move(1, 2)", "Move(1, 2)"),
    ("Click(0, 0)", "Click(0, 0)"),
    ("RightClick(159, 209)", "RightClick(159, 209)"),
    ("DoubleClick(80, 105)", "DoubleClick(80, 105)"),
    ("ScrollUp(3, 4)", "ScrollUp(3, 4)"),
    ("ScrollDown(3, 4)", "ScrollDown(3, 4)"),
    ('Text(10, 20, "Hello World!")', 'Text(10, 20, "Hello World!")'),
    ('Key("k")', 'Key("k")'),
    ('Key("K")', 'Key("K")'),
    ('Key("Space")', 'Key("Space")'),
    ('Key("Shift+K")', 'Key("Shift+K")'),
])
def test_every_form_parses_to_its_canonical_text_and_back(text, canonical):
  action = parsed(text)
  assert format_action(action) == canonical
  assert parsed(canonical) == action


@pytest.mark.parametrize("text, canonical", [
    ("  click(3,4)  ", "Click(3, 4)"),
    ("CLICK ( 3 , 4 )", "Click(3, 4)"),
    ("rightclick(3,\t4)", "RightClick(3, 4)"),
    ("doubleCLICK(+3, 4)", "DoubleClick(3, 4)"),
    ("scrolldown(007, 4)", "ScrollDown(7, 4)"),
    ("text(1, 2, 'single')", 'Text(1, 2, "single")'),
    ('key("enter")', 'Key("Enter")'),
    ('Key("RETURN")', 'Key("Enter")'),
    ('Key("esc")', 'Key("Escape")'),
    ('Key("del")', 'Key("Delete")'),
    ('Key("up")', 'Key("ArrowUp")'),
    ('Key("PgDn")', 'Key("PageDown")'),
    ('Key("f5")', 'Key("F5")'),
    ('Key(" ")', 'Key("Space")'),
    ('Key("shift+k")', 'Key("Shift+K")'),
    ('Key("Ctrl+A")', 'Key("Ctrl+a")'),
    ('Key("ctrl + shift + a")', 'Key("Ctrl+Shift+A")'),
    ('Key("Shift+Control+Tab")', 'Key("Ctrl+Shift+Tab")'),
    ('Key("Cmd+Option+z")', 'Key("Alt+Meta+z")'),
    ('Key("+")', 'Key("+")'),
    ('Key("Ctrl++")', 'Key("Ctrl++")'),
    ('Key("Shift")', 'Key("Shift")'),
    ('Key("Ctrl+Shift")', 'Key("Ctrl+Shift")'),
    ('Key("Shift+1")', 'Key("Shift+1")'),
])
def test_whitespace_case_quotes_and_key_aliases_are_forgiven(text, canonical):
  assert format_action(parsed(text)) == canonical


@pytest.mark.parametrize("literal, typed", [
    (r'"say \"hi\""', 'say "hi"'),
    (r"'it\'s'", "it's"),
    (r'"it\'s"', "it's"),
    (r"'say \"hi\"'", 'say "hi"'),
    (r'"back\\slash"', "back\\slash"),
    (r'"line\nbreak"', "line\nbreak"),
    (r'"a\tb"', "a\tb"),
    ('"a, b) c("', "a, b) c("),
    ("'\"'", '"'),
])
def test_text_strings_decode_quotes_and_escapes(literal, typed):
  action = parsed(f"Text(5, 6, {literal})")
  assert action == ScreenAction("Text", 5, 6, text=typed)
  assert parsed(format_action(action)) == action


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126) | st.sampled_from("\n\t"), min_size=1,
               max_size=MAX_TYPED_CHARS),
       st.integers(0, W - 1), st.integers(0, H - 1))
def test_any_typable_text_survives_the_canonical_round_trip(typed, x, y):
  action = ScreenAction("Text", x, y, text=typed)
  text = format_action(action)
  assert "\n" not in text and parsed(text) == action


def test_the_json_reply_carries_the_intent_and_nothing_else():
  action = parsed('{"intent": "close the dialog", "action": "Click(12, 40)"}')
  assert action == ScreenAction("Click", 12, 40) and action.intent == "close the dialog"
  multiline = parsed('{\n  "intent": "type",\n  "action": "Text(1, 2, \\"a\\\\nb\\")"\n}')
  assert multiline.text == "a\nb"
  assert parsed('{"action": "Key(\'Enter\')"}').intent == ""
  assert "not a JSON object" in rejected('{"action": "Click(1, 2)"')
  assert "not a JSON object" in rejected('{"action": "Click(1, 2)"} trailing')
  assert 'no "action"' in rejected('{"intent": "x"}')
  assert "other than" in rejected('{"action": "Click(1, 2)", "reason": "x"}')
  assert "must be a string" in rejected('{"action": ["Click(1, 2)"]}')
  assert '"intent" must be a string' in rejected('{"intent": 3, "action": "Click(1, 2)"}')
  assert "off the screen" in rejected('{"action": "Click(500, 2)"}')


@pytest.mark.parametrize("width, height", [(160, 210), (80, 105), (1920, 1080)])
def test_points_must_lie_on_the_screen(width, height):
  for x, y in [(0, 0), (width - 1, height - 1), (width // 2, 0)]:
    assert parsed(f"Click({x}, {y})", width, height) == ScreenAction("Click", x, y)
    assert parsed(f'Text({x}, {y}, "a")', width, height).x == x
  for x, y in [(-1, 0), (0, -1), (width, 0), (0, height), (10**30, 5)]:
    error = rejected(f"Click({x}, {y})", width, height)
    assert f"x must be in 0..{width - 1} and y in 0..{height - 1}" in error
    rejected(f'Text({x}, {y}, "a")', width, height)


@pytest.mark.parametrize("text, says", [
    ("", "empty"),
    ("   \n ", "empty"),
    ("click the button", "Expected ( after Click"),
    ("Tap(1, 2)", 'Unknown action "Tap"'),
    ("None()", 'Unknown action "None"'),
    ("DragTo(1, 2)", 'Unknown action "DragTo"'),
    ("42", "Expected an action"),
    ("Click(1, 2)\nClick(3, 4)", "2 lines"),
    ("Click(1, 2) Click(3, 4)", "Unexpected text after Click"),
    ("Click(1, 2).", "Unexpected text after Click"),
    ("```Click(1, 2)```", "Expected an action"),
    ("Click(12.5, 3)", "whole pixels"),
    ("Click(1e3, 3)", "Expected , or )"),
    ("Click(1, 2", "not closed"),
    ("Click(1 2)", "Expected , or )"),
    ("Click()", "Click takes two whole-pixel coordinates: Click(x, y)"),
    ("Click(1)", "Click takes two whole-pixel coordinates"),
    ("Click(1, 2, 3)", "Click takes two whole-pixel coordinates"),
    ('Click("1", "2")', "Click takes two whole-pixel coordinates"),
    ("Click(x, y)", "Expected a number or a quoted string"),
    ("Text(1, 2)", 'Text takes two whole-pixel coordinates and a quoted string: Text(x, y, "text")'),
    ("Text(1, 2, hello)", "Expected a number or a quoted string"),
    ('Text(1, 2, "")', "at least one character"),
    (f'Text(1, 2, "{"a" * (MAX_TYPED_CHARS + 1)}")', f"at most {MAX_TYPED_CHARS}"),
    ('Text(1, 2, "unclosed)', "not closed with"),
    ("Text(1, 2, 'mixed\")", "not closed with '"),
    (r'Text(1, 2, "bad \q")', r"Unknown escape"),
    ('Text(1, 2, "caf\u00e9")', "printable ASCII"),
    ("Key()", "Key takes one quoted key"),
    ("Key(Enter)", "Expected a number or a quoted string"),
    ('Key("")', "The key is empty"),
    ('Key("Hyper+a")', '"Hyper" in Key("Hyper+a") is not a modifier'),
    ('Key("Shift+Shift+a")', "Shift is named twice"),
    ('Key("Ctrl+Control")', "Ctrl is named twice"),
    ('Key("Ctrl+")', "ends without a key"),
    ('Key("Enterr")', 'Unknown key "Enterr"'),
    ('Key("ab")', 'Unknown key "ab"'),
    ('Key("\u00e9")', "printable ASCII"),
    ('Key("a", "b")', "Key takes one quoted key"),
    ("{}", 'no "action"'),
    ("[1, 2]", "Expected an action"),
])
def test_garbage_is_an_invalid_action_that_says_what_was_wrong(text, says):
  assert says in rejected(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60) | st.from_regex(r"\s*[A-Za-z]{3,12}\s*\(.{0,20}\)?\s*", fullmatch=True))
def test_the_parser_never_raises_and_always_answers_one_way(text):
  action, error = parse_response(text, W, H)
  assert (action is None) != (error == "")
  if action is not None:
    assert parsed(format_action(action)) == action


def test_quote_is_the_canonical_string_literal():
  assert quote('a"b\\c\nd\te') == '"a\\"b\\\\c\\nd\\te"'


# ---- the environment in Chromium ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env():
  env = MiniWoBEnv(task=list(ORACLE_TASKS))
  yield env
  env.close()


def browser_processes():
  """Every Chromium or chromedriver process descended from this test process."""
  found = []
  for p in psutil.Process().children(recursive=True):
    try:
      if p.name() in ("chromium", "chromedriver", "chrome") and p.status() != psutil.STATUS_ZOMBIE:
        found.append(p)
    except psutil.NoSuchProcess:
      pass
  return found


def screen_difference(a, b):
  """How two screenshots differ: the number of pixels and their bounding box (y0, y1, x0, x1)."""
  ys, xs = np.nonzero((a != b).any(axis=-1))
  return len(ys), (ys.min(), ys.max(), xs.min(), xs.max()) if len(ys) else None


def gone(pid):
  """True once process `pid` has ended (a zombie waiting for a reaper counts: it runs nothing)."""
  try:
    return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return True


def test_bad_arguments_are_refused_before_a_browser_starts():
  before = len(browser_processes())
  with pytest.raises(ValueError, match="unknown MiniWoB tasks"):
    MiniWoBEnv(task="click-nothing")
  with pytest.raises(ValueError, match="unknown MiniWoB tasks"):
    MiniWoBEnv(task=[])
  with pytest.raises(ValueError, match="split"):
    MiniWoBEnv(split="validation")
  with pytest.raises(ValueError, match="screenshot_size"):
    MiniWoBEnv(screenshot_size=(0, 10))
  assert len(browser_processes()) == before
  assert len(TASKS) == 130 and set(ORACLE_TASKS) <= set(TASKS)


def test_the_oracle_reaches_success_on_every_oracle_task(env):
  for index, task in enumerate(ORACLE_TASKS):
    for seed in (index, index + len(ORACLE_TASKS), index + 5 * len(ORACLE_TASKS)):
      demo = oracle_episode(env, seed=seed)
      assert demo.task_id == f"{task}:train-{seed}"
      assert demo.success, (task, seed, demo.actions)
      assert len(demo.actions) == (2 if task in ("click-button-sequence", "enter-text") else 1)
      assert all(parsed(a) is not None for a in demo.actions)
  assert env.browser.starts == 1


def test_observations_are_a_screenshot_and_the_utterance_and_the_step_reports_the_task(env):
  observation, info = env.reset(seed=2)  # click-button
  assert env.observation_space.contains(observation)
  screen = observation["screenshot"]
  assert screen.shape == (H, W, 3) and screen.dtype == np.uint8 and not screen.flags.writeable
  assert observation["text"].startswith('Task: Click on the "') and observation["text"] == env.raw_observation()
  assert (screen[:40] == [255, 255, 0]).all(axis=-1).mean() > 0.8  # MiniWoB's yellow utterance bar
  assert info["task_name"] == "click-button" and info["seed"] == "train-2" and info["step"] == 0
  assert not info["success"] and info["feedback"] == ""
  action = env.oracle_action()
  observation, reward, terminated, truncated, info = env.step(f'{{"intent": "press it", "action": "{action}"}}')
  assert (reward, terminated, truncated) == (1.0, True, False)
  assert info["success"] and info["format_ok"] and info["format_reward"] == 1.0 and info["action"] == action
  assert info["intent"] == "press it" and info["raw_reward"] == 1.0
  assert info["feedback"] == "Success: the task was completed in 1 steps (reward 1.00)."
  with pytest.raises(RuntimeError, match="no episode is running"):
    env.step(action)


def test_a_wrong_click_ends_the_episode_with_the_tasks_negative_reward(env):
  env.reset(seed=1)  # click-test-2: TWO (#subbtn2) ends the episode with -1
  rect = env.browser.script("test", "var r = document.getElementById('subbtn2').getBoundingClientRect();"
                                    "return [r.left + r.width / 2, r.top + r.height / 2];")
  _, reward, terminated, truncated, info = env.step(f"Click({int(rect[0])}, {int(rect[1])})")
  assert (reward, terminated, truncated, info["success"]) == (-1.0, True, False, False)
  assert info["feedback"] == "Failure: the task ended with reward -1.00 after 1 steps."


def test_equal_seeds_give_equal_screens_whatever_came_before_and_splits_differ(env):
  other = MiniWoBEnv(task=list(ORACLE_TASKS))
  try:
    seeds = [4, 7, 2, 12]  # click-dialog, enter-text, click-button, click-dialog
    first = {}
    for seed in seeds:
      observation, info = other.reset(seed=seed)
      first[seed] = (observation["screenshot"].copy(), observation["text"], info["state_key"], info["task_id"])
    for seed in reversed(seeds):  # another browser, another order, episodes played in between
      observation, info = env.reset(seed=seed)
      screen, text, key, task_id = first[seed]
      assert np.array_equal(observation["screenshot"], screen), (seed, screen_difference(
          observation["screenshot"], screen))
      assert (observation["text"], info["state_key"], info["task_id"]) == (text, key, task_id)
      oracle_episode(env, seed=seed + 1)
    assert first[4][2] != first[12][2] and not np.array_equal(first[4][0], first[12][0])
    test = MiniWoBEnv(task="enter-text", split="test")
    try:
      names = {test.reset(seed=s)[0]["text"] for s in range(4)}
      train = {env.reset(options={"task_index": ORACLE_TASKS.index("enter-text")}, seed=s)[0]["text"]
               for s in range(4)}
      assert names != train and test.reset(seed=0)[1]["task_id"] == "enter-text:test-0"
    finally:
      test.close()
  finally:
    other.close()


def test_the_state_key_follows_the_screen_not_only_the_utterance(env):
  _, info = env.reset(seed=7)  # enter-text: the utterance stays, the field fills
  observation, _, _, _, after = env.step(env.oracle_action())
  assert observation["text"] == env.raw_observation()
  assert after["state_key"] != info["state_key"]


def test_invalid_actions_cost_a_step_score_zero_and_name_the_expected_form(env, monkeypatch):
  env.reset(seed=2)
  screen = env.screenshot
  for step, response in enumerate(["click it", "Click(500, 10)", 'Key("Hyper+x")', "{not json", 42], start=1):
    observation, reward, terminated, truncated, info = env.step(response)
    assert observation["text"].startswith("Invalid action: ")
    assert "Reply with one action, e.g. Click(12, 40)" in observation["text"] and "x in 0..159, y in 0..209" in \
        observation["text"]
    assert observation["text"].endswith(env.raw_observation())
    assert observation["screenshot"] is screen
    assert env.observation_space.contains(observation)
    assert (reward, info["format_ok"], info["format_reward"], info["action"], info["step"]) == (
        0.0, False, 0.0, None, step)
  assert not (terminated or truncated)
  monkeypatch.setattr(env, "max_steps", 6)
  _, _, terminated, truncated, info = env.step("nothing")
  assert truncated and not terminated and info["feedback"] == "Failure: out of steps (6) with the task unfinished."


def test_every_action_kind_runs_in_the_browser(env, monkeypatch):
  monkeypatch.setattr(env, "max_steps", 20)
  env.reset(seed=7)  # enter-text: a field to type in
  field = "return document.getElementById('tt').value;"
  text_action = env.oracle_action()
  assert text_action.startswith("Text(")
  x, y = (int(v) for v in text_action[5:].split(",")[:2])
  for response in [f"Move({x}, {y})", f"RightClick({x}, {y})", f"DoubleClick({x}, {y})", f"ScrollDown({x}, {y})",
                   f"ScrollUp({x}, {y})", f'Text({x}, {y}, "ab")']:
    _, reward, terminated, truncated, info = env.step(response)
    assert info["format_ok"] and not (terminated or truncated) and reward == 0.0, response
  assert env.browser.script("test", field) == "ab"
  for response, value in [('Key("Shift+k")', "abK"), ('Key("c")', "abKc"), ('Key("Backspace")', "abK"),
                          ('Key("Ctrl+a")', "abK"), ('Key("Delete")', ""), ('Key("Space")', " "),
                          (r'Text(' f'{x}, {y}' r', "q\"\\")', ' q"\\')]:
    _, reward, terminated, truncated, info = env.step(response)
    assert info["format_ok"] and not (terminated or truncated)
    assert env.browser.script("test", field) == value, response
  _, _, terminated, truncated, info = env.step(f'Text({x}, {y}, "\\n")')  # Enter submits nothing here
  assert not terminated and env.browser.script("test", field) == ' q"\\'


def test_the_screenshot_size_rescales_the_screen_and_the_coordinates():
  small = MiniWoBEnv(task=["click-test", "enter-text"], screenshot_size=(105, 80), max_steps=3)
  try:
    assert small.observation_space["screenshot"].shape == (105, 80, 3)
    for seed in range(4):
      demo = oracle_episode(small, seed=seed)
      assert demo.success, demo.actions
      assert demo.observations[0]["screenshot"].shape == (105, 80, 3)
    small.reset(seed=0)
    assert "x in 0..79, y in 0..104" in small.step("Click(100, 10)")[0]["text"]
  finally:
    small.close()


def test_gymnasium_make_builds_it_and_renders_the_screenshot():
  env = gymnasium.make("explore_jax/MiniWoB-v0", task="focus-text", render_mode="rgb_array")
  try:
    observation, info = env.reset(seed=3)
    assert np.array_equal(env.render(), observation["screenshot"])
    _, reward, terminated, _, info = env.step(env.unwrapped.oracle_action())
    assert reward == 1.0 and terminated and info["success"]
  finally:
    env.close()
  with pytest.raises(RuntimeError, match="oracle for"):
    other = MiniWoBEnv(task="click-checkboxes")
    try:
      other.reset(seed=0)
      other.oracle_action()
    finally:
      other.close()


def test_a_browser_killed_mid_episode_ends_only_that_episode_and_reset_starts_a_new_one():
  env = MiniWoBEnv(task="click-button-sequence")
  try:
    env.reset(seed=0)
    env.step(env.oracle_action())  # the first of two clicks
    old_pid, old_driver = env.browser.pid, env.browser.driver_pid
    os.kill(old_pid, signal.SIGKILL)
    assert wait_until(lambda: gone(old_pid))
    with pytest.raises(MiniWoBBrowserError, match="Chromium died during .*the next reset\\(\\) starts a new browser"):
      env.step("Click(5, 5)")
    with pytest.raises(RuntimeError, match="no episode is running"):
      env.step("Click(5, 5)")
    demo = oracle_episode(env, seed=0)  # the same episode again, in a new browser
    assert demo.success and env.browser.starts == 2 and env.browser.pid != old_pid
    assert wait_until(lambda: gone(old_driver))  # the old guardian took chromedriver along

    # A renderer crash leaves Chromium's main process alive but the page dead: the same recovery.
    env.reset(seed=1)
    renderers = [p for p in psutil.Process(env.browser.pid).children(recursive=True)
                 if "--type=renderer" in " ".join(p.cmdline())]
    assert renderers
    for p in renderers:
      p.kill()
    with pytest.raises(MiniWoBBrowserError, match="the next reset\\(\\) starts a new browser"):
      env.step("Click(5, 5)")
    assert oracle_episode(env, seed=1).success and env.browser.starts == 3
  finally:
    env.close()


@pytest.fixture
def short_tmpdirs():
  """Two folders in the system's temporary folder, not pytest's deeper tmp_path: Chromium's socket path inside
  a TMPDIR must stay under 108 characters."""
  dirs = [tempfile.mkdtemp(prefix=p) for p in ("closed-", "killed-")]
  yield dirs
  for d in dirs:
    shutil.rmtree(d, ignore_errors=True)


def test_no_browser_or_its_files_outlive_its_environment_or_its_process(short_tmpdirs, monkeypatch):
  # Every temporary file goes under TMPDIR: the browser's folder, and Chromium's own folders inside it.
  closed, killed = short_tmpdirs
  monkeypatch.setenv("TMPDIR", closed)
  monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile reads TMPDIR again
  env = MiniWoBEnv(task="click-test")
  env.reset(seed=0)
  pids = [env.browser.pid, env.browser.driver_pid]
  assert os.listdir(closed)
  env.close()
  env.close()
  assert wait_until(lambda: all(gone(p) for p in pids))
  assert os.listdir(closed) == []
  # A process killed outright (SIGKILL: no finalizer runs) takes its browser and the browser's files along.
  code = ("from explore_jax.envs.miniwob import MiniWoBEnv\n"
          "env = MiniWoBEnv(task='click-test'); env.reset(seed=0)\n"
          "print(env.browser.pid, env.browser.driver_pid, flush=True)\n"
          "import time; time.sleep(60)\n")
  child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "TMPDIR": killed},
                           cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  try:
    pids = [int(p) for p in child.stdout.readline().split()]
    assert len(pids) == 2 and not any(gone(p) for p in pids)
    assert os.listdir(killed)
  finally:
    child.kill()
    child.wait()
  assert wait_until(lambda: all(gone(p) for p in pids))
  assert wait_until(lambda: not os.listdir(killed), timeout_s=60), os.listdir(killed)


def test_answers_in_eapo_fields_play_their_boxed_action_in_the_browser(env):
  from explore_jax.envs.fields import FieldAnswers

  fields = FieldAnswers(lambda: env)  # not closed here: the module's browser is the world's
  observation, _ = fields.reset(seed=2)  # click-button
  observation, _, _, _, info = fields.step("Click(1, 1)")  # the world's grammar alone is not an answer
  assert info["format_reward"] == 0.0 and observation["text"].startswith("Invalid action: Expected <think>")
  assert observation["screenshot"].shape == env.screenshot.shape
  done = False
  while not done:
    observation, reward, terminated, truncated, info = fields.step(fields.oracle_action())
    assert info["format_reward"] == 1.0 and isinstance(observation, dict)
    done = terminated or truncated
  assert info["success"] and reward > 0
