"""launch/train.py as a user runs it: the default config end to end, and one-line config errors."""

import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env(extra=None):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as a user has
  return {**env, **(extra or {})}


def train(*args, timeout=600, env=None):
  return subprocess.run([sys.executable, os.path.join(REPO, "launch", "train.py"), *args],
                        capture_output=True, text=True, timeout=timeout, cwd=REPO, env=_env(env))


SMALL = ("--config.train.num_iterations=1", "--config.sft.steps=2", "--config.sft.oracle_episodes=8",
         "--config.rollout.task_pool=2", "--config.rollout.num_tasks=2", "--config.rollout.group_size=2",
         "--config.eval.every=1",
         "--config.eval.num_episodes=2", "--config.eval.passk_samples=2", "--config.eval.passk_held_out_tasks=2")


@pytest.mark.slow
def test_default_config_trains_evaluates_and_reports(tmp_path):
  """The `make run` job in miniature: SFT warm start, an SGE iteration, pass@k table; then launch/eval.py."""
  env = {"EXPLORE_JAX_CACHE": str(tmp_path / "cache")}
  run = train("--config=configs/sge_coding.py", f"--workdir={tmp_path / 'run'}", *SMALL, env=env)
  assert run.returncode == 0, run.stderr[-3000:]
  assert "[sft]" in run.stdout and "pass@1" in run.stdout and "summary.md" in run.stdout
  assert "docs/determinism.md" in run.stdout and "make protocol" in run.stdout  # one run is not a claim
  summary = json.load(open(tmp_path / "run" / "summary.json"))
  assert set(summary) == {"warm start / train", "trained / train", "warm start / held-out", "trained / held-out"}
  for entry in summary.values():
    assert entry["tasks"] == 2 and entry["samples_per_task"] == 2
    assert 0.0 <= entry["pass_at_k"]["1"] <= entry["pass_at_k"]["2"] <= 1.0
    assert entry["distinct_outcomes_per_task"] >= 1.0
  for name in ("pass_at_k.png", "curves.png", "metrics.jsonl", "summary.md"):
    assert os.path.getsize(tmp_path / "run" / name) > 0
  rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  assert rows[-1]["iteration"] == 1 and "sge/negative_reflections" in rows[-1]

  ev = subprocess.run([sys.executable, os.path.join(REPO, "launch", "eval.py"), "--config=configs/sge_coding.py",
                       f"--run={tmp_path / 'run'}", "--samples=2", "--splits=held-out",
                       "--config.eval.passk_held_out_tasks=2", "--transcripts=1"],
                      capture_output=True, text=True, timeout=600, cwd=REPO, env=_env(env))
  assert ev.returncode == 0, ev.stderr[-3000:]
  evaluated = json.load(open(tmp_path / "run" / "eval-1" / "summary.json"))
  # One episode of each held-out task, step by step, as the policy played it.
  episodes = [json.loads(line) for line in open(tmp_path / "run" / "eval-1" / "transcripts-held-out.jsonl")]
  assert len(episodes) == 2 and len({e["task"] for e in episodes}) == 2
  assert all(e["steps"] and all(s["observation"] and isinstance(s["response"], str) for s in e["steps"])
             for e in episodes)
  assert list(evaluated) == ["step 1 / held-out"]
  # The same checkpoint and sampling stream as the run's own final evaluation give the same numbers.
  assert evaluated["step 1 / held-out"]["pass_at_k"] == summary["trained / held-out"]["pass_at_k"]

  # provenance.json names the warm start's cache entry; carried to another cache (as launch/sweep.py
  # --carry_warm_starts does), it is found there by the same key and reused, not computed again.
  key = json.load(open(tmp_path / "run" / "provenance.json"))["warm_start"]
  assert len(os.listdir(tmp_path / "cache" / "sft" / f"{key}.pass_at_k")) == 1  # its pass@k, cached beside it
  shutil.copytree(tmp_path / "cache" / "sft" / key, tmp_path / "elsewhere" / "sft" / key)
  ws = subprocess.run([sys.executable, os.path.join(REPO, "launch", "eval.py"), "--config=configs/sge_coding.py",
                       "--policy=warm_start", "--samples=1", "--splits=held-out", f"--output={tmp_path / 'ws'}",
                       *[a for a in SMALL if a.startswith("--config.sft.")], "--config.eval.passk_held_out_tasks=1"],
                      capture_output=True, text=True, timeout=600, cwd=REPO,
                      env=_env({"EXPLORE_JAX_CACHE": str(tmp_path / "elsewhere")}))
  assert ws.returncode == 0, ws.stderr[-3000:]
  assert f"[sft] warm start reused from {tmp_path / 'elsewhere' / 'sft' / key}" in ws.stdout + ws.stderr


