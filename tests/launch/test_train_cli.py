"""launch/train.py as a user runs it: the default config end to end, and one-line config errors."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train(*args, timeout=600):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as a user has
  return subprocess.run([sys.executable, os.path.join(REPO, "launch", "train.py"), *args],
                        capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def test_default_config_runs_and_checkpoints(tmp_path):
  run = train("--config=configs/sge_coding.py", f"--workdir={tmp_path}", "--config.sampling.max_new_tokens=16")
  assert run.returncode == 0, run.stderr[-3000:]
  summary = json.load(open(tmp_path / "summary.json"))
  assert summary["new_tokens"] > 0 and len(summary["losses"]) == 3
  assert os.path.isdir(os.path.join(summary["checkpoint_dir"], "3"))
  assert json.load(open(tmp_path / "config.json"))["sampling"]["max_new_tokens"] == 16
  assert "not implemented yet" in run.stdout  # it says plainly what it does not do


@pytest.mark.parametrize("arg, message", [
    ("--config.sge.temprature=1.0", "unknown config field 'config.sge.temprature'"),
    ("--config.optimizer.learning_rate=fast", "could not convert string to float: 'fast'"),
])
def test_bad_override_is_one_line_naming_it(tmp_path, arg, message):
  run = train("--config=configs/sge_coding.py", f"--workdir={tmp_path}", arg, timeout=120)
  assert run.returncode != 0
  lines = run.stderr.strip().splitlines()
  assert len(lines) == 1 and message in lines[0], run.stderr


def test_unknown_variant_is_named(tmp_path):
  run = train("--config=configs/sge_coding.py:tiniest", timeout=120)
  assert run.returncode != 0 and "unknown variant 'tiniest'" in run.stderr.strip().splitlines()[-1]
