"""Training-curve endpoints compared across arms: a metric of metrics.jsonl early and late in each run.

Some claims are about how a quantity moves during training rather than about the trained policy's success:
ScreenExplorer's, that with the world-model reward the exploration diversity D_grp keeps rising instead of
collapsing (diversity/d_grp_*, logged by the method every iteration); EAPO's revisit share. For each metric of
`CURVE_METRICS` that every run of an arm logged, per run:

  early  the mean over its first `window` iterations that carry the metric
  late   the mean over its last `window` ones
  change late - early (the endpoint "rising or collapsing")

and per arm the mean and percentile-bootstrap interval over runs of late and of change (stats.bootstrap_ci),
with the sign-flip p of change over runs (does it move at all?; stats.paired_task_test against zero, each run
its own unit). Between every two arms that both have it:
the difference of means of `change` with its bootstrap interval and the permutation p over runs (the primary test,
as for pass@k in launch/compare.py). Nothing is reported for a metric fewer than two runs of an arm carry.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np

from explore_jax.train import stats

# The metrics compared when runs log them, in report order: ScreenExplorer's diversity (eqs. 5-6), the revisits and
# step-level group sizes of exploration-aware grouping (EAPO's figure), and the diversity DPEPO's paper measures
# (distinct actions across the copies at a step, distinct transitions across a task group).
CURVE_METRICS = ("diversity/d_grp_vis", "diversity/d_grp_text", "diversity/d_seq_vis", "diversity/d_seq_text",
                 "revisit_share", "step_group_size", "dpepo/distinct_actions_per_step",
                 "dpepo/distinct_transitions_per_group")


def window_means(rows: Sequence[dict], metric: str, window: int) -> tuple[float, float] | None:
  """(early, late) of one run's metrics.jsonl rows (module docstring); None when it never logged `metric`."""
  values = [float(r[metric]) for r in sorted(rows, key=lambda r: r.get("iteration", 0)) if metric in r]
  if not values:
    return None
  w = max(1, min(int(window), len(values)))
  return float(np.mean(values[:w])), float(np.mean(values[-w:]))


def analyse(curves: dict[str, list[tuple[str, list[dict]]]], *, window: int = 5, confidence: float = 0.95,
            resamples: int = 10_000, seed: int = 0, metrics: Sequence[str] = CURVE_METRICS) -> dict[str, Any]:
  """{metric: {"arms": {arm: per-arm numbers}, "comparisons": [...]}} for the metrics the runs logged."""
  report: dict[str, Any] = {}
  for metric in metrics:
    arms = {}
    for arm, runs in curves.items():
      pairs = [window_means(rows, metric, window) for _, rows in runs]
      if any(p is None for p in pairs) or len(pairs) < 2:
        continue
      early, late = np.array(pairs).T
      change = late - early
      arms[arm] = {"runs": len(pairs), "early": early.tolist(), "late": late.tolist(), "change": change.tolist(),
                   "late_mean_ci": stats.bootstrap_ci(late, confidence=confidence, resamples=resamples, seed=seed),
                   "change_mean_ci": stats.bootstrap_ci(change, confidence=confidence, resamples=resamples,
                                                        seed=seed),
                   "change_sign_flip_p": stats.paired_task_test(change, np.zeros_like(change),
                                                                   resamples=resamples, seed=seed)}
    if not arms:
      continue
    comparisons = []
    for a, b in itertools.combinations(arms, 2):
      ca, cb = arms[a]["change"], arms[b]["change"]
      comparisons.append({"a": a, "b": b, "diff_ci": stats.bootstrap_diff_ci(ca, cb, confidence=confidence,
                                                                           resamples=resamples, seed=seed),
                          "permutation_p": stats.permutation_test(ca, cb, seed=seed)})
    report[metric] = {"window": int(window), "arms": arms, "comparisons": comparisons}
  return report


def markdown(report: dict[str, Any], confidence: float = 0.95) -> str:
  """The report as compare.md's training-curve section ("" when no metric was compared)."""
  if not report:
    return ""
  conf = f"{100 * confidence:g}%"
  out = ["## Training curves: early vs late (metrics.jsonl)", ""]
  for metric, r in report.items():
    out += [f"### {metric} (windows of {r['window']} iterations)", "",
            f"| arm | runs | late, mean [{conf} CI] | change late - early, mean [{conf} CI] | sign-flip p |",
            "|---|---|---|---|---|"]
    for arm, a in r["arms"].items():
      lm, ll, lh = a["late_mean_ci"]
      cm, cl, ch = a["change_mean_ci"]
      out.append(f"| {arm} | {a['runs']} | {lm:.4f} [{ll:.4f}, {lh:.4f}] | {cm:+.4f} [{cl:+.4f}, {ch:+.4f}] | "
                 f"{a['change_sign_flip_p']:.3f} |")
    if r["comparisons"]:
      out += ["", f"| change: a - b | difference [{conf} CI] | permutation p |", "|---|---|---|"]
      for c in r["comparisons"]:
        d, lo, hi = c["diff_ci"]
        out.append(f"| {c['a']} - {c['b']} | {d:+.4f} [{lo:+.4f}, {hi:+.4f}] | {c['permutation_p']:.3f} |")
    out.append("")
  return "\n".join(out) + "\n"
