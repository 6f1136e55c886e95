"""rollout.batching as a user sets it: one iteration of a small GRPO run on KeyDoor per mode, from the same
checkpoint and seed. The rollouts are the same episodes (a response's tokens do not depend on how requests are
batched), so the iteration's rollout metrics agree; only the sampler's own counters and timings differ."""

import json

import pytest

from tests.small_runs import small_run

SAME = ("return", "episode_length", "success_rate", "format_ok", "update/response_tokens", "update/tokens")


@pytest.mark.slow
def test_fixed_continuous_and_streaming_batching_play_the_same_rollout(tmp_path, nano_checkpoint, monkeypatch):
  from configs import grpo_keydoor
  from explore_jax.sampling import slots
  from explore_jax.train import loop
  from explore_jax.train.builder import build

  rounds = []
  advance = slots.SlotEngine.advance
  monkeypatch.setattr(slots.SlotEngine, "advance", lambda self: (rounds.append(self.streaming), advance(self))[1])
  rows, used = {}, {}
  for mode in ("fixed", "continuous", "streaming"):
    c = small_run(grpo_keydoor.get_config(), nano_checkpoint)
    c.rl.minibatch_size = 8
    c.train.num_iterations, c.eval.every, c.eval.passk_samples = 1, 0, 0
    c.rollout.batching = mode
    workdir = tmp_path / mode
    loop.run(build(c, str(workdir)))
    rows[mode] = [json.loads(line) for line in open(workdir / "metrics.jsonl")][-1]
    used[mode] = set(rounds)
    rounds.clear()
  assert used == {"fixed": set(), "continuous": {False}, "streaming": {True}}  # the slots ran, in their mode
  for mode in ("continuous", "streaming"):
    assert {k: rows[mode][k] for k in SAME} == {k: rows["fixed"][k] for k in SAME}, mode
    # The update sees the same records; their behaviour log-probs differ in the last bits at most.
    assert rows[mode]["update/loss"] == pytest.approx(rows["fixed"]["update/loss"], rel=1e-3, abs=1e-6), mode
  with pytest.raises(ValueError, match="rollout.batching"):
    c.rollout.batching = "slots"
    build(c, str(tmp_path / "bad"))
