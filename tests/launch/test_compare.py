"""launch/compare.py: per-method mean and std over seeds from run directories."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_dir(path, method, pass1, solved):
  os.makedirs(path)
  json.dump({"method": method}, open(os.path.join(path, "config.json"), "w"))
  entry = {"pass_at_k": {"1": pass1, "2": pass1 + 0.1}, "tasks_solved_at_least_once": solved,
           "distinct_outcomes_per_task": 2.0}
  json.dump({"trained / train": entry}, open(os.path.join(path, "summary.json"), "w"))
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    for i in range(3):
      f.write(json.dumps({"iteration": i, "success_rate": pass1, "eval/success_rate": pass1}) + "\n")


def test_compare_averages_seeds_per_method(tmp_path):
  _run_dir(tmp_path / "a0", "sge", 0.5, 10)
  _run_dir(tmp_path / "a1", "sge", 0.7, 12)
  _run_dir(tmp_path / "b0", "grpo", 0.4, 9)
  out = subprocess.run([sys.executable, os.path.join(REPO, "launch", "compare.py"), str(tmp_path / "a0"),
                        str(tmp_path / "a1"), str(tmp_path / "b0"), "--ks=1,2", f"--output={tmp_path / 'cmp'}"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
  assert out.returncode == 0, out.stderr[-2000:]
  # sge: mean 0.6, sample std 0.1414; grpo: one seed, std 0.
  assert "| sge | trained / train | 2 | 0.600 ± 0.141 | 0.700 ± 0.141 | 11.0 ± 1.4 | 2.00 ± 0.00 |" in out.stdout
  assert "| grpo | trained / train | 1 | 0.400 ± 0.000 |" in out.stdout
  assert os.path.getsize(tmp_path / "cmp" / "compare.png") > 0
  bad = subprocess.run([sys.executable, os.path.join(REPO, "launch", "compare.py"), str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
  assert bad.returncode != 0 and "has no config.json" in bad.stderr
