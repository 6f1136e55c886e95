"""samples.jsonl: the first episodes of each iteration as text, cut to a bound, and a resume that drops the lines
past the restored iteration."""

import json

import numpy as np

from explore_jax.actors.protocol import EpisodeResult, EpisodeSpec, Response, StepRecord
from explore_jax.train import samples


def episode(traj, responses, success=False):
  resp = Response(traj, 0, np.zeros(1, np.int32), np.zeros(1, np.float32), np.ones(1, np.float32),
                  np.zeros(1, np.int32), 0)
  steps = [StepRecord(traj, 0, traj, t, 0, [1], resp, text, float(success and t == len(responses) - 1), 1.0, 7,
                      t == len(responses) - 1, success, {}, observation={"text": f"room {t}", "screenshot": None})
           for t, text in enumerate(responses)]
  return EpisodeResult(EpisodeSpec(traj, 0, traj, "explore_jax/KeyDoor-v0", seed=3), steps, success,
                       float(success), "")


def rows(path):
  return [json.loads(line) for line in open(path)]


def test_the_first_episodes_of_each_iteration_are_written_and_a_resume_drops_what_followed(tmp_path):
  writer = samples.SampleWriter(str(tmp_path), 2)
  writer.write(1, [episode(2, ["c"]), episode(0, ["a", "x" * 5000], success=True), episode(1, ["b"])])
  writer.write(2, [episode(0, ["d"]), episode(1, ["e"])])
  written = rows(tmp_path / "samples.jsonl")
  assert [(r["iteration"], r["episode"]) for r in written] == [(1, 0), (1, 1), (2, 0), (2, 1)]
  first = written[0]
  assert first["success"] and first["return"] == 1.0 and first["steps"][0] == {
      "observation": "room 0", "response": "a", "reward": 0.0, "format_reward": 1.0}
  assert len(first["steps"][1]["response"]) == samples.MAX_CHARS + 3
  samples.SampleWriter(str(tmp_path), 2, resume_from=1)  # a run restored at iteration 1
  assert [r["iteration"] for r in rows(tmp_path / "samples.jsonl")] == [1, 1]
  samples.SampleWriter(str(tmp_path), 0).write(3, [episode(0, ["f"])])  # off: nothing more
  assert len(rows(tmp_path / "samples.jsonl")) == 2
