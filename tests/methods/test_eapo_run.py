"""EAPO end to end: `configs/eapo_keydoor.py` as a user runs it, cut to one iteration of a smaller corridor: the
warm start on the oracle's field answers and the rollback stage on its episodes, a rollout in the fields world,
q_phi trained before the rewards and scoring them, the (state, depth) grouping, a rollback SFT request and a
checkpoint with q_phi in it."""

import json

import pytest

from tests import train_runs

RUN = ("--config=configs/eapo_keydoor.py", "--config.train.num_iterations=1", "--config.sft.steps=2",
       "--config.sft.batch_size=8", "--config.sft.oracle_episodes=4", "--config.env.kwargs.num_rooms=3",
       "--config.env.kwargs.max_steps=6", "--config.env.max_steps=6", "--config.rollout.num_tasks=2",
       "--config.rollout.group_size=2", "--config.rollout.task_pool=2", "--config.rollout.num_actors=1",
       "--config.rollout.envs_per_actor=4", "--config.rl.micro_batch_size=0", "--config.rl.epochs=1",
       "--config.eval.every=0", "--config.eval.passk_samples=0", "--config.checkpoint.every=1",
       "--config.eapo.rollback.every=1", "--config.eapo.rollback.cold_start_steps=2")


@pytest.mark.slow
def test_eapo_trains_an_iteration_with_q_phi(tmp_path):
  (row,) = train_runs.train(tmp_path, RUN)
  # Two SFT steps teach no format, so most answers are malformed (no q_phi targets): what matters here is that the
  # parts meet; q_phi's arithmetic is checked against an independent scoring in test_eapo.py.
  assert row["truncated_prompts"] == 0.0 and row["episode_length"] <= 6
  assert {"reward/eapo_format", "reward/eapo_explore", "revisit_share", "step_group_size"} <= set(row)
  assert 0.0 <= row["revisit_share"] <= 1.0
  step = tmp_path / "run" / "checkpoints" / "1"
  assert (step / "commit_success.txt").exists()
  tree = json.load(open(step / "state" / "_METADATA"))["tree_metadata"]
  assert any(key.startswith("('aux', 'q_phi', 'params', 'q'") for key in tree)  # q_phi's weights and its prior
  assert any(key.startswith("('aux', 'q_phi', 'opt_state'") for key in tree)
  # RL started after the rollback stage, cached beside the warm start under the key the run's provenance names.
  key = json.load(open(tmp_path / "run" / "provenance.json"))["warm_start"]
  assert (tmp_path / "cache" / "sft" / key).is_dir() and len(list((tmp_path / "cache" / "sft").iterdir())) == 2
