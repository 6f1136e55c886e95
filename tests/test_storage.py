"""Run directories in a bucket: the storage layer, metrics, provenance and checkpoints against a local Cloud
Storage emulator (tests/gcs_emulator.py), the same clients a TPU VM uses (gcsfs, tensorstore via orbax)."""

import json
import os
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from etils import epath

from explore_jax import storage
from explore_jax.train import metrics as metrics_lib
from explore_jax.train import provenance
from explore_jax.train.checkpoint import Checkpointer, abstract_like


@pytest.fixture
def bucket(gcs, request):
  """A prefix of its own in the session's emulated bucket (tests/conftest.py: gcs)."""
  return f"gs://test-bucket/{request.node.name}"


def test_paths():
  assert storage.scheme("gs://b/x") == "gs" and storage.scheme("runs/x") is None
  assert storage.resolve("gs://b/runs/x") == "gs://b/runs/x"
  assert storage.resolve("runs/x") == os.path.abspath("runs/x")


def test_files_in_a_bucket(bucket, tmp_path):
  run = bucket
  storage.makedirs(run)  # the bucket is there: nothing to make
  with pytest.raises(FileNotFoundError, match="no bucket gs://no-such-bucket"):
    storage.makedirs("gs://no-such-bucket/run")
  with storage.open(f"{run}/a.json", "w") as f:
    f.write('{"a": 1}')
  assert storage.exists(f"{run}/a.json") and not storage.exists(f"{run}/b.json")
  assert storage.isdir(run) and not storage.isdir(f"{run}/a.json")
  with storage.open(f"{run}/a.json") as f:
    assert json.load(f) == {"a": 1}
  with pytest.raises(ValueError, match="written whole"):
    storage.open(f"{run}/a.json", "a")
  with pytest.raises(FileNotFoundError):
    storage.open(f"{run}/b.json")
  storage.write_text(f"{run}/c.txt", "whole")
  local = tmp_path / "c.txt"
  storage.copy(f"{run}/c.txt", local)
  storage.copy(local, f"{run}/d.txt")
  with storage.open(f"{run}/d.txt", "rb") as f:
    assert f.read() == b"whole"


def _event_records(data: bytes) -> int:
  """The number of records in a TensorBoard event file (TFRecord framing: length, crc, data, crc)."""
  n, i = 0, 0
  while i < len(data):
    (length,) = struct.unpack("<Q", data[i:i + 8])
    i += 8 + 4 + length + 4
    n += 1
  assert i == len(data)
  return n


def test_metrics_in_a_bucket_read_as_a_local_run(bucket, tmp_path):
  """metrics.jsonl (resume truncation included), TensorBoard events and the curves, bucket vs local disk."""
  def run(workdir, listdir, read):
    w = metrics_lib.MetricsWriter(workdir)
    for i in range(1, 6):
      w.write(i, {"success_rate": i / 10, "return": np.float32(i)})
    w.close()
    # Its event file holds the same records as on disk (wall times differ, so not the same bytes).
    [events] = listdir(os.path.join(workdir, "tensorboard"))
    records = _event_records(read(os.path.join(workdir, "tensorboard", events)))
    w = metrics_lib.MetricsWriter(workdir, resume_from=3)  # a run resumed from iteration 3
    w.write(4, {"success_rate": 0.9})
    w.close()
    metrics_lib.plot_curves(w.history, ["success_rate", "return"], os.path.join(workdir, "curves.png"))
    return records, read(os.path.join(workdir, "metrics.jsonl")).decode()

  def read(path):
    with storage.open(path, "rb") as f:
      return f.read()

  local, remote = str(tmp_path / "run"), bucket
  os.makedirs(local)
  expected = run(local, os.listdir, read)
  got = run(remote, lambda d: [p.name for p in epath.Path(d).iterdir()], read)
  assert got == expected and expected[0] > 5
  assert [json.loads(r)["iteration"] for r in got[1].splitlines()] == [1, 2, 3, 4]
  assert read(f"{remote}/curves.png")[:8] == b"\x89PNG\r\n\x1a\n"


def test_provenance_in_a_bucket(bucket):
  run = bucket
  assert provenance.load(run) is None
  first = provenance.record(run, 0, {"w": jnp.ones(3)})
  assert provenance.load(run) == first
  assert provenance.record(run, 5) == first  # the same machine resuming: nothing new


def test_checkpoints_in_a_bucket_round_trip_exactly(bucket):
  """Arrays through tensorstore's GCS driver, steps committed without renames, retention, a second process's
  view (a fresh Checkpointer), all on the emulator."""
  directory = f"{bucket}/checkpoints"
  state = {"w": (jnp.arange(24, dtype=jnp.float32).reshape(4, 6)).astype(jnp.bfloat16),
           "b": jnp.linspace(-1.0, 1.0, 6), "count": jnp.int32(7)}
  with Checkpointer(directory, max_to_keep=2) as ckpt:
    assert ckpt.directory == directory
    for step in (1, 2, 3):
      ckpt.save(step, jax.tree.map(lambda x: x + step, state), rng=jax.random.key(step),
                metadata={"iteration": step})
  with Checkpointer(directory) as again:
    assert again.all_steps() == [2, 3]
    restored = again.restore(abstract_like(state))
  assert restored.step == 3 and restored.metadata == {"iteration": 3}
  for name in state:
    assert restored.state[name].dtype == state[name].dtype
    np.testing.assert_array_equal(np.asarray(restored.state[name]), np.asarray(state[name] + 3))
  np.testing.assert_array_equal(jax.random.key_data(restored.rng), jax.random.key_data(jax.random.key(3)))
  committed = sorted(p.name for p in epath.Path(f"{directory}/3").iterdir())
  assert "commit_success.txt" in committed and not any("tmp" in name for name in committed)
