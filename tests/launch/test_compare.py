"""launch/compare.py: per-method statistics over seeds, tests between methods and per-task tables."""

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from explore_jax.train import evaluation, stats

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPARE = os.path.join(REPO, "launch", "compare.py")


def _compare(*args):
  out = subprocess.run([sys.executable, COMPARE, *map(str, args)], capture_output=True, text=True, timeout=300,
                       cwd=REPO)
  assert out.returncode == 0, out.stderr[-2000:]
  return out.stdout


def _write_run(path, method, summary, iterations=3, success=0.5):
  os.makedirs(path)
  json.dump({"method": method}, open(os.path.join(path, "config.json"), "w"))
  json.dump(summary, open(os.path.join(path, "summary.json"), "w"))
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    for i in range(iterations):
      f.write(json.dumps({"iteration": i, "success_rate": success, "eval/success_rate": success}) + "\n")


def _run_dir(path, method, pass1, solved):
  """An old-style summary.json: aggregates only, no per-task counts."""
  entry = {"pass_at_k": {"1": pass1, "2": pass1 + 0.1}, "tasks_solved_at_least_once": solved,
           "distinct_outcomes_per_task": 2.0}
  _write_run(path, method, {"trained / train": entry}, success=pass1)


def test_compare_averages_seeds_per_method(tmp_path):
  _run_dir(tmp_path / "a0", "sge", 0.5, 10)
  _run_dir(tmp_path / "a1", "sge", 0.7, 12)
  _run_dir(tmp_path / "b0", "grpo", 0.4, 9)
  out = _compare(tmp_path / "a0", tmp_path / "a1", tmp_path / "b0", "--ks=1,2", f"--output={tmp_path / 'cmp'}")
  # sge: mean 0.6, sample std 0.1414; grpo: one seed, std 0.
  assert "| sge | trained / train | 2 | 0.600 ± 0.141 | 0.700 ± 0.141 | 11.0 ± 1.4 | 2.00 ± 0.00 |" in out
  assert "| grpo | trained / train | 1 | 0.400 ± 0.000 |" in out
  # Bootstrap over sge's two seeds: the resampled means are 0.5, 0.6 or 0.7; one grpo seed has no interval.
  assert "| sge | trained / train | 2 | 0.600 [0.500, 0.700] | 0.700 [0.600, 0.800] |" in out
  assert "| grpo | trained / train | 1 | 0.400 [—, —] | 0.500 [—, —] |" in out
  # 2 vs 1 seeds: C(3, 2) = 3 splits, |diff| of {.5,.7}|{.4} = 0.2, {.5,.4}|{.7} = 0.25, {.7,.4}|{.5} = 0.05.
  # p = 2/3; Welch needs two seeds a side; no per-task counts in these summaries.
  assert "| trained / train | pass@1 | sge | grpo | 2 vs 1 | 0.200 [—, —] | 0.667 | — | — | — | — |" in out
  assert "No per-task counts for trained / train" in out
  assert os.path.getsize(tmp_path / "cmp" / "compare.png") > 0
  assert open(tmp_path / "cmp" / "compare.md").read() in out
  bad = subprocess.run([sys.executable, COMPARE, str(tmp_path)], capture_output=True, text=True, timeout=120,
                       cwd=REPO)
  assert bad.returncode != 0 and "has no config.json" in bad.stderr


TASKS = [3, 5, 8, 13, 21, 34]  # task ids (the evaluator's are env seeds)
N = 4                          # samples per task: pass@1..4


