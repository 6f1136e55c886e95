"""Coding tasks: the procedural family's design, HumanEval through the sandbox, JSONL datasets."""

import collections
import concurrent.futures
import gzip
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from explore_jax.envs.coding import (OPS, SPLITS, TestCase, humaneval_tasks, load_jsonl_tasks,
                                     make_tasks, procedural_split, procedural_tasks, run_program)
from explore_jax.envs.coding.tasks import humaneval_data_path, split_check

FIXTURES = pathlib.Path(__file__).parents[2] / "third_party" / "coding"  # records from MBPP and LeetCodeDataset
ROOT = pathlib.Path(__file__).parents[2]
ASSERT = re.compile(r"assert f\((-?\d+)\) == (-?\d+)$")


def _inputs(task):
  return [int(ASSERT.match(t.code).group(1)) for t in task.tests]


def _op_and_a(task):
  for op in OPS:
    for a in range(2, 10):
      if task.canonical_solution == f"def f(x):\n    return {op.expression.format(a=a)}\n":
        return op, a
  raise AssertionError(task)


def _run_all(jobs, workers=4):
  """run_program(*args, **kwargs) for every job, on a few threads (subprocesses release the GIL)."""
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    return list(pool.map(lambda job: run_program(*job[0], **job[1]), jobs))


# ---- the procedural family ---------------------------------------------------------------------------


def test_the_operations_and_their_texts():
  assert [(op.name, op.weight) for op in OPS] == [
      ("add", 0.30), ("mul", 0.25), ("sub", 0.20), ("mod", 0.10), ("max", 0.08), ("min", 0.07)]
  assert [op.strategy.format(a=3) for op in OPS] == [
      "add 3 to x", "multiply x by 3", "subtract 3 from x", "take x modulo 3",
      "take the larger of x and 3", "take the smaller of x and 3"]
  assert [op.expression.format(a=3) for op in OPS] == [
      "x + 3", "x * 3", "x - 3", "x % 3", "max(x, 3)", "min(x, 3)"]


@pytest.mark.parametrize("split", SPLITS)
def test_every_task_follows_the_design(split):
  tasks = procedural_tasks(split, 300, family_seed=1)
  assert len({t.task_id for t in tasks}) == 300
  for task in tasks:
    op, a = _op_and_a(task)
    assert task.strategy == op.strategy.format(a=a) and task.entry_point == "f"
    xs = _inputs(task)
    assert [t.name for t in task.tests] == ["test_0", "test_1", "test_2", "test_3"]
    assert len(set(xs)) == 4 and all(-5 <= x <= 20 for x in xs)
    assert [t.code for t in task.tests] == [f"assert f({x}) == {op.apply(x, a)}" for x in xs]
    for other in OPS:  # only the task's own operation passes every test
      if other is not op:
        assert any(other.apply(x, a) != op.apply(x, a) for x in xs), (task, other.name)
    named = f"Write a Python function f(x) that {op.phrase.format(a=a)}."
    if task.prompt != named:
      hidden = rf"Write a Python function f\(x\) that combines x with {a}\. "
      example = re.fullmatch(hidden + r"Example: f\((\d+)\) == (-?\d+)\.", task.prompt)
      assert example, task.prompt
      x0, y0 = int(example.group(1)), int(example.group(2))
      assert 0 <= x0 <= 12 and y0 == op.apply(x0, a) and xs[0] == x0
    assert procedural_split(task.prompt, 1) == split
  named_share = sum("Example" not in t.prompt for t in tasks) / len(tasks)
  assert 0.4 < named_share < 0.6


def test_operations_are_drawn_with_their_weights():
  counts = collections.Counter(_op_and_a(t)[0].name
                               for split in SPLITS for t in procedural_tasks(split, 1000))
  for op in OPS:  # pooled over the splits; each split leans to the prompts it holds
    assert abs(counts[op.name] / 3000 - op.weight) < 0.04, counts


def test_splits_share_no_prompt_and_streams_are_prefix_stable():
  for seed in (0, 1, 7):
    prompts = {split: {t.prompt for t in procedural_tasks(split, 400, seed)} for split in SPLITS}
    assert not prompts["train"] & prompts["test"]
    assert not prompts["train"] & prompts["sft"] and not prompts["test"] & prompts["sft"]
  assert procedural_tasks("train", 64)[:10] == procedural_tasks("train", 10)
  assert procedural_tasks("train", 20, 0) != procedural_tasks("train", 20, 1)
  assert procedural_tasks("train", 20) != procedural_tasks("test", 20)
  with pytest.raises(ValueError, match="split"):
    procedural_tasks("valid", 4)


def _digest(tasks):
  return hashlib.sha256(repr(tasks).encode()).hexdigest()


