"""Random network distillation on the policy's action features (i-MENTOR as adapted by SGE, appendix A.4).

y = the policy's final hidden state (after the last norm, before the logit head) at the last token of an
action. A frozen random MLP gives the target z_bar = f_bar(y); a predictor MLP f is trained to match it.
The exploration reward of an action is its normalised prediction error

  R_RND = ||f(y) - f_bar(y)||^2 / std(||f(y) - f_bar(y)||^2)       (std over the iteration's actions)

which is large for actions unlike those seen before. The pair is one flax module, used functionally:
params = {"target": ..., "predictor": ...}; the runtime trains it as an aux model with "target" frozen
(train/aux_models.py), with these pure functions as its loss and reward.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array

# Logical axes of the MLPs' kernels: the hidden layer shards like the policy's MLP (rules "mlp").
_HIDDEN_AXES = ("embed", "mlp")
_OUTPUT_AXES = ("mlp", None)


@dataclasses.dataclass(frozen=True)
class RNDConfig:
  hidden_dim: int = 256     # width of both MLPs' hidden layer
  output_dim: int = 64      # dimension of the target latent z
  learning_rate: float = 1e-3


class MLP(nn.Module):
  """Dense -> ReLU -> Dense with LeCun-normal kernels and zero biases, kernels named by logical axes."""
  hidden_dim: int
  output_dim: int

  @nn.compact
  def __call__(self, x: Array) -> Array:
    init = nn.initializers.lecun_normal()
    x = nn.Dense(self.hidden_dim, kernel_init=nn.with_logical_partitioning(init, _HIDDEN_AXES))(x)
    x = nn.relu(x)
    return nn.Dense(self.output_dim, kernel_init=nn.with_logical_partitioning(init, _OUTPUT_AXES))(x)


class RNDPair(nn.Module):
  """f_bar (target, frozen) and f (predictor): both map features [N, E] to latents [N, output_dim]."""
  hidden_dim: int = 256
  output_dim: int = 64

  def setup(self):
    self.target = MLP(self.hidden_dim, self.output_dim)
    self.predictor = MLP(self.hidden_dim, self.output_dim)

  def __call__(self, x: Array) -> tuple[Array, Array]:
    return self.predictor(x), self.target(x)


def module(config: RNDConfig) -> RNDPair:
  return RNDPair(config.hidden_dim, config.output_dim)


def init(key: Array, input_dim: int, config: RNDConfig = RNDConfig()) -> dict:
  """{"target": ..., "predictor": ...}: two independently initialised MLPs (plain arrays)."""
  variables = module(config).init(key, jnp.zeros((1, input_dim), jnp.float32))
  return nn.meta.unbox(variables["params"])


def param_axes(input_dim: int, config: RNDConfig = RNDConfig()) -> dict:
  """The params tree with each leaf replaced by its tuple of logical axis names (biases: replicated)."""
  boxed = jax.eval_shape(lambda: module(config).init(jax.random.key(0), jnp.zeros((1, input_dim)))["params"])
  return jax.tree.map(lambda x: tuple(x.names) if isinstance(x, nn.Partitioned) else (None,) * len(x.shape),
                      boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def errors(params: dict, features: Array, config: RNDConfig = RNDConfig()) -> Array:
  """[N] squared prediction errors ||f(y) - f_bar(y)||^2 (no gradient into the target)."""
  pred, target = module(config).apply({"params": params}, features.astype(jnp.float32))
  return jnp.sum(jnp.square(pred - jax.lax.stop_gradient(target)), axis=-1)


def normalised_rewards(err: Array, mask: Array, eps: float = 1e-8) -> Array:
  """err / std(err) over the masked-in entries (0 elsewhere)."""
  mask = mask.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(mask), 1.0)
  mean = jnp.sum(err * mask) / n
  std = jnp.sqrt(jnp.sum(jnp.square(err - mean) * mask) / n)
  return err / (std + eps) * mask


def loss(params: dict, batch: dict, config: RNDConfig = RNDConfig()) -> tuple[Array, dict]:
  """The predictor's masked mean squared error on batch["features"] [N, E] with batch["mask"] [N]."""
  mask = batch["mask"].astype(jnp.float32)
  value = jnp.sum(errors(params, batch["features"], config) * mask) / jnp.maximum(jnp.sum(mask), 1.0)
  return value, {"predictor_loss": value}
