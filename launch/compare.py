"""Compares finished runs across seeds: pass@k with confidence intervals, tests between methods, per task.

  python launch/compare.py runs/results/sge_seed0 runs/results/sge_seed1 ... runs/results/grpo_seed2 \\
      --output=runs/results

Runs are grouped by their config's `method`, or by --labels (one name per run, in order: launch/sweep.py
passes its arms); each must hold summary.json and metrics.jsonl (written by
launch/train.py when the config asks for pass@k). Prints markdown and, with --output, writes:

  compare.md    1. mean +- sample std over seeds of every pass@k column (--ks), solved >= 1, distinct outcomes,
                states and steps to success ("—" where a run lacks one);
                2. per method and task set: pass@1 and pass@k_max, mean with a percentile-bootstrap CI over
                   seeds (k_max: the largest k every run has);
                3. per pair of methods and task set both were evaluated on: the difference of means with its
                   bootstrap CI (seeds resampled per method), the permutation p over seeds (the primary test),
                   Welch's t, dof and p (for reference) and the paired sign-flip p over tasks;
                4. per task set: the tasks where the methods' seed-averaged pass@k differ most;
                5. learning, per method and each task set all its runs have (one the other methods lack
                   included): trained minus warm start pass@1 and pass@k_max of the same runs, the mean with its
                   bootstrap CI over runs, the exact sign-flip p over runs and the paired sign-flip p over
                   tasks (does RL improve on the policy it started from?).
  compare.json  the same numbers, plus each method's per-task, seed-averaged pass@k for every k.
  6. training curves (explore_jax/train/curve_compare.py), for the metrics of CURVE_METRICS the runs log
     (ScreenExplorer's D_grp, EAPO's revisits and step groups, DPEPO's distinct actions and transitions): early
     vs late window per run, per arm and between arms.
  compare.png   training success and held-out success per iteration, mean +- std over seeds (and D_grp where
                logged).

explore_jax/train/stats.py has the methods and why the permutation test is the primary one. Part 3's paired
test and part 4 need per-task counts: a summary.json entry's "per_task" (TaskSetEval.to_json(): task_ids, samples,
successes); runs without them get every other number and a note. Pairwise tests leave out the policies in
--skip_policies (the shared warm start is the same policy for every method).
"""

import itertools
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from explore_jax.train import curve_compare, provenance, stats  # noqa: E402
from explore_jax.train.evaluation import (TRAINED, WARM_START, pass_at_k, split_task_set_label,  # noqa: E402
                                          task_set_label)

_OUTPUT = flags.DEFINE_string("output", None,
                              "Directory for compare.md, compare.json and compare.png (default: print only).")
_KS = flags.DEFINE_list("ks", ["1", "2", "4", "8", "16"], "The k of the mean +- std table's pass@k columns.")
_CONFIDENCE = flags.DEFINE_float("confidence", 0.95, "Confidence of the bootstrap intervals.")
_RESAMPLES = flags.DEFINE_integer("resamples", 10_000,
                                  "Bootstrap resamples, and Monte Carlo draws of a permutation test too large "
                                  "to enumerate.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the bootstrap and of Monte Carlo permutation tests.")
_TOP_TASKS = flags.DEFINE_integer("top_tasks", 10, "Tasks listed per task set in the per-task table.")
_SKIP_POLICIES = flags.DEFINE_list("skip_policies", [WARM_START],
                                   "Policies (the part of a label before ' / ') left out of the pairwise tests.")
_LABELS = flags.DEFINE_list("labels", None, "One group name per run, in order (default: each run's config method).")
_CURVE_WINDOW = flags.DEFINE_integer("curve_window", 5, "Iterations averaged at each end of a training curve "
                                     "(explore_jax/train/curve_compare.py: D_grp early vs late).")


def load(run: str) -> tuple[str, dict, list[dict], str | None, str]:
  """A finished run's method, summary.json, metrics.jsonl rows, warm start and machine.

  The warm start names the policy RL started from: the digest of its exact bits where the run has
  provenance.json (two runs share a warm start only if their starting parameters are bit-identical, which
  another machine breaks), else its config's sft.seed (runs recorded before provenance.json), None without
  an SFT warm start. The machine is provenance.json's tag(s), "?" without one.
  """
  for name in ("config.json", "summary.json", "metrics.jsonl"):
    if not os.path.exists(os.path.join(run, name)):
      sys.exit(f"error: {run} has no {name} (not a finished run with pass@k?)")
  config = json.load(open(os.path.join(run, "config.json")))
  sft = config.get("sft") or {}
  summary = json.load(open(os.path.join(run, "summary.json")))
  metrics = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl")) if line.strip()]
  origin = provenance.load(run) or {}
  if origin.get("start_digest"):
    warm_start = f"start {origin['start_digest']}"
  else:
    warm_start = f"sft.seed={sft.get('seed')}" if sft.get("enabled") else None
  machine = "+".join(dict.fromkeys(m["tag"] for m in origin.get("machines", []))) or "?"
  return config["method"], summary, metrics, warm_start, machine


