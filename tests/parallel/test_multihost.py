"""Multi-host jax on one machine: two CPU processes (4 fake devices each) joined over loopback by
explore_jax.parallel.distributed form one 8-device mesh, run the project's sharded train step on the tiny
model and save the sharded state with orbax, collectively. One process with 8 fake devices runs the same
step, restores the two processes' checkpoint, and everything must agree bit for bit, but for the last bits of
what a cross-process all-reduce of more than two partial sums feeds (below).

This file is also the worker script: `python tests/parallel/test_multihost.py ROLE ...` (see _worker).
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.parallel.processes import cpu_env, free_port, run_together

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 420  # generous: two training runs may share the machine's cores
MESH = (2, 2, 2)  # data, fsdp, tensor: every kind of sharding crosses the process boundary somewhere


# ---- the worker ---------------------------------------------------------------------------------------------
def _worker(role: str, out_dir: str, ckpt_dir: str, coordinator: str = "", num_processes: int = 0,
            process_id: int = -1) -> None:
  sys.path.insert(0, ROOT)
  from explore_jax.parallel import distributed

  multi = distributed.initialize(coordinator, num_processes, process_id)
  assert multi == (role == "worker"), (role, multi)
  assert distributed.initialize(coordinator, num_processes, process_id) == multi  # idempotent
  if multi:
    try:
      distributed.initialize(coordinator, num_processes, 1 - process_id)
    except RuntimeError as e:
      assert "already initialised differently" in str(e)
    else:
      raise AssertionError("a conflicting second initialize() did not raise")

  import jax
  import numpy as np

  from explore_jax.models import Model, preset
  from explore_jax.parallel import DEFAULT_RULES, make_mesh, tree_shardings
  from explore_jax.train import checkpoint, sft, state as state_lib
  from explore_jax.train.provenance import params_digest

  mesh = make_mesh(MESH)
  model = Model(preset("tiny"), mesh=mesh, rules=DEFAULT_RULES)
  param_sh = tree_shardings(mesh, model.param_axes(), DEFAULT_RULES, model.param_shapes())
  params = jax.jit(model.init, out_shardings=param_sh)(jax.random.key(0))
  optimizer = state_lib.make_optimizer(1e-3, max_grad_norm=1.0)
  shardings = state_lib.state_shardings(model, optimizer, mesh, DEFAULT_RULES)
  state = state_lib.create_train_state(params, optimizer, shardings)
  start_digest = params_digest(state.params)

  # The global batch from host numpy: every process holds all of it and hands jax only its own shards.
  rng = np.random.default_rng(0)
  batch_size, length = 8, 24
  tokens = rng.integers(0, model.config.vocab_size, (batch_size, length), dtype=np.int32)
  pad = rng.integers(0, 6, batch_size)[:, None]
  attention = np.arange(length)[None] >= pad
  loss_mask = attention & (np.arange(length)[None] >= length // 2)
  batch_sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp")))
  batch = {k: jax.make_array_from_callback(v.shape, batch_sh, lambda idx, v=v: v[idx])
           for k, v in (("tokens", tokens), ("attention_mask", attention), ("loss_mask", loss_mask))}

  step = sft.make_train_step(model, optimizer, shardings)
  state, metrics = step(state, batch)
  metrics = {k: float(jax.device_get(v)) for k, v in metrics.items()}
  result = {"process_index": jax.process_index(), "process_count": jax.process_count(),
            "device_count": jax.device_count(), "local_device_count": jax.local_device_count(),
            "is_primary": distributed.is_primary(), "start_digest": start_digest,
            "params_digest": params_digest(state.params), "state_digest": params_digest(state),
            "metrics": metrics,
            "param_shardings": sorted({str(s.spec) for s in jax.tree.leaves(shardings.params)})}

  # A SIGTERM that reached the last process only: every process agrees to stop (train/preemption.py).
  from explore_jax.train import preemption
  stop = preemption.StopRequest()
  result["stop_agreed"] = [stop.agreed()]
  stop.requested = jax.process_index() == jax.process_count() - 1
  result["stop_agreed"].append(stop.agreed())

  if role == "worker":  # both processes write their shards of one checkpoint
    with checkpoint.Checkpointer(ckpt_dir, max_to_keep=None) as ckpt:
      ckpt.save(1, state, rng=jax.random.key(7), metadata={"processes": jax.process_count()})
  else:  # the reference restores what the two processes wrote, onto its own 8-device mesh
    with checkpoint.Checkpointer(ckpt_dir, max_to_keep=None) as ckpt:
      restored = ckpt.restore(checkpoint.abstract_like(state))
    equal = jax.tree.map(lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))), restored.state, state)
    # How far the two processes' state is from this one's, leaf by leaf: (max |a - b|, max |b|, elements differing).
    gaps = {jax.tree_util.keystr(path): (float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))),
                                         float(np.max(np.abs(np.asarray(b, np.float64)))),
                                         int(np.sum(np.asarray(a) != np.asarray(b))))
            for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(restored.state)[0], jax.tree.leaves(state))}
    result["restored"] = {"step": restored.step, "metadata": restored.metadata,
                          "state_digest": params_digest(restored.state),
                          "all_leaves_equal": all(jax.tree.leaves(equal)), "gaps": gaps,
                          "rng_equal": bool(np.array_equal(jax.random.key_data(restored.rng),
                                                           jax.random.key_data(jax.random.key(7)))),
                          "sharding_kept": all(jax.tree.leaves(jax.tree.map(
                              lambda a, b: a.sharding == b.sharding, restored.state, state)))}
  name = f"{role}_{jax.process_index()}.json"
  with open(os.path.join(out_dir, name), "w") as f:
    json.dump(result, f, indent=1)


# ---- the test -----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
  out, ckpt = tmp_path / "out", tmp_path / "ckpt"
  out.mkdir()
  me = os.path.abspath(__file__)
  coordinator = f"127.0.0.1:{free_port()}"
  run_together([([sys.executable, me, "worker", str(out), str(ckpt), coordinator, "2", str(i)], cpu_env(4))
                for i in range(2)], str(tmp_path), "worker", TIMEOUT_S)
  run_together([([sys.executable, me, "reference", str(out), str(ckpt)], cpu_env(8))], str(tmp_path), "reference",
               TIMEOUT_S)

  workers = [json.loads((out / f"worker_{i}.json").read_text()) for i in range(2)]
  ref = json.loads((out / "reference_0.json").read_text())
  for i, w in enumerate(workers):
    assert (w["process_index"], w["process_count"], w["device_count"], w["local_device_count"]) == (i, 2, 8, 4)
    assert w["is_primary"] == (i == 0)
  assert (ref["process_count"], ref["device_count"], ref["is_primary"]) == (1, 8, True)
  assert workers[0]["stop_agreed"] == workers[1]["stop_agreed"] == ref["stop_agreed"] == [False, True]
  # The layout really is sharded on every mesh axis.
  assert any("tensor" in s for s in ref["param_shardings"]) and any("fsdp" in s for s in ref["param_shardings"])
  assert workers[0]["param_shardings"] == ref["param_shardings"]
  # Same bits: the initial params, the loss and gradient norm; the two processes' parameters after one sharded
  # update are one array, and the reference's agree with them leaf by leaf below.
  for key in ("start_digest", "metrics"):
    assert workers[0][key] == workers[1][key] == ref[key], key
  assert workers[0]["params_digest"] == workers[1]["params_digest"]
  assert ref["metrics"]["skipped"] == 0 and ref["params_digest"] != ref["start_digest"]
  assert workers[0]["state_digest"] == workers[1]["state_digest"]
  # The checkpoint the two processes wrote together restores, in one process, bit for bit and in the
  # reference's layout.
  r = ref["restored"]
  assert r["step"] == 1 and r["metadata"] == {"processes": 2}
  assert r["rng_equal"] and r["sharding_kept"]
  assert r["state_digest"] == workers[0]["state_digest"]
  # Adam's moments hold the raw gradients, and the gradients of replicated weights (the RMSNorm scales)
  # are all-reduced over the 4 batch shards: gloo across processes adds those partial sums in another order
  # than XLA's in-process all-reduce, so a few elements differ in their last bits (measured: <= 2 ulp).
  # Two-way reductions (every sharded weight's gradient) are exact, and so is every parameter they update.
  # The first Adam update is about lr * sign(g), not exactly (eps, bias correction), so a norm scale's
  # gradient that differs in its last bit may move that scale's last bit (measured: none on an AMD EPYC, one
  # element of one leaf by 1 ulp on an Intel Xeon). Anything wrong in the layout would be O(1).
  for leaf, (gap, scale, _) in r["gaps"].items():
    assert gap <= 1e-5 * max(scale, 1e-30), (leaf, gap, scale)
    if not leaf.startswith(".opt_state"):
      replicated = leaf.rstrip("']").endswith("norm")
      assert gap <= 4 * 2.0 ** -23 * scale if replicated else gap == 0, (leaf, gap, scale)  # 4 float32 ulps

def test_single_process_is_a_no_op():
  """No settings (or num_processes=1) on a machine without a TPU: nothing starts, the backend is untouched."""
  from explore_jax.parallel import distributed

  if distributed.on_cloud_tpu_vm():
    return
  assert distributed.initialize() is False
  assert distributed.initialize("", 0, -1) is False
  assert distributed.initialize("127.0.0.1:1", 1, 0) is False
  assert not distributed.is_initialized()
  assert distributed.is_primary()


if __name__ == "__main__":
  role, out_dir, ckpt_dir, *rest = sys.argv[1:]
  _worker(role, out_dir, ckpt_dir, *(rest[:1] + [int(x) for x in rest[1:]]))