def test_tasks_are_the_same_in_every_process():
  script = ("from explore_jax.envs.coding import procedural_tasks\nimport hashlib\n"
            "print(hashlib.sha256(repr(procedural_tasks('test', 50, 3)).encode()).hexdigest())")
  digests = {subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, text=True,
                            capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed}
                            ).stdout.strip() for seed in ("1", "2")}
  assert digests == {_digest(procedural_tasks("test", 50, 3))}


def test_canonical_solutions_pass_and_other_operations_fail_in_the_sandbox():
  tasks = procedural_tasks("test", 12)
  jobs, expected = [((t.canonical_solution, t.tests), {}) for t in tasks], []
  for task in tasks:
    op, a = _op_and_a(task)
    other = next(o for o in OPS if o is not op)
    jobs.append(((f"def f(x):\n    return {other.expression.format(a=a)}\n", task.tests), {}))
    expected.append(tuple(t.name for t, x in zip(task.tests, _inputs(task))
                          if other.apply(x, a) != op.apply(x, a)))
  results = _run_all(jobs)
  assert all(r.passed for r in results[:len(tasks)])
  assert [r.failing for r in results[len(tasks):]] == expected and all(expected)


# ---- HumanEval ---------------------------------------------------------------------------------------


def test_humaneval_has_164_tasks_split_into_many_tests():
  tasks = humaneval_tasks()
  assert len(tasks) == 164 and len({t.task_id for t in tasks}) == 164
  assert tasks[0].task_id == "HumanEval/0" and tasks[0].entry_point == "has_close_elements"
  assert sum(len(t.tests) for t in tasks) > 1000  # one per assert, `assert True` dropped
  assert all(t.canonical_solution.startswith(t.prompt.split(":\n", 1)[1]) for t in tasks)
  helpers = {t.task_id: t.setup for t in tasks}
  assert "def encode_cyclic" in helpers["HumanEval/38"] and "def decode_cyclic" not in helpers[
      "HumanEval/38"]
  assert humaneval_tasks() == tasks  # read once


def test_a_humaneval_solution_that_returns_nothing_fails_every_task():
  with gzip.open(humaneval_data_path(), "rt") as f:
    records = [json.loads(line) for line in f]
  jobs = [((r["prompt"] + body, t.tests), dict(setup=t.setup, time_limit_s=5.0))
          for r, t in zip(records, humaneval_tasks()) for body in ("    return None\n",)]
  results = _run_all(jobs)
  assert not [t.task_id for t, r in zip(humaneval_tasks(), results) if r.passed]
  assert {r.status for r in results} == {"failed"}
  assert results[0].message.endswith("(got None)")


def test_split_check_makes_one_test_per_assert_with_the_statements_before_it():
  source = ("import math\nMETADATA = {}\n\ndef check(candidate):\n    base = 2\n"
            "    assert candidate(base) == 4\n    assert True\n    extra = math.floor(2.5)\n"
            "    for x in range(3):\n        assert candidate(x) == x * x\n"
            "    assert candidate(extra) == 4, 'message'\n")
  tests = split_check(source, "square")
  assert [t.name for t in tests] == ["test_0", "test_1", "test_2"]
  assert "extra = " not in tests[0].code and "extra = math.floor(2.5)" in tests[2].code
  assert "for x in range(3)" not in tests[2].code and "assert True" not in tests[1].code
  program = "def square(x):\n    return x * x\n"
  assert run_program(program, tests).passed
  result = run_program("def square(x):\n    return x + x\n", tests)
  assert result.failing == ("test_1",) and result.message == "assert candidate(x) == x * x (got 2)"
  whole = split_check("def check(a, b):\n    pass\n", "f")
  assert len(whole) == 1 and whole[0].code.endswith("check(f)\n")


class _Finaliser:
  """Cyclic garbage whose finaliser runs Python code: a collection during a tree conversion then
  lets another thread run in the middle of it."""

  def __del__(self):
    sum(range(50))


def test_splitting_and_compiling_tests_is_safe_from_several_threads():
  # On CPython 3.11 this harness makes plain ast.parse fail within a fraction of a second with
  # "SystemError: AST constructor recursion depth mismatch"; environments run in threads.
  source = "def check(candidate):\n" + "".join(
      f"    assert candidate({i}) == [{i}, ({i}, {{'a': [{i}]}})]\n" for i in range(40))
  interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-6)

  def work(seed):
    for _ in range(60):
      for _ in range(50):
        garbage = _Finaliser()
        garbage.cycle = garbage
      tests = split_check(source + f"    assert candidate(-{seed}) == -1\n", "f")
      assert len(tests) == 41
    return seed

  try:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
      assert sorted(pool.map(work, range(4))) == [0, 1, 2, 3]
  finally:
    sys.setswitchinterval(interval)


# ---- JSONL datasets ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name, ids", [
    ("mbpp", ["MBPP/2", "MBPP/3", "MBPP/9001"]),
    ("leetcode", ["LeetCode/two-sum", "LeetCode/palindrome-number"]),
    ("apps", ["APPS/4001", "APPS/4002", "APPS/2001"])])
