"""A method's own networks (RND here) are saved in the orbax checkpoint beside the policy and restored."""

import jax
import numpy as np

from configs import rnd_coding
from explore_jax.train.loop import Trainer


def test_rnd_networks_survive_a_restart(tmp_path):
  c = rnd_coding.get_config()
  c.sft.enabled = False
  trainer = Trainer(c, str(tmp_path))
  assert trainer.restore_or_init() == 0
  features = np.random.default_rng(0).normal(size=(16, trainer.model.config.hidden_size)).astype(np.float32)
  records = type("R", (), {"extras": {"features": features}, "valid": np.ones(16, bool)})()
  before = jax.tree.map(np.asarray, trainer.method.aux_state())
  trainer.method.update_aux(records, 0)
  trained = jax.tree.map(np.asarray, trainer.method.aux_state())
  assert not np.array_equal(before.predictor[0][0], trained.predictor[0][0])
  trainer.save(1)

  again = Trainer(c, str(tmp_path))
  assert again.restore_or_init() == 1
  restored = jax.tree.map(np.asarray, again.method.aux_state())
  for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(jax.tree.leaves(again.load_params(1)), jax.tree.leaves(trainer.state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
