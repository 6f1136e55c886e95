"""ScreenExplorer end to end: `configs/screen_explorer_miniwob.py` as a user runs it, cut to two iterations of one
group: the warm start on the oracle's JSON replies, rollouts in ScreenReading-v0 around MiniWoB-v0 in Chromium,
the world model trained before the rewards, the eight terms, the diversity measures, the delayed first update,
the distillation stream and a checkpoint with the world model in it."""

import json
import os

import pytest

from explore_jax.train import sft_data
from tests import train_runs

RUN = ("--config=configs/screen_explorer_miniwob.py", "--config.train.num_iterations=2", "--config.rl.first_update=1",
       "--config.screen_explorer.distill.from_iteration=0", "--config.sft.steps=2", "--config.sft.batch_size=4",
       "--config.sft.oracle_episodes=4", "--config.eval.every=0", "--config.eval.passk_samples=0",
       "--config.rollout.num_actors=1", "--config.rl.micro_batch_size=0", "--config.rl.epochs=1",
       "--config.checkpoint.every=2", "--config.env.max_steps=3", "--config.env.kwargs.max_steps=3")


@pytest.mark.slow
def test_screen_explorer_explores_two_iterations_with_its_world_model(tmp_path):
  first, second = train_runs.train(tmp_path, RUN)
  # Two SFT steps teach no format, so most replies are malformed (gated to 0): what matters here is that the parts
  # meet; the terms' arithmetic is checked against rl/screen_rewards.py in test_screen_explorer.py.
  for row in (first, second):
    assert row["episodes_dropped"] == 0.0 and row["truncated_prompts"] == 0.0 and row["episode_length"] == 3
    assert {f"reward/se_{t}" for t in ("inst_vis", "inst_text", "seq_vis", "seq_text", "world_vis", "world_text",
                                        "des", "inter")} <= set(row)
    assert {"diversity/d_seq_vis", "diversity/d_grp_vis", "diversity/d_seq_text", "diversity/d_grp_text",
            "world_model/steps", "distill/steps_kept"} <= set(row)
    assert 0.0 <= row["diversity/d_grp_vis"] <= 1.0
  assert first["update_delayed"] == 1.0 and "update_delayed" not in second  # the actor updates from iteration 1
  streams = sorted(os.listdir(tmp_path / "run" / "distill"))
  assert [s for s in streams if s.endswith(".jsonl")] == ["iter_000000.jsonl", "iter_000001.jsonl"]
  kept = sft_data.load_demonstrations(str(tmp_path / "run" / "distill"))
  assert len(kept) == first["distill/steps_kept"] + second["distill/steps_kept"]
  step = tmp_path / "run" / "checkpoints" / "2"
  assert (step / "commit_success.txt").exists()
  tree = json.load(open(step / "state" / "_METADATA"))["tree_metadata"]
  assert any(key.startswith("('aux', 'world_model', 'params'") for key in tree)
  assert any(key.startswith("('aux', 'world_model', 'opt_state'") for key in tree)
