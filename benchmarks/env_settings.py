"""Benchmark: what a periodic evaluation costs the actors when they keep idle environments of one setting or of
two (rollout.kept_env_settings).

Evaluation plays the held-out split, so its episodes ask for environments of other kwargs than training's. An
actor keeps idle environments for reuse (actors/actor.py EnvCache); with room for one setting, the evaluation
starts its environments afresh and evicts training's, which the next training rollout starts again. For each
setting count, a fresh pool of --actors x --envs_per_actor plays rollouts of one episode per slot, alternately
training and evaluation (--held_out kwargs) as a training run does: training, evaluation (each starts its
environments), then training and evaluation again, whose wall seconds are compared (prints, asserts nothing).
Actions come from benchmarks/envs.py's driver: no model.

  .venv/bin/python benchmarks/env_settings.py [--world alfworld-pick] [--held_out split=valid_unseen]
      [--actors 2] [--envs_per_actor 4]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.envs import TINY, WORLDS, Echo, action_prompt, specs, template_cut  # noqa: E402
from explore_jax.actors import ActorPool  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument("--world", default="alfworld-pick", help=f"one of {', '.join(WORLDS)}")
  parser.add_argument("--held_out", default="split=valid_unseen",
                      help="KEY=VALUE: the evaluation's kwarg (a JSON value, or a string)")
  parser.add_argument("--actors", type=int, default=2)
  parser.add_argument("--envs_per_actor", type=int, default=4)
  args = parser.parse_args()
  key, _, value = args.held_out.partition("=")
  try:
    value = json.loads(value)
  except ValueError:
    pass
  held_out = {key: value}
  slots = args.actors * args.envs_per_actor
  policy = Echo(*template_cut(TINY))
  rows = []
  for kept in (1, 2):
    with ActorPool(num_actors=args.actors, tokenizer_dir=TINY, prompt_hook=action_prompt,
                   envs_per_actor=args.envs_per_actor, episode_timeout_s=300.0, kept_env_settings=kept) as pool:
      times, dropped = [], 0
      for i, overrides in enumerate(({}, held_out, {}, held_out)):
        start = time.perf_counter()
        results, _ = pool.run(specs(args.world, slots, 0, 1000 * i, **overrides), policy)
        times.append(time.perf_counter() - start)
        dropped += sum(r.dropped for r in results)
    rows.append((kept, *times, dropped))
    print(f"kept_env_settings={kept}: training {times[0]:.1f} s, evaluation {times[1]:.1f} s, training again "
          f"{times[2]:.1f} s, evaluation again {times[3]:.1f} s", flush=True)
  print()
  print(f"{args.world}, {args.actors} actors x {args.envs_per_actor} environments, one episode per slot; "
        f"evaluation overrides {held_out}; load average {os.getloadavg()[0]:.1f}")
  print()
  print("| kept_env_settings | training s | evaluation s | training again s | evaluation again s | dropped |")
  print("|---|---|---|---|---|---|")
  for kept, *times, dropped in rows:
    print(f"| {kept} | " + " | ".join(f"{t:.1f}" for t in times) + f" | {dropped} |")


if __name__ == "__main__":
  main()