def mean_std(values, digits: int = 3) -> str:
  """mean ± sample std (0 for one value)."""
  v = np.asarray(values, float)
  return f"{v.mean():.{digits}f} ± {v.std(ddof=1) if len(v) > 1 else 0.0:.{digits}f}"


def _mean_std_if_all(values, digits: int = 3) -> str:
  """mean_std, or "—" when some run lacks the value (its summary predates the measure)."""
  return "—" if any(v is None for v in values) else mean_std(values, digits)


def fmt(x: float, digits: int = 3) -> str:
  return "—" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def fmt_p(p: float) -> str:
  """p-values: three decimals, three significant digits below 0.001."""
  if p is None or not math.isfinite(p):
    return "—"
  return f"{p:.3f}" if p >= 0.001 else f"{p:.2e}"


def fmt_ci(mean: float, low: float, high: float) -> str:
  return f"{fmt(mean)} [{fmt(low)}, {fmt(high)}]"


def _json_safe(x):
  """nan/inf -> None (compare.json stays strict JSON)."""
  if isinstance(x, float) and not math.isfinite(x):
    return None
  if isinstance(x, dict):
    return {k: _json_safe(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_json_safe(v) for v in x]
  return x


def labels_of(summaries: list[dict]) -> list[str]:
  """Labels present in every summary, in the first one's order."""
  return [label for label in summaries[0] if all(label in s for s in summaries[1:])]


def common_ks(summaries: list[dict], labels: list[str]) -> list[int]:
  """The k with a pass@k in every summary's every label."""
  ks = None
  for s in summaries:
    for label in labels:
      have = {int(k) for k in s[label]["pass_at_k"]}
      ks = have if ks is None else ks & have
  return sorted(ks or ())


def task_pass_at_k(entry: dict, ks: list[int]) -> dict[str, dict[int, float]] | None:
  """{task key: {k: pass@k}} from a summary entry's per-task counts, or None when it has none."""
  counts = entry.get("per_task")
  if not counts:
    return None
  return {json.dumps(t, sort_keys=True): {k: pass_at_k(int(n), int(c), k) for k in ks}
          for t, n, c in zip(counts["task_ids"], counts["samples"], counts["successes"])}


def per_task_arrays(entries: list[dict], ks: list[int]) -> tuple[list[str], dict[int, np.ndarray]] | None:
  """Task keys common to all seeds and {k: [tasks, seeds] pass@k}, or None when a seed has no counts."""
  per_seed = [task_pass_at_k(e, ks) for e in entries]
  if any(p is None for p in per_seed):
    return None
  tasks = [t for t in per_seed[0] if all(t in p for p in per_seed[1:])]
  return tasks, {k: np.array([[p[t][k] for p in per_seed] for t in tasks]) for k in ks}


def analyse(by_method: dict[str, list[tuple[str, dict]]], *, confidence: float, resamples: int, seed: int,
            skip_policies: list[str], warm_starts: dict[str, object] | None = None,
            machines: dict[str, str] | None = None) -> dict:
  """Every number of compare.md / compare.json (see the module docstring). `warm_starts` and `machines`
  map a run to its warm start and machine (load())."""
  warm_starts, machines = warm_starts or {}, machines or {}
  methods = list(by_method)
  # A method's own statistics (its pass@k table, trained - warm start) cover the task sets all its runs have;
  # the comparisons between methods, the task sets every run has.
  own_labels = {m: labels_of([s for _, s in entries]) for m, entries in by_method.items()}
  labels = labels_of([s for entries in by_method.values() for _, s in entries])
  ks = sorted(set.intersection(*(set(common_ks([s for _, s in by_method[m]], own_labels[m])) for m in methods)))
  if not ks:
    sys.exit("error: the runs share no pass@k")
  k_max = ks[-1]
  report = {"confidence": confidence, "resamples": resamples, "seed": seed, "ks": ks, "k_max": k_max,
            "skip_policies": list(skip_policies), "sets": labels, "methods": {}, "comparisons": [], "per_task": {},
            "warm_starts": composition(by_method, warm_starts, machines)}
  values: dict[tuple[str, str, int], list[float]] = {}
  tasks: dict[tuple[str, str], tuple[list[str], dict[int, np.ndarray]] | None] = {}
  aligned_tasks: dict[str, dict[str, dict[int, np.ndarray]]] = {}  # label -> method -> k -> [common tasks, seeds]
  for method, entries in by_method.items():
    sets = {}
    for label in own_labels[method]:
      rows = [s[label] for _, s in entries]
      per_k = {}
      for k in ks:
        v = [float(r["pass_at_k"][str(k)]) for r in rows]
        values[method, label, k] = v
        mean, low, high = stats.bootstrap_ci(v, confidence=confidence, resamples=resamples, seed=seed)
        per_k[str(k)] = {"values": v, "mean": mean, "low": low, "high": high}
      sets[label] = {"seeds": len(rows), "pass_at_k": per_k}
      tasks[method, label] = per_task_arrays(rows, ks)
    report["methods"][method] = {"runs": [run for run, _ in entries], "seeds": len(entries), "sets": sets}

  for label in labels:
    have = {m: tasks[m, label] for m in methods if tasks[m, label] is not None}
    if len(have) < len(methods):
      continue
    index = {m: {t: i for i, t in enumerate(have[m][0])} for m in methods}
    common = [t for t in have[methods[0]][0] if all(t in index[m] for m in methods[1:])]
    if not common:
      continue
    aligned = {m: {k: have[m][1][k][[index[m][t] for t in common]] for k in ks} for m in methods}
    aligned_tasks[label] = aligned
    report["per_task"][label] = {
        "task_ids": [json.loads(t) for t in common],
        "methods": {m: {str(k): aligned[m][k].mean(axis=1).tolist() for k in ks} for m in methods}}

  for label in labels:
    if split_task_set_label(label)[0] in skip_policies:
      continue
    for k in sorted({1, k_max}):
      for a, b in itertools.combinations(methods, 2):
        va, vb = values[a, label, k], values[b, label, k]
        diff, low, high = stats.bootstrap_diff_ci(va, vb, confidence=confidence, resamples=resamples, seed=seed)
        t, dof, welch_p = stats.welch_t(va, vb)
        row = {"set": label, "k": k, "a": a, "b": b, "seeds_a": len(va), "seeds_b": len(vb),
               "difference": diff, "low": low, "high": high,
               "permutation_p": stats.permutation_test(va, vb, resamples=resamples, seed=seed),
               "welch_t": t, "welch_dof": dof, "welch_p": welch_p, "paired_task_p": None, "tasks": None,
               "within_warm_starts_p": None, "warm_starts": None, "matched_runs": None, "matched_difference": None}
        row.update(within_warm_starts(va, vb, [warm_starts.get(run) for run, _ in by_method[a]],
                                      [warm_starts.get(run) for run, _ in by_method[b]], resamples, seed))
        if label in aligned_tasks:
          aligned = aligned_tasks[label]
          row["paired_task_p"] = stats.paired_task_test(aligned[a][k], aligned[b][k], resamples=resamples,
                                                        seed=seed)
          row["tasks"] = int(aligned[a][k].shape[0])
        report["comparisons"].append(row)
  report["learning"] = learning(by_method, own_labels, ks, k_max, tasks, confidence=confidence,
                                resamples=resamples, seed=seed)
  return report


def learning(by_method: dict[str, list[tuple[str, dict]]], own_labels: dict[str, list[str]], ks: list[int],
             k_max: int, tasks: dict, *, confidence: float, resamples: int, seed: int) -> list[dict]:
  """Per method and task set X whose "warm start / X" and "trained / X" all the method's runs have (`own_labels`,
  whatever the other methods were evaluated on): the per-run differences
  trained - warm start (each run against its own starting policy), their mean with a bootstrap CI over runs,
  the exact sign-flip p over runs (the runs are the random unit), and the paired sign-flip p over tasks (the
  task's run-averaged difference; its unit is the task, given these runs)."""
  rows = []
  for method, entries in by_method.items():
    labels = own_labels[method]
    for label in labels:
      policy, task_set = split_task_set_label(label)
      warm_label = task_set_label(WARM_START, task_set)
      if policy != TRAINED or warm_label not in labels:
        continue
      for k in sorted({1, k_max}):
        trained = [float(s[label]["pass_at_k"][str(k)]) for _, s in entries]
        warm = [float(s[warm_label]["pass_at_k"][str(k)]) for _, s in entries]
        d = np.subtract(trained, warm)
        mean, low, high = stats.bootstrap_ci(d, confidence=confidence, resamples=resamples, seed=seed)
        row = {"method": method, "set": task_set, "k": k, "runs": len(d), "warm_start": float(np.mean(warm)),
               "trained": float(np.mean(trained)), "difference": mean, "low": low, "high": high,
               "sign_flip_p": stats.paired_task_test(d, np.zeros_like(d), resamples=resamples, seed=seed),
               "paired_task_p": None, "tasks": None}
        a, b = tasks.get((method, label)), tasks.get((method, warm_label))
        if a is not None and b is not None and a[0] == b[0]:
          row["paired_task_p"] = stats.paired_task_test(a[1][k], b[1][k], resamples=resamples, seed=seed)
          row["tasks"] = len(a[0])
        rows.append(row)
  return rows


def composition(by_method: dict[str, list[tuple[str, dict]]], warm_starts: dict[str, object],
                machines: dict[str, str]) -> list[dict]:
  """Per warm start: the machines its runs ran on and each method's run count (who can be compared)."""
  rows: dict[object, dict] = {}
  for method, entries in by_method.items():
    for run, _ in entries:
      row = rows.setdefault(warm_starts.get(run), {"warm_start": warm_starts.get(run), "machines": [], "runs": {}})
      if machines.get(run, "?") not in row["machines"]:
        row["machines"].append(machines.get(run, "?"))
      row["runs"][method] = row["runs"].get(method, 0) + 1
  return list(rows.values())


def within_warm_starts(va: list[float], vb: list[float], strata_a: list, strata_b: list, resamples: int,
                       seed: int) -> dict:
  """The comparison of A and B within warm starts, on the runs whose warm start both methods have.

  A warm start only one of them ran from (another machine's, say) says nothing about the difference and
  is left out, so the difference and the test are those of a matched design. Empty when the shared runs
  come from a single warm start (the plain permutation test is then the same test).
  """
  shared = set(strata_a) & set(strata_b)
  if len(set(strata_a) | set(strata_b)) < 2 or not shared:
    return {}
  ia = [i for i, s in enumerate(strata_a) if s in shared]
  ib = [i for i, s in enumerate(strata_b) if s in shared]
  a, b = [va[i] for i in ia], [vb[i] for i in ib]
  return {"within_warm_starts_p": stats.stratified_permutation_test(
              a, b, [strata_a[i] for i in ia], [strata_b[i] for i in ib], resamples=resamples, seed=seed),
          "warm_starts": len(shared), "matched_runs": [len(a), len(b)],
          "matched_difference": float(np.mean(a) - np.mean(b))}


def markdown(by_method: dict[str, list[tuple[str, dict]]], report: dict, ks_table: list[str],
             top_tasks: int) -> str:
  methods, k_max = list(report["methods"]), report["k_max"]
  ks_table = [k for k in ks_table if int(k) in report["ks"]] or [str(k_max)]  # the k every run has
  conf = f"{100 * report['confidence']:g}%"
  out = ["## pass@k, mean ± sample std over seeds", ""]
  head = ["method", "policy / tasks", "seeds"] + [f"pass@{k}" for k in ks_table] + ["solved≥1", "distinct outcomes",
                                                                                   "distinct states", "steps to success"]
  out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for method, entries in by_method.items():
    for label in entries[0][1]:
      rows = [s[label] for _, s in entries if label in s]
      cells = [method, label, str(len(rows))] + [mean_std([r["pass_at_k"][k] for r in rows]) for k in ks_table]
      cells += [mean_std([r["tasks_solved_at_least_once"] for r in rows], 1),
                mean_std([r["distinct_outcomes_per_task"] for r in rows], 2),
                _mean_std_if_all([r.get("distinct_states_per_task") for r in rows], 2),
                _mean_std_if_all([r.get("steps_to_success") for r in rows], 2)]
      out.append("| " + " | ".join(cells) + " |")

  out += ["", f"## Mean over seeds with {conf} percentile-bootstrap CI ({report['resamples']} resamples)", "",
          f"| method | policy / tasks | seeds | pass@1 [{conf} CI] | pass@{k_max} [{conf} CI] |",
          "|---|---|---|---|---|"]
  for method, m in report["methods"].items():
    for label, s in m["sets"].items():
      cells = [method, label, str(s["seeds"])]
      cells += [fmt_ci(*(s["pass_at_k"][str(k)][x] for x in ("mean", "low", "high"))) for k in (1, k_max)]
      out.append("| " + " | ".join(cells) + " |")

  if report["comparisons"]:
    out += ["", "## Differences between methods", "",
            f"A − B: difference of the means over seeds, {conf} bootstrap CI resampling each method's seeds. "
            "Primary test: the permutation p over seeds (exact up to 100,000 splits; its smallest possible "
            "value is 2 / C(n_A + n_B, n_A), 0.1 at 3 vs 3 seeds). Welch's t for reference. Paired tasks: "
            "sign-flip p over tasks of the seed-averaged per-task difference (where, not whether: it ignores "
            "seed variance). No multiple-comparison correction.", "",
            "| policy / tasks | pass@k | A | B | seeds | A − B [CI] | permutation p | Welch t | Welch dof "
            "| Welch p | paired tasks p (tasks) |", "|" + "---|" * 11]
    for c in report["comparisons"]:
      paired = "—" if c["paired_task_p"] is None else f"{fmt_p(c['paired_task_p'])} ({c['tasks']})"
      cells = [c["set"], f"pass@{c['k']}", c["a"], c["b"], f"{c['seeds_a']} vs {c['seeds_b']}",
               fmt_ci(c["difference"], c["low"], c["high"]), fmt_p(c["permutation_p"]), fmt(c["welch_t"], 2),
               fmt(c["welch_dof"], 1), fmt_p(c["welch_p"]), paired]
      out.append("| " + " | ".join(cells) + " |")

  if len(report["warm_starts"]) > 1:
    out += ["", "## Warm starts", "",
            "The policies RL started from: a digest of the starting parameters' exact bits (provenance.json), "
            "or the config's sft.seed for runs recorded without one. The same sft.seed on another machine is "
            "another warm start (docs/determinism.md).", "",
            "| warm start | machine | " + " | ".join(methods) + " |", "|" + "---|" * (2 + len(methods))]
    for w in report["warm_starts"]:
      out.append(f"| {w['warm_start']} | {', '.join(w['machines'])} | "
                 + " | ".join(str(w["runs"].get(m, 0)) for m in methods) + " |")

  within = [c for c in report["comparisons"] if c["within_warm_starts_p"] is not None]
  if within:
    out += ["", "## Differences within warm starts", "",
            "The runs come from several warm starts, and runs from one warm start are alike. This permutation "
            "test relabels runs only among those sharing a warm start, which takes the warm starts' own "
            "differences out of the comparison (the test above permutes across them and is conservative). It "
            "uses only the warm starts both methods ran from (matched runs, their difference of means). It is "
            "the primary test of a protocol with several warm starts.",
            "", "| policy / tasks | pass@k | A | B | matched runs | warm starts | A − B (matched) "
            "| permutation p within warm starts |", "|" + "---|" * 8]
    for c in within:
      cells = [c["set"], f"pass@{c['k']}", c["a"], c["b"], " vs ".join(map(str, c["matched_runs"])),
               str(c["warm_starts"]), fmt(c["matched_difference"]), fmt_p(c["within_warm_starts_p"])]
      out.append("| " + " | ".join(cells) + " |")

  if report.get("learning"):
    out += ["", "## Learning: trained − warm start, each run against its own starting policy", "",
            "Does RL improve on the policy it started from? Per run, the trained policy's pass@k minus its warm "
            "start's, on the same tasks and samples. The sign-flip test over runs treats the runs as the random "
            "unit (with n runs its smallest p is 2/2^n); the paired test over tasks pairs each task's "
            "run-averaged success before and after.",
            "", f"| method | tasks | pass@k | runs | warm start | trained | trained − warm [{conf} CI] "
            "| sign-flip p (runs) | paired p (tasks) |", "|" + "---|" * 9]
    for r in report["learning"]:
      cells = [r["method"], r["set"], f"pass@{r['k']}", str(r["runs"]), fmt(r["warm_start"]), fmt(r["trained"]),
               fmt_ci(r["difference"], r["low"], r["high"]), fmt_p(r["sign_flip_p"]),
               fmt_p(r["paired_task_p"]) + (f" ({r['tasks']} tasks)" if r["tasks"] else "")]
      out.append("| " + " | ".join(cells) + " |")

  missing = [label for label in report["sets"] if label not in report["per_task"]]
  if any(split_task_set_label(label)[0] not in report["skip_policies"] for label in report["per_task"]):
    out += ["", f"## Per task: seed-averaged pass@1 and pass@{k_max}, where the methods differ most", ""]
    for label, pt in report["per_task"].items():
      if split_task_set_label(label)[0] in report["skip_policies"]:
        continue
      m = pt["methods"]
      at_kmax = np.array([m[x][str(k_max)] for x in methods])   # [methods, tasks]
      at_1 = np.array([m[x]["1"] for x in methods])
      spread = at_kmax.max(0) - at_kmax.min(0)
      spread1 = at_1.max(0) - at_1.min(0)
      order = sorted((i for i in range(len(pt["task_ids"])) if spread[i] > 0 or spread1[i] > 0),
                     key=lambda i: (-spread[i], -spread1[i], i))
      out += [f"### {label}: the methods differ on {len(order)} of {len(pt['task_ids'])} tasks"
              f"{f' (the {top_tasks} largest differences)' if len(order) > top_tasks else ''}", ""]
      if not order:
        continue
      head = ["task"] + [f"{x} pass@{kk}" for x in methods for kk in (1, k_max)] + [f"spread pass@{k_max}"]
      out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
      for i in order[:top_tasks]:
        cells = [json.dumps(pt["task_ids"][i])]
        cells += [fmt(m[x][str(kk)][i]) for x in methods for kk in (1, k_max)] + [fmt(spread[i])]
        out.append("| " + " | ".join(cells) + " |")
      out.append("")
  if missing:
    out += ["", f"No per-task counts for {', '.join(missing)} in every run (summary.json entries without "
            "\"per_task\"): no paired task test or per-task table there."]
  return "\n".join(out).rstrip() + "\n"


def plot(by_method: dict[str, list[tuple[str, list[dict]]]], path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  keys = ["success_rate", "eval/success_rate"] + [k for k in curve_compare.CURVE_METRICS[:1] if any(
      k in r for entries in by_method.values() for _, m in entries for r in m)]  # D_grp where a method logs it
  fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.5))
  for ax, key in zip(axes, keys):
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
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv):
  runs = argv[1:]
  if not runs:
    raise app.UsageError("give run directories")
  summaries: dict[str, list[tuple[str, dict]]] = {}
  curves: dict[str, list[tuple[str, list[dict]]]] = {}
  warm_starts: dict[str, object] = {}
  machines: dict[str, str] = {}
  if _LABELS.value is not None and len(_LABELS.value) != len(runs):
    raise app.UsageError(f"--labels has {len(_LABELS.value)} names for {len(runs)} runs")
  for i, run in enumerate(runs):
    method, summary, metrics, warm_starts[run], machines[run] = load(run)
    method = _LABELS.value[i] if _LABELS.value is not None else method
    summaries.setdefault(method, []).append((run, summary))
    curves.setdefault(method, []).append((run, metrics))
  report = analyse(summaries, confidence=_CONFIDENCE.value, resamples=_RESAMPLES.value, seed=_SEED.value,
                   skip_policies=_SKIP_POLICIES.value, warm_starts=warm_starts, machines=machines)
  report["curves"] = curve_compare.analyse(curves, window=_CURVE_WINDOW.value, confidence=_CONFIDENCE.value,
                                           resamples=_RESAMPLES.value, seed=_SEED.value)
  text = markdown(summaries, report, list(_KS.value), _TOP_TASKS.value)
  text += ("\n" + curve_compare.markdown(report["curves"], _CONFIDENCE.value)) if report["curves"] else ""
  print(text, end="")
  if _OUTPUT.value:
    os.makedirs(_OUTPUT.value, exist_ok=True)
    with open(os.path.join(_OUTPUT.value, "compare.md"), "w") as f:
      f.write(text)
    with open(os.path.join(_OUTPUT.value, "compare.json"), "w") as f:
      json.dump(_json_safe(report), f, indent=1, allow_nan=False)
    plot(curves, os.path.join(_OUTPUT.value, "compare.png"))
    names = ("compare.md", "compare.json", "compare.png")
    print(f"[compare] {', '.join(os.path.join(_OUTPUT.value, n) for n in names)}")


if __name__ == "__main__":
  app.run(main)
