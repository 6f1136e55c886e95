"""Benchmark: rollout overlapped with learning (config.rollout.max_staleness) against the synchronous loop.

Runs launch/train.py once per mode on the same config, warm start and seed (one shared cache, so the SFT warm
start is computed once, before the first timed run), one run at a time, and prints per mode:

  iter s        median wall time of an RL iteration (time_iteration_s: rollout wait, update, evaluation
                when due), the first iteration left out (it compiles)
  RL s          the sum over all iterations: what the loop cost end to end
  wait share    median share of the loop's iteration spent waiting for episodes (all of the rollout when
                synchronous; what the update did not hide when overlapped)
  sync points   iterations whose rollout waited for the update before it (checkpoint iterations)
  quality       the run's final figures: held-in / held-out pass@k from summary.json when the config
                computes pass@k, else the last periodic evaluation's success rate

and the speedup (synchronous RL s / overlapped RL s). Prints, asserts nothing; wall time under whatever load
the machine carries (the load average is printed with each run). --order ABBA runs sync, overlapped,
overlapped, sync (two runs of each mode: a drifting load then hits both alike).

  .venv/bin/python benchmarks/overlap.py --config=configs/sge_coding.py [--staleness 1] [--order AB] \\
      [--root runs/bench/overlap] [-- --config.train.num_iterations=8 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(config: str, workdir: str, overrides: list[str], env: dict[str, str]) -> float:
  """Runs one training job to completion; returns its wall time."""
  if os.path.exists(workdir):
    shutil.rmtree(workdir)
  t0 = time.time()
  subprocess.run([sys.executable, os.path.join(REPO, "launch", "train.py"), f"--config={config}",
                  f"--workdir={workdir}", *overrides], cwd=REPO, env=env, check=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  return time.time() - t0


def summarize(workdir: str) -> dict[str, float]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()][1:]  # row 0: the warm start's evaluation
  times = [r["time_iteration_s"] for r in rows]
  out = {"iterations": len(rows), "iter_s": statistics.median(times[1:] or times), "rl_s": sum(times),
         "wait_share": statistics.median(r["throughput/rollout_wait_share"] for r in rows),
         "sync_points": sum(r["rollout/staleness"] == 0 for r in rows),
         "staleness": statistics.mean(r["rollout/staleness"] for r in rows)}
  summary = os.path.join(workdir, "summary.json")
  if os.path.exists(summary):
    with open(summary) as f:
      s = json.load(f)
    for label, row in s.items():  # "trained / train", "trained / held-out": {"pass_at_k": {k: value}}
      if label.startswith("trained"):
        k = max(row["pass_at_k"], key=int)
        out[f"{label} pass@1"], out[f"{label} pass@{k}"] = row["pass_at_k"]["1"], row["pass_at_k"][k]
  evals = [r["eval/success_rate"] for r in rows if "eval/success_rate" in r]
  if evals:
    out["eval success (last)"] = evals[-1]
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="configs/sge_coding.py")
  parser.add_argument("--staleness", type=int, default=1)
  parser.add_argument("--order", default="AB", help="A = synchronous, B = overlapped, in run order")
  parser.add_argument("--root", default=os.path.join(REPO, "runs", "bench", "overlap"))
  args, overrides = parser.parse_known_args()
  overrides = [o for o in overrides if o != "--"]
  env = dict(os.environ, EXPLORE_JAX_CACHE=os.environ.get("EXPLORE_JAX_CACHE",
                                                          os.path.join(os.path.expanduser("~"), ".cache",
                                                                       "explore_jax")))
  modes = {"A": ("synchronous", 0), "B": (f"overlapped k={args.staleness}", args.staleness)}
  name = os.path.splitext(os.path.basename(args.config.split(":")[0]))[0]
  print(f"{args.config} {' '.join(overrides)}  (cpu count {os.cpu_count()})")
  results: dict[str, list[dict[str, float]]] = {}
  for i, mode in enumerate(args.order):
    label, k = modes[mode]
    workdir = os.path.join(args.root, name, f"{i}_{mode}")
    wall = run(args.config, workdir, [*overrides, f"--config.rollout.max_staleness={k}"], env)
    s = summarize(workdir)
    s["wall_s"] = wall
    results.setdefault(label, []).append(s)
    figures = "  ".join(f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}"
                        for key, value in s.items())
    print(f"[{label}] load {os.getloadavg()[0]:.1f}  {figures}", flush=True)
  sync, over = (results.get(modes[m][0]) for m in "AB")
  if sync and over:
    ratio = statistics.mean(s["rl_s"] for s in sync) / statistics.mean(s["rl_s"] for s in over)
    per_iter = statistics.mean(s["iter_s"] for s in sync) / statistics.mean(s["iter_s"] for s in over)
    print(f"speedup (synchronous / overlapped): RL time {ratio:.2f}x, median iteration {per_iter:.2f}x")


if __name__ == "__main__":
  main()
