"""The accelerator figures in one command (`make bench-gpu`): sampler decode throughput and its fraction of the HBM
roofline, and the learner step's MFU, at the Qwen3-0.6B and -1.7B shapes in bfloat16 (random weights), on the
first accelerator JAX sees. Prints a markdown table for benchmarks/README.md and writes the figures as JSON beside
it (benchmarks/results/accelerator_<device>.json; --output to choose).

  sampler   benchmarks/sampler.py --preset=P --dtype=bfloat16 --batch=1,64 --skip_torch --skip_no_cache
            --hbm_gbps=<the device's>: decode tokens/s (prefill subtracted) and the roofline fraction (parameters
            plus the whole preallocated KV cache read once per step)
  learner   benchmarks/learner.py --preset=P --dtype=bfloat16 --batch=8 --prompt_len=2048 --response_len=512: one
            jitted loss + gradient of the policy loss; MFU = 6 x params x tokens / step time / peak bf16 FLOP/s
            (the matmul FLOPs of forward and backward; attention's score FLOPs are left out, so MFU is slightly
            understated at long prompts)

  attention benchmarks/decode_attention.py at Qwen3-1.7B's attention shape (16 query heads over 8, head 128), batch
            64, a 4,096-slot cache a quarter full, bf16: one decode step's attention, dense against the blocked
            loop and the Pallas kernel that read only each row's range
  loop      benchmarks/loop_sampler.py --config=<--loop_config> --iterations=1 --modes=fixed,continuous: one
            rollout of a text world (TextWorld-Express by default, its warm start trained first where not cached)
            through the actor pool with the fixed-shape sampler and with continuous batching, from the same
            episodes; each mode's warm new tokens/s and its ratio to the sampler alone at the loop's shapes

Each part runs as its own process under --part_timeout_s (--loop_timeout_s for the loop; a part that does not
finish is reported so and the rest still run); the device's bandwidth and peak come from DEVICES by its kind
(--hbm_gbps / --peak_tflops override). The JSON is written after every part; --resume keeps the parts it holds
without an error and runs the rest, so a command stopped at a machine's time limit goes on where it stopped.
Prints and writes, asserts nothing.

  .venv/bin/python benchmarks/bench_gpu.py [--presets qwen3-0.6b,qwen3-1.7b] [--parts sampler,learner,...]
      [--output PATH] [--resume]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# Device kind (as jax reports it, lower case, a substring) -> (HBM GB/s, dense bf16 peak TFLOP/s), from the
# vendors' data sheets (SXM parts).
DEVICES = {"h200": (4800.0, 989.0), "h100": (3350.0, 989.0), "a100": (2039.0, 312.0), "v5lite": (819.0, 197.0),
           "v5p": (2765.0, 459.0), "v6e": (1640.0, 918.0), "v4": (1200.0, 275.0)}

LEARNER_SHAPE = dict(batch=8, prompt_len=2048, response_len=512)


def device_kind() -> str:
  import jax

  return jax.devices()[0].device_kind


def device_figures(kind: str) -> tuple[float, float]:
  for name, figures in DEVICES.items():
    if name in kind.lower().replace(" ", ""):
      return figures
  return 0.0, 0.0


def run_part(args: list[str], timeout_s: float) -> tuple[str, float, str]:
  """(stdout, seconds, error or "") of one benchmark script."""
  start = time.perf_counter()
  try:
    out = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
  except subprocess.TimeoutExpired:
    return "", time.perf_counter() - start, f"did not finish in {timeout_s:.0f} s"
  error = "" if out.returncode == 0 else f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}"
  return out.stdout, time.perf_counter() - start, error


def sampler_rows(stdout: str) -> dict[int, dict[str, float]]:
  rows: dict[int, dict[str, float]] = {}
  for b, tps in re.findall(r"\[decode\] batch (\d+): ([\d,]+) tokens/s", stdout):
    rows.setdefault(int(b), {})["decode_tokens_per_s"] = float(tps.replace(",", ""))
  for b, frac in re.findall(r"\[roofline\] batch (\d+):.*= ([\d.]+)% of roofline", stdout):
    rows.setdefault(int(b), {})["roofline_fraction"] = float(frac) / 100
  return rows


def learner_row(stdout: str, num_params: float, peak_tflops: float) -> dict[str, float]:
  found = re.search(r"response-only logits: ([\d.]+) ms per loss\+grad", stdout)
  if not found:
    return {}
  step_s = float(found.group(1)) / 1e3
  tokens = LEARNER_SHAPE["batch"] * (LEARNER_SHAPE["prompt_len"] + LEARNER_SHAPE["response_len"])
  flops = 6.0 * num_params * tokens
  row = {"step_ms": step_s * 1e3, "tokens": tokens, "tflops_per_s": flops / step_s / 1e12}
  if peak_tflops:
    row["mfu"] = row["tflops_per_s"] / peak_tflops
  return row


def attention_rows(stdout: str) -> dict[str, dict[str, float]]:
  """{impl: {"ms", "vs_dense"}} from benchmarks/decode_attention.py's lines."""
  return {impl: {"ms": float(ms), "vs_dense": float(x)}
          for impl, ms, x in re.findall(r"^(dense|blocked|pallas)\s+([\d.]+) ms per call \(([\d.]+)x dense\)",
                                        stdout, re.M)}


