"""What the GUI worlds' benchmarks (benchmarks/desktop.py, benchmarks/miniwob_browser.py) measure alike.

- The random policy: seeded random actions of ScreenExplorer's grammar at uniform points of the screen, drawn
  from a benchmark's own `ActionMix` (which kinds and how often, the words Text types, the keys Key presses),
  and `play`, the loop that plays them (`kind_means`: the mean cost of each kind's steps).
- `invalid_steps`: the cost of an invalid action (no call into the world).
- `measure_procs`: N spawned processes, one environment each, a warm-up episode, then the random policy for a
  given time in all of them at once; the worlds' memory sampled while they run. `measure_counts` runs it for
  each N of a list and prints a line per N.
- `print_summary`: the machine's line and the table of the N-process runs.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import random
import statistics
import time
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class ActionMix:
  """The random policy's draw: a kind by `weights`, a uniform point, a word of `words` for Text, a key of `keys`
  for Key."""

  kinds: tuple[str, ...]
  weights: tuple[float, ...]
  words: tuple[str, ...]
  keys: tuple[str, ...]

  def action(self, rng: random.Random, width: int, height: int) -> tuple[str, str]:
    """(kind, response) of the random policy."""
    kind = rng.choices(self.kinds, self.weights)[0]
    x, y = rng.randrange(width), rng.randrange(height)
    if kind == "Key":
      return kind, f'Key("{rng.choice(self.keys)}")'
    if kind == "Text":
      return kind, f'Text({x}, {y}, "{rng.choice(self.words)}")'
    return kind, f"{kind}({x}, {y})"


def play(env: Any, mix: ActionMix, rng: random.Random, seconds: float | None, steps: int | None, seed: int,
         timings: dict[str, list[float]] | None = None) -> tuple[int, int, float]:
  """The random policy on `env` (a GUI world: width, height, reset, step) until `seconds` of wall time or `steps`
  steps, episode i seeded `seed + i`: (steps, episodes, wall seconds). `timings`, when given, gathers the seconds
  of each reset ("reset") and of each step by its kind."""
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
      kind, response = mix.action(rng, env.width, env.height)
      t = time.perf_counter()
      _, _, terminated, truncated, _ = env.step(response)
      if timings is not None:
        timings.setdefault(kind, []).append(time.perf_counter() - t)
      done_steps += 1
      done = terminated or truncated
  return done_steps, episodes, time.perf_counter() - start


def kind_means(timings: dict[str, list[float]], mix: ActionMix) -> str:
  """"Click 31, Move 12, ...": the mean ms of each kind's steps in `timings` (as `play` gathers them), in the
  mix's order."""
  return ", ".join(f"{k} {1e3 * statistics.mean(timings[k]):.0f}" for k in mix.kinds if k in timings)


def invalid_steps(env: Any, n: int = 20) -> list[float]:
  """The seconds of `n` invalid actions (episodes seeded 0, a new one when the step limit ends one)."""
  seconds = []
  env.reset(seed=0)
  for _ in range(n):
    t = time.perf_counter()
    _, _, terminated, truncated, _ = env.step("not an action")
    seconds.append(time.perf_counter() - t)
    if terminated or truncated:
      env.reset(seed=0)
  return seconds


def worker(index: int, make_env: Callable[[], Any], mix: ActionMix, seconds: float, ready, go, results) -> None:
  """One of the N processes: an environment, a warm-up episode, then the random policy for `seconds`."""
  env = make_env()
  try:
    rng = random.Random(index)
    play(env, mix, rng, None, 1, seed=10_000 * index)
    ready.put(index)
    go.wait()
    steps, episodes, wall = play(env, mix, rng, seconds, None, seed=10_000 * index + 100)
    results.put((index, steps, episodes, wall))
  finally:
    env.close()


def measure_procs(n: int, make_env: Callable[[], Any], mix: ActionMix, seconds: float,
                  pss: Callable[[list[int]], int], timeout_s: float) -> dict[str, float]:
  """N spawned processes, each `make_env()` (picklable: a functools.partial of the environment's class) playing
  `mix` for `seconds` after a warm-up episode (`timeout_s` the longest a start, or an end after `seconds`, may
  take); `pss(pids)` (bytes, given the workers' pids) sampled while they play. The row: steps, episodes,
  steps_per_s over all, ms_per_step (mean per process) and pss (the largest sample)."""
  ctx = multiprocessing.get_context("spawn")
  ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
  procs = [ctx.Process(target=worker, args=(i, make_env, mix, seconds, ready, go, results)) for i in range(n)]
  for p in procs:
    p.start()
  try:
    for _ in procs:
      ready.get(timeout=timeout_s)
    samples = []
    start = time.perf_counter()
    go.set()
    while time.perf_counter() - start < seconds:  # the worlds' memory while they work
      time.sleep(min(1.0, seconds / 4))
      samples.append(pss([p.pid for p in procs]))
    rows = [results.get(timeout=seconds + timeout_s) for _ in procs]
  finally:
    for p in procs:
      p.join(timeout=30)
      if p.is_alive():
        p.kill()
  steps = sum(r[1] for r in rows)
  wall = max(r[3] for r in rows)
  return dict(steps=steps, episodes=sum(r[2] for r in rows), steps_per_s=steps / wall,
              ms_per_step=1e3 * statistics.mean(r[3] / max(r[1], 1) for r in rows), pss=max(samples, default=0))


def measure_counts(counts: str, make_env: Callable[[], Any], mix: ActionMix, seconds: float,
                   pss: Callable[[list[int]], int], timeout_s: float, world: str,
                   rate_digits: int) -> dict[int, dict[str, float]]:
  """`measure_procs` for each N of `counts` ("1,2,4"), smallest first, a line printed as each ends (`world`
  names one environment's programs, steps/s show `rate_digits` decimals): the rows by N."""
  rows = {}
  for n in sorted({int(n) for n in counts.split(",") if n}):
    rows[n] = r = measure_procs(n, make_env, mix, seconds, pss, timeout_s)
    print(f"N={n}: {r['steps_per_s']:.{rate_digits}f} steps/s over {r['steps']} steps ({r['episodes']} episodes), "
          f"{r['ms_per_step']:.0f} ms per step per process, {world}s {r['pss'] / 2**20:.0f} MiB PSS", flush=True)
  return rows


def print_summary(rows: dict[int, dict[str, float]], load_start: tuple[float, ...], load_end: tuple[float, ...],
                  settings: str, world: str, rate_digits: int) -> None:
  """The machine's line (CPUs, load, `settings`), then the table of `measure_procs` rows by N; `world` names one
  environment's programs in the memory columns ("desktop", "browser"), steps/s show `rate_digits` decimals."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  print()
  print(f"CPUs: {os.cpu_count()}, usable {cores}; load average (1 min) {load_start[0]:.1f} at the start, "
        f"{load_end[0]:.1f} at the end; {settings}")
  print()
  print(f"| N processes | steps/s | vs N=1 | ms/step per process | {world}s' PSS MiB | per extra {world} MiB |")
  print("|---|---|---|---|---|---|")
  base = rows.get(1)
  for n, r in rows.items():
    speedup = f"{r['steps_per_s'] / base['steps_per_s']:.2f}" if base else "-"
    extra = f"{(r['pss'] - base['pss']) / (n - 1) / 2**20:.0f}" if base and n > 1 else "-"
    print(f"| {n} | {r['steps_per_s']:.{rate_digits}f} | {speedup} | {r['ms_per_step']:.0f} | "
          f"{r['pss'] / 2**20:.0f} | {extra} |")
