"""Coding-v0: the response grammar, attempts and feedback, outcomes, the oracle on every task."""

import concurrent.futures
import pathlib
import subprocess
import sys
import threading
import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from explore_jax.envs import MAX_TEXT_LENGTH, oracle_demonstrations, state_key
from explore_jax.envs.coding import OPS, CodingEnv, extract_code
from explore_jax.envs.coding.env import GENERIC_STRATEGY
from tests.envs.test_coding_tasks import _inputs, _op_and_a

WRONG = "### Strategy\nguess\n### Code\ndef f(x):\n    return {expression}\n"


def test_gymnasium_make_and_check_env_accept_the_environment():
  env = gymnasium.make("explore_jax/Coding-v0", num_tasks=8, render_mode="ansi")
  observation, info = env.reset(seed=0)
  assert env.render() == observation and info["task_id"] == env.unwrapped.tasks[0].task_id
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # check_env reports problems as warnings
    check_env(env.unwrapped)
  assert gymnasium.make("explore_jax.envs:explore_jax/Coding-v0", num_tasks=8).reset(seed=0)[0] == (
      observation)


@pytest.mark.parametrize("split", ["train", "test"])
def test_the_oracle_solves_every_procedural_task_at_the_first_attempt(split):
  env = CodingEnv(split=split, num_tasks=64)
  demos = oracle_demonstrations(env, range(64))
  assert all(d.success and len(d.actions) == 1 for d in demos)
  assert [d.task_id for d in demos] == [t.task_id for t in env.tasks]
  action = demos[0].actions[0]
  task = env.tasks[0]
  assert action == f"### Strategy\n{task.strategy}\n### Code\n{task.canonical_solution}"
  assert "```" not in action and len(action) < 90


def test_the_oracle_solves_all_of_humaneval_through_the_environment():
  local = threading.local()

  def solve(index):
    if not hasattr(local, "env"):
      local.env = CodingEnv(dataset="humaneval", time_limit_s=5.0)
    env = local.env
    env.reset(options={"task_index": index})
    action = env.oracle_action()
    _, reward, terminated, _, info = env.step(action)
    return reward, terminated, info["outcome"], info["status"], action

  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    results = list(pool.map(solve, range(164)))
  failed = {i: r[2:4] for i, r in enumerate(results) if r[:4] != (1.0, True, [], "passed")}
  assert not failed, failed
  assert all(r[4].startswith(f"### Strategy\n{GENERIC_STRATEGY}\n### Code\n") for r in results)


def test_a_wrong_operation_fails_twice_then_the_episode_truncates():
  env = CodingEnv(split="test", num_tasks=16)
  observation, info = env.reset(options={"task_index": 3})
  task = env.task
  op, a = _op_and_a(task)
  other = next(o for o in OPS if o is not op and o.name != "mod")
  wrong = WRONG.format(expression=other.expression.format(a=a))
  failing = sorted(t.name for t, x in zip(task.tests, _inputs(task))
                   if other.apply(x, a) != op.apply(x, a))
  first = next(x for x in _inputs(task) if other.apply(x, a) != op.apply(x, a))
  message = f"assert f({first}) == {op.apply(first, a)} (got {other.apply(first, a)})"
  assert observation == task.prompt and "outcome" not in info

  observation, reward, terminated, truncated, info = env.step(wrong)
  assert (reward, terminated, truncated) == (0.0, False, False)
  assert info["outcome"] == failing and info["status"] == "failed" and info["feedback"] == ""
  assert info["format_ok"] and info["action"] == extract_code(wrong)
  assert observation == f"{task.prompt}\nYour previous code failed: {message}"
  assert info["state_key"] == state_key(observation) != state_key(task.prompt)

  observation, reward, terminated, truncated, info = env.step(wrong)
  assert (reward, terminated, truncated) == (0.0, False, True)
  assert info["feedback"] == message and not info["success"] and info["step"] == 2
  with pytest.raises(RuntimeError):
    env.step(wrong)


def test_a_failed_attempt_then_the_right_one_succeeds():
  env = CodingEnv(num_tasks=8)
  env.reset(seed=5)
  _, _, _, _, info = env.step("### Code\ndef f(x):\n    return None\n")
  assert info["status"] == "failed" and len(info["outcome"]) == 4
  observation, reward, terminated, truncated, info = env.step(env.oracle_action())
  assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
  assert info["outcome"] == [] and info["feedback"] == "All tests passed."
  assert observation.startswith("All tests passed.\n")


def test_different_wrong_operations_give_different_outcome_keys():
  env = CodingEnv(split="train", num_tasks=64)
  varied = 0
  for index in range(0, 64, 4):
    env.reset(options={"task_index": index})
    op, a = _op_and_a(env.task)
    outcomes = {}
    for other in OPS:
      if other is op:
        continue
      env.reset(options={"task_index": index})
      _, _, _, _, info = env.step(WRONG.format(expression=other.expression.format(a=a)))
      expected = sorted(t.name for t, x in zip(env.task.tests, _inputs(env.task))
                        if other.apply(x, a) != op.apply(x, a))
      assert info["outcome"] == expected and expected  # only the right operation passes
      outcomes[other.name] = tuple(expected)
    varied += len(set(outcomes.values())) > 1
  assert varied >= 4  # on many tasks the wrong operations fail different sets of tests


MALFORMED = [None, 42, b"### Code\nx = 1", "", "   \n", "def f(x):\n    return x + 1\n",
             "### Strategy\nadd one\n", "### Code\n", "### Code\n```python\n```\n",
             "### Code\n   \n\n", "x" * 200_000, "### Code\n" + "y = 1\n" * MAX_TEXT_LENGTH,
             "ключ 🗝️ ### Code"]


