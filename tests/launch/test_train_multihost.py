"""launch/train.py as a two-process multi-host run (4 fake CPU devices each, loopback) against one process with
8 fake devices: one GRPO iteration on KeyDoor with the tiny model, an evaluation before and after it. Each
process's actors play their share of the episodes; the runs' metrics.jsonl must agree.

The random tiny model never acts validly, so every advantage is 0: an entropy bonus gives the update a
gradient that depends on every sampled token (its norm must agree bit for bit, its loss to float32 rounding).
"""

import json
import os
import sys

import pytest

from tests.parallel.processes import cpu_env, free_port, run_together

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 540  # generous: three processes compile on a machine whose cores they share
SMALL = ("--config=configs/grpo_keydoor.py", "--config.train.num_iterations=1", "--config.sft.enabled=False",
         "--config.rollout.num_tasks=2", "--config.rollout.group_size=2", "--config.rollout.envs_per_actor=2",
         "--config.env.kwargs.num_rooms=2", "--config.rl.epochs=1", "--config.rl.minibatch_size=16",
         "--config.rl.loss.entropy_coef=0.01",
         "--config.eval.every=1", "--config.eval.num_episodes=2", "--config.train.compilation_cache=False")
# Timings differ from run to run. The reported entropy and mean ratio are float32 means over every token whose
# partial sums the two runs add in different orders (gloo across processes, XLA within one): their last bits
# may differ (measured: 4e-8 relative). So may the loss, which with every advantage 0 is the entropy bonus, the
# same mean: equal to the bit on an AVX-512 machine, 4.5e-8 apart on an AVX2 one. The gradient norm and
# everything sampled agree bit for bit on both.
TIMED = ("time_", "throughput/", "sample_tokens_per_s", "sample_prompt_tokens_per_s")
REDUCED = ("update/entropy", "update/ratio_mean", "update/loss")


@pytest.mark.slow
def test_two_process_run_matches_one_process(tmp_path, nano_checkpoint):
  train = os.path.join(REPO, "launch", "train.py")
  small = (*SMALL, f"--config.model.checkpoint={nano_checkpoint}")
  coordinator = f"127.0.0.1:{free_port()}"
  multi, single = tmp_path / "multi", tmp_path / "single"
  workers = [([sys.executable, train, *small, "--config.rollout.num_actors=1", f"--workdir={multi}",
               f"--config.distributed.coordinator_address={coordinator}", "--config.distributed.num_processes=2",
               f"--config.distributed.process_id={i}"], cpu_env(4)) for i in range(2)]
  # Two actors in one process: the same sampler batch (actors x envs x processes rows) as one actor in each.
  reference = ([sys.executable, train, *small, "--config.rollout.num_actors=2", f"--workdir={single}"], cpu_env(8))
  run_together(workers + [reference], str(tmp_path), "train", TIMEOUT_S)

  rows = {name: [json.loads(line) for line in open(d / "metrics.jsonl")] for name, d in (("multi", multi),
                                                                                       ("single", single))}
  # The evaluation before training (iteration 0), then the iteration with its evaluation.
  assert [r["iteration"] for r in rows["multi"]] == [r["iteration"] for r in rows["single"]] == [0, 1]
  last = rows["multi"][-1]
  assert "eval/success_rate" in last and last["episodes_dropped"] == 0 and last["update/grad_norm"] > 0
  for m, s in zip(rows["multi"], rows["single"]):
    assert set(m) == set(s)
    for key in sorted(m):
      if key.startswith(TIMED):
        continue
      if key in REDUCED:
        assert abs(m[key] - s[key]) <= 1e-6 * abs(s[key]), (key, m[key], s[key])
      else:
        assert m[key] == s[key], (key, m[key], s[key])
  # Both started from the same policy.
  provenance = [json.load(open(d / "provenance.json")) for d in (multi, single)]
  assert provenance[0]["start_digest"] == provenance[1]["start_digest"]
