"""RND networks and the RND baseline's rewards: bonus only on zero-return trajectories, normalised by its
std, and a predictor that learns (seen features lose their bonus, novel ones keep it) through the aux-model
path (train/aux_models.py) with its target frozen."""

import types

import jax
import jax.numpy as jnp
import numpy as np

from configs import rnd_coding
from explore_jax.methods import make_method
from explore_jax.methods.base import BuildContext
from explore_jax.methods.rnd import zero_return_trajectories
from explore_jax.parallel import make_mesh
from explore_jax.parallel.sharding import DEFAULT_RULES
from explore_jax.rl import rnd
from explore_jax.train.aux_models import build_aux_models


def _mlp(params, x):
  """The MLP written out by hand: relu(x W1 + b1) W2 + b2."""
  h = jax.nn.relu(x @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"])
  return h @ params["Dense_1"]["kernel"] + params["Dense_1"]["bias"]


def test_errors_are_squared_distances_to_the_frozen_target():
  config = rnd.RNDConfig(hidden_dim=16, output_dim=4)
  params = rnd.init(jax.random.key(0), 8, config)
  x = jax.random.normal(jax.random.key(1), (5, 8))
  expected = jnp.sum((_mlp(params["predictor"], x) - _mlp(params["target"], x)) ** 2, -1)
  np.testing.assert_allclose(rnd.errors(params, x, config), expected, rtol=1e-5)
  assert not np.allclose(params["predictor"]["Dense_0"]["kernel"], params["target"]["Dense_0"]["kernel"])


def test_normalised_rewards_divide_by_the_masked_std():
  err = jnp.array([1.0, 3.0, 100.0])
  mask = jnp.array([True, True, False])
  np.testing.assert_allclose(rnd.normalised_rewards(err, mask), [1.0, 3.0, 0.0], rtol=1e-5)  # std of {1, 3} = 1


def _method(hidden=16, steps=1, lr=3e-3):
  c = rnd_coding.get_config()
  c.rl.overlong_buffer = 0
  c.rnd.hidden_dim, c.rnd.output_dim, c.rnd.learning_rate, c.rnd.update_steps = 64, 16, lr, steps
  method = make_method(c)
  ctx = BuildContext(model_config=types.SimpleNamespace(hidden_size=hidden))
  return method, ctx


def test_predictor_learns_seen_features_but_not_novel_ones_with_the_target_frozen():
  method, ctx = _method(steps=300)
  mesh = make_mesh((-1, 1, 1), ("data", "fsdp", "tensor"))
  aux = build_aux_models(method.aux_models(ctx), mesh, DEFAULT_RULES, jax.random.key(0))["rnd"]
  start = jax.tree.map(np.asarray, aux.params)
  seen = np.asarray(jax.random.normal(jax.random.key(1), (64, 16)))
  novel = np.asarray(jax.random.normal(jax.random.key(2), (64, 16)) * 3.0 + 2.0)
  cfg = method.rnd_config
  before = float(rnd.errors(aux.params, seen, cfg).mean())
  aux.train(types.SimpleNamespace(extras={"features": seen}, valid=np.ones(64, bool)))
  assert float(rnd.errors(aux.params, seen, cfg).mean()) < 0.1 * before
  assert float(rnd.errors(aux.params, novel, cfg).mean()) > 5 * float(rnd.errors(aux.params, seen, cfg).mean())
  for a, b in zip(jax.tree.leaves(start["target"]), jax.tree.leaves(aux.params["target"])):
    np.testing.assert_array_equal(a, np.asarray(b))
  # Masked-out rows do not train the predictor.
  method, ctx = _method(steps=1)
  aux = build_aux_models(method.aux_models(ctx), mesh, DEFAULT_RULES, jax.random.key(0))["rnd"]
  start = jax.tree.map(np.asarray, aux.params)
  aux.train(types.SimpleNamespace(extras={"features": seen}, valid=np.zeros(64, bool)))
  for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(aux.params)):
    np.testing.assert_array_equal(a, np.asarray(b))


def test_rnd_networks_are_sharded_by_their_logical_axes():
  method, ctx = _method(hidden=16)
  mesh = make_mesh((2, 1, 4), ("data", "fsdp", "tensor"))
  aux = build_aux_models(method.aux_models(ctx), mesh, DEFAULT_RULES, jax.random.key(0))["rnd"]
  kernel = aux.params["predictor"]["Dense_0"]["kernel"]   # ("embed", "mlp"): the hidden layer over "tensor"
  assert kernel.sharding.spec[1] == "tensor" and len(kernel.sharding.device_set) == 8
  moment = aux.state.opt_state  # Adam's moments of the predictor are laid out like their params
  shardings = {str(x.sharding.spec) for x in jax.tree.leaves(moment) if x.ndim == 2}
  assert any("tensor" in s for s in shardings)


def test_zero_return_trajectories():
  task = np.array([0.0, 1.0, 0.0, 0.0, 0.0])
  traj = np.array([0, 0, 1, 1, 2])
  valid = np.array([True, True, True, True, False])
  np.testing.assert_array_equal(zero_return_trajectories(task, traj, valid), [False, False, True, True, False])


def test_rnd_method_rewards_failed_trajectories_only():
  method, ctx = _method(hidden=32)
  assert method.wants_features and method.intrinsic_names == ("rnd",)
  assert method.record_fields(ctx) == {"features": ((32,), "float32")}
  mesh = make_mesh((-1, 1, 1), ("data", "fsdp", "tensor"))
  aux = build_aux_models(method.aux_models(ctx), mesh, DEFAULT_RULES, jax.random.key(0))
  n = 6
  features = np.random.default_rng(0).normal(size=(n, 32)).astype(np.float32)
  records = types.SimpleNamespace(
      task_reward=np.array([1, 0, 0, 0, 0, 0], np.float32), format_reward=np.ones(n, np.float32),
      response_mask=np.ones((n, 4), bool), traj_id=np.array([0, 1, 2, 2, 3, 3]),
      valid=np.array([True] * 5 + [False]), extras={"features": features})
  bonus = method.intrinsic_rewards(records, {"rnd": aux["rnd"].params})["rnd"]
  assert bonus[0] == 0.0 and bonus[5] == 0.0     # success gets no bonus; padding gets nothing
  assert np.all(bonus[1:5] > 0)                  # failed trajectories do
  err = np.asarray(rnd.errors(aux["rnd"].params, features[:5], method.rnd_config))
  np.testing.assert_allclose(bonus[1:5], 0.1 * err[1:5] / err.std(), rtol=1e-4)  # coef 0.1 * err / std(err)
