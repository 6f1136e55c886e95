"""launch/train.py as a user runs it, in its own process, for the methods' end-to-end tests: one CPU device (no
fake devices), a fresh cache under the test's directory, the run's metrics.jsonl rows back."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def user_environment(tmp_path) -> dict:
  """The environment of a user's run: the test's own cache, XLA_FLAGS' fake devices dropped."""
  env = {**os.environ, "EXPLORE_JAX_CACHE": str(tmp_path / "cache")}
  env.pop("XLA_FLAGS", None)
  return env


def train(tmp_path, args, workdir=None, timeout: float = 900) -> list[dict]:
  """Runs launch/train.py with `args` into `workdir` (default tmp_path/run); asserts it succeeded and returns
  its metrics rows."""
  workdir = str(workdir or tmp_path / "run")
  run = subprocess.run([sys.executable, os.path.join(REPO, "launch", "train.py"), *args, f"--workdir={workdir}"],
                       cwd=REPO, env=user_environment(tmp_path), capture_output=True, text=True, timeout=timeout)
  assert run.returncode == 0, run.stderr[-3000:]
  return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