@pytest.mark.parametrize("response", MALFORMED, ids=lambda r: repr(r)[:24])
def test_a_malformed_response_is_an_invalid_action_that_uses_an_attempt(response):
  env = CodingEnv(num_tasks=4, attempts=2)
  env.reset(seed=1)
  observation, reward, terminated, truncated, info = env.step(response)
  assert (reward, terminated, truncated) == (0.0, False, False)
  assert not info["format_ok"] and info["format_reward"] == 0.0 and info["action"] is None
  assert info["outcome"] == ["<invalid>"] and info["status"] == "invalid" and info["step"] == 1
  assert observation.startswith("Invalid action: ") and env.response_format in observation
  assert observation.endswith(env.task.prompt) and len(observation) < 400
  assert env.observation_space.contains(observation)
  _, _, _, truncated, info = env.step(response)
  assert truncated and info["feedback"] == "No attempt gave code to run."


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60))
def test_any_text_steps_without_raising(text):
  env = CodingEnv(num_tasks=4)
  env.reset(seed=0)
  observation, reward, _, _, info = env.step(text)
  assert env.observation_space.contains(observation) and reward in (0.0, 1.0)
  assert info["format_reward"] == float(info["format_ok"])


def test_code_is_taken_from_the_last_code_section_without_fences():
  assert extract_code("### Strategy\ns\n### Code\ndef f(x):\n    return x\n") == (
      "def f(x):\n    return x\n")
  assert extract_code("### Code\n```python\ndef f(x):\n    return x\n```\nIt adds.\n") == (
      "def f(x):\n    return x\n")
  assert extract_code("### Code:\n\n```\nx = 1\n```") == "x = 1\n"
  assert extract_code("### Code\nold = 1\n### Code (fixed)\nnew = 2\n") == "new = 2\n"
  assert extract_code("### Code\nx = 1\n```\ntrailing words\n") == "x = 1\n"
  assert extract_code("no section\n") == "" and extract_code("### Code\n```\n```") == ""


def test_task_selection_is_deterministic():
  first, second = CodingEnv(num_tasks=10), CodingEnv(num_tasks=10)
  for seed in range(25):
    assert first.reset(seed=seed) == second.reset(seed=seed)
    assert first.task_index == seed % 10 and first.task_id == first.tasks[seed % 10].task_id
  observation, info = first.reset(seed=99, options={"task_index": 4})
  assert first.task_index == 4 and observation == first.tasks[4].prompt
  for bad in (10, -1, "3", 2.0, True):
    with pytest.raises(ValueError, match="task_index"):
      first.reset(options={"task_index": bad})
  first.reset(seed=3)
  drawn = [first.reset()[1]["task_id"] for _ in range(5)]  # unseeded: the env's own generator
  second.reset(seed=3)
  assert drawn == [second.reset()[1]["task_id"] for _ in range(5)]
  assert first.num_tasks == len(first.tasks) == 10


@pytest.mark.parametrize("program, status", [
    ("import os\nwhile True:\n    os.fork()\n", "blocked"),
    ("while True:\n    pass\n", "timeout"),
    ("x = bytearray(10**10)\n", "memory"),
    ("import os\nos.kill(os.getppid(), 9)\n", "blocked"),
], ids=["fork-bomb", "endless-loop", "memory", "kill-parent"])
def test_a_hostile_program_fails_its_attempt_and_the_next_episode_runs_normally(program, status):
  env = CodingEnv(num_tasks=4, time_limit_s=1.0)
  env.reset(seed=2)
  observation, reward, _, _, info = env.step(f"### Strategy\nbreak out\n### Code\n{program}")
  assert reward == 0.0 and info["status"] == status and info["outcome"] == [
      "test_0", "test_1", "test_2", "test_3"]
  assert "Your previous code failed: " in observation and len(observation) < 500
  env.reset(seed=2)
  _, reward, terminated, _, info = env.step(env.oracle_action())
  assert (reward, terminated, info["status"]) == (1.0, True, "passed")


def test_feedback_is_cut_to_feedback_chars():
  env = CodingEnv(num_tasks=4, feedback_chars=40)
  env.reset(seed=0)
  observation, *_ = env.step("### Code\ndef f(x):\n    raise ValueError('z' * 1000)\n")
  failure = observation.split("Your previous code failed: ", 1)[1]
  assert len(failure) <= 43 and failure.endswith("...")


def test_datasets_and_options_reach_the_tasks():
  env = CodingEnv(dataset="procedural", split="sft", num_tasks=3, family_seed=4, attempts=1)
  assert env.max_steps == 1 and [t.task_id for t in env.tasks] == [
      f"procedural/4/sft/{i}" for i in range(3)]
  env = CodingEnv(path=str(pathlib.Path(__file__).parents[2] / "third_party" / "coding" / "apps.jsonl"))
  env.reset(options={"task_index": 0})
  _, reward, _, _, info = env.step(env.oracle_action())
  assert reward == 1.0 and info["success"]
  with pytest.raises(ValueError, match="dataset"):
    CodingEnv(dataset="")


def test_the_package_never_imports_jax():
  script = ("import sys, gymnasium, explore_jax.envs.coding\n"
            "env = gymnasium.make('explore_jax/Coding-v0', num_tasks=2)\nenv.reset(seed=0)\n"
            "env.step(env.unwrapped.oracle_action())\nassert 'jax' not in sys.modules\n")
  subprocess.run([sys.executable, "-c", script], check=True)