def _summary(rng, skill):
  """summary.json in the evaluator's format: TaskSetEval.to_dict per label, plus its per-task counts."""
  out = {}
  for policy, split in itertools.product(("warm start", "trained"), ("train", "held-out")):
    label = f"{policy} / {split}"
    # The warm start is one policy for every run: the same counts; trained policies differ per seed.
    probs = np.linspace(0.1, 0.8, len(TASKS)) if policy == "warm start" else np.clip(
        np.linspace(0.0, 0.9, len(TASKS)) + skill + rng.normal(0, 0.1, len(TASKS)), 0, 1)
    successes = np.array([0 if policy == "trained" and t == 13 and skill < 0.2 else rng.binomial(N, p)
                          for t, p in zip(TASKS, probs)])
    if policy == "warm start":
      successes = np.array([0, 1, 1, 2, 3, 3])
    e = evaluation.TaskSetEval(label, list(TASKS), np.full(len(TASKS), N), successes,
                               np.full(len(TASKS), 2))
    out[label] = {**e.to_dict(range(1, N + 1)), "per_task": e.to_json()}
  return out


def test_compare_statistics_equal_stats_module(tmp_path):
  rng = np.random.default_rng(0)
  runs = {"sge": [_summary(rng, 0.3) for _ in range(4)], "grpo": [_summary(rng, 0.0) for _ in range(3)]}
  dirs = []
  for method, summaries in runs.items():
    for seed, s in enumerate(summaries):
      dirs.append(tmp_path / f"{method}_seed{seed}")
      _write_run(dirs[-1], method, s)
  out = _compare(*dirs, "--ks=1,2,4", "--resamples=2000", "--seed=7", f"--output={tmp_path / 'cmp'}")
  report = json.load(open(tmp_path / "cmp" / "compare.json"))
  md = open(tmp_path / "cmp" / "compare.md").read()
  assert md in out
  assert report["k_max"] == N and report["ks"] == [1, 2, 3, 4]

  def values(method, label, k):
    return [s[label]["pass_at_k"][str(k)] for s in runs[method]]

  def per_task(method, label, k):  # [tasks, seeds], recomputed from the raw counts
    return np.array([[evaluation.pass_at_k(N, c, k) for c in s[label]["per_task"]["successes"]]
                     for s in runs[method]]).T

  # Per method: the bootstrap CI of every pass@k, with the CLI's seed and resamples.
  for method in runs:
    assert report["methods"][method]["seeds"] == len(runs[method])
    for label in runs[method][0]:
      for k in range(1, N + 1):
        got = report["methods"][method]["sets"][label]["pass_at_k"][str(k)]
        mean, low, high = stats.bootstrap_ci(values(method, label, k), resamples=2000, seed=7)
        assert (got["mean"], got["low"], got["high"]) == (mean, low, high)
        assert got["values"] == values(method, label, k)
  mean, low, high = stats.bootstrap_ci(values("sge", "trained / held-out", 1), resamples=2000, seed=7)
  assert f"| sge | trained / held-out | 4 | {mean:.3f} [{low:.3f}, {high:.3f}] |" in out
  # The warm start is the same policy everywhere: a degenerate interval.
  ws = report["methods"]["grpo"]["sets"]["warm start / train"]["pass_at_k"]["4"]
  assert ws["low"] == ws["mean"] == ws["high"]

  # Pairs: trained policies only (the warm start is skipped), pass@1 and pass@k_max.
  rows = {(c["set"], c["k"]): c for c in report["comparisons"]}
  assert set(rows) == {(f"trained / {s}", k) for s in ("train", "held-out") for k in (1, N)}
  for (label, k), c in rows.items():
    a, b = values("sge", label, k), values("grpo", label, k)
    assert (c["a"], c["b"], c["seeds_a"], c["seeds_b"]) == ("sge", "grpo", 4, 3)
    assert (c["difference"], c["low"], c["high"]) == stats.bootstrap_diff_ci(a, b, resamples=2000, seed=7)
    assert c["permutation_p"] == stats.permutation_test(a, b)       # C(7, 4) = 35 splits: exact
    assert c["permutation_p"] * 35 == pytest.approx(round(c["permutation_p"] * 35))
    assert (c["welch_t"], c["welch_dof"], c["welch_p"]) == pytest.approx(stats.welch_t(a, b), abs=0, rel=0)
    assert c["paired_task_p"] == stats.paired_task_test(per_task("sge", label, k), per_task("grpo", label, k))
    assert c["tasks"] == len(TASKS)
  c = rows["trained / train", N]
  line = (f"| trained / train | pass@{N} | sge | grpo | 4 vs 3 | {c['difference']:.3f} [{c['low']:.3f}, "
          f"{c['high']:.3f}] | {c['permutation_p']:.3f} | {c['welch_t']:.2f} | {c['welch_dof']:.1f} | ")
  assert line in out

  # Per task: seed-averaged pass@k per method, and the table led by the task where they differ most.
  pt = report["per_task"]["trained / train"]
  assert pt["task_ids"] == TASKS
  for method in runs:
    for k in range(1, N + 1):
      np.testing.assert_array_equal(pt["methods"][method][str(k)], per_task(method, "trained / train", k).mean(1))
  at_n = np.array([pt["methods"][m][str(N)] for m in runs])
  spread = at_n.max(0) - at_n.min(0)
  top = int(np.argmax(spread))  # ties broken by pass@1 spread, then task order; check the leading spread only
  section = md.split("### trained / train")[1]
  first = [line for line in section.splitlines() if line.startswith("| ")][1]   # after the header
  assert first.endswith(f" {spread[top]:.3f} |")
  assert "No per-task counts" not in out
  assert "### warm start" not in md   # the same policy for both: no per-task table, but in compare.json
  warm = report["per_task"]["warm start / train"]["methods"]
  for k in range(1, N + 1):
    np.testing.assert_allclose(warm["sge"][str(k)], warm["grpo"][str(k)], atol=1e-12)


