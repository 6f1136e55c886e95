"""train/provenance.py: the bit fingerprint of a parameter tree, machine names, and provenance.json."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from explore_jax.train import provenance


def _tree():
  rng = np.random.default_rng(0)
  return {"embed": rng.normal(size=(7, 5)).astype(np.float32),
          "layers": [{"w": rng.normal(size=(5, 5)).astype(np.float32), "norm": np.ones(5, jnp.bfloat16)}]}


def test_params_digest_sees_every_bit_and_nothing_else():
  tree = _tree()
  digest = provenance.params_digest(tree)
  assert len(digest) == 12
  # The same bits as device arrays (and a second call): the same digest.
  assert provenance.params_digest(jax.tree.map(jnp.asarray, tree)) == digest
  # One ulp in one element.
  bumped = jax.tree.map(np.copy, tree)
  bumped["layers"][0]["w"][3, 1] = np.nextafter(bumped["layers"][0]["w"][3, 1], np.float32(np.inf))
  assert provenance.params_digest(bumped) != digest
  # Two elements swapped (the plain sum of bit patterns is unchanged; the position-weighted one is not).
  swapped = jax.tree.map(np.copy, tree)
  swapped["embed"][0, 0], swapped["embed"][0, 1] = tree["embed"][0, 1], tree["embed"][0, 0]
  assert provenance.params_digest(swapped) != digest
  # The same bits under another name or shape.
  assert provenance.params_digest({"embedding": tree["embed"], "layers": tree["layers"]}) != digest
  reshaped = {**tree, "embed": tree["embed"].reshape(5, 7)}
  assert provenance.params_digest(reshaped) != digest


def test_params_digest_does_not_depend_on_the_reduction_order():
  # Integer sums wrap exactly: summing the bit patterns in any grouping gives the same total, unlike floats.
  x = np.random.default_rng(1).normal(size=4096).astype(np.float32)
  bits = x.view(np.uint32).astype(np.uint64)
  assert int(bits.sum()) % 2**32 == int(sum(int(b) for b in bits[::-1])) % 2**32
  assert provenance.params_digest({"x": x}) == provenance.params_digest({"x": jnp.asarray(x).reshape(64, 64).ravel()})


def test_machine_tag_is_a_stable_directory_name():
  info = {"cpu": "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "vendor": "GenuineIntel", "isa": "avx2,avx512f",
          "visible_cores": 2, "jax": "0.10.2", "jaxlib": "0.10.2", "xla_flags": ""}
  tag = provenance.machine_tag(info)
  assert tag.startswith("intel-xeon-2c-") and len(tag) == len("intel-xeon-2c-") + 6
  assert provenance.machine_tag(dict(info)) == tag
  for key, value in (("visible_cores", 1), ("isa", "avx2"), ("jaxlib", "0.10.3"), ("xla_flags", "--x=1")):
    assert provenance.machine_tag({**info, key: value}) != tag, key
  here = provenance.machine_tag()
  assert here == provenance.machine_tag() and os.sep not in here and " " not in here
  # With GPUs the GPU model names the tag (its arithmetic decides the results); the CPU still counts in the hash.
  gpu = {**info, "gpus": ["NVIDIA H100 80GB HBM3"]}
  assert provenance.machine_tag(gpu).startswith("nvidia-h100-1g-")
  assert provenance.machine_tag(gpu) != provenance.machine_tag({**gpu, "cpu": "AMD EPYC 7B13"})


def test_gpus_listed_from_the_driver_unless_jax_is_kept_off_them(tmp_path, monkeypatch):
  gpus = tmp_path / "gpus" / "0000:00:05.0"
  gpus.mkdir(parents=True)
  (gpus / "information").write_text("Model: \t\t NVIDIA H200\nIRQ:   42\n")
  real_isdir, real_listdir, real_open = os.path.isdir, os.listdir, open
  redirect = lambda path: str(path).replace("/proc/driver/nvidia/gpus", str(tmp_path / "gpus"))
  monkeypatch.setattr(os.path, "isdir", lambda path: real_isdir(redirect(path)))
  monkeypatch.setattr(os, "listdir", lambda path: real_listdir(redirect(path)))
  monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(redirect(path), *a, **k))
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  assert provenance.machine()["gpus"] == ["NVIDIA H200"]
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  assert "gpus" not in provenance.machine()


def test_record_keeps_the_start_and_lists_each_machine_once(tmp_path, monkeypatch):
  tree = _tree()
  info = provenance.record(str(tmp_path), 0, tree)
  assert info["start_digest"] == provenance.params_digest(tree)
  assert [m["iteration"] for m in info["machines"]] == [0]
  assert info["machines"][0]["tag"] == provenance.machine_tag()
  # Resumed on the same machine: nothing new. On another: appended, the start kept.
  assert provenance.record(str(tmp_path), 4)["machines"] == info["machines"]
  other = {**provenance.machine(), "visible_cores": 1}
  monkeypatch.setattr(provenance, "machine", lambda: dict(other))
  again = provenance.record(str(tmp_path), 6)
  assert again["start_digest"] == info["start_digest"]
  assert [m["iteration"] for m in again["machines"]] == [0, 6] and again["machines"][1]["visible_cores"] == 1
  assert json.load(open(tmp_path / "provenance.json")) == again == provenance.load(str(tmp_path))
  assert provenance.load(str(tmp_path / "nowhere")) is None


def test_params_digest_names_unsupported_leaves():
  with pytest.raises(ValueError, match="complex64 leaves are not supported"):
    provenance.params_digest({"x": np.zeros(3, np.complex64)})


def test_record_of_a_secondary_process_computes_and_writes_nothing(tmp_path):
  info = provenance.record(str(tmp_path), 0, _tree(), write=False)
  assert info["start_digest"] == provenance.params_digest(_tree())
  assert list(tmp_path.iterdir()) == []
