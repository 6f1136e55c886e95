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

The random policy (seeded; benchmarks/gui_bench.py) draws Click 30%, DoubleClick 20%, Text 15%, Move 10%,
ScrollDown 10%, Key 10% (Escape, Enter, Tab, Ctrl+a), RightClick 5% at uniform points of the screen; episodes
are --max_steps long (the desktop has no task to end one sooner). Double-clicks that land on an icon open
programs, so windows pile up as an exploring policy's would.

  .venv/bin/python benchmarks/desktop.py [--procs 1,2,4] [--seconds 20] [--steps 60] [--settle_s 0.3]
                                         [--screen 640x480]
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.gui_bench import (  # noqa: E402
    ActionMix, invalid_steps, kind_means, measure_counts, play, print_summary)
from explore_jax.envs.desktop.env import DesktopEnv  # noqa: E402

MIX = ActionMix(kinds=("Click", "DoubleClick", "Text", "Move", "ScrollDown", "Key", "RightClick"),
                weights=(30, 20, 15, 10, 10, 10, 5), words=("hello", "ls\\n", "notes", "1+2="),
                keys=("Escape", "Enter", "Tab", "Ctrl+a"))
MARKER = "EXPLORE_JAX_DESKTOP="


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
    play(env, MIX, rng, None, args.kind_steps, seed=1000, timings=timings)
    played_pss = desktop_pss(prefix)
    invalid = invalid_steps(env)
    t = time.perf_counter()
    for _ in range(50):
      env.session.screenshot()
    shot_ms = 1e3 * (time.perf_counter() - t) / 50
  finally:
    env.close()

  env = DesktopEnv(screen_size=screen, settle_s=args.settle_s, max_steps=args.max_steps)
  try:
    steps, episodes, wall = play(env, MIX, random.Random(1), None, args.steps, seed=2000)
  finally:
    env.close()

  print(f"alone, {env.width}x{env.height}, max_steps {args.max_steps}:")
  print(f"  start {first:.2f} s; reset {statistics.mean(resets):.2f} s mean (median {statistics.median(resets):.2f}, "
        f"of {args.resets}); screenshot {shot_ms:.2f} ms; invalid action {1e3 * statistics.mean(invalid):.2f} ms")
  kinds = kind_means(timings, MIX)
  print(f"  step ms by kind at settle_s 0 (mean): {kinds}")
  print(f"  random policy at settle_s {args.settle_s:g}: {steps / wall:.2f} steps/s ({1e3 * wall / steps:.0f} ms per "
        f"step, resets included) over {steps} steps, {episodes} episodes")
  print(f"  one desktop: {fresh_pss / 2**20:.0f} MiB PSS after a reset, {played_pss / 2**20:.0f} MiB after "
        f"{args.kind_steps} random steps", flush=True)

  make_env = functools.partial(DesktopEnv, screen_size=screen, settle_s=args.settle_s, max_steps=args.max_steps)
  return measure_counts(args.procs, make_env, MIX, args.seconds, lambda pids: desktop_pss(prefix), timeout_s=180,
                        world="desktop", rate_digits=2)


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

  print_summary(rows, load_start, load_end, f"settle_s {args.settle_s:g}, {args.seconds:g} s per N", world="desktop",
                rate_digits=2)


if __name__ == "__main__":
  main()
