"""DPEPO end to end: `configs/dpepo_keydoor.py` as a user runs it, cut to one iteration of a smaller corridor: the
cold start on the diverse oracle's parallel demonstrations, a rollout in 4 copies, W_t into the update, a
checkpoint."""

import pytest

from tests import train_runs

RUN = ("--config=configs/dpepo_keydoor.py", "--config.train.num_iterations=1", "--config.sft.steps=2",
       "--config.sft.batch_size=8", "--config.sft.oracle_episodes=4", "--config.env.kwargs.num_rooms=3",
       "--config.env.kwargs.max_steps=8", "--config.env.max_steps=8", "--config.rollout.num_tasks=2",
       "--config.rollout.group_size=2", "--config.rollout.task_pool=2", "--config.rollout.num_actors=1",
       "--config.rollout.envs_per_actor=4", "--config.rl.micro_batch_size=0", "--config.rl.epochs=1",
       "--config.eval.every=0", "--config.eval.passk_samples=0", "--config.checkpoint.every=1")


@pytest.mark.slow
def test_dpepo_trains_an_iteration_in_parallel_copies(tmp_path):
  (row,) = train_runs.train(tmp_path, RUN)
  # Two SFT steps teach no format: what matters here is that the run's parts meet (the parallel world, its prompt
  # within the budget, W_t into the update); the weights' values are checked by hand in test_dpepo.py.
  assert row["truncated_prompts"] == 0.0 and row["episode_length"] <= 8
  assert 0.0 <= row["dpepo/copies_acting_per_step"] <= 4.0 and 0.5 <= row["dpepo/step_weight_mean"] <= 1.0
  assert {"dpepo/distinct_actions_per_step", "dpepo/distinct_transitions_per_group", "dpepo/steps_to_success"} <= set(row)
  assert (tmp_path / "run" / "checkpoints" / "1" / "commit_success.txt").exists()