def test_jsonl_records_become_tasks_whose_solutions_pass(name, ids):
  tasks = load_jsonl_tasks(FIXTURES / f"{name}.jsonl")
  assert [t.task_id for t in tasks] == ids
  assert load_jsonl_tasks(FIXTURES / f"{name}.jsonl", format=name) == tasks
  assert make_tasks(str(FIXTURES / f"{name}.jsonl")) == tasks
  jobs = [((t.canonical_solution, t.tests), dict(setup=t.setup)) for t in tasks]
  jobs += [(("class Solution:\n    pass\nprint(0)\n", t.tests), dict(setup=t.setup)) for t in tasks]
  results = _run_all(jobs)
  assert [r.status for r in results[:len(tasks)]] == ["passed"] * len(tasks), results
  assert all(r.status == "failed" and r.message for r in results[len(tasks):]), results


def test_dataset_fields_are_read_as_their_harnesses_do():
  mbpp = load_jsonl_tasks(FIXTURES / "mbpp.jsonl")
  assert [t.entry_point for t in mbpp] == ["similar_elements", "is_not_prime", "hypotenuse"]
  assert mbpp[2].setup == "from math import sqrt, isclose"
  assert mbpp[0].prompt.startswith("Write a function to find the shared elements")
  assert "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))" in mbpp[0].prompt
  two_sum, palindrome = load_jsonl_tasks(FIXTURES / "leetcode.jsonl")
  assert two_sum.entry_point == "Solution().twoSum" and "from typing import *" in two_sum.setup
  assert two_sum.prompt.endswith("def twoSum(self, nums: List[int], target: int) -> List[int]:")
  assert palindrome.prompt.startswith("You are an expert Python programmer")  # only `query`
  assert len(palindrome.tests) == 4  # `assert True` dropped, the loop is one test
  add, lines, calls = load_jsonl_tasks(FIXTURES / "apps.jsonl")
  assert [t.stdin for t in add.tests] == ["1 2\n", "-5 5\n", "1000000000 1000000000\n"]
  assert calls.entry_point == "maxSubArray" and all(t.stdin is None for t in calls.tests)
  result = run_program("n = int(input())\nprint(*range(1, n + 1), sep='\\n')\n", lines.tests)
  assert result.failing == ("test_0", "test_1") and result.message.startswith("On input '3\\n': ")


@pytest.mark.parametrize("line, match", [
    ('{"task_id": 1, "text": "t", "code": "c"}',
     r"bad\.jsonl:2: the mbpp record lacks the field 'test_list'"),
    ('{"problem_id": 1, "question": "q"}',
     r"bad\.jsonl:2: the apps record lacks the field 'input_output'"),
    ('{"task_id": "x", "query": "q", "entry_point": "f"}',
     r"bad\.jsonl:2: the leetcode record lacks the field 'test'"),
    ('{"question": "q", "problem_id": 1, '
     '"input_output": "{\\"inputs\\": [\\"1\\"], \\"outputs\\": []}"}',
     r"bad\.jsonl:2: the apps record lacks the field 'input_output' with equally long"),
    ('{"task_id": 1, "text": "t", "code": "c", "test_list": []}', r"bad\.jsonl:2: .* has no tests"),
    ('{"name": "x"}', r"bad\.jsonl:2: cannot tell the format of a record with fields \['name'\]"),
    ('{"task_id": 1,', r"bad\.jsonl:2: not valid JSON"),
    ('[1, 2]', r"bad\.jsonl:2: expected a JSON object, got list"),
])
def test_a_malformed_record_names_its_line_and_what_is_missing(tmp_path, line, match):
  good = (FIXTURES / "mbpp.jsonl").read_text().splitlines()[0]
  path = tmp_path / "bad.jsonl"
  path.write_text(f"{good}\n{line}\n\n")
  with pytest.raises(ValueError, match=match):
    load_jsonl_tasks(path)


def test_make_tasks_picks_the_source_by_name(tmp_path):
  assert make_tasks("procedural", split="test", num_tasks=5, family_seed=2) == procedural_tasks(
      "test", 5, 2)
  assert len(make_tasks("humaneval")) == 164
  assert make_tasks("jsonl", path=str(FIXTURES / "apps.jsonl")) == load_jsonl_tasks(
      FIXTURES / "apps.jsonl")
  for bad in ("", "mbpp", str(tmp_path / "missing.txt")):
    with pytest.raises(ValueError, match="dataset must be"):
      make_tasks(bad)
  with pytest.raises(ValueError, match="format"):
    load_jsonl_tasks(FIXTURES / "apps.jsonl", format="csv")
  assert isinstance(make_tasks("procedural", num_tasks=1)[0].tests[0], TestCase)
