"""The learner's state (params, optimizer state, step), its optimizer and its shardings on the mesh."""

from __future__ import annotations

from typing import Any, Optional

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from explore_jax.models import lora as lora_lib
from explore_jax.models.transformer import Model
from explore_jax.parallel import sharding


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


def make_optimizer(learning_rate: float, *, weight_decay: float = 0.0, b1: float = 0.9, b2: float = 0.999,
                   eps: float = 1e-8, max_grad_norm: Optional[float] = 1.0, warmup_steps: int = 0,
                   ) -> optax.GradientTransformation:
  """AdamW with optional global-norm clipping and linear warmup to a constant rate."""
  lr: Any = learning_rate
  if warmup_steps > 0:
    lr = optax.linear_schedule(0.0, learning_rate, warmup_steps)
  parts = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm else []
  parts.append(optax.adamw(lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay))
  return optax.chain(*parts)


def state_shardings(model: Model, optimizer: optax.GradientTransformation, mesh: Mesh,
                    rules: sharding.Rules, lora: Optional[lora_lib.LoraConfig] = None) -> TrainState:
  """NamedShardings of every leaf: params by their logical axes, optimizer moments like their params,
  scalars (step, Adam's count) replicated. With `lora` the trained params are its adapters."""
  if lora is None:
    shapes, axes = model.param_shapes(), model.param_axes()
  else:
    shapes, axes = lora_lib.shapes(model.config, lora), lora_lib.axes(model.config, lora)
  param_sh = sharding.tree_shardings(mesh, axes, rules, shapes)
  replicated = NamedSharding(mesh, P())
  opt_shapes = jax.eval_shape(optimizer.init, shapes)
  opt_sh = optax.tree_map_params(optimizer, lambda _, s: s, opt_shapes, param_sh,
                                 transform_non_params=lambda _: replicated,
                                 is_leaf=lambda x: isinstance(x, NamedSharding))
  return TrainState(step=replicated, params=param_sh, opt_state=opt_sh)


def create_train_state(params: Any, optimizer: optax.GradientTransformation,
                       shardings: Optional[TrainState] = None) -> TrainState:
  """A fresh TrainState around `params`, with the optimizer state created directly in its shardings."""
  def init(p):
    return TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=optimizer.init(p))

  if shardings is None:
    return jax.jit(init)(params)
  params = jax.device_put(params, shardings.params)
  return jax.jit(init, out_shardings=shardings)(params)


def apply_if_finite(state: TrainState, new_state: TrainState, ok: jax.Array) -> TrainState:
  """new_state where `ok`, else the old state with the step still advanced (the update is skipped)."""
  kept = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new_state, state)
  return kept.replace(step=state.step + 1)

