"""Benchmark: what DPEPO's parallel copies cost an iteration, per world, against the same config in one copy.

For each world (--worlds) runs launch/train.py with configs/dpepo_<world>.py twice per order ABBA: as configured
(K = 4 copies) and with --config.env.parallel.copies=1 (the same pipeline, prompt and recipe in one copy), without
the cold start (the untrained tiny model: malformed answers step no copy, so every episode runs to its step limit,
the dearest case), and prints per run the median over the iterations after the first (which compiles) of:

  iter s       time_iteration_s
  rollout s    time_rollout_s: the copies' longer prompts are sampled here
  update s     time_update_s
  prompt tok   sampled prompt tokens per step record (the copies' layouts)

and the ratio K=4 / K=1 of the medians' iteration times, which is what chose the tiny world of
configs/protocols/dpepo.py. First, per world, the cold start's prompts and responses in tokens (mean and max over
the demonstrations of 8 SFT games, against the config's budgets: what sized configs/textworlds.PARALLEL_TINY);
--prompts_only stops there. Prints, asserts nothing; the load average is printed per run.

  .venv/bin/python benchmarks/dpepo_iteration.py [--worlds keydoor,twx] [--iterations 3] [-- --config.x=y ...]
  .venv/bin/python benchmarks/dpepo_iteration.py --worlds keydoor,twx,alfworld,scienceworld --prompts_only
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
sys.path.insert(0, REPO)  # configs/


def run(world: str, copies: int, workdir: str, iterations: int, extra: list[str], env: dict[str, str]) -> list[dict]:
  shutil.rmtree(workdir, ignore_errors=True)
  cmd = [sys.executable, os.path.join(REPO, "launch", "train.py"), f"--config=configs/dpepo_{world}.py",
         f"--workdir={workdir}", f"--config.train.num_iterations={iterations}", "--config.eval.every=0",
         "--config.eval.passk_samples=0", "--config.checkpoint.every=1000", "--config.sft.enabled=False",
         f"--config.env.parallel.copies={copies}", *extra]
  subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  with open(os.path.join(workdir, "config.json")) as f:
    r = json.load(f)["rollout"]
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  for m in rows:  # prompt tokens per step record: prefill throughput x sampling time / steps
    steps = m["episode_length"] * r["num_tasks"] * r["group_size"]
    m["prompt_tokens_per_step"] = m["sample_prompt_tokens_per_s"] * m["time_sampling_s"] / max(steps, 1)
  return rows


def cold_start_sizes(world: str, games: int = 8) -> str:
  """A table row: the cold start's prompt and response tokens, mean / max, against the config's budgets."""
  import importlib

  import numpy as np

  from explore_jax import hf
  from explore_jax.actors.actor import PromptTokenizer
  from explore_jax.methods import make_method
  from explore_jax.train import rollout, sft_data

  c = importlib.import_module(f"configs.dpepo_{world}").get_config()
  env_id, kwargs = rollout.environment(c, {**c.env.kwargs, **c.sft.get("env_kwargs", {})}, demonstrations=True)
  seeds = range(c.sft.oracle_seed_offset, c.sft.oracle_seed_offset + games)
  demos = sft_data.oracle_sft_demos(env_id, kwargs, seeds, make_method(c).prompt_hook(), workers=1)
  tokenizer = PromptTokenizer.from_dir(hf.resolve(c.model.checkpoint), 1 << 20)
  prompts = [len(tokenizer.encode(d["messages"])[0]) for d in demos]
  responses = [len(tokenizer.tokenizer.encode(d["response"])) for d in demos]
  return (f"| {world} | {len(demos)} | {np.mean(prompts):.0f} / {max(prompts)} | {c.rollout.max_prompt_tokens} | "
          f"{np.mean(responses):.0f} / {max(responses)} | {c.rollout.max_new_tokens} |")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--worlds", default="keydoor,twx")
  parser.add_argument("--iterations", type=int, default=3)
  parser.add_argument("--root", default="runs/bench/dpepo")
  parser.add_argument("--prompts_only", action="store_true")
  args, extra = parser.parse_known_args()
  extra = [a for a in extra if a != "--"]
  env = {**os.environ, "EXPLORE_JAX_CACHE": os.path.abspath(os.path.join(args.root, "cache"))}
  os.environ["EXPLORE_JAX_CACHE"] = env["EXPLORE_JAX_CACHE"]  # ALFWorld's generated games
  print("| world | demonstrations | prompt tok mean / max | budget | response tok mean / max | budget |")
  print("|---|---|---|---|---|---|")
  for world in args.worlds.split(","):
    print(cold_start_sizes(world), flush=True)
  if args.prompts_only:
    return
  print("\n| world | copies | iter s | rollout s | update s | prompt tok / step |")
  print("|---|---|---|---|---|---|")
  for world in args.worlds.split(","):
    rows: dict[int, list[dict]] = {4: [], 1: []}
    for i, copies in enumerate((4, 1, 1, 4)):
      rows[copies] += run(world, copies, os.path.join(args.root, f"{world}_{copies}_{i}"), args.iterations, extra,
                          env)[1:]
      print(f"[{world} run {i}] K={copies}: load average {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    medians = {}
    for copies, ms in rows.items():
      med = lambda key: statistics.median(m[key] for m in ms)  # noqa: E731
      tokens = med("prompt_tokens_per_step")
      medians[copies] = med("time_iteration_s")
      print(f"| {world} | {copies} | {medians[copies]:.1f} | {med('time_rollout_s'):.1f} | {med('time_update_s'):.1f} "
            f"| {tokens:.0f} |", flush=True)
    print(f"{world}: dpepo_k4_vs_k1_iteration={medians[4] / medians[1]:.2f}", flush=True)


if __name__ == "__main__":
  main()
