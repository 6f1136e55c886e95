"""A method's own networks (RND here) are saved in the orbax checkpoint beside the policy, with their
shardings, and restored onto them."""

import types

import jax
import numpy as np

from configs import rnd_coding
from explore_jax.train import loop
from explore_jax.train.builder import build


def test_rnd_networks_survive_a_restart(tmp_path):
  c = rnd_coding.get_config()
  c.sft.enabled = False
  c.mesh.shape = (2, 1, 4)
  parts = build(c, str(tmp_path))
  assert loop.restore_or_init(parts) == 0
  aux = parts.learner.aux["rnd"]
  features = np.random.default_rng(0).normal(size=(16, parts.model.config.hidden_size)).astype(np.float32)
  before = jax.tree.map(np.asarray, aux.params)
  aux.train(types.SimpleNamespace(extras={"features": features}, valid=np.ones(16, bool)))
  trained = jax.tree.map(np.asarray, aux.state)
  assert not np.array_equal(before["predictor"]["Dense_0"]["kernel"], trained.params["predictor"]["Dense_0"]["kernel"])
  loop.save(parts, 1)

  again = build(c, str(tmp_path))
  assert loop.restore_or_init(again) == 1
  restored = again.learner.aux["rnd"].state
  for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(a, np.asarray(b))
  for a, b in zip(jax.tree.leaves(aux.state), jax.tree.leaves(restored)):  # the same layout on the mesh
    assert a.sharding == b.sharding
  for a, b in zip(jax.tree.leaves(loop.load_params(again, 1)), jax.tree.leaves(parts.learner.state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
