"""Benchmark: what EAPO costs an iteration against GiGPO on the same world (the issue's "q_phi costs forward and
backward passes of a second policy-sized model on every step").

Runs launch/train.py with configs/eapo_keydoor.py (EAPO) and configs/eapo_keydoor.py:gigpo (GiGPO, the plain
prompt and answers), each from its own warm start (the oracle in fields, the plain oracle; cached in
EXPLORE_JAX_CACHE, so a second invocation skips them), and prints per arm the median over the iterations after the
first (which compiles) of:

  iter s      time_iteration_s
  sample s    time_sampling_s: EAPO's answers are ~100 tokens where GiGPO's are ~4
  update s    time_update_s: everything after the rollout (q_phi, rewards, advantages, the policy update, SFT)
  q_phi s     EAPO's q_phi steps before the rewards (q_phi/seconds, q_phi/steps of them) and its scoring of every
              target (time_rewards_s)
  new tok     sampled tokens per iteration

and the ratio EAPO / GiGPO of the medians' iteration times. Prints, asserts nothing; the load average is printed.

  .venv/bin/python benchmarks/eapo_iteration.py [--iterations 3] [-- --config.x=y ...]
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
ARMS = (("eapo", "configs/eapo_keydoor.py"), ("gigpo", "configs/eapo_keydoor.py:gigpo"))


def run(config: str, workdir: str, iterations: int, extra: list[str]) -> list[dict]:
  shutil.rmtree(workdir, ignore_errors=True)
  cmd = [sys.executable, os.path.join(REPO, "launch", "train.py"), f"--config={config}", f"--workdir={workdir}",
         f"--config.train.num_iterations={iterations}", "--config.eval.every=0", "--config.eval.passk_samples=0",
         f"--config.checkpoint.every={iterations}", *extra]
  out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
  if out.returncode:
    raise SystemExit(f"{config} failed:\n{out.stderr[-3000:]}")
  return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl")) if line.strip()]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--iterations", type=int, default=3)
  parser.add_argument("--root", default="/tmp/eapo_iteration")
  parser.add_argument("extra", nargs="*", help="config overrides for both arms (after --)")
  args = parser.parse_args()
  medians = {}
  for name, config in ARMS:
    rows = run(config, os.path.join(args.root, name), args.iterations, args.extra)
    warm = rows[1:] or rows
    med = {k: statistics.median(r.get(k, 0.0) for r in warm)
           for k in ("time_iteration_s", "time_sampling_s", "time_update_s", "sample_tokens_per_s")}
    tokens = statistics.median(r["sample_tokens_per_s"] * r["time_sampling_s"] for r in warm)
    medians[name] = med
    extra = ""
    if name == "eapo":
      extra = (f"  q_phi train {statistics.median(r.get('q_phi/seconds', 0.0) for r in warm):.1f} s "
               f"({statistics.median(r.get('q_phi/steps', 0.0) for r in warm):.0f} steps) scoring "
               f"{statistics.median(r.get('time_rewards_s', 0.0) for r in warm):.1f} s")
    print(f"{name:6s} iter {med['time_iteration_s']:7.1f} s  sample {med['time_sampling_s']:6.1f} s  update "
          f"{med['time_update_s']:6.1f} s  new tok {tokens:7.0f}  format_ok {warm[-1]['format_ok']:.2f}{extra}  "
          f"load {os.getloadavg()[0]:.1f}")
  ratio = medians["eapo"]["time_iteration_s"] / max(medians["gigpo"]["time_iteration_s"], 1e-9)
  print(f"eapo_vs_gigpo_iteration={ratio:.2f}")


if __name__ == "__main__":
  main()
