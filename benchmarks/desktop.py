"""Benchmark: Desktop-v0's X desktop, one environment alone and N environments in N processes.

Prints, asserts nothing. Every figure is wall time on this machine under whatever load it carries (the load
average is printed with them).

  alone      one environment in this process:
             start      the first reset of a new environment (Xvfb, openbox, pcmanfm's desktop, drawn)
             reset      reset() of a running one (the old desktop stopped and its folder removed, a new one
                        started and drawn), mean of --resets
             step       step() per action kind with settle_s 0 (the X work alone: xdotool runs, the checks,
                        the screen read) and an invalid action (no X call)
             screenshot one framebuffer read alone
             steps/s    the random policy's steps per second at --settle_s, resets included
             memory     the desktop's PSS (proportional set size, /proc/<pid>/smaps_rollup) summed over its
                        processes, right after a reset and after the random policy has played
  N procs    N spawned processes, one environment each, all running the random policy for --seconds at
             --settle_s: steps/s over all, mean ms per step, and the desktops' PSS summed (sampled while they
             run) and per extra desktop ((total(N) - total(1)) / (N - 1))

The random policy (seeded) draws Click 30%, DoubleClick 20%, Text 15%, Move 10%, ScrollDown 10%, Key 10% (Escape,
Enter, Tab, Ctrl+a), RightClick 5% at uniform points of the screen; episodes are --max_steps long (the desktop
has no task to end one sooner). Double-clicks that land on an icon open programs, so windows pile up as an
exploring policy's would.

  .venv/bin/python benchmarks/desktop.py [--procs 1,2,4] [--seconds 20] [--steps 60] [--settle_s 0.3]
                                         [--screen 640x480]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from explore_jax.envs.desktop.env import DesktopEnv  # noqa: E402

KINDS = ("Click", "DoubleClick", "Text", "Move", "ScrollDown", "Key", "RightClick")
WEIGHTS = (30, 20, 15, 10, 10, 10, 5)
WORDS = ("hello", "ls\\n", "notes", "1+2=")
MARKER = "EXPLORE_JAX_DESKTOP="


def random_action(rng: random.Random, width: int, height: int) -> tuple[str, str]:
  """(kind, response) of the random policy."""
  kind = rng.choices(KINDS, WEIGHTS)[0]
  x, y = rng.randrange(width), rng.randrange(height)
  if kind == "Key":
    return kind, f'Key("{rng.choice(["Escape", "Enter", "Tab", "Ctrl+a"])}")'
  if kind == "Text":
    return kind, f'Text({x}, {y}, "{rng.choice(WORDS)}")'
  return kind, f"{kind}({x}, {y})"


def play(env: DesktopEnv, rng: random.Random, seconds: float | None, steps: int | None, seed: int,
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


def desktop_pss(prefix: str) -> int:
  """Bytes of PSS of every process whose desktop marker names a folder under `prefix`."""
  total = 0
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/environ", "rb") as f:
        marked = any(v.startswith(f"{MARKER}{prefix}".encode()) for v in f.read().split(b"\0"))
      if not marked:
        continue
      with open(f"/proc/{entry}/smaps_rollup") as f:
        total += next(int(line.split()[1]) for line in f if line.startswith("Pss:")) * 1024
    except (OSError, StopIteration, ValueError):
      pass
  return total


def worker(index: int, screen: tuple[int, int], settle_s: float, max_steps: int, seconds: float, ready, go,
           results) -> None:
  """One of the N processes: an environment, a warm-up episode, then the random policy for `seconds`."""
  env = DesktopEnv(screen_size=screen, settle_s=settle_s, max_steps=max_steps)
  try:
    rng = random.Random(index)
    play(env, rng, None, 1, seed=10_000 * index)
    ready.put(index)
    go.wait()
    steps, episodes, wall = play(env, rng, seconds, None, seed=10_000 * index + 100)
    results.put((index, steps, episodes, wall))
  finally:
    env.close()


def measure_procs(n: int, prefix: str, screen: tuple[int, int], settle_s: float, max_steps: int,
                  seconds: float) -> dict[str, float]:
  ctx = multiprocessing.get_context("spawn")
  ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
  procs = [ctx.Process(target=worker, args=(i, screen, settle_s, max_steps, seconds, ready, go, results))
           for i in range(n)]
  for p in procs:
    p.start()
  try:
    for _ in procs:
      ready.get(timeout=180)
    pss = []
    start = time.perf_counter()
    go.set()
    while time.perf_counter() - start < seconds:  # the desktops' memory while they work
      time.sleep(min(1.0, seconds / 4))
      pss.append(desktop_pss(prefix))
    rows = [results.get(timeout=seconds + 180) for _ in procs]
  finally:
    for p in procs:
      p.join(timeout=30)
      if p.is_alive():
        p.kill()
  steps = sum(r[1] for r in rows)
  wall = max(r[3] for r in rows)
  return dict(steps=steps, episodes=sum(r[2] for r in rows), steps_per_s=steps / wall,
              ms_per_step=1e3 * statistics.mean(r[3] / max(r[1], 1) for r in rows), pss=max(pss, default=0))


def run(args: argparse.Namespace, screen: tuple[int, int], prefix: str) -> dict[int, dict[str, float]]:
  """The measurements alone (printed as they come), then the N-process runs: their rows by N."""
  env = DesktopEnv(screen_size=screen, settle_s=0.0, max_steps=args.max_steps)
  try:
    t = time.perf_counter()
    env.reset(seed=0)
    first = time.perf_counter() - t
    fresh_pss = desktop_pss(prefix)
    resets = []
    for seed in range(args.resets):
      t = time.perf_counter()
      env.reset(seed=seed)
      resets.append(time.perf_counter() - t)
    rng = random.Random(0)
    timings: dict[str, list[float]] = {}
    play(env, rng, None, args.kind_steps, seed=1000, timings=timings)
    played_pss = desktop_pss(prefix)
    invalid = []
    env.reset(seed=0)
    for _ in range(20):
      t = time.perf_counter()
      _, _, terminated, truncated, _ = env.step("not an action")
      invalid.append(time.perf_counter() - t)
      if terminated or truncated:
        env.reset(seed=0)
    t = time.perf_counter()
    for _ in range(50):
      env.session.screenshot()
    shot_ms = 1e3 * (time.perf_counter() - t) / 50
  finally:
    env.close()

  env = DesktopEnv(screen_size=screen, settle_s=args.settle_s, max_steps=args.max_steps)
  try:
    steps, episodes, wall = play(env, random.Random(1), None, args.steps, seed=2000)
  finally:
    env.close()

  print(f"alone, {env.width}x{env.height}, max_steps {args.max_steps}:")
  print(f"  start {first:.2f} s; reset {statistics.mean(resets):.2f} s mean (median {statistics.median(resets):.2f}, "
        f"of {args.resets}); screenshot {shot_ms:.2f} ms; invalid action {1e3 * statistics.mean(invalid):.2f} ms")
  kinds = ", ".join(f"{k} {1e3 * statistics.mean(timings[k]):.0f}" for k in KINDS if k in timings)
  print(f"  step ms by kind at settle_s 0 (mean): {kinds}")
  print(f"  random policy at settle_s {args.settle_s:g}: {steps / wall:.2f} steps/s ({1e3 * wall / steps:.0f} ms per "
        f"step, resets included) over {steps} steps, {episodes} episodes")
  print(f"  one desktop: {fresh_pss / 2**20:.0f} MiB PSS after a reset, {played_pss / 2**20:.0f} MiB after "
        f"{args.kind_steps} random steps", flush=True)

  counts = sorted({int(n) for n in args.procs.split(",") if n})
  rows = {}
  for n in counts:
    rows[n] = measure_procs(n, prefix, screen, args.settle_s, args.max_steps, args.seconds)
    r = rows[n]
    print(f"N={n}: {r['steps_per_s']:.2f} steps/s over {r['steps']} steps ({r['episodes']} episodes), "
          f"{r['ms_per_step']:.0f} ms per step per process, desktops {r['pss'] / 2**20:.0f} MiB PSS", flush=True)
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument("--screen", default="640x480", help="the screen's WIDTHxHEIGHT")
  parser.add_argument("--settle_s", type=float, default=0.3)
  parser.add_argument("--max_steps", type=int, default=10)
  parser.add_argument("--steps", type=int, default=60, help="random-policy steps timed alone, at --settle_s")
  parser.add_argument("--kind_steps", type=int, default=80, help="random-policy steps timed at settle_s 0")
  parser.add_argument("--resets", type=int, default=8)
  parser.add_argument("--procs", default="1,2,4", help="process counts N")
  parser.add_argument("--seconds", type=float, default=20.0, help="wall time of each N-process run")
  args = parser.parse_args()
  screen = tuple(int(v) for v in args.screen.split("x"))
  load_start = os.getloadavg()
  # The desktops' folders go under one folder of this run's, so that their processes can be told from others'.
  prefix = tempfile.mkdtemp(prefix="desktop-bench-")
  os.chmod(prefix, 0o711)  # as a desktop's own folder: confined programs (another user) reach theirs through it
  os.environ["TMPDIR"] = prefix  # spawned workers inherit it
  tempfile.tempdir = None

  try:
    rows = run(args, screen, prefix)
  finally:
    shutil.rmtree(prefix, ignore_errors=True)
  load_end = os.getloadavg()

  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  print()
  print(f"CPUs: {os.cpu_count()}, usable {cores}; load average (1 min) {load_start[0]:.1f} at the start, "
        f"{load_end[0]:.1f} at the end; settle_s {args.settle_s:g}, {args.seconds:g} s per N")
  print()
  print("| N processes | steps/s | vs N=1 | ms/step per process | desktops' PSS MiB | per extra desktop MiB |")
  print("|---|---|---|---|---|---|")
  base = rows.get(1)
  for n, r in rows.items():
    speedup = f"{r['steps_per_s'] / base['steps_per_s']:.2f}" if base else "-"
    extra = f"{(r['pss'] - base['pss']) / (n - 1) / 2**20:.0f}" if base and n > 1 else "-"
    print(f"| {n} | {r['steps_per_s']:.2f} | {speedup} | {r['ms_per_step']:.0f} | {r['pss'] / 2**20:.0f} | {extra} |")


if __name__ == "__main__":
  main()
