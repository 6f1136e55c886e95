"""Benchmark: a group of ALFWorld environments resetting to one new game at once.

A GRPO/GiGPO group is `group_size` environments of one game. With a fresh game per group (rollout.task_pool 0)
every group's reset is the game's first: it must be generated and checked by the planner (games.py) before
the game processes load it. One process of the group plans the game while the others wait for its copy
(a lock beside the game). For each of --games new games this times the group's reset three ways, on fresh caches:
  - one cache (as actors share one): one process plans, the others wait and load;
  - a cache per environment: every process plans its own copy (what a group cost without the lock);
  - the game already on disk (planned beforehand by another environment): every process only loads it.

  .venv/bin/python benchmarks/alfworld_new_games.py [--group 8] [--games 4]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from explore_jax.envs.alfworld.env import ALFWorldEnv  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument("--group", type=int, default=8, help="environments resetting to one game at once")
  parser.add_argument("--games", type=int, default=4, help="games timed, each of the three ways")
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as root:
    def make(cache: str) -> ALFWorldEnv:
      return ALFWorldEnv(split="train", task_types=["pick_and_place_simple"], max_receptacles=10,
                         cache_dir=os.path.join(root, cache))
    shared = [make("shared") for _ in range(args.group)]
    own = [make(f"own{i}") for i in range(args.group)]
    planner = make("shared")
    envs = [*shared, *own, planner]
    try:
      with concurrent.futures.ThreadPoolExecutor(args.group) as pool:
        def group_reset(group: list[ALFWorldEnv], seed: int) -> float:
          start = time.perf_counter()
          list(pool.map(lambda env: env.reset(seed=seed), group))
          return time.perf_counter() - start

        for env in envs:  # start every game process
          env.reset(seed=0)
        one, each, loaded = [], [], []
        for i in range(1, args.games + 1):
          one.append(group_reset(shared, i))
          each.append(group_reset(own, i))
          planner.reset(seed=1000 + i)  # another game, on disk before the group's reset
          loaded.append(group_reset(shared, 1000 + i))
    finally:
      for env in envs:
        env.close()
  print(f"| a group of {args.group} resetting at once to | mean s | max s |")
  print("|---|---|---|")
  for name, times in (("a new game, one cache: one process plans it", one),
                      ("a new game, a cache per environment: each plans it", each),
                      ("a game on disk: each loads it", loaded)):
    print(f"| {name} | {statistics.mean(times):.2f} | {max(times):.2f} |")
  print(f"\n{args.games} games; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
  main()
