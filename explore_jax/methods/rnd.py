"""RND baseline (i-MENTOR; SGE appendix A.4): an exploration reward for novel actions on failed trajectories.

Every response carries the policy's final hidden state at its last token (record field `features`,
recorded by the sampler at no extra forward pass). Before the advantages, each step record of a trajectory
whose task return is zero gets the intrinsic term `rnd = rnd.coef * R_RND` (explore_jax/rl/rnd.py,
computed with the predictor as it is before this iteration's training); successful trajectories keep their
task reward only. The target/predictor pair is an aux model (train/aux_models.py): after the policy
update the predictor takes `rnd.update_steps` Adam steps on the iteration's features, through the shared
jitted train step; the pair and its optimizer state live in the orbax checkpoint with their shardings.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import numpy as np

from explore_jax.actors.protocol import EpisodeResult
from explore_jax.methods.base import BuildContext, Method, register_method

AUX = "rnd"


def add_config(c: Any) -> Any:
  """RND's own fields, for a config whose method includes it ("rnd", "sge+rnd", "eapo+rnd").

  The paper gives R_RND = err / std(err) but no weight against the task reward. err / std is not centred, so its
  mean is mean(err) / std(err), several times the success reward of 1 early on; at weight 1 the tiny coding policy
  learned to fail novelly (held-in pass@1 0.46 -> 0.05 in 16 iterations). At 0.1 the mean bonus of a failed step
  is 0.07-0.9 (docs/results.md), below a success."""
  import ml_collections

  c.rnd = ml_collections.ConfigDict({"coef": 0.1, "hidden_dim": 256, "output_dim": 64, "learning_rate": 1e-3,
                                     "update_steps": 4})
  return c


@register_method("rnd")
class RND(Method):
  """GRPO plus the RND exploration reward on zero-reward trajectories."""

  name = "rnd"
  wants_features = True
  intrinsic_names = ("rnd",)

  def __init__(self, config: Any):
    super().__init__(config)
    from explore_jax.rl import rnd  # jax stays out of the package's import

    self._rnd = rnd
    self.rnd_config = rnd.RNDConfig(hidden_dim=config.rnd.hidden_dim, output_dim=config.rnd.output_dim,
                                    learning_rate=config.rnd.learning_rate)

  def record_fields(self, ctx: BuildContext) -> dict[str, Any]:
    return {"features": ((ctx.model_config.hidden_size,), "float32")}

  def step_fields(self, result: EpisodeResult) -> list[dict[str, Any]]:
    return [{"features": s.response.features} for s in result.steps]

  def aux_models(self, ctx: BuildContext) -> dict[str, Any]:
    from explore_jax.train.aux_models import AuxModelSpec

    rnd, cfg, dim = self._rnd, self.rnd_config, ctx.model_config.hidden_size
    steps = int(self.config.rnd.update_steps)

    def batches(records):
      batch = {"features": np.asarray(records.extras["features"], np.float32), "mask": np.asarray(records.valid)}
      return [batch] * steps

    return {AUX: AuxModelSpec(init=functools.partial(rnd.init, input_dim=dim, config=cfg),
                              loss=functools.partial(rnd.loss, config=cfg), batches=batches,
                              param_axes=rnd.param_axes(dim, cfg), frozen=("target",), phase="after_update",
                              learning_rate=cfg.learning_rate)}

  def intrinsic_rewards(self, records: Any, aux_params: dict[str, Any],
                        aux_outputs: Optional[dict[str, Any]] = None) -> dict[str, np.ndarray]:
    valid = np.asarray(records.valid)
    err = _jit(self._rnd.errors, self.rnd_config)(aux_params[AUX], np.asarray(records.extras["features"], np.float32))
    bonus = np.asarray(self._rnd.normalised_rewards(err, valid))
    failed = zero_return_trajectories(np.asarray(records.task_reward), np.asarray(records.traj_id), valid)
    return {"rnd": (float(self.config.rnd.coef) * bonus * failed).astype(np.float32)}


def zero_return_trajectories(task_reward: np.ndarray, traj_id: np.ndarray, valid: np.ndarray) -> np.ndarray:
  """[N] bool: valid records whose trajectory's summed task reward is zero."""
  totals: dict[int, float] = {}
  for r, t, v in zip(task_reward, traj_id, valid):
    if v:
      totals[int(t)] = totals.get(int(t), 0.0) + float(r)
  return np.array([bool(v) and totals[int(t)] == 0.0 for t, v in zip(traj_id, valid)], bool)


@functools.lru_cache(maxsize=None)
def _jit(fn, config):
  import jax

  return jax.jit(functools.partial(fn, config=config))
