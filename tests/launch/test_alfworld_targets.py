"""launch/alfworld_targets.py: the games a config's warm start was shown and the ones it is evaluated on, read from
the config as the environment would play them, beside a pass@k record's successes."""

import os
import subprocess
import sys

import pytest

from configs import textworlds
from explore_jax.envs.alfworld.env import generated_game
from launch import alfworld_targets as targets

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def small_config():
  c = textworlds.get_config("gigpo", "alfworld")
  c.sft.oracle_seed_offset, c.sft.oracle_episodes = 500, 6
  c.eval.passk_held_out_tasks = 4
  return c


def record(won_held_out, won_seen):
  """A warm start's pass@k file: one set per task set, 4 samples per game."""
  return [{"label": "warm start / held-out", "task_ids": [0, 1, 2, 3], "samples": [4] * 4,
           "successes": won_held_out},
          {"label": "warm start / valid_seen", "task_ids": [0, 1, 2, 3], "samples": [4] * 4,
           "successes": won_seen}]


def test_games_are_the_environments_and_the_report_counts_the_demonstrations():
  c = small_config()
  demos = targets.games({**c.env.kwargs, **c.sft.env_kwargs}, range(500, 506))
  assert [(g.index, g.room, g.object_type) for g in demos] == [
      (s, spec.room, spec.object_target) for s in range(500, 506)
      for spec in [generated_game("train", ["pick_and_place_simple"], s, 10)]]
  held_out = targets.games({**c.env.kwargs, **c.eval.env_kwargs}, range(4))
  assert all(g.room in (202, 304, 305, 404, 406) for g in held_out)  # the unseen rooms of at most 10
  # A seed past the split's size plays game seed % size, as a seeded reset does.
  assert targets.games({"split": "valid_unseen", "task_types": ["pick_and_place_simple"]}, [134 + 3]) == \
      targets.games({"split": "valid_unseen", "task_types": ["pick_and_place_simple"]}, [3])

  text = targets.report(c, record([4, 0, 2, 0], [1, 1, 1, 1]), familiar=1)
  assert text.startswith(f"6 demonstration games (seeds 500-505), {len({g.room for g in demos})} rooms")
  assert "games in rooms no demonstration played: 4 of 4" in text  # held-out rooms are never demonstrated
  objects = [g.object_type for g in demos]
  receptacles = [g.receptacle for g in demos]
  for g, k in zip(held_out, [4, 0, 2, 0]):
    assert (f"| {g.index} | {g.room} (0) | {g.object_type} ({objects.count(g.object_type)}) | {g.receptacle} "
            f"({receptacles.count(g.receptacle)}) | {k} of 4 |") in text.splitlines()
  # Grouped by whether a demonstration asked for the game's object (these games: some did, some did not).
  groups = {True: [], False: []}
  for g, k in zip(held_out, [4, 0, 2, 0]):
    groups[g.object_type in objects].append(k)
  assert groups[True] and groups[False]
  for name, ks in (("at least 1", groups[True]), ("fewer than 1", groups[False])):
    rate = sum(ks) / (4 * len(ks))
    assert f"games whose object {name} demonstrations asked for: {len(ks)}, pass@1 {rate:.3f}" in text
  assert "## valid_seen (valid_seen)" in text
  with pytest.raises(ValueError, match="no set labelled 'trained / held-out'.*'warm start / held-out'"):
    targets.report(c, record([4, 0, 2, 0], [1, 1, 1, 1]), policy="trained")


def test_successes_reads_a_warm_start_file_and_a_run_summary():
  pass_at_k = record([4, 0, 2, 0], [1, 1, 1, 1])
  assert targets.successes(pass_at_k, "warm start", "held-out") == {0: (4, 4), 1: (0, 4), 2: (2, 4), 3: (0, 4)}
  assert targets.successes(pass_at_k, "trained", "held-out") is None
  summary = {"trained / valid_seen": {"label": "trained / valid_seen", "success_rate": 0.5,
                                      "per_task": {"label": "trained / valid_seen", "task_ids": [7],
                                                   "samples": [2], "successes": [1]}}}
  assert targets.successes(summary, "trained", "valid_seen") == {7: (1, 2)}


def test_the_command_names_a_config_that_is_not_alfworld():
  result = subprocess.run([sys.executable, "launch/alfworld_targets.py", "--config=configs/gigpo_twx.py"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
  assert result.returncode != 0 and "not explore_jax/ALFWorld-v0" in result.stderr + result.stdout