def test_compare_tests_within_warm_starts(tmp_path):
  # Two warm starts far apart (0.8 vs 0.5), sge 0.02 above grpo on each: across warm starts the difference
  # drowns in the warm starts' gap, within them every relabelling but the observed one and its mirror is smaller.
  runs, labels = [], []
  for method, offset in (("sge", 0.02), ("grpo", 0.0)):
    for ws, base in ((0, 0.8), (1, 0.5)):
      for seed, jitter in enumerate((0.0, 0.01)):
        path = tmp_path / f"{method}_ws{ws}_s{seed}"
        _run_dir(path, method, base + offset + jitter, 10)
        json.dump({"method": method, "sft": {"enabled": True, "seed": ws}}, open(path / "config.json", "w"))
        runs.append(path)
  out = _compare(*runs, "--ks=1,2", f"--output={tmp_path / 'cmp'}")
  sge = [0.82, 0.83, 0.52, 0.53]
  grpo = [0.80, 0.81, 0.50, 0.51]
  within = stats.stratified_permutation_test(sge, grpo, [0, 0, 1, 1], [0, 0, 1, 1])
  assert within == pytest.approx(2 / 36)  # C(4, 2)^2 = 36 relabellings; only the observed one and its mirror
  assert stats.permutation_test(sge, grpo) > 0.5
  assert "## Differences within warm starts" in out
  assert f"| trained / train | pass@1 | sge | grpo | 4 vs 4 | 2 | 0.020 | {within:.3f} |" in out
  report = json.load(open(tmp_path / "cmp" / "compare.json"))
  assert report["comparisons"][0]["within_warm_starts_p"] == pytest.approx(within)
  # One warm start (or none): no such section.
  assert "within warm starts" not in _compare(*runs[:2], *runs[4:6], "--ks=1,2")


