"""Sharding on 8 fake CPU devices: forward equals single device, params land where the rules say,
a sharded train step learns."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from explore_jax.models import Model, preset
from explore_jax.parallel import DEFAULT_RULES, logical_to_spec, make_mesh, tree_shardings
from explore_jax.parallel.mesh import resolve_shape
from explore_jax.train import sft, state as state_lib

MESHES = [(8, 1, 1), (2, 2, 2), (1, 2, 4)]
CONFIG = preset("tiny", num_layers=2, vocab_size=512)


@pytest.fixture(scope="module")
def reference():
  m = Model(CONFIG)
  params = m.init(jax.random.key(0), std=0.05)
  tokens = jax.random.randint(jax.random.key(1), (8, 16), 0, CONFIG.vocab_size)
  mask = jnp.arange(16)[None] >= jnp.array([0, 3, 0, 5, 1, 0, 0, 2])[:, None]
  pos = jnp.maximum(jnp.cumsum(mask, -1) - 1, 0)
  logits = jax.jit(m.apply)(params, tokens, pos, attention_mask=mask).logits
  return params, tokens, pos, mask, logits


def test_eight_fake_devices():
  assert jax.device_count() == 8


def test_mesh_shapes():
  assert resolve_shape((-1, 2, 1), 8) == (4, 2, 1)
  with pytest.raises(ValueError, match="does not fit"):
    resolve_shape((3, -1, 1), 8)
  with pytest.raises(ValueError, match="at most one"):
    resolve_shape((-1, -1, 1), 8)


def test_logical_rules_map_to_specs():
  mesh = make_mesh((2, 2, 2))
  assert logical_to_spec(("batch", "length"), DEFAULT_RULES, mesh, (8, 4)) == P(("data", "fsdp"), None)
  assert logical_to_spec(("embed", "mlp"), DEFAULT_RULES, mesh, (64, 128)) == P("fsdp", "tensor")
  # A dimension the mesh axis does not divide is replicated rather than rejected.
  assert logical_to_spec(("kv_heads", "head_dim"), DEFAULT_RULES, mesh, (3, 8)) == P(None, None)
  with pytest.raises(KeyError, match="no sharding rule"):
    logical_to_spec(("nonsense",), DEFAULT_RULES)


@pytest.mark.parametrize("shape", MESHES)
def test_sharded_forward_equals_single_device(reference, shape):
  params, tokens, pos, mask, expected = reference
  mesh = make_mesh(shape)
  model = Model(CONFIG, mesh=mesh, rules=DEFAULT_RULES)
  shardings = tree_shardings(mesh, model.param_axes(), DEFAULT_RULES, model.param_shapes())
  sharded = jax.device_put(params, shardings)
  data = jax.sharding.NamedSharding(mesh, logical_to_spec(("batch", "length"), DEFAULT_RULES, mesh))
  tokens, pos, mask = jax.device_put((tokens, pos, mask), data)
  logits = jax.jit(model.apply)(sharded, tokens, pos, attention_mask=mask).logits
  np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), atol=1e-5)
  # Parameters land with the shardings the rules say: (1, 2, 4) puts embed on fsdp, heads on tensor.
  if shape == (1, 2, 4):
    assert sharded["layers"]["q"].sharding.spec == P(None, "fsdp", "tensor", None)
    assert sharded["layers"]["down"].sharding.spec == P(None, "tensor", "fsdp")
    assert sharded["embed"].sharding.spec == P("tensor", "fsdp")
    q = sharded["layers"]["q"]
    assert q.addressable_shards[0].data.shape == (q.shape[0], q.shape[1] // 2, q.shape[2] // 4, q.shape[3])


def test_rules_table_is_the_layout(reference):
  """Changing the table (here: no tensor parallelism) changes where the weights live, nothing else."""
  params, tokens, pos, mask, expected = reference
  mesh = make_mesh((1, 2, 4))
  rules = (("q_heads", None), ("kv_heads", None), ("mlp", None), ("vocab", None)) + DEFAULT_RULES
  model = Model(CONFIG, mesh=mesh, rules=rules)
  sharded = jax.device_put(params, tree_shardings(mesh, model.param_axes(), rules, model.param_shapes()))
  assert sharded["layers"]["q"].sharding.spec == P(None, "fsdp", None, None)
  logits = jax.jit(model.apply)(sharded, tokens, pos, attention_mask=mask).logits
  np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 2, 2), (1, 2, 4)])
def test_sharded_train_step_reduces_loss(reference, shape):
  params, tokens, _, _, _ = reference
  mesh = make_mesh(shape)
  model = Model(CONFIG, mesh=mesh, rules=DEFAULT_RULES)
  optimizer = state_lib.make_optimizer(3e-3, max_grad_norm=1.0)
  shardings = state_lib.state_shardings(model, optimizer, mesh, DEFAULT_RULES)
  state = state_lib.create_train_state(params, optimizer, shardings)
  assert state.opt_state[1][0].mu["layers"]["gate"].sharding.spec == shardings.params["layers"]["gate"].spec
  step = sft.make_train_step(model, optimizer, shardings)
  batch = {"tokens": tokens, "loss_mask": jnp.ones_like(tokens, bool)}
  losses = []
  for _ in range(8):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  assert losses[-1] < losses[0] - 0.5, losses
  assert int(state.step) == 8 and state.params["layers"]["q"].sharding == shardings.params["layers"]["q"]
  # A batch whose rows do not split over the mesh's batch axes (data x fsdp) is refused by name, not by XLA.
  with pytest.raises(ValueError, match=f"a batch of 9 rows cannot be split over the {shape[0] * shape[1]} devices"):
    step(state, {k: jnp.concatenate([v, v[:1]]) for k, v in batch.items()})


def test_non_finite_update_is_skipped(reference):
  params, tokens, _, _, _ = reference
  model = Model(CONFIG)
  optimizer = state_lib.make_optimizer(1e-3)
  state = state_lib.create_train_state(params, optimizer)
  before = jax.tree.map(np.asarray, state.params)
  poisoned = jax.tree.map(lambda x: x, params)
  bad_state = state.replace(params={**poisoned, "final_norm": poisoned["final_norm"].at[0].set(jnp.nan)})
  step = sft.make_train_step(model, optimizer)
  new, metrics = step(bad_state, {"tokens": tokens, "loss_mask": jnp.ones_like(tokens, bool)})
  assert int(metrics["skipped"]) == 1 and int(new.step) == 1
  np.testing.assert_array_equal(np.asarray(new.params["embed"]), before["embed"])
