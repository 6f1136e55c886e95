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

The random policy (seeded) draws Click 50%, Move 10%, DoubleClick 10%, ScrollDown 10%, Key 10% (Tab, Enter,
a letter) and Text 10% (a short word) at uniform points of the screen, on --task (click-button by default:
random clicks end an episode now and then, as an exploring policy's would).

  .venv/bin/python benchmarks/miniwob_browser.py [--task click-button] [--procs 1,2,4] [--seconds 15] [--steps 200]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import sys
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from explore_jax.envs import oracle_episode  # noqa: E402
from explore_jax.envs.miniwob import ORACLE_TASKS, MiniWoBEnv  # noqa: E402

KINDS = ("Click", "Move", "DoubleClick", "ScrollDown", "Key", "Text")
WEIGHTS = (50, 10, 10, 10, 10, 10)
WORDS = ("hello", "okay", "submit", "Kanesha")


def random_action(rng: random.Random, width: int, height: int) -> tuple[str, str]:
  """(kind, response) of the random policy."""
  kind = rng.choices(KINDS, WEIGHTS)[0]
  x, y = rng.randrange(width), rng.randrange(height)
  if kind == "Key":
    return kind, f'Key("{rng.choice(["Tab", "Enter", "a", "Shift+K"])}")'
  if kind == "Text":
    return kind, f'Text({x}, {y}, "{rng.choice(WORDS)}")'
  return kind, f"{kind}({x}, {y})"


def play(env: MiniWoBEnv, rng: random.Random, seconds: float | None, steps: int | None, seed: int,
         timings: dict[str, list[float]] | None = None) -> tuple[int, int, float]:
  """The random policy until `seconds` of wall time or `steps` steps: (steps, episodes, wall seconds)."""
  done_steps = episodes = 0
  start = time.perf_counter()
  while True:
    now = time.perf_counter()
    if (seconds is not None and now - start >= seconds) or (steps is not None and done_steps >= steps):
      break
    t = time.perf_counter()
    env.reset(seed=seed + episodes)
    if timings is not None:
      timings.setdefault("reset", []).append(time.perf_counter() - t)
    episodes += 1
    done = False
    while not done:
      kind, response = random_action(rng, env.width, env.height)
      t = time.perf_counter()
      _, _, terminated, truncated, _ = env.step(response)
      if timings is not None:
        timings.setdefault(kind, []).append(time.perf_counter() - t)
      done_steps += 1
      done = terminated or truncated
  return done_steps, episodes, time.perf_counter() - start


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


def worker(index: int, task: str, max_steps: int, seconds: float, ready, go, results) -> None:
  """One of the N processes: an environment, a warm-up episode, then the random policy for `seconds`."""
  env = MiniWoBEnv(task=task, max_steps=max_steps)
  try:
    rng = random.Random(index)
    play(env, rng, None, 1, seed=10_000 * index)
    ready.put(index)
    go.wait()
    steps, episodes, wall = play(env, rng, seconds, None, seed=10_000 * index + 100)
    results.put((index, steps, episodes, wall))
  finally:
    env.close()


def measure_procs(n: int, task: str, max_steps: int, seconds: float) -> dict[str, float]:
  ctx = multiprocessing.get_context("spawn")
  ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
  procs = [ctx.Process(target=worker, args=(i, task, max_steps, seconds, ready, go, results)) for i in range(n)]
  for p in procs:
    p.start()
  try:
    for _ in procs:
      ready.get(timeout=120)
    pss = []
    start = time.perf_counter()
    go.set()
    while time.perf_counter() - start < seconds:  # the browsers' memory while they work
      time.sleep(min(1.0, seconds / 4))
      pss.append(browser_pss([p.pid for p in procs]))
    rows = [results.get(timeout=seconds + 120) for _ in procs]
  finally:
    for p in procs:
      p.join(timeout=30)
      if p.is_alive():
        p.kill()
  steps = sum(r[1] for r in rows)
  wall = max(r[3] for r in rows)
  return dict(steps=steps, episodes=sum(r[2] for r in rows), steps_per_s=steps / wall,
              ms_per_step=1e3 * statistics.mean(r[3] / max(r[1], 1) for r in rows), pss=max(pss, default=0))


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
    play(env, rng, None, 20, seed=0)  # warm-up
    timings: dict[str, list[float]] = {}
    steps, episodes, wall = play(env, rng, None, args.steps, seed=1000, timings=timings)
    alone = steps / wall
    invalid = []
    env.reset(seed=0)
    for _ in range(20):
      t = time.perf_counter()
      _, _, terminated, truncated, _ = env.step("not an action")
      invalid.append(time.perf_counter() - t)
      if terminated or truncated:
        env.reset(seed=0)
    invalid_ms = 1e3 * statistics.mean(invalid)
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
  kinds = ", ".join(f"{k} {1e3 * statistics.mean(timings[k]):.0f}" for k in KINDS if k in timings)
  print(f"  step ms by kind (mean): {kinds}")
  print(f"  random policy: {alone:.1f} steps/s ({1e3 / alone:.0f} ms per step, resets included) over {steps} steps, "
        f"{episodes} episodes ({steps / episodes:.1f} steps each)")
  print(f"  oracle episodes: {args.oracle_episodes / oracle_wall:.1f} episodes/s, {oracle_steps / oracle_wall:.1f} "
        f"steps/s ({oracle_steps} steps, resets included) on {len(ORACLE_TASKS)} oracle tasks", flush=True)

  counts = sorted({int(n) for n in args.procs.split(",") if n})
  rows = {}
  for n in counts:
    rows[n] = measure_procs(n, args.task, args.max_steps, args.seconds)
    r = rows[n]
    print(f"N={n}: {r['steps_per_s']:.1f} steps/s over {r['steps']} steps ({r['episodes']} episodes), "
          f"{r['ms_per_step']:.0f} ms per step per process, browsers {r['pss'] / 2**20:.0f} MiB PSS", flush=True)
  load_end = os.getloadavg()

  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  print()
  print(f"CPUs: {os.cpu_count()}, usable {cores}; load average (1 min) {load_start[0]:.1f} at the start, "
        f"{load_end[0]:.1f} at the end; {args.seconds:g} s per N")
  print()
  print("| N processes | steps/s | vs N=1 | ms/step per process | browsers' PSS MiB | per extra browser MiB |")
  print("|---|---|---|---|---|---|")
  base = rows.get(1)
  for n, r in rows.items():
    speedup = f"{r['steps_per_s'] / base['steps_per_s']:.2f}" if base else "-"
    extra = f"{(r['pss'] - base['pss']) / (n - 1) / 2**20:.0f}" if base and n > 1 else "-"
    print(f"| {n} | {r['steps_per_s']:.1f} | {speedup} | {r['ms_per_step']:.0f} | {r['pss'] / 2**20:.0f} | {extra} |")


if __name__ == "__main__":
  main()