def loop_rows(stdout: str) -> dict[str, dict[str, float]]:
  """{mode: {"warm_tokens_per_s", "alone_over_loop"}} from benchmarks/loop_sampler.py's report."""
  rows: dict[str, dict[str, float]] = {}
  for mode, warm in re.findall(r"^(fixed|continuous|streaming)\s.*?; warm ([\d,]+) tok/s", stdout, re.M):
    rows[mode] = {"warm_tokens_per_s": float(warm.replace(",", ""))}
  for mode, ratio in zip(list(rows), re.findall(r"alone / loop \(warm\): ([\d.]+)x", stdout)):
    rows[mode]["alone_over_loop"] = float(ratio)
  return rows


PARTS = ("sampler", "learner", "attention", "loop")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--presets", default="qwen3-0.6b,qwen3-1.7b")
  parser.add_argument("--parts", default=",".join(PARTS), help=f"which of {PARTS} to run")
  parser.add_argument("--hbm_gbps", type=float, default=0.0)
  parser.add_argument("--peak_tflops", type=float, default=0.0)
  parser.add_argument("--part_timeout_s", type=float, default=150.0)
  parser.add_argument("--loop_config", default="configs/gigpo_twx.py")
  parser.add_argument("--loop_timeout_s", type=float, default=240.0)
  parser.add_argument("--output", default="")
  parser.add_argument("--resume", action="store_true",
                      help="keep the parts --output already holds without an error, run the others")
  args = parser.parse_args()
  parts = args.parts.split(",")
  if set(parts) - set(PARTS):
    parser.error(f"--parts: unknown {sorted(set(parts) - set(PARTS))}; choose among {PARTS}")

  from explore_jax.models.config import PRESETS

  kind = device_kind()
  hbm, peak = device_figures(kind)
  hbm, peak = args.hbm_gbps or hbm, args.peak_tflops or peak
  print(f"device: {kind}; HBM {hbm:.0f} GB/s, peak bf16 {peak:.0f} TFLOP/s (0: unknown kind, pass them)")
  path = args.output or os.path.join(REPO, "benchmarks", "results",
                                     f"accelerator_{re.sub(r'[^a-z0-9]+', '_', kind.lower()).strip('_')}.json")
  result: dict = {"device": kind, "hbm_gbps": hbm, "peak_bf16_tflops": peak, "learner_shape": LEARNER_SHAPE,
                  "presets": {}}
  if args.resume and os.path.exists(path):
    with open(path) as f:
      kept = json.load(f)
    if kept.get("device") == kind:
      result = kept
      for entry in result["presets"].values():  # JSON made the batch sizes strings
        if "sampler" in entry:
          entry["sampler"]["batches"] = {int(b): row for b, row in entry["sampler"]["batches"].items()}
      print(f"resuming {os.path.relpath(path, REPO)}: its parts without an error are kept")

  def save() -> None:  # after every part, so that a run stopped part-way keeps what it measured
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(f"{path}.tmp", "w") as f:
      json.dump(result, f, indent=1)
    os.replace(f"{path}.tmp", path)

  def run(part: str, owner: dict, key: str, label: str, script: list[str], timeout_s: float, rows) -> None:
    if part not in parts:
      return
    if owner.get(key) and not owner[key].get("error"):
      print(f"{label}: kept", flush=True)
      return
    stdout, seconds, error = run_part(script, timeout_s)
    owner[key] = {**rows(stdout), "seconds": seconds, "error": error}
    print(f"{label} ({seconds:.0f} s{'; ' + error if error else ''})", flush=True)
    save()

  for name in args.presets.split(","):
    entry = result["presets"].setdefault(name, {"params": PRESETS[name].num_params()})
    run("sampler", entry, "sampler", f"[{name}] sampler",
        ["benchmarks/sampler.py", f"--preset={name}", "--dtype=bfloat16", "--batch=1,64", "--skip_torch",
         "--skip_no_cache", f"--hbm_gbps={hbm}"], args.part_timeout_s,
        lambda out: {"batches": sampler_rows(out)})
    run("learner", entry, "learner", f"[{name}] learner",
        ["benchmarks/learner.py", f"--preset={name}", "--dtype=bfloat16",
         *(f"--{k}={v}" for k, v in LEARNER_SHAPE.items())], args.part_timeout_s,
        lambda out: learner_row(out, entry["params"], peak))
  run("attention", result, "decode_attention", "[attention]",
      ["benchmarks/decode_attention.py", "--batch=64", "--cache=4096", "--heads=16", "--kv_heads=8",
       "--head_dim=128", "--dtype=bfloat16"], args.part_timeout_s, lambda out: {"impls": attention_rows(out)})
  run("loop", result, "loop", f"[loop] {args.loop_config}",
      ["benchmarks/loop_sampler.py", f"--config={args.loop_config}", "--iterations=1", "--modes=fixed,continuous"],
      args.loop_timeout_s, lambda out: {"config": args.loop_config, "modes": loop_rows(out)})

  print("\n| shape (bf16) | decode tok/s, batch 1 | roofline, batch 1 | decode tok/s, batch 64 | roofline, batch 64 "
        "| learner step ms | learner MFU |")
  print("|---|---|---|---|---|---|---|")
  for name, entry in result["presets"].items():
    batches, learner = entry.get("sampler", {}).get("batches", {}), entry.get("learner", {})
    cell = lambda d, k, f: f.format(d[k]) if k in d else "—"  # noqa: E731
    print(f"| {name} | {cell(batches.get(1, {}), 'decode_tokens_per_s', '{:,.0f}')} | "
          f"{cell(batches.get(1, {}), 'roofline_fraction', '{:.0%}')} | "
          f"{cell(batches.get(64, {}), 'decode_tokens_per_s', '{:,.0f}')} | "
          f"{cell(batches.get(64, {}), 'roofline_fraction', '{:.0%}')} | {cell(learner, 'step_ms', '{:.1f}')} | "
          f"{cell(learner, 'mfu', '{:.1%}')} |")
  print("\n| decode attention (B 64, cache 4096, 16/8 heads of 128, bf16) | ms | vs dense |\n|---|---|---|")
  for impl, row in result.get("decode_attention", {}).get("impls", {}).items():
    print(f"| {impl} | {row['ms']:.3f} | {row['vs_dense']:.2f}x |")
  modes = result.get("loop", {}).get("modes", {})
  loop_config = result.get("loop", {}).get("config", args.loop_config)
  print(f"\n| loop ({loop_config}) | warm new tok/s | alone / loop |\n|---|---|---|")
  for mode in ("fixed", "continuous"):
    row = modes.get(mode, {})
    warm, ratio = row.get("warm_tokens_per_s", float("nan")), row.get("alone_over_loop", float("nan"))
    print(f"| {mode} | {warm:,.0f} | {ratio:.2f}x |")
  save()
  print(f"written: {os.path.relpath(path, REPO)}")


if __name__ == "__main__":
  main()
