"""The training loop as a user runs it: two actor processes end to end, kill -9 then resume, and a SIGTERM's
polite stop then resume."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from explore_jax.train import provenance
from tests.polling import wait_until
from tests.small_runs import small_run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMING = ("time_", "tokens_per_s", "update/grad_norm", "throughput/")  # wall-clock figures differ between runs

SMALL = [
    "--config=configs/grpo_keydoor.py",
    "--config.rollout.num_tasks=2", "--config.rollout.group_size=3", "--config.rollout.num_actors=2",
    "--config.rollout.envs_per_actor=2", "--config.rl.minibatch_size=16", "--config.sft.oracle_episodes=2",
    "--config.sft.steps=4", "--config.sft.batch_size=8", "--config.eval.every=2", "--config.eval.num_episodes=2",
    "--config.checkpoint.every=1",
]


def launch(workdir, *extra, cache, checkpoint):
  """train.py on SMALL and the model in `checkpoint` (conftest's nano_checkpoint), in the background."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["EXPLORE_JAX_CACHE"] = str(cache)
  env["EXPLORE_JAX_XLA_CACHE"] = os.path.join(cache, "xla")  # its own: the first run compiles, the resumed loads
  return subprocess.Popen([sys.executable, os.path.join(REPO, "launch", "train.py"), f"--workdir={workdir}",
                           *SMALL, f"--config.model.checkpoint={checkpoint}", *extra], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def _rows_written(workdir):
  try:
    return len(rows(workdir)) >= 1
  except (OSError, ValueError):  # not there yet, or a line being written
    return False


def comparable(row):
  return {k: v for k, v in row.items() if not any(t in k for t in TIMING)}


@pytest.mark.slow
def test_two_iterations_with_two_actors_then_kill_or_stop_and_resume(tmp_path, nano_checkpoint):
  cache = tmp_path / "cache"
  # The reference: three iterations without interruption.
  ref = launch(tmp_path / "ref", "--config.train.num_iterations=3", cache=cache, checkpoint=nano_checkpoint)
  out, err = ref.communicate(timeout=900)
  assert ref.returncode == 0, err[-3000:]
  reference = rows(tmp_path / "ref")
  assert [r["iteration"] for r in reference] == [0, 1, 2, 3]
  for r in reference[1:]:
    assert r["episodes_dropped"] == 0 and r["update/minibatches"] >= 1 and 0 <= r["success_rate"] <= 1
  for name in ("config.json", "curves.png", "metrics.jsonl"):
    assert os.path.exists(tmp_path / "ref" / name), name
  # The run kept its compiled programs (train/xla_cache.py); the resumed run below loads them, and must still
  # make the same run bit for bit.
  compiled = [f for d in (cache / "xla").iterdir() for f in d.iterdir()]
  assert len(compiled) >= 3, compiled
  assert os.listdir(tmp_path / "ref" / "tensorboard")

  # The same command killed with SIGKILL after its first iteration, then started again.
  run = launch(tmp_path / "run", "--config.train.num_iterations=3", cache=cache, checkpoint=nano_checkpoint)
  deadline = time.time() + 600
  while time.time() < deadline:
    if os.path.exists(tmp_path / "run" / "metrics.jsonl") and len(rows(tmp_path / "run")) >= 2:
      break
    assert run.poll() is None, run.communicate()[1][-3000:]
    time.sleep(0.2)
  run.send_signal(signal.SIGKILL)
  run.communicate()
  resumed = launch(tmp_path / "run", "--config.train.num_iterations=3", cache=cache, checkpoint=nano_checkpoint)
  out, err = resumed.communicate(timeout=900)
  assert resumed.returncode == 0, err[-3000:]
  assert "[resume] from iteration" in out
  assert [comparable(r) for r in rows(tmp_path / "run")] == [comparable(r) for r in reference]

  # SIGTERM once iteration 0's evaluation is written, with no checkpoint due before the end: the run finishes
  # the iteration it is in, saves it, exits 143; started again, it makes the same run as the reference.
  polite = ("--config.train.num_iterations=3", "--config.checkpoint.every=3")
  run = launch(tmp_path / "term", *polite, cache=cache, checkpoint=nano_checkpoint)
  assert wait_until(lambda: _rows_written(tmp_path / "term") or run.poll() is not None, timeout_s=600) \
      and run.poll() is None, run.communicate()[1][-3000:]
  run.send_signal(signal.SIGTERM)
  out, err = run.communicate(timeout=600)
  assert run.returncode == 143, err[-3000:]
  assert "[stopped] stopped on request at iteration" in out and "[stop] SIGTERM" in err
  kept = sorted(int(step) for step in os.listdir(tmp_path / "term" / "checkpoints") if step.isdigit())
  written = [r["iteration"] for r in rows(tmp_path / "term")]
  assert kept[0] == 0 and kept[-1] == written[-1] in (1, 2), (kept, written)  # nothing done was lost
  resumed = launch(tmp_path / "term", *polite, cache=cache, checkpoint=nano_checkpoint)
  out, err = resumed.communicate(timeout=900)
  assert resumed.returncode == 0, err[-3000:]
  assert f"[resume] from iteration {kept[-1]}" in out
  assert [comparable(r) for r in rows(tmp_path / "term")] == [comparable(r) for r in reference]

  # provenance.json: both runs started from the same bits, the resumed one on the same machine (one entry).
  ref_origin, run_origin = provenance.load(tmp_path / "ref"), provenance.load(tmp_path / "run")
  assert ref_origin["start_digest"] == run_origin["start_digest"] and len(ref_origin["start_digest"]) == 12
  child = {**provenance.machine(), "xla_flags": ""}  # launch() runs without this process's XLA_FLAGS
  assert [m["tag"] for m in run_origin["machines"]] == [provenance.machine_tag(child)]


def test_a_sigterm_in_a_pass_at_k_leaves_before_its_next_task_set_and_the_run_resumes_into_it(
    tmp_path, nano_checkpoint, monkeypatch):
  """A pass@k takes minutes: a SIGTERM that arrives while one task set is sampled leaves before the next, at the
  iteration last saved (step 0 before the warm start's; the last iteration before the trained policy's), and the
  same run, started again, samples the sets it had not finished and writes the summary."""
  from configs import grpo_keydoor
  from explore_jax.train import evaluator as evaluator_lib
  from explore_jax.train import loop, preemption
  from explore_jax.train.builder import build

  c = small_run(grpo_keydoor.get_config(), nano_checkpoint)
  c.rl.minibatch_size = 8
  c.train.num_iterations, c.checkpoint.every = 1, 1
  c.eval.every, c.eval.passk_samples, c.eval.passk_held_out_tasks = 0, 1, 2
  sampled = []
  sample = evaluator_lib.Evaluator.pass_at_k

  def pass_at_k(self, pool, params, task_set, *, policy, **kwargs):
    sampled.append(f"{policy} / {task_set}")
    if len(sampled) in (1, 4):  # the first run's first set; the second run's first set of the trained policy
      os.kill(os.getpid(), signal.SIGTERM)  # arrives while this set is sampled
    return sample(self, pool, params, task_set, policy=policy, **kwargs)

  monkeypatch.setattr(evaluator_lib.Evaluator, "pass_at_k", pass_at_k)
  with pytest.raises(preemption.Stopped) as stopped:
    loop.run(build(c, str(tmp_path)))
  assert stopped.value.iteration == 0 and sampled == ["warm start / train"]
  assert not (tmp_path / "pass_at_k_warm_start.json").exists()
  with pytest.raises(preemption.Stopped) as stopped:
    loop.run(build(c, str(tmp_path)))
  assert stopped.value.iteration == 1
  assert sampled[1:] == ["warm start / train", "warm start / held-out", "trained / train"]
  assert (tmp_path / "pass_at_k_warm_start.json").exists() and not (tmp_path / "summary.json").exists()
  loop.run(build(c, str(tmp_path)))
  assert sampled[4:] == ["trained / train", "trained / held-out"]
  summary = json.load(open(tmp_path / "summary.json"))
  assert list(summary) == ["warm start / train", "trained / train", "warm start / held-out", "trained / held-out"]
