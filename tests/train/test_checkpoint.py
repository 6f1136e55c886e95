"""Checkpointer: exact round trips, retention, resharding on restore, surviving a killed writer."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from explore_jax.train.checkpoint import Checkpointer, Restored, abstract_like

REPO_ROOT = Path(__file__).resolve().parents[2]
TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax's name for a step directory that is not committed yet


@flax.struct.dataclass
class TrainState:
  params: dict
  opt_state: dict
  step: jax.Array


def make_state(scale: float = 1.0) -> TrainState:
  """A params/optimizer-like pytree with mixed dtypes; values are exact in bfloat16."""
  w = (jnp.arange(24, dtype=jnp.float32).reshape(4, 6) * scale).astype(jnp.bfloat16)
  b = jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32) * scale
  return TrainState(
      params={"dense": {"w": w, "b": b}},
      opt_state={"mu": {"w": w * 2, "b": b / 3}, "count": jnp.int32(7)},
      step=jnp.int32(int(100 * scale)),
  )


def assert_trees_equal(actual, expected):
  """Same structure, dtypes and bit-exact values."""
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    assert a.dtype == e.dtype and a.shape == e.shape
    np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


def mesh(shape, names):
  devices = np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape)
  return Mesh(devices, names, axis_types=(jax.sharding.AxisType.Auto,) * len(names))


@pytest.mark.parametrize("async_save", [False, True])
@pytest.mark.parametrize("rng_kind", ["typed", "typed_rbg", "raw"])
def test_round_trip_is_exact(tmp_path, rng_kind, async_save):
  state = make_state()
  rng = {"typed": jax.random.key(3), "typed_rbg": jax.random.key(3, impl="rbg"),
         "raw": jax.random.PRNGKey(3)}[rng_kind]
  rng = jax.random.split(rng)[1]  # a key with non-trivial data
  metadata = {"config": {"lr": 3e-4, "model": "tiny", "layers": [2, 4]},
              "metrics": {"loss": 1.25}, "data_position": 12345}
  with Checkpointer(tmp_path / "ckpt", async_save=async_save) as ckpt:
    assert ckpt.save(100, state, rng=rng, metadata=metadata)
    restored = ckpt.restore(abstract_like(state))

  assert isinstance(restored, Restored) and restored.step == 100
  assert isinstance(restored.state, TrainState)
  assert_trees_equal(restored.state, state)
  assert restored.state.params["dense"]["w"].dtype == jnp.bfloat16
  assert restored.state.opt_state["count"].dtype == jnp.int32
  assert restored.metadata == metadata
  if rng_kind == "raw":
    assert restored.rng.dtype == jnp.uint32
    np.testing.assert_array_equal(restored.rng, rng)
  else:
    assert jax.random.key_impl(restored.rng) == jax.random.key_impl(rng)
    np.testing.assert_array_equal(jax.random.key_data(restored.rng), jax.random.key_data(rng))
    # The restored key must drive the same random stream, not just hold the same bits.
    np.testing.assert_array_equal(jax.random.uniform(restored.rng, (4,)),
                                  jax.random.uniform(rng, (4,)))


def test_rng_and_metadata_are_optional(tmp_path):
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, make_state())
    restored = ckpt.restore(abstract_like(make_state()))
  assert restored.rng is None and restored.metadata is None
  assert_trees_equal(restored.state, make_state())


def test_max_to_keep_keeps_newest(tmp_path):
  with Checkpointer(tmp_path, max_to_keep=2) as ckpt:
    for step in range(1, 6):
      ckpt.save(step, make_state(step))
    assert ckpt.all_steps() == [4, 5]
  assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["4", "5"]
  with Checkpointer(tmp_path, max_to_keep=2) as reopened:
    assert reopened.latest_step() == 5
    assert_trees_equal(reopened.restore(abstract_like(make_state()), step=4).state, make_state(4))


def test_keep_steps_outlive_max_to_keep(tmp_path):
  with Checkpointer(tmp_path, max_to_keep=2, keep_steps=(0,)) as ckpt:
    for step in range(0, 6):
      ckpt.save(step, make_state(step + 1))
    assert ckpt.all_steps() == [0, 4, 5]
  with Checkpointer(tmp_path, max_to_keep=2, keep_steps=(0,)) as reopened:
    reopened.save(6, make_state(7))
    assert reopened.all_steps() == [0, 5, 6]
    assert_trees_equal(reopened.restore(abstract_like(make_state()), step=0).state, make_state(1))


def test_save_interval_and_force(tmp_path):
  with Checkpointer(tmp_path, save_interval_steps=2) as ckpt:
    assert ckpt.save(1, make_state())  # off the interval, but the first save always happens
    assert not ckpt.save(3, make_state())
    assert ckpt.save(4, make_state())
    assert ckpt.save(5, make_state(), force=True)
    assert ckpt.all_steps() == [1, 4, 5]


def test_existing_step_is_never_skipped_silently(tmp_path):
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, make_state(1))
    ckpt.save(2, make_state(2))
    with pytest.raises(FileExistsError, match="step 2 already exists"):
      ckpt.save(2, make_state(3))
    with pytest.raises(FileExistsError):
      ckpt.save(2, make_state(3), force=True)
    assert_trees_equal(ckpt.restore(abstract_like(make_state())).state, make_state(2))

    assert ckpt.save(2, make_state(3), overwrite=True)
    assert_trees_equal(ckpt.restore(abstract_like(make_state())).state, make_state(3))
    # Overwriting a step older than the latest replaces it and leaves the latest alone.
    assert ckpt.save(1, make_state(4), metadata={"v": 2}, overwrite=True)
    assert ckpt.all_steps() == [1, 2]
    restored = ckpt.restore(abstract_like(make_state()), step=1)
    assert_trees_equal(restored.state, make_state(4))
    assert restored.metadata == {"v": 2}


def test_step_older_than_latest_raises(tmp_path):
  with Checkpointer(tmp_path, max_to_keep=None) as ckpt:
    ckpt.save(5, make_state())
    with pytest.raises(ValueError, match="older than the latest"):
      ckpt.save(3, make_state())
    assert ckpt.all_steps() == [5]
    # Branching from an earlier step is explicit: delete the newer one, then save.
    ckpt.delete(5)
    assert ckpt.save(3, make_state(3))
    assert ckpt.all_steps() == [3]
    with pytest.raises(FileNotFoundError):
      ckpt.delete(5)


def test_unserializable_metadata_fails_before_writing(tmp_path):
  with Checkpointer(tmp_path) as ckpt:
    with pytest.raises(TypeError):
      ckpt.save(1, make_state(), metadata={"loss": np.float32(1.0)})
    assert ckpt.all_steps() == []
  assert not any(tmp_path.glob("1*"))


def test_restore_without_checkpoint_names_directory(tmp_path):
  with Checkpointer(tmp_path / "empty") as ckpt:
    assert ckpt.latest_step() is None
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "empty")):
      ckpt.restore(abstract_like(make_state()))
    ckpt.save(1, make_state())
    with pytest.raises(FileNotFoundError, match=r"step 7 .*available steps: \[1\]"):
      ckpt.restore(abstract_like(make_state()), step=7)


def test_restore_rejects_target_without_sharding(tmp_path):
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, {"x": jnp.ones(3)})
    with pytest.raises(ValueError, match="no sharding"):
      ckpt.restore({"x": jax.ShapeDtypeStruct((3,), jnp.float32)})
    with pytest.raises(ValueError, match="no sharding"):
      abstract_like(jax.eval_shape(lambda: {"x": jnp.ones(3)}))


def test_restore_reshards_onto_another_mesh(tmp_path):
  assert len(jax.devices()) == 8, "tests/conftest.py must force 8 host devices"
  mesh_8 = mesh((8,), ("data",))
  init = lambda: {"w": jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8),
                  "b": jnp.arange(8, dtype=jnp.int32)}
  saved_specs = {"w": P("data", None), "b": P("data")}
  saved_shardings = {k: NamedSharding(mesh_8, spec) for k, spec in saved_specs.items()}
  state = jax.jit(init, out_shardings=saved_shardings)()
  assert state["w"].sharding.spec == P("data", None)
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, state, rng=jax.random.key(0))

  mesh_2x4 = mesh((2, 4), ("data", "model"))
  targets = {"w": NamedSharding(mesh_2x4, P("model", "data")),
             "b": NamedSharding(mesh_2x4, P(None))}
  with Checkpointer(tmp_path) as ckpt:
    restored = ckpt.restore(abstract_like(jax.eval_shape(init), targets))
  for name in ("w", "b"):
    assert restored.state[name].sharding == targets[name]
    np.testing.assert_array_equal(restored.state[name], init()[name])
  assert restored.rng.sharding == NamedSharding(mesh_2x4, P())
  np.testing.assert_array_equal(jax.random.key_data(restored.rng),
                                jax.random.key_data(jax.random.key(0)))

  replicated = NamedSharding(mesh_2x4, P())  # one sharding for every leaf
  with Checkpointer(tmp_path) as ckpt:
    restored = ckpt.restore(abstract_like(jax.eval_shape(init), replicated))
  assert all(x.sharding == replicated for x in jax.tree.leaves(restored.state))
  np.testing.assert_array_equal(restored.state["w"], init()["w"])


def test_relative_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with Checkpointer("runs/ckpt") as ckpt:
    assert ckpt.directory == str(tmp_path / "runs" / "ckpt")
    ckpt.save(3, make_state())
  assert (tmp_path / "runs" / "ckpt" / "3").is_dir()
  with Checkpointer("runs/ckpt") as ckpt:
    assert_trees_equal(ckpt.restore(abstract_like(make_state())).state, make_state())


def test_leftover_tmp_directory_is_ignored_and_harmless(tmp_path):
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, make_state(1))
  # What a writer killed mid-save of steps 5 and 9 leaves: uncommitted directories, partial items.
  for step in (5, 9):
    partial = tmp_path / f"{step}{TMP_SUFFIX}" / "state"
    partial.mkdir(parents=True)
    (partial / "partial_chunk").write_bytes(b"\x00" * 64)

  with Checkpointer(tmp_path) as ckpt:
    assert ckpt.all_steps() == [1] and ckpt.latest_step() == 1
    assert_trees_equal(ckpt.restore(abstract_like(make_state())).state, make_state(1))
    ckpt.save(2, make_state(2))
    ckpt.save(5, make_state(5))  # orbax replaces the stale tmp directory of the same step
    assert ckpt.all_steps() == [1, 2, 5]
    assert_trees_equal(ckpt.restore(abstract_like(make_state())).state, make_state(5))
  assert (tmp_path / f"9{TMP_SUFFIX}").exists()

  with Checkpointer(tmp_path, cleanup_tmp=True) as ckpt:
    ckpt.save(6, make_state(6))  # the cleanup runs in the background; a save waits for it
    assert ckpt.latest_step() == 6
  assert not list(tmp_path.glob(f"*{TMP_SUFFIX}*"))


# Writer for the kill test: step 1 small, then step 2 large enough that its write takes a while.
WRITER = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp
    from explore_jax.train.checkpoint import Checkpointer

    ckpt = Checkpointer(sys.argv[1])
    ckpt.save(1, {"w": jnp.arange(12, dtype=jnp.bfloat16).reshape(3, 4), "step": jnp.int32(1)},
              rng=jax.random.key(1), metadata={"step": 1})
    big = jnp.arange(BIG_SIZE, dtype=jnp.float32).block_until_ready()
    print("SAVING_STEP_2", flush=True)
    ckpt.save(2, {"w": big, "step": jnp.int32(2)}, rng=jax.random.key(2), metadata={"step": 2})
    print("SAVED_STEP_2", flush=True)
""")
BIG_SIZE = 64 * 2**20  # 256 MiB of float32; orbax needs most of a second to write it here
PARTIAL_BYTES = 2**20


