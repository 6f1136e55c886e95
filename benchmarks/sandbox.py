"""Benchmark: the coding sandbox's cost per attempt and per test call (prints, asserts nothing).

Every attempt starts one sandboxed interpreter, so an attempt costs about one interpreter start-up plus
its tests. Measured, one attempt at a time (no threads), with the canonical solutions:

  procedural   a procedural task (4 tests `assert f(x) == y`): the tiny model's RL workload
  humaneval    HumanEval/141, the HumanEval task with the most tests (26 asserts)
  per call     the slope between a task of 1 test and one of 201 tests `assert f(i) == 3 * i`:
               what each further test call adds to an attempt
  rl batch     32 procedural tasks, half answered right and half with another operation (failing
               tests, messages), on 4 threads as an actor's environments run: the environment
               time of one RL iteration of the tiny model's workload (wall ms per batch; one
               batch every 10 rounds)

Each figure is the median of --repeats attempts (the rounds alternate between the workloads, so a
change of load on a shared machine touches all of them alike); p10 and p90 follow in brackets.
`--compare=PATH` also measures another copy of sandbox.py (e.g. an older one, with its _runner.py
beside it), its attempts interleaved with the project's, and prints the ratios of the medians.

  .venv/bin/python benchmarks/sandbox.py [--repeats 60] [--isolate auto|false] [--compare PATH]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from explore_jax.envs.coding import TestCase, humaneval_tasks, procedural_tasks  # noqa: E402
from explore_jax.envs.coding import sandbox as project_sandbox  # noqa: E402


def load_sandbox(path: str):
  """The copy of sandbox.py at `path`, loaded under a name of its own."""
  spec = importlib.util.spec_from_file_location("compared_sandbox", os.path.abspath(path))
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up
  spec.loader.exec_module(module)
  return module


def quantiles(seconds: list[float]) -> str:
  cuts = statistics.quantiles(seconds, n=10)
  return (f"{statistics.median(seconds) * 1e3:7.2f} ms  "
          f"[p10 {cuts[0] * 1e3:.2f}, p90 {cuts[-1] * 1e3:.2f}]")


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument("--repeats", type=int, default=60)
  parser.add_argument("--isolate", choices=("auto", "false"), default="auto")
  parser.add_argument("--compare", default=None, help="another sandbox.py to measure alongside")
  args = parser.parse_args()
  sandboxes = {"project": project_sandbox}
  if args.compare:
    sandboxes["compared"] = load_sandbox(args.compare)
  isolate = "auto" if args.isolate == "auto" else False

  procedural = procedural_tasks("train", 1)[0]
  humaneval = next(t for t in humaneval_tasks() if t.task_id == "HumanEval/141")
  triple = "def f(x):\n    return 3 * x\n"
  workloads = {
      "procedural": (procedural.canonical_solution, procedural.tests, procedural.setup),
      "humaneval": (humaneval.canonical_solution, humaneval.tests, humaneval.setup),
      "1 call": (triple, (TestCase("t0", "assert f(0) == 0"),), ""),
      "201 calls": (triple, tuple(TestCase(f"t{i}", f"assert f({i}) == {3 * i}")
                                  for i in range(201)), ""),
  }

  def attempt(sandbox, name: str) -> float:
    program, tests, setup = workloads[name]
    start = time.perf_counter()
    result = sandbox.run_program(program, tests, setup=setup, time_limit_s=10.0,
                                 isolate_network=isolate)
    seconds = time.perf_counter() - start
    if not result.passed:
      raise SystemExit(f"{name}: the canonical solution did not pass: {result}")
    return seconds

  wrong = "def f(x):\n    return x + 1\n"  # no task adds 1 (a is at least 2)
  batch = [(wrong if i % 2 else task.canonical_solution, task.tests)
           for i, task in enumerate(procedural_tasks("test", 32))]

  def rl_batch(sandbox) -> float:
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
      list(pool.map(lambda job: sandbox.run_program(*job, isolate_network=isolate), batch))
    return time.perf_counter() - start

  for sandbox in sandboxes.values():  # warm-up: caches, the namespace probe
    for name in workloads:
      attempt(sandbox, name)
    rl_batch(sandbox)
  times = {(which, name): [] for which in sandboxes for name in [*workloads, "rl batch"]}
  for round_ in range(args.repeats):
    for name in workloads:
      for which, sandbox in sandboxes.items():
        times[which, name].append(attempt(sandbox, name))
    if round_ % 10 == 0:
      for which, sandbox in sandboxes.items():
        times[which, "rl batch"].append(rl_batch(sandbox))

  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  print(f"network namespace: {isolate == 'auto' and project_sandbox.network_isolation_available()}, "
        f"repeats {args.repeats}, load average at the end {load:.2f}")
  for which, sandbox in sandboxes.items():
    print(f"{which}: {sandbox.__file__}")
    for name in workloads:
      print(f"  {name:<11} {len(workloads[name][1]):>3} tests  {quantiles(times[which, name])} "
            "per attempt")
    slope = (statistics.median(times[which, "201 calls"])
             - statistics.median(times[which, "1 call"])) / 200
    print(f"  per call    {slope * 1e3:.3f} ms  (201 calls vs 1, medians)")
    print(f"  rl batch     32 attempts  {statistics.median(times[which, 'rl batch']) * 1e3:7.1f} ms "
          f"per batch (median of {len(times[which, 'rl batch'])})")
  if args.compare:
    def ratio(name: str) -> float:
      return statistics.median(times["project", name]) / statistics.median(times["compared", name])

    ratios = ", ".join(f"{name} {ratio(name):.2f}" for name in [*workloads, "rl batch"])
    print(f"project / compared, medians: {ratios}")


if __name__ == "__main__":
  main()