def test_within_warm_starts_uses_only_the_warm_starts_both_methods_share(tmp_path):
  # Machine 1 ran sge and grpo (runs without provenance.json: their warm start is the config's sft.seed);
  # machine 2 ran sge and an ablation from its own warm starts (provenance.json's start digests d0, d1).
  # Each pair may only be compared on the warm starts both of its methods ran from.
  runs = []

  def run(name, method, value, sft_seed, digest=None):
    path = tmp_path / name
    _run_dir(path, method, value, 10)
    json.dump({"method": method, "sft": {"enabled": True, "seed": sft_seed}}, open(path / "config.json", "w"))
    if digest:
      json.dump({"start_digest": digest, "machines": [{"tag": "m2", "iteration": 0}]},
                open(path / "provenance.json", "w"))
    runs.append(path)

  values = {("sge", "m1"): [0.82, 0.83, 0.52, 0.53], ("grpo", "m1"): [0.80, 0.81, 0.50, 0.51],
            ("sge", "m2"): [0.30, 0.32, 0.60, 0.61], ("abl", "m2"): [0.25, 0.26, 0.55, 0.57]}
  for (method, machine), vs in values.items():
    for i, v in enumerate(vs):
      ws = i // 2
      run(f"{method}_{machine}_{i}", method, v, ws, digest=f"d{ws}" if machine == "m2" else None)
  out = _compare(*runs, "--ks=1,2", f"--output={tmp_path / 'cmp'}")

  assert "| warm start | machine | sge | grpo | abl |" in out
  assert "| sft.seed=0 | ? | 2 | 2 | 0 |" in out and "| start d1 | m2 | 2 | 0 | 2 |" in out
  within = {(c["a"], c["b"]): c for c in json.load(open(tmp_path / "cmp" / "compare.json"))["comparisons"]
            if c["k"] == 1}
  sge_grpo = within["sge", "grpo"]
  assert sge_grpo["matched_runs"] == [4, 4] and sge_grpo["matched_difference"] == pytest.approx(0.02)
  assert sge_grpo["within_warm_starts_p"] == pytest.approx(2 / 36)
  sge_abl = within["sge", "abl"]
  assert sge_abl["matched_runs"] == [4, 4] and sge_abl["matched_difference"] == pytest.approx(0.05)
  assert sge_abl["within_warm_starts_p"] == pytest.approx(stats.stratified_permutation_test(
      values["sge", "m2"], values["abl", "m2"], [0, 0, 1, 1], [0, 0, 1, 1]))
  # Over all 8 sge runs the plain difference mixes machines: 0.566 - 0.408.
  assert sge_abl["difference"] == pytest.approx(np.mean(values["sge", "m1"] + values["sge", "m2"]) - 0.4075)
  assert within["grpo", "abl"]["within_warm_starts_p"] is None  # no warm start in common
  assert "| trained / train | pass@1 | sge | abl | 4 vs 4 | 2 | 0.050 |" in out


def _before_after(task_sets: dict[str, tuple[list[int], list[int]]]) -> dict:
  """summary.json of one run: per task set, the successes of 4 samples on tasks 1 and 2, warm start and trained."""
  summary = {}
  for task_set, (warm, trained) in task_sets.items():
    for policy, successes in ((evaluation.WARM_START, warm), (evaluation.TRAINED, trained)):
      e = evaluation.TaskSetEval(evaluation.task_set_label(policy, task_set), [1, 2], np.full(2, 4),
                                 np.array(successes), np.ones(2))
      summary[e.label] = {**e.to_dict(range(1, 5)), "per_task": e.to_json()}
  return summary


def test_learning_compares_each_run_with_its_own_warm_start(tmp_path):
  """Three runs on tasks 1 and 2 with 4 samples each; successes (warm start -> trained) per task:
  run 0 [1, 2] -> [2, 3], run 1 [1, 2] -> [2, 2], run 2 [2, 2] -> [2, 3]."""
  counts = [([1, 2], [2, 3]), ([1, 2], [2, 2]), ([2, 2], [2, 3])]
  dirs = []
  for i, before_after in enumerate(counts):
    dirs.append(tmp_path / f"run{i}")
    _write_run(dirs[-1], "gigpo", _before_after({"held-out": before_after}))
  out = _compare(*dirs, "--resamples=4000", f"--output={tmp_path / 'cmp'}")
  row = next(r for r in json.load(open(tmp_path / "cmp" / "compare.json"))["learning"] if r["k"] == 1)
  # pass@1 = successes / 8 per run: warm .375, .375, .5; trained .625, .5, .625; differences .25, .125, .125.
  assert (row["warm_start"], row["trained"]) == pytest.approx((1.25 / 3, 1.75 / 3))
  assert row["difference"] == pytest.approx(0.5 / 3)
  # Bootstrap over three runs: a resample is all .125 with probability 8/27 and all .25 with 1/27, both > 2.5%.
  assert (row["low"], row["high"]) == pytest.approx((0.125, 0.25))
  # Sign flips over runs: only +++ and --- reach |mean| >= 1/6: p = 2/8.
  assert row["sign_flip_p"] == pytest.approx(0.25)
  # Over tasks: run-averaged differences (6 - 4) / 12 and (8 - 6) / 12; ++ and -- reach, +- and -+ give 0: p = 2/4.
  assert row["paired_task_p"] == pytest.approx(0.5) and row["tasks"] == 2
  assert "| gigpo | held-out | pass@1 | 3 | 0.417 | 0.583 | 0.167 [0.125, 0.250] | 0.250 | 0.500 (2 tasks) |" in out
  # The default --ks (1, 2, 4, 8, 16) keeps only the k every run has.
  assert "pass@8" not in out.split("## Mean over seeds")[0]


