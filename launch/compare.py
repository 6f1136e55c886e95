"""Compares finished runs across seeds: pass@k tables and learning curves, mean and std per method.

  python launch/compare.py runs/results/sge_seed0 runs/results/sge_seed1 ... runs/results/grpo_seed2 \\
      --output=runs/results

Runs are grouped by their config's `method`; each must hold summary.json and metrics.jsonl (written by
launch/train.py when the config asks for pass@k). Prints a markdown table and writes compare.md and
compare.png (training success and held-out success per iteration, mean +- std over seeds).
"""

import json
import os
import sys

import numpy as np
from absl import app, flags

_OUTPUT = flags.DEFINE_string("output", None, "Directory for compare.md and compare.png (default: print only).")
_KS = flags.DEFINE_list("ks", ["1", "2", "4", "8", "16"], "The k of the pass@k columns.")


def load(run: str) -> tuple[str, dict, list[dict]]:
  for name in ("config.json", "summary.json", "metrics.jsonl"):
    if not os.path.exists(os.path.join(run, name)):
      sys.exit(f"error: {run} has no {name} (not a finished run with pass@k?)")
  method = json.load(open(os.path.join(run, "config.json")))["method"]
  summary = json.load(open(os.path.join(run, "summary.json")))
  metrics = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl")) if line.strip()]
  return method, summary, metrics


def mean_std(values, digits: int = 3) -> str:
  """mean ± sample std (0 for one value)."""
  v = np.asarray(values, float)
  return f"{v.mean():.{digits}f} ± {v.std(ddof=1) if len(v) > 1 else 0.0:.{digits}f}"


def main(argv):
  runs = argv[1:]
  if not runs:
    raise app.UsageError("give run directories")
  by_method: dict[str, list[tuple[dict, list[dict]]]] = {}
  for run in runs:
    method, summary, metrics = load(run)
    by_method.setdefault(method, []).append((summary, metrics))
  ks = [k for k in _KS.value]
  head = ["method", "policy / tasks", "seeds"] + [f"pass@{k}" for k in ks] + ["solved≥1", "distinct outcomes"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for method, entries in by_method.items():
    for label in entries[0][0]:
      rows = [s[label] for s, _ in entries]
      cells = [method, label, str(len(rows))] + [mean_std([r["pass_at_k"][k] for r in rows]) for k in ks]
      cells += [mean_std([r["tasks_solved_at_least_once"] for r in rows], 1),
                mean_std([r["distinct_outcomes_per_task"] for r in rows], 2)]
      lines.append("| " + " | ".join(cells) + " |")
  text = "\n".join(lines)
  print(text)
  if _OUTPUT.value:
    os.makedirs(_OUTPUT.value, exist_ok=True)
    with open(os.path.join(_OUTPUT.value, "compare.md"), "w") as f:
      f.write(text + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, key in zip(axes, ("success_rate", "eval/success_rate")):
      for method, entries in by_method.items():
        its = sorted({r["iteration"] for _, m in entries for r in m if key in r})
        values = np.array([[next((r[key] for r in m if r["iteration"] == i and key in r), np.nan) for i in its]
                           for _, m in entries])
        mean, std = np.nanmean(values, 0), np.nanstd(values, 0)
        ax.plot(its, mean, marker=".", label=f"{method} ({len(entries)} seeds)")
        ax.fill_between(its, mean - std, mean + std, alpha=0.2)
      ax.set_xlabel("iteration")
      ax.set_ylabel(key)
      ax.grid(alpha=0.3)
      ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(_OUTPUT.value, "compare.png"), dpi=100)
    print(f"[compare] {os.path.join(_OUTPUT.value, 'compare.md')}, {os.path.join(_OUTPUT.value, 'compare.png')}")


if __name__ == "__main__":
  app.run(main)
