"""RND networks and the RND baseline's rewards: bonus only on zero-return trajectories, normalised by its
std, and a predictor that learns (seen features lose their bonus, novel ones keep it)."""

import types

import jax
import jax.numpy as jnp
import numpy as np

from configs import rnd_coding
from explore_jax.methods import make_method
from explore_jax.methods.rnd import zero_return_trajectories
from explore_jax.rl import rnd


def test_errors_are_squared_distances_to_the_frozen_target():
  state = rnd.init(jax.random.key(0), 8, rnd.RNDConfig(hidden_dim=16, output_dim=4))
  x = jax.random.normal(jax.random.key(1), (5, 8))
  expected = jnp.sum((rnd.apply_mlp(state.predictor, x) - rnd.apply_mlp(state.target, x)) ** 2, -1)
  np.testing.assert_allclose(rnd.errors(state, x), expected, rtol=1e-6)


def test_normalised_rewards_divide_by_the_masked_std():
  err = jnp.array([1.0, 3.0, 100.0])
  mask = jnp.array([True, True, False])
  np.testing.assert_allclose(rnd.normalised_rewards(err, mask), [1.0, 3.0, 0.0], rtol=1e-5)  # std of {1, 3} = 1


def test_predictor_learns_seen_features_but_not_novel_ones():
  config = rnd.RNDConfig(hidden_dim=64, output_dim=16, learning_rate=3e-3)
  state = rnd.init(jax.random.key(0), 16, config)
  seen = jax.random.normal(jax.random.key(1), (64, 16))
  novel = jax.random.normal(jax.random.key(2), (64, 16)) * 3.0 + 2.0
  before = float(rnd.errors(state, seen).mean())
  step = jax.jit(lambda s, x, m: rnd.update(s, x, m, config))
  for _ in range(300):
    state, _ = step(state, seen, jnp.ones(64, bool))
  assert float(rnd.errors(state, seen).mean()) < 0.1 * before
  assert float(rnd.errors(state, novel).mean()) > 5 * float(rnd.errors(state, seen).mean())
  # Masked-out rows do not train the predictor.
  state2 = rnd.init(jax.random.key(0), 16, config)
  state3, _ = rnd.update(state2, seen, jnp.zeros(64, bool), config)
  for a, b in zip(jax.tree.leaves(state2.predictor), jax.tree.leaves(state3.predictor)):
    np.testing.assert_array_equal(a, b)


def test_zero_return_trajectories():
  task = np.array([0.0, 1.0, 0.0, 0.0, 0.0])
  traj = np.array([0, 0, 1, 1, 2])
  valid = np.array([True, True, True, True, False])
  np.testing.assert_array_equal(zero_return_trajectories(task, traj, valid), [False, False, True, True, False])


def test_rnd_method_rewards_failed_trajectories_only():
  c = rnd_coding.get_config()
  c.rl.overlong_buffer = 0
  method = make_method(c)
  assert method.wants_features
  n, e = 6, 32
  method.init_aux(types.SimpleNamespace(hidden_size=e), jax.random.key(0))
  features = np.random.default_rng(0).normal(size=(n, e)).astype(np.float32)
  records = types.SimpleNamespace(
      task_reward=np.array([1, 0, 0, 0, 0, 0], np.float32), format_reward=np.ones(n, np.float32),
      response_mask=np.ones((n, 4), bool), traj_id=np.array([0, 1, 2, 2, 3, 3]),
      valid=np.array([True] * 5 + [False]), extras={"features": features})
  r = method.step_rewards(records)
  assert r[0] == 1.0 and r[5] == 0.0            # success keeps its reward; padding gets nothing
  assert np.all(r[1:5] > 0)                     # failed trajectories get the bonus
  m = method.update_aux(records, 0)
  assert m["rnd/predictor_loss"] > 0 and m["rnd/bonus_on_failed"] > 0