def test_learning_covers_a_task_set_only_one_method_has(tmp_path):
  """Method a's two runs have held-out and valid_seen, b's only held-out: a's learning covers both of its sets,
  and the two are compared on held-out alone."""
  a = {"held-out": ([1, 2], [2, 2]), "valid_seen": ([0, 1], [2, 3])}
  dirs = [tmp_path / "a0", tmp_path / "a1", tmp_path / "b0"]
  _write_run(dirs[0], "a", _before_after(a))
  _write_run(dirs[1], "a", _before_after(a))
  _write_run(dirs[2], "b", _before_after({"held-out": ([1, 2], [1, 2])}))
  _compare(*dirs, "--resamples=1000", f"--output={tmp_path / 'cmp'}")
  report = json.load(open(tmp_path / "cmp" / "compare.json"))
  learnt = {(r["method"], r["set"]): r for r in report["learning"] if r["k"] == 1}
  assert set(learnt) == {("a", "held-out"), ("a", "valid_seen"), ("b", "held-out")}
  # valid_seen pass@1: (0 + 1) / 8 -> (2 + 3) / 8 in both runs of a.
  assert learnt["a", "valid_seen"]["difference"] == pytest.approx(0.5)
  assert learnt["b", "held-out"]["difference"] == 0.0
  assert "valid_seen" in str(report["methods"]["a"]["sets"]) and "valid_seen" not in str(report["methods"]["b"])
  assert {c["set"] for c in report["comparisons"]} == {"trained / held-out"}  # the shared warm start is skipped


def test_compare_reports_a_logged_diversity_curve_early_against_late(tmp_path):
  entry = {"pass_at_k": {"1": 0.0}, "tasks_solved_at_least_once": 0, "distinct_outcomes_per_task": 1.0}
  for name, method, curve in (("a0", "se", [0.1, 0.2, 0.3]), ("a1", "se", [0.1, 0.3, 0.4]),
                              ("b0", "se_no_world", [0.3, 0.2, 0.1]), ("b1", "se_no_world", [0.2, 0.2, 0.1])):
    _write_run(tmp_path / name, method, {"trained / train": entry})
    with open(tmp_path / name / "metrics.jsonl", "w") as f:
      for i, v in enumerate(curve):
        f.write(json.dumps({"iteration": i + 1, "success_rate": 0.0, "diversity/d_grp_vis": v}) + "\n")
  out = _compare(*(tmp_path / n for n in ("a0", "a1", "b0", "b1")), "--ks=1", "--curve_window=1",
                 f"--output={tmp_path / 'cmp'}")
  assert "## Training curves: early vs late" in out and "### diversity/d_grp_vis (windows of 1 iterations)" in out
  assert "| se | 2 | 0.3500 [0.3000, 0.4000] | +0.2500 [+0.2000, +0.3000] | 0.500 |" in out
  assert "| se - se_no_world | +0.4000 [+0.3000, +0.5000] |" in out
  curves = json.load(open(tmp_path / "cmp" / "compare.json"))["curves"]
  assert curves["diversity/d_grp_vis"]["arms"]["se_no_world"]["change"] == pytest.approx([-0.2, -0.1])