@pytest.mark.parametrize("arg, message", [
    ("--config.sge.temprature=1.0", "unknown config field 'config.sge.temprature'"),
    ("--config.optimizer.learning_rate=fast", "could not convert string to float: 'fast'"),
])
def test_bad_override_is_one_line_naming_it(tmp_path, arg, message):
  run = train("--config=configs/sge_coding.py", f"--workdir={tmp_path}", arg, timeout=120)
  assert run.returncode != 0
  lines = run.stderr.strip().splitlines()
  assert len(lines) == 1 and message in lines[0], run.stderr


def test_unknown_method_is_named(tmp_path):
  run = train("--config=configs/sge_coding.py", f"--workdir={tmp_path}", "--config.method=sgd", timeout=120)
  assert run.returncode != 0 and "unknown method 'sgd'" in run.stderr.strip().splitlines()[-1]


def test_unknown_variant_is_named(tmp_path):
  run = train("--config=configs/sge_coding.py:tiniest", timeout=120)
  assert run.returncode != 0 and "unknown variant 'tiniest'" in run.stderr.strip().splitlines()[-1]


def test_paper_variant_names_what_it_needs(tmp_path):
  run = train("--config=configs/sge_coding.py:paper", f"--workdir={tmp_path}", timeout=120)
  assert run.returncode != 0 and "set config.model.checkpoint" in run.stderr.strip().splitlines()[-1]
  run = train("--config=configs/grpo_coding.py:paper", f"--workdir={tmp_path}", "--config.model.checkpoint=tiny",
              timeout=300)
  last = run.stderr.strip().splitlines()[-1]
  assert run.returncode != 0 and "dataset must be 'procedural', 'humaneval' or a .jsonl file" in last


def test_eval_of_a_base_model_from_a_hugging_face_directory(tmp_path):
  """The paper's "Base" curves: a checkpoint directory evaluated zero-shot, no SFT, no training."""
  env = _env({"EXPLORE_JAX_CACHE": str(tmp_path / "cache")})
  hf_dir = subprocess.run([sys.executable, "-c", "from explore_jax import hf; print(hf.resolve('tiny'))"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300).stdout.strip()
  assert os.path.isfile(os.path.join(hf_dir, "config.json")) and hf_dir.startswith(str(tmp_path))
  ev = subprocess.run([sys.executable, os.path.join(REPO, "launch", "eval.py"), "--config=configs/sge_coding.py",
                       "--policy=base", f"--config.model.checkpoint={hf_dir}", "--samples=2", "--splits=held-out",
                       "--config.eval.passk_held_out_tasks=2", f"--output={tmp_path / 'eval'}"],
                      capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
  assert ev.returncode == 0, ev.stderr[-3000:]
  result = json.load(open(tmp_path / "eval" / "summary.json"))["base / held-out"]
  assert result["tasks"] == 2 and result["samples_per_task"] == 2
  # A random model writes no valid "### Code" section: every attempt is the invalid-action outcome.
  assert result["pass_at_k"]["1"] == 0.0 and result["distinct_outcomes_per_task"] == 1.0


def test_eval_names_a_split_the_config_does_not_have(tmp_path):
  ev = subprocess.run([sys.executable, os.path.join(REPO, "launch", "eval.py"), "--config=configs/grpo_keydoor.py",
                       "--policy=base", "--samples=1", "--splits=held-out,valid_seen", f"--output={tmp_path}"],
                      capture_output=True, text=True, timeout=300, cwd=REPO, env=_env())
  assert ev.returncode != 0
  assert ev.stderr.strip().splitlines()[-1] == (
      "error: unknown split(s) ['valid_seen']; this config has held-out (train is the held-in pool of a "
      "rollout.task_pool; another split of the environment goes in --config.eval.more_splits)"), ev.stderr


def test_a_run_directory_is_taken_by_one_process_at_a_time(tmp_path):
  """A second process started on a run directory that a live run holds stops before it writes anything there;
  once the holder is gone (its lock goes with it, the file stays) the directory can be taken again."""
  import fcntl

  (tmp_path / "config.json").write_text("{}")
  with open(tmp_path / ".run.lock", "w") as held:
    fcntl.flock(held, fcntl.LOCK_EX)
    held.write("4242")
    held.flush()
    run = train("--config=configs/grpo_keydoor.py", f"--workdir={tmp_path}", timeout=120)
  assert run.returncode != 0
  assert "is in use by another process (pid 4242)" in run.stderr.strip().splitlines()[-1], run.stderr
  assert (tmp_path / "config.json").read_text() == "{}"
  run = train("--config=configs/grpo_keydoor.py", f"--workdir={tmp_path}", "--config.model.checkpoint=/nowhere/model",
              timeout=300)
  assert run.returncode != 0 and "in use" not in run.stderr, run.stderr
  assert json.loads((tmp_path / "config.json").read_text())["model"]["checkpoint"] == "/nowhere/model"
