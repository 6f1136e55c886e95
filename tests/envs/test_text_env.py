"""TextEnv's shared contract on a minimal environment, and the state key."""

import os
import subprocess
import sys

import pytest

from explore_jax.envs import Outcome, TextEnv, excerpt, state_key, text_space

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Counter(TextEnv):
  """Count to a target with "+1"; "boom" makes the grammar itself fail; the clock runs out at 3."""

  response_format = 'Reply "+1".'

  def __init__(self, target=2, clock=None, **kwargs):
    super().__init__(**{"max_steps": 5, **kwargs})
    self.target, self.clock = target, clock

  def _reset_task(self, options):
    self.count = 0
    return options.get("task_id", "count")

  def raw_observation(self):
    return f"count {self.count}"

  def parse_action(self, text):
    if text.strip() == "boom":
      raise ValueError("grammar bug")
    return (1, "") if text.strip() == "+1" else (None, "Not +1.")

  def action_text(self, action):
    return "+1"

  def _apply(self, action):
    self.count += action
    done = self.count >= self.target
    return Outcome(reward=float(done), success=done, terminated=done,
                   truncated=self.clock is not None and self.steps >= self.clock,
                   message="counted")


def test_a_counter_episode_has_the_info_every_method_reads():
  env = Counter()
  observation, info = env.reset(seed=0, options={"task_id": "t7"})
  assert observation == "count 0"
  assert info == dict(
      task_id="t7", state_key=state_key("count 0"), success=False, feedback="", step=0)
  observation, reward, terminated, truncated, info = env.step(" +1\n")
  assert observation == "counted\ncount 1"  # the message is shown, the state key ignores it
  assert info["state_key"] == state_key("count 1")
  assert (reward, terminated, truncated) == (0.0, False, False)
  assert info["format_ok"] and info["format_reward"] == 1.0 and info["action"] == "+1"
  _, reward, terminated, truncated, info = env.step("+1")
  assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
  assert info["feedback"] == "Success in 2 steps."
  with pytest.raises(RuntimeError, match="reset"):
    env.step("+1")
  with pytest.raises(RuntimeError, match="never began"):
    Counter().step("+1")


@pytest.mark.parametrize("response", ["", "-1", "boom", None, 3, b"+1"])
def test_a_bad_response_costs_a_step_and_nothing_else(response):
  env = Counter()
  env.reset(seed=0)
  observation, reward, terminated, truncated, info = env.step(response)
  assert observation.startswith("Invalid action: ")
  assert observation.endswith('Reply "+1".\ncount 0')
  assert (reward, terminated, truncated) == (0.0, False, False)
  assert not info["format_ok"] and info["format_reward"] == 0.0 and info["action"] is None
  assert info["state_key"] == state_key("count 0") and info["step"] == 1


def test_the_step_limit_and_the_environment_clock_truncate():
  env = Counter(target=99)
  env.reset(seed=0)
  results = [env.step("nope") for _ in range(5)]
  assert [r[3] for r in results] == [False] * 4 + [True]
  assert results[-1][4]["feedback"] == "Out of steps."
  env = Counter(target=99, clock=2)
  env.reset(seed=0)
  assert env.step("+1")[3] is False and env.step("+1")[3] is True


def test_an_invalid_render_mode_or_step_limit_is_refused():
  with pytest.raises(ValueError, match="render_mode"):
    Counter(render_mode="human")
  with pytest.raises(ValueError, match="max_steps"):
    Counter(max_steps=0)


def test_state_key_is_a_deterministic_int63_equal_exactly_for_equal_text():
  keys = {state_key(t) for t in ["", "a", "a ", "Room 1/4.", "Room 1/4.\n", "é"]}
  assert len(keys) == 6
  assert all(isinstance(k, int) and 0 <= k < 2**63 for k in keys)
  assert state_key("Room " + "1/4.") == state_key("Room 1/4.")


def test_state_key_is_the_same_in_another_process_with_another_hash_seed():
  texts = ["Room 2/4. Here: key.", "count 0", ""]
  code = ("from explore_jax.envs import state_key; import sys; "
          "print([state_key(t) for t in eval(sys.argv[1])])")
  result = subprocess.run(
      [sys.executable, "-c", code, repr(texts)], capture_output=True, text=True, check=True,
      env={**os.environ, "PYTHONHASHSEED": "12345"}, cwd=ROOT)
  assert eval(result.stdout) == [state_key(t) for t in texts]


def test_excerpt_quotes_any_text_inside_the_observation_charset():
  space = text_space()
  for text in ["go\nup", "é" * 100, "\x00\x01", "ok"]:
    quoted = excerpt(text)
    assert space.contains(quoted) and "\n" not in quoted and len(quoted) <= 43
  assert excerpt("go\n  up") == "go up"
  assert excerpt("x" * 50) == "x" * 40 + "..."


def test_importing_the_environments_does_not_import_jax():
  code = "import sys, explore_jax.envs; print('jax' in sys.modules)"
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=ROOT)
  assert result.stdout.strip() == "False"
