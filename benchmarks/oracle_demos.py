"""Benchmark: an SFT warm start's oracle demonstrations, played on one ALFWorld instance or on several at once.

The ALFWorld configs' warm start plays the search oracle on `sft.oracle_episodes` training games (2,048 in the
protocol's ws2048 arm). ALFWorld declares a seeded oracle, so train/sft_data.py plays them on several instances
(each its own game process, one thread each). This times the same episodes, in the same prompts, for each
--workers count, and checks that every count gives exactly the demonstrations of one instance. The games are
generated first (not timed) into the usual cache, so the figures are the playing alone.

  .venv/bin/python benchmarks/oracle_demos.py [--episodes 64] [--workers 1,2,4]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import textworlds  # noqa: E402
from explore_jax.methods.base import ObservationPrompt  # noqa: E402
from explore_jax.train import sft_data  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument("--episodes", type=int, default=64, help="oracle episodes (training games 500, 501, ...)")
  parser.add_argument("--workers", default="1,2,4", help="instances at once, comma-separated")
  args = parser.parse_args()
  c = textworlds.get_config("gigpo", "alfworld")
  kwargs = {**c.env.kwargs, **c.sft.env_kwargs, "max_receptacles": 10}
  hook = ObservationPrompt(system=c.system_prompt, action_history=c.action_history)
  seeds = range(c.sft.oracle_seed_offset, c.sft.oracle_seed_offset + args.episodes)
  reference = sft_data.oracle_sft_demos(c.env.id, kwargs, seeds, hook, workers=1)  # generates missing games
  print(f"{args.episodes} search episodes ({len(reference)} demonstrated steps), {os.cpu_count()} cores")
  base = None
  for workers in (int(w) for w in args.workers.split(",")):
    start = time.perf_counter()
    demos = sft_data.oracle_sft_demos(c.env.id, kwargs, seeds, hook, workers=workers)
    seconds = time.perf_counter() - start
    base = base or seconds
    same = "same demonstrations" if demos == reference else "DIFFERENT demonstrations"
    print(f"  workers {workers}: {seconds:6.1f} s  {args.episodes / seconds:5.1f} episodes/s  "
          f"{base / seconds:4.2f}x  {same}")


if __name__ == "__main__":
  main()
