"""Benchmark: rollouts whose actors step their environments one after another or at once (rollout.env_threads).

The learner answers a round's requests together; an actor then resets or steps every environment the round
reached. With env_threads=1 it does so one environment after another; with 0 (envs_per_actor threads) the
calls of worlds whose instances are processes of their own (ALFWorld) go out at once, and the actor waits for
the slowest instead of the sum. For each setting, a fresh pool of --actors x --envs_per_actor plays a warm-up
rollout (starting every slot's environment), then --rollouts rollouts of one episode per slot, timed, in
lock-step rounds as training's (batch_wait_s=inf). Actions come from benchmarks/envs.py's driver: no model.
Prints the wall seconds and their ratio, and whether both settings played the same episodes (asserts nothing).

  .venv/bin/python benchmarks/env_threads.py [--world alfworld-pick] [--actors 2] [--envs_per_actor 16]
      [--rollouts 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.envs import TINY, WORLDS, Echo, action_prompt, specs, template_cut  # noqa: E402
from explore_jax.actors import ActorPool  # noqa: E402


def episodes(results):
  return sorted((r.spec.episode_id, r.error, [(s.response_text, s.task_reward, s.state_key) for s in r.steps])
                for r in results)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument("--world", default="alfworld-pick", help=f"one of {', '.join(WORLDS)}")
  parser.add_argument("--actors", type=int, default=2)
  parser.add_argument("--envs_per_actor", type=int, default=16)
  parser.add_argument("--rollouts", type=int, default=2)
  args = parser.parse_args()
  slots = args.actors * args.envs_per_actor
  policy = Echo(*template_cut(TINY))
  rows, played = [], {}
  for threads in (1, 0):
    with ActorPool(num_actors=args.actors, tokenizer_dir=TINY, prompt_hook=action_prompt,
                   envs_per_actor=args.envs_per_actor, episode_timeout_s=300.0, batch_wait_s=float("inf"),
                   env_threads=threads) as pool:
      pool.run(specs(args.world, slots, 0, 0), policy)
      start, results, steps = time.perf_counter(), [], 0
      for i in range(args.rollouts):
        done, metrics = pool.run(specs(args.world, slots, 1000 * (i + 1), 1000 * (i + 1)), policy)
        results += done
        steps += metrics["steps"]
      wall = time.perf_counter() - start
    played[threads] = episodes(results)
    dropped = sum(r.dropped for r in results)
    rows.append((threads, wall, steps, dropped))
    print(f"env_threads={threads}: {wall:.1f} s for {steps} steps ({steps / wall:.0f} steps/s), {dropped} dropped",
          flush=True)
  print()
  print(f"{args.world}, {args.actors} actors x {args.envs_per_actor} environments, {args.rollouts} rollouts of one "
        f"episode per slot; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
  print()
  print("| env_threads | wall s | steps | steps/s | dropped |")
  print("|---|---|---|---|---|")
  for threads, wall, steps, dropped in rows:
    print(f"| {threads} | {wall:.1f} | {steps} | {steps / wall:.0f} | {dropped} |")
  print()
  print(f"one after another / at once: {rows[0][1] / rows[1][1]:.2f}x; the same episodes: {played[1] == played[0]}")


if __name__ == "__main__":
  main()
