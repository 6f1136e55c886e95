"""Random network distillation on the policy's action features (i-MENTOR as adapted by SGE, appendix A.4).

y = the policy's final hidden state (after the last norm, before the logit head) at the last token of an
action. A frozen random MLP gives the target z_bar = f_bar(y); a predictor MLP f is trained to match it.
The exploration reward of an action is its normalised prediction error

  R_RND = ||f(y) - f_bar(y)||^2 / std(||f(y) - f_bar(y)||^2)       (std over the iteration's actions)

which is large for actions unlike those seen before. Pure functions over a small pytree (`RNDState`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

Array = jax.Array
MLP = list[tuple[Array, Array]]


@dataclasses.dataclass(frozen=True)
class RNDConfig:
  hidden_dim: int = 256     # width of both MLPs' hidden layer
  output_dim: int = 64      # dimension of the target latent z
  learning_rate: float = 1e-3


class RNDState(NamedTuple):
  target: MLP        # f_bar, frozen
  predictor: MLP     # f, trained
  opt_state: optax.OptState


def init_mlp(key: Array, sizes: tuple[int, ...]) -> MLP:
  """Dense layers with LeCun-normal weights and zero biases."""
  keys = jax.random.split(key, len(sizes) - 1)
  return [(jax.random.normal(k, (m, n), jnp.float32) / jnp.sqrt(m), jnp.zeros((n,), jnp.float32))
          for k, m, n in zip(keys, sizes[:-1], sizes[1:])]


def apply_mlp(params: MLP, x: Array) -> Array:
  for i, (w, b) in enumerate(params):
    x = x @ w + b
    if i < len(params) - 1:
      x = jax.nn.relu(x)
  return x


def optimizer(config: RNDConfig) -> optax.GradientTransformation:
  return optax.adam(config.learning_rate)


def init(key: Array, input_dim: int, config: RNDConfig = RNDConfig()) -> RNDState:
  sizes = (input_dim, config.hidden_dim, config.output_dim)
  k_target, k_pred = jax.random.split(key)
  predictor = init_mlp(k_pred, sizes)
  return RNDState(init_mlp(k_target, sizes), predictor, optimizer(config).init(predictor))


def errors(state: RNDState, features: Array) -> Array:
  """[N] squared prediction errors ||f(y) - f_bar(y)||^2."""
  features = features.astype(jnp.float32)
  diff = apply_mlp(state.predictor, features) - jax.lax.stop_gradient(apply_mlp(state.target, features))
  return jnp.sum(jnp.square(diff), axis=-1)


def normalised_rewards(err: Array, mask: Array, eps: float = 1e-8) -> Array:
  """err / std(err) over the masked-in entries (0 elsewhere)."""
  mask = mask.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(mask), 1.0)
  mean = jnp.sum(err * mask) / n
  std = jnp.sqrt(jnp.sum(jnp.square(err - mean) * mask) / n)
  return err / (std + eps) * mask


def update(state: RNDState, features: Array, mask: Array, config: RNDConfig = RNDConfig()
           ) -> tuple[RNDState, Array]:
  """One Adam step of the predictor on the masked mean squared error; returns (state, loss)."""
  mask = mask.astype(jnp.float32)

  def loss_fn(predictor):
    err = errors(state._replace(predictor=predictor), features)
    return jnp.sum(err * mask) / jnp.maximum(jnp.sum(mask), 1.0)

  loss, grads = jax.value_and_grad(loss_fn)(state.predictor)
  updates, opt_state = optimizer(config).update(grads, state.opt_state, state.predictor)
  return RNDState(state.target, optax.apply_updates(state.predictor, updates), opt_state), loss
