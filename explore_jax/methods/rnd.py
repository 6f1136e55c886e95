"""RND baseline (i-MENTOR; SGE appendix A.4): an exploration reward for novel actions on failed trajectories.

Every response carries the policy's final hidden state at its last token (`features`, recorded by the
sampler at no extra forward pass). Before the advantages, each step record of a trajectory whose task
return is zero gets `rnd.coef * R_RND` added to its reward (explore_jax/rl/rnd.py); successful trajectories
keep their task reward only. After the policy update the predictor takes `rnd.update_steps` Adam steps on
the iteration's features. Target, predictor and its optimizer state are saved in each orbax checkpoint.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from explore_jax.methods.base import Method, register_method


@register_method("rnd")
class RND(Method):
  """GRPO plus the RND exploration reward on zero-reward trajectories."""

  name = "rnd"
  wants_features = True

  def __init__(self, config: Any):
    super().__init__(config)
    from explore_jax.rl import rnd  # jax stays out of the package's import

    self._rnd = rnd
    self.rnd_config = rnd.RNDConfig(hidden_dim=config.rnd.hidden_dim, output_dim=config.rnd.output_dim,
                                    learning_rate=config.rnd.learning_rate)
    self.state = None  # built by init_aux, from the policy's hidden size
    self.last_bonus = 0.0

  def init_aux(self, model_config: Any, key: Any) -> None:
    self.state = self._rnd.init(key, model_config.hidden_size, self.rnd_config)

  def step_rewards(self, records: Any) -> np.ndarray:
    rewards = super().step_rewards(records)
    features = np.asarray(records.extras["features"], np.float32)
    valid = np.asarray(records.valid)
    err = self._rnd.errors(self.state, features)
    bonus = np.asarray(self._rnd.normalised_rewards(err, valid))
    failed = zero_return_trajectories(np.asarray(records.task_reward), np.asarray(records.traj_id), valid)
    self.last_bonus = float(bonus[failed].mean()) if failed.any() else 0.0
    return rewards + float(self.config.rnd.coef) * bonus * failed

  def update_aux(self, records: Any, iteration: int) -> dict[str, float]:
    features = np.asarray(records.extras["features"], np.float32)
    valid = np.asarray(records.valid)
    losses = []
    for _ in range(int(self.config.rnd.update_steps)):
      self.state, loss = _jit_update(self._rnd, self.rnd_config)(self.state, features, valid)
      losses.append(float(loss))
    return {"rnd/predictor_loss": losses[-1] if losses else 0.0,
            "rnd/bonus_on_failed": self.last_bonus}

  def aux_state(self) -> Any:
    return self.state

  def load_aux_state(self, tree: Any) -> None:
    self.state = tree


def zero_return_trajectories(task_reward: np.ndarray, traj_id: np.ndarray, valid: np.ndarray) -> np.ndarray:
  """[N] bool: valid records whose trajectory's summed task reward is zero."""
  totals: dict[int, float] = {}
  for r, t, v in zip(task_reward, traj_id, valid):
    if v:
      totals[int(t)] = totals.get(int(t), 0.0) + float(r)
  return np.array([bool(v) and totals[int(t)] == 0.0 for t, v in zip(traj_id, valid)], bool)


_UPDATES: dict = {}


def _jit_update(rnd_module, config):
  if config not in _UPDATES:
    import functools

    import jax

    _UPDATES[config] = jax.jit(functools.partial(rnd_module.update, config=config))
  return _UPDATES[config]
