"""configs/grpo_miniwob.py as a user runs it: a vision-language policy on MiniWoB++ in Chromium, screenshots
through actors, sampler, records and the update (no episode dropped: the prompt budget holds the image and the
longest feedback)."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_grpo_miniwob_trains_an_iteration_on_screenshots(tmp_path):
  out = subprocess.run(
      [sys.executable, "launch/train.py", "--config=configs/grpo_miniwob.py", f"--workdir={tmp_path / 'run'}",
       "--config.train.num_iterations=1", "--config.eval.every=0", "--config.rollout.num_actors=1",
       "--config.rollout.num_tasks=1", "--config.rollout.group_size=2", "--config.rl.minibatch_size=8"],
      cwd=REPO, capture_output=True, text=True, timeout=1200)
  assert out.returncode == 0, out.stderr[-3000:]
  with open(tmp_path / "run" / "metrics.jsonl") as f:
    row = [json.loads(line) for line in f][-1]
  # Both episodes ran their 3 steps (a random policy's actions are malformed, so every step is one), and the
  # update trained on their records, images included.
  assert row["episodes_dropped"] == 0 and row["episode_length"] == 3.0
  assert row["update/minibatches"] >= 1 and row["update/tokens"] > 2 * 3 * 48


def test_an_sft_warm_start_on_screenshots_is_refused_clearly():
  from configs import grpo_miniwob
  from explore_jax.methods import make_method
  from explore_jax.train import sft_data

  c = grpo_miniwob.get_config()
  with pytest.raises(ValueError, match="does not take image prompts yet"):
    sft_data.oracle_sft_demos(c.env.id, {**c.env.kwargs, "task": "click-test"}, [0], make_method(c).prompt_hook())
