"""Benchmark: MiniWoB-v0 in headless Chromium, one environment alone and N environments in N processes.

(Not benchmarks/miniwob.py: a script run from this folder has it first on sys.path, and a file of that name
would hide the `miniwob` package from every benchmark here.)

Prints, asserts nothing. Every figure is wall time on this machine under whatever load it carries (the load
average is printed with them).

  alone      one environment in this process:
             start      a browser's start (guardian, Chromium, chromedriver, session), mean of --starts
             reset      reset() (a fresh page load, seeding, the first screenshot), mean over the run below
             step       step() per action kind of the random policy below (the action, the task's state,
                        the screenshot) and an invalid action (no browser call)
             screenshot one screenshot alone
             steps/s    the random policy's steps per second, resets included (episodes end on the task's
                        own end or after --max_steps)
             oracle     oracle episodes (reset + the gold clicks) per second on the oracle tasks
  N procs    N spawned processes, one environment each, all running the random policy for --seconds after
             a warm-up episode: steps/s over all of them, mean ms per step, and the browsers' memory: the PSS
             (proportional set size: shared pages split between the processes sharing them) of every
             Chromium and chromedriver process, summed, and per extra browser ((total(N) - total(1)) / (N-1))

The random policy (seeded; benchmarks/gui_bench.py) draws Click 50%, Move 10%, DoubleClick 10%,
ScrollDown 10%, Key 10% (Tab, Enter, a letter) and Text 10% (a short word) at uniform points of the screen, on
--task (click-button by default: random clicks end an episode now and then, as an exploring policy's would).

  .venv/bin/python benchmarks/miniwob_browser.py [--task click-button] [--procs 1,2,4] [--seconds 15] [--steps 200]
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import sys
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.gui_bench import (  # noqa: E402
    ActionMix, invalid_steps, kind_means, measure_counts, play, print_summary)
from explore_jax.envs import oracle_episode  # noqa: E402
from explore_jax.envs.miniwob import ORACLE_TASKS, MiniWoBEnv  # noqa: E402

MIX = ActionMix(kinds=("Click", "Move", "DoubleClick", "ScrollDown", "Key", "Text"), weights=(50, 10, 10, 10, 10, 10),
                words=("hello", "okay", "submit", "Kanesha"), keys=("Tab", "Enter", "a", "Shift+K"))


def browser_pss(root_pids: list[int]) -> int:
  """Bytes of PSS of every Chromium / chromedriver process under the given processes."""
  total = 0
  for pid in root_pids:
    try:
      children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
      continue
    for p in children:
      try:
        if p.name() in ("chromium", "chromedriver", "chrome"):
          total += p.memory_full_info().pss
      except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        pass
  return total


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument("--task", default="click-button")
  parser.add_argument("--max_steps", type=int, default=10)
  parser.add_argument("--steps", type=int, default=200, help="random-policy steps timed alone")
  parser.add_argument("--oracle_episodes", type=int, default=24)
  parser.add_argument("--starts", type=int, default=3)
  parser.add_argument("--procs", default="1,2,4", help="process counts N")
  parser.add_argument("--seconds", type=float, default=15.0, help="wall time of each N-process run")
  args = parser.parse_args()
  load_start = os.getloadavg()

  starts = []
  for _ in range(args.starts):
    t = time.perf_counter()
    env = MiniWoBEnv(task=args.task, max_steps=args.max_steps)
    starts.append(time.perf_counter() - t)
    env.close()

  env = MiniWoBEnv(task=args.task, max_steps=args.max_steps)
  try:
    rng = random.Random(0)
    play(env, MIX, rng, None, 20, seed=0)  # warm-up
    timings: dict[str, list[float]] = {}
    steps, episodes, wall = play(env, MIX, rng, None, args.steps, seed=1000, timings=timings)
    alone = steps / wall
    invalid_ms = 1e3 * statistics.mean(invalid_steps(env))
    t = time.perf_counter()
    for _ in range(20):
      env.browser.screenshot()
    shot_ms = 1e3 * (time.perf_counter() - t) / 20
    one_pss = browser_pss([os.getpid()])
  finally:
    env.close()

  oracle = MiniWoBEnv(task=list(ORACLE_TASKS))
  try:
    oracle_episode(oracle, seed=0)
    t = time.perf_counter()
    oracle_steps = sum(len(oracle_episode(oracle, seed=s).actions) for s in range(args.oracle_episodes))
    oracle_wall = time.perf_counter() - t
  finally:
    oracle.close()

  print(f"alone, task {args.task}, max_steps {args.max_steps}:")
  resets = timings["reset"]
  print(f"  start {statistics.mean(starts):.2f} s (of {args.starts}); reset {1e3 * statistics.mean(resets):.0f} ms "
        f"(median {1e3 * statistics.median(resets):.0f}); screenshot {shot_ms:.1f} ms; invalid action "
        f"{invalid_ms:.2f} ms; one browser {one_pss / 2**20:.0f} MiB PSS")
  kinds = kind_means(timings, MIX)
  print(f"  step ms by kind (mean): {kinds}")
  print(f"  random policy: {alone:.1f} steps/s ({1e3 / alone:.0f} ms per step, resets included) over {steps} steps, "
        f"{episodes} episodes ({steps / episodes:.1f} steps each)")
  print(f"  oracle episodes: {args.oracle_episodes / oracle_wall:.1f} episodes/s, {oracle_steps / oracle_wall:.1f} "
        f"steps/s ({oracle_steps} steps, resets included) on {len(ORACLE_TASKS)} oracle tasks", flush=True)

  make_env = functools.partial(MiniWoBEnv, task=args.task, max_steps=args.max_steps)
  rows = measure_counts(args.procs, make_env, MIX, args.seconds, browser_pss, timeout_s=120, world="browser",
                        rate_digits=1)
  load_end = os.getloadavg()

  print_summary(rows, load_start, load_end, f"{args.seconds:g} s per N", world="browser", rate_digits=1)


if __name__ == "__main__":
  main()
