"""Benchmark: what EMPO²'s tips, memory and novelty cost an iteration, against GRPO on the same world and recipe.

Runs launch/train.py with configs/empo2_twx.py and configs/grpo_twx.py (the same tiny TextWorld-Express recipe:
EMPO² is GRPO plus its parts), in the order ABBA so that a drifting load hits both alike, one shared cache (each
config's SFT warm start is computed before its first timed run), and prints per config the median over the
iterations after the first (which compiles) of:

  iter s       time_iteration_s
  rollout s    time_rollout_s: EMPO²'s includes writing a tip per episode (rollout.final_max_new_tokens) and the
               retrieval queries' embedding round trips
  update s     time_update_s: EMPO²'s records carry the tips in their prompts
  rest s       iter - rollout - update: EMPO²'s `observe` (every step's state and every tip's key through
               all-MiniLM-L6-v2) and the records
  prompt tok   the update's tokens

and the ratio of the medians' iteration times. Prints, asserts nothing; the load average is printed per run.

  .venv/bin/python benchmarks/empo2_overhead.py [--iterations 4] [--root runs/bench/empo2] [-- --config.x=y ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {"empo2": "configs/empo2_twx.py", "grpo": "configs/grpo_twx.py"}


def run(name: str, workdir: str, iterations: int, extra: list[str], env: dict[str, str]) -> list[dict]:
  shutil.rmtree(workdir, ignore_errors=True)
  cmd = [sys.executable, os.path.join(REPO, "launch", "train.py"), f"--config={CONFIGS[name]}", f"--workdir={workdir}",
         f"--config.train.num_iterations={iterations}", "--config.eval.every=0", "--config.eval.passk_samples=0",
         "--config.checkpoint.every=1000", *extra]
  subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--iterations", type=int, default=4)
  parser.add_argument("--root", default="runs/bench/empo2")
  args, extra = parser.parse_known_args()
  extra = [a for a in extra if a != "--"]
  env = {**os.environ, "EXPLORE_JAX_CACHE": os.path.abspath(os.path.join(args.root, "cache"))}
  rows: dict[str, list[dict]] = {"empo2": [], "grpo": []}
  for i, name in enumerate(("empo2", "grpo", "grpo", "empo2")):
    metrics = run(name, os.path.join(args.root, f"{name}_{i}"), args.iterations, extra, env)
    rows[name] += metrics[1:]
    print(f"[run {i}] {name}: load average {os.getloadavg()[0]:.2f}", flush=True)
  print("| config | iter s | rollout s | update s | rest s | prompt tok |")
  print("|---|---|---|---|---|---|")
  medians = {}
  for name, ms in rows.items():
    med = lambda key: statistics.median(m[key] for m in ms)  # noqa: E731
    rest = statistics.median(m["time_iteration_s"] - m["time_rollout_s"] - m["time_update_s"] for m in ms)
    medians[name] = med("time_iteration_s")
    print(f"| {name} | {medians[name]:.1f} | {med('time_rollout_s'):.1f} | {med('time_update_s'):.1f} | "
          f"{rest:.1f} | {med('update/tokens'):.0f} |")
  print(f"empo2_vs_grpo_iteration={medians['empo2'] / medians['grpo']:.2f}")


if __name__ == "__main__":
  main()
