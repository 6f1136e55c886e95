"""EMPO² end to end: `configs/empo2_twx.py` as a user runs it (tips written, retrieved and encoded by
all-MiniLM-L6-v2 through the actors' embedding requests), killed with SIGKILL after its first checkpoint and
resumed, against the same command uninterrupted: the second iteration (which retrieves from the memory the first
one wrote) and the memories it leaves are the same."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import train_runs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = ("--config=configs/empo2_twx.py", "--config.train.num_iterations=2", "--config.sft.steps=4",
       "--config.sft.oracle_episodes=8", "--config.rollout.task_pool=2", "--config.rollout.num_tasks=2",
       "--config.rollout.group_size=4", "--config.rollout.num_actors=1", "--config.rollout.envs_per_actor=8",
       "--config.eval.every=0", "--config.eval.passk_samples=0", "--config.checkpoint.every=1",
       "--config.empo2.p_memory_free=0.25",  # most rollouts memory-augmented, so the second retrieves tips
       # The prompts as round 0 cut them (from the left): at this budget a fitted prompt drops the tiny model's long
       # tips; fitting is tested in test_empo2.py and test_actor.py.
       "--config.empo2.fit_prompts=False")
TIMING = ("time_", "throughput/", "sample_tokens_per_s", "sample_prompt_tokens_per_s")


def train(workdir, env, wait=True):
  cmd = [sys.executable, os.path.join(REPO, "launch", "train.py"), *RUN, f"--workdir={workdir}"]
  if not wait:
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def metrics(workdir):
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  return [{k: v for k, v in row.items() if not k.startswith(TIMING)} for row in rows]


def method_state(workdir, step):
  with open(os.path.join(workdir, "checkpoints", str(step), "metadata", "metadata")) as f:
    return json.load(f)["method"]


@pytest.mark.slow
def test_empo2_killed_and_resumed_gives_the_uninterrupted_run(tmp_path):
  env = train_runs.user_environment(tmp_path)  # one CPU device, as a user has
  straight = train(tmp_path / "straight", env)
  assert straight.returncode == 0, straight.stderr[-3000:]
  first = metrics(tmp_path / "straight")
  assert [m["iteration"] for m in first] == [1, 2]
  assert first[0]["empo2/tips_added"] > 0 and first[1]["empo2/tips_shown_per_step"] > 0  # written, then retrieved
  tips = method_state(tmp_path / "straight", 2)["tips"]
  assert sum(len(v) for v in tips.values()) >= first[0]["empo2/tips_added"]

  killed = train(tmp_path / "killed", env, wait=False)
  committed = tmp_path / "killed" / "checkpoints" / "1" / "commit_success.txt"
  deadline = time.monotonic() + 900
  while not committed.exists() and killed.poll() is None and time.monotonic() < deadline:
    time.sleep(0.2)
  assert committed.exists(), killed.stderr.read()[-3000:] if killed.poll() is not None else "no checkpoint 1"
  killed.send_signal(signal.SIGKILL)
  killed.wait()
  resumed = train(tmp_path / "killed", env)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "[resume] from iteration 1" in resumed.stdout + resumed.stderr
  again = metrics(tmp_path / "killed")
  assert again[-1] == first[-1]  # the iteration that read the restored memories
  assert method_state(tmp_path / "killed", 2) == method_state(tmp_path / "straight", 2)
