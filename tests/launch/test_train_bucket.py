"""launch/train.py with its run directory in a bucket (gs://), as on a multi-host TPU slice, against a local Cloud
Storage emulator: every run file lands in the bucket, a second command resumes from the bucket's checkpoint, and
the metrics and pass@k summary are those of the same run in a local directory; launch/eval.py then evaluates the
bucket's checkpoint into the bucket, and launch/export.py exports it to a local directory."""

import json
import os
import subprocess
import sys

import pytest
from etils import epath

from explore_jax import storage
from tests import gcs_emulator

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMING = ("time_", "tokens_per_s", "update/grad_norm", "throughput/")  # wall-clock figures differ between runs
SMALL = [  # tests/train/test_loop.py's run, evaluated every iteration, with a pass@k summary
    "--config=configs/grpo_keydoor.py",
    "--config.rollout.num_tasks=2", "--config.rollout.group_size=3", "--config.rollout.num_actors=2",
    "--config.rollout.envs_per_actor=2", "--config.rl.minibatch_size=16", "--config.sft.oracle_episodes=2",
    "--config.sft.steps=4", "--config.sft.batch_size=8", "--config.eval.every=1", "--config.eval.num_episodes=2",
    "--config.checkpoint.every=1", "--config.rollout.task_pool=2", "--config.eval.passk_samples=2",
    "--config.eval.passk_held_out_tasks=2",
]
RUN_FILES = ("config.json", "metrics.jsonl", "provenance.json", "pass_at_k_warm_start.json", "summary.md",
             "summary.json", "pass_at_k.png", "curves.png")


# Set in this process by explore_jax/storage.py from STORAGE_EMULATOR_HOST; children must derive their own.
DERIVED = ("TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")


def environment(url, cache):
  """A user's environment with the emulator's address: one CPU device, nothing but STORAGE_EMULATOR_HOST."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS" and k not in DERIVED}
  return {**env, **gcs_emulator.environment(url), "EXPLORE_JAX_CACHE": str(cache)}


def launch(script, *args, cache, url, checkpoint):
  """launch/<script> on SMALL and the model in `checkpoint` (conftest's nano_checkpoint); returns its output."""
  run = subprocess.run([sys.executable, os.path.join(REPO, "launch", script), *SMALL,
                        f"--config.model.checkpoint={checkpoint}", *args],
                       capture_output=True, text=True, timeout=900, cwd=REPO, env=environment(url, cache))
  assert run.returncode == 0, run.stderr[-3000:]
  return run.stdout


def train(workdir, iterations, *, cache, url, checkpoint):
  return launch("train.py", f"--workdir={workdir}", f"--config.train.num_iterations={iterations}", cache=cache,
                url=url, checkpoint=checkpoint)


def read(path, mode="r"):
  with storage.open(path, mode) as f:
    return f.read()


def comparable(text):
  return [{k: v for k, v in json.loads(line).items() if not any(t in k for t in TIMING)}
          for line in text.splitlines() if line.strip()]


@pytest.mark.slow
def test_a_run_in_a_bucket_resumes_there_and_matches_a_local_run(gcs, tmp_path, nano_checkpoint):
  where = dict(cache=tmp_path / "cache", url=gcs, checkpoint=nano_checkpoint)
  local = str(tmp_path / "local")
  train(local, 2, **where)  # the reference: two iterations, uninterrupted, on disk

  run = "gs://test-bucket/runs/keydoor"
  out = train(run, 1, **where)
  assert f"[done] run directory: {run}" in out
  assert not os.path.exists(os.path.join(REPO, "gs:"))  # no local directory named after the scheme
  with storage.open(f"{run}/metrics.jsonl") as f:
    assert [r["iteration"] for r in comparable(f.read())] == [0, 1]
  # The same command for two iterations resumes from the bucket's checkpoint of iteration 1.
  out = train(run, 2, **where)
  assert f"[resume] from iteration 1 in {run}/checkpoints" in out

  for name in RUN_FILES:
    assert storage.exists(f"{run}/{name}"), name
  assert read(f"{run}/pass_at_k.png", "rb")[:4] == b"\x89PNG"
  events = list(epath.Path(f"{run}/tensorboard").iterdir())
  assert len(events) == 2 and all(e.name.startswith("events.out.tfevents.") for e in events)  # one per command
  steps = sorted(p.name for p in epath.Path(f"{run}/checkpoints").iterdir())
  assert steps == ["0", "1", "2"]
  assert all(storage.exists(f"{run}/checkpoints/{s}/commit_success.txt") for s in steps)

  with open(os.path.join(local, "metrics.jsonl")) as f:
    assert comparable(read(f"{run}/metrics.jsonl")) == comparable(f.read())
  with open(os.path.join(local, "summary.json")) as f:
    summary = json.loads(read(f"{run}/summary.json"))
    assert summary == json.load(f)
  assert json.loads(read(f"{run}/config.json"))["train"]["num_iterations"] == 2
  origin = json.loads(read(f"{run}/provenance.json"))
  with open(os.path.join(local, "provenance.json")) as f:
    assert origin["start_digest"] == json.load(f)["start_digest"]

  # The bucket's checkpoint evaluated as on disk (tests/launch/test_train_cli.py), its files beside it.
  out = launch("eval.py", f"--run={run}", "--samples=2", "--splits=held-out", "--transcripts=1", **where)
  assert f"[eval] {run}/eval-2" in out
  evaluated = json.loads(read(f"{run}/eval-2/summary.json"))
  assert evaluated["step 2 / held-out"]["pass_at_k"] == summary["trained / held-out"]["pass_at_k"]
  assert len(read(f"{run}/eval-2/transcripts-held-out.jsonl").splitlines()) == 2

  # The bucket's checkpoint exported to a local Hugging Face directory, as the local run's is.
  exported = {}
  for name, source in (("bucket", run), ("local", local)):
    out = launch("export.py", f"--run={source}", f"--output={tmp_path / ('export-' + name)}", **where)
    assert f"[export] step 2: the policy as a Hugging Face checkpoint in {tmp_path / ('export-' + name)}" in out
    exported[name] = {f: open(tmp_path / f"export-{name}" / f, "rb").read()
                      for f in sorted(os.listdir(tmp_path / f"export-{name}"))}
  assert "model.safetensors" in exported["bucket"] and exported["bucket"] == exported["local"]


def test_a_missing_bucket_is_a_one_line_error(gcs, tmp_path):
  run = subprocess.run([sys.executable, os.path.join(REPO, "launch", "train.py"), "--workdir=gs://no-such-bucket/x",
                        "--config=configs/grpo_keydoor.py"], capture_output=True, text=True, timeout=300, cwd=REPO,
                       env=environment(gcs, tmp_path / "cache"))
  assert run.returncode != 0
  assert run.stderr.strip().splitlines()[-1] == ("error: no bucket gs://no-such-bucket (the run directory "
                                                 "gs://no-such-bucket/x needs it; create it first)")