def bytes_under(directory: Path) -> int:
  """Total size of the files under `directory` (0 if absent), tolerating files renamed meanwhile."""
  total = 0
  for root, _, files in os.walk(directory):
    for name in files:
      try:
        total += os.path.getsize(os.path.join(root, name))
      except FileNotFoundError:
        pass
  return total


def test_killed_save_keeps_last_good_checkpoint(tmp_path):
  script = tmp_path / "writer.py"
  script.write_text(WRITER.replace("BIG_SIZE", str(BIG_SIZE)))
  ckpt_dir = tmp_path / "ckpt"
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p))
  with open(tmp_path / "writer.log", "w") as log:
    proc = subprocess.Popen([sys.executable, str(script), str(ckpt_dir)], stdout=subprocess.PIPE,
                            stderr=log, text=True, env=env)
    try:
      marker = proc.stdout.readline()
      assert marker.strip() == "SAVING_STEP_2", (tmp_path / "writer.log").read_text()[-3000:]
      # Orbax first writes small metadata files, then the array chunks; kill once chunk bytes
      # land so the uncommitted step holds a partial array, the worst case for a reader.
      deadline = time.monotonic() + 30
      while bytes_under(ckpt_dir / f"2{TMP_SUFFIX}") < PARTIAL_BYTES and proc.poll() is None:
        assert time.monotonic() < deadline, "step 2 never started writing"
        time.sleep(0.002)
      proc.send_signal(signal.SIGKILL)
    finally:
      if proc.poll() is None:
        proc.kill()
      proc.wait()

  killed_mid_write = not (ckpt_dir / "2").exists()
  print(f"kill landed mid-write: {killed_mid_write}")
  step_1 = {"w": jnp.arange(12, dtype=jnp.bfloat16).reshape(3, 4), "step": jnp.int32(1)}
  with Checkpointer(ckpt_dir) as ckpt:
    if killed_mid_write:
      assert bytes_under(ckpt_dir / f"2{TMP_SUFFIX}") >= PARTIAL_BYTES
      assert ckpt.all_steps() == [1] and ckpt.latest_step() == 1
      restored = ckpt.restore(abstract_like(step_1))
      assert_trees_equal(restored.state, step_1)
      assert restored.metadata == {"step": 1}
      np.testing.assert_array_equal(jax.random.key_data(restored.rng),
                                    jax.random.key_data(jax.random.key(1)))
      # The run resumes: it saves step 2 again over the debris and reads it back.
      resumed = {"w": jnp.ones(5), "step": jnp.int32(2)}
      ckpt.save(2, resumed)
      assert_trees_equal(ckpt.restore(abstract_like(resumed)).state, resumed)
    else:
      # The write beat the kill: then step 2 is committed and must be whole.
      assert ckpt.latest_step() == 2
      step_2 = {"w": jnp.arange(BIG_SIZE, dtype=jnp.float32), "step": jnp.int32(2)}
      assert_trees_equal(ckpt.restore(abstract_like(step_2)).state, step_2)
