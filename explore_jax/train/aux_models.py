"""A method's auxiliary models as real models: built on the mesh, trained by the shared step, checkpointed.

A method declares each of its networks as an `AuxModelSpec` (methods/base.py: `Method.aux_models`); the
runtime turns it into an `AuxModel`:

  * parameters are created directly in their shardings: each leaf's logical axes (the spec's `param_axes`,
    e.g. a policy-sized LM's `Model.param_axes()` or a flax module's `nn.with_logical_partitioning`
    metadata) map to mesh axes through the config's sharding rules, exactly like the policy's;
  * its own optimizer (AdamW at the spec's rate, global-norm clipping), with the top-level parameter
    subtrees named in `frozen` never updated (RND's random target, q_phi's prior);
  * its update is `train.sft.make_train_step`: the same jitted, sharded, donated step as the policy's,
    skipping non-finite updates;
  * its `TrainState` is saved in the run's orbax checkpoint with its shardings and restored onto them.

When it trains is the method's choice (`phase`): "before_rewards" trains on the iteration's fresh records
before any reward is computed (ScreenExplorer's world model; EAPO's q_phi, as its released reward manager trains
before it scores), "after_update" after the policy update (RND's predictor).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from explore_jax.parallel import sharding
from explore_jax.train import sft
from explore_jax.train import state as state_lib

Batch = dict[str, jax.Array]
PHASES = ("before_rewards", "after_update")


@dataclasses.dataclass(frozen=True)
class AuxModelSpec:
  """What a method declares about one of its networks.

  Attributes:
    init: key -> params (called under jit with the shardings as outputs; may close over arrays, e.g. the
      policy's parameters for q_phi and its prior).
    loss: (params, batch) -> (scalar loss, metrics); differentiated with respect to the trainable leaves.
    batches: the iteration's records -> the batches of this iteration's updates (one optimizer step each;
      every array has the record axis first, sharded over the rules' batch axes).
    param_axes: params-shaped tree of logical axis tuples (None leaves or None: replicated).
    frozen: top-level keys of the params dict that never change.
    phase: "before_rewards" or "after_update".
    learning_rate, max_grad_norm, weight_decay, betas: its optimizer (AdamW; Adam's b1, b2).
    from_policy: None, or the policy's parameters RL starts from (after the warm start; full weights, LoRA
      merged) -> this model's starting params, which the runtime restarts it from, with a fresh optimizer, once
      the warm start is done (q_phi and its prior: copies of the policy it explores with). `init` still gives the
      shapes and the parameters before then; a resumed run restores its checkpoint instead.
    keep_outputs: the loss's metrics carry per-row outputs under "outputs" (a dict of [B, ...] arrays with the
      batch's record indices as "row", -1 on padding rows); the runtime keeps, for each record, what the last
      update that saw it computed (with the batches of several epochs in order: the last epoch's forward pass,
      as ScreenExplorer's released code scores its world model's predictions) and hands them to the method's
      `intrinsic_rewards` as `aux_outputs[name]`.
  """
  init: Callable[[jax.Array], Any]
  loss: Callable[[Any, Batch], tuple[jax.Array, dict[str, jax.Array]]]
  batches: Callable[[Any], Iterable[Batch]]
  param_axes: Any = None
  frozen: tuple[str, ...] = ()
  phase: str = "after_update"
  learning_rate: float = 1e-3
  max_grad_norm: Optional[float] = None
  weight_decay: float = 0.0
  from_policy: Optional[Callable[[Any], Any]] = None
  keep_outputs: bool = False
  betas: tuple[float, float] = (0.9, 0.999)

  def __post_init__(self):
    if self.phase not in PHASES:
      raise ValueError(f"aux model phase must be one of {PHASES}, got {self.phase!r}")


def _frozen_labels(params: Any, frozen: tuple[str, ...]) -> Any:
  if frozen and not isinstance(params, dict):
    raise ValueError("an aux model with frozen parts needs a dict of top-level parameter subtrees")
  missing = [k for k in frozen if k not in params]
  if missing:
    raise ValueError(f"frozen parts {missing} are not top-level keys of the aux model's params {sorted(params)}")
  if not frozen:
    return jax.tree.map(lambda _: "train", params)
  return {k: jax.tree.map(lambda _: "frozen" if k in frozen else "train", v) for k, v in params.items()}


OUTPUTS = "outputs"  # the metrics key of a keep_outputs loss's per-row outputs


class AuxModel:
  """One built aux model: `state` (a TrainState on the mesh), `train(records)`, `params`, and `outputs` (the
  per-record outputs of its last training, for a keep_outputs spec)."""

  def __init__(self, name: str, spec: AuxModelSpec, mesh: jax.sharding.Mesh, rules: sharding.Rules,
               key: jax.Array):
    self.name, self.spec, self.mesh, self.rules = name, spec, mesh, rules
    self._shapes = jax.eval_shape(spec.init, key)
    axes = spec.param_axes
    if axes is None:
      axes = jax.tree.map(lambda s: (None,) * len(s.shape), self._shapes)
    self._axes = axes
    labels = _frozen_labels(self._shapes, spec.frozen)
    adam = state_lib.make_optimizer(spec.learning_rate, weight_decay=spec.weight_decay,
                                    max_grad_norm=spec.max_grad_norm, b1=spec.betas[0], b2=spec.betas[1])
    self.optimizer = optax.multi_transform({"train": adam, "frozen": optax.set_to_zero()}, labels)
    self.shardings = _state_shardings(self._shapes, self._axes, self.optimizer, mesh, rules)
    params = jax.jit(spec.init, out_shardings=self.shardings.params)(key)
    self.state = state_lib.create_train_state(params, self.optimizer, self.shardings)
    self.outputs: dict[str, Any] = {}
    self._step = sft.make_train_step(self, self.optimizer, self.shardings,
                                     loss_fn=lambda _, params, batch: spec.loss(params, batch))

  @property
  def params(self) -> Any:
    return self.state.params

  def start_from_policy(self, policy_params: Any) -> None:
    """Restarts this model from `spec.from_policy(policy_params)` with a fresh optimizer state. Every leaf is a
    copy in this model's shardings: the policy's own buffers are donated by its updates."""
    params = self.spec.from_policy(policy_params)
    params = jax.tree.map(lambda x, sh: jax.device_put(jnp.array(x, copy=True), sh), params, self.shardings.params)
    self.state = state_lib.create_train_state(params, self.optimizer, self.shardings)

  def train(self, records: Any) -> dict[str, float]:
    """One optimizer step per batch the spec makes of `records`; returns the last step's metrics, the number of
    steps and their wall time (`<name>/steps`, `<name>/seconds`)."""
    metrics: dict[str, Any] = {}
    kept: list[Any] = []
    t0, steps = time.time(), 0
    for batch in self.spec.batches(records):
      self.state, metrics = self._step(self.state, {k: jnp.asarray(v) for k, v in batch.items()})
      if self.spec.keep_outputs:
        metrics = dict(metrics)
        kept.append(metrics.pop(OUTPUTS))  # fetched once, after the loop: the steps stay queued
      steps += 1
    if self.spec.keep_outputs:
      self.outputs = last_outputs(jax.device_get(kept))
    out = {f"{self.name}/{k}": float(v) for k, v in jax.device_get(metrics).items()}
    return {**out, f"{self.name}/steps": float(steps), f"{self.name}/seconds": time.time() - t0}

  def abstract_state(self) -> Any:
    """The restore target: this model's TrainState shapes with their shardings."""
    from explore_jax.train import checkpoint

    return checkpoint.abstract_like(jax.eval_shape(lambda: self.state), self.shardings)


def last_outputs(steps: list[dict[str, Any]]) -> dict[str, Any]:
  """Per-record outputs from the steps' {"row": [B], name: [B, ...]} dicts: for each record index, the last step's
  row for it (rows -1 are padding); `seen` [N] says which records some step computed (N = the largest index + 1)."""
  rows = [np.asarray(s["row"]) for s in steps]
  n = max((int(r.max()) + 1 for r in rows if r.size), default=0)
  out: dict[str, Any] = {"seen": np.zeros(n, bool)}
  for step, row in zip(steps, rows):
    keep = row >= 0
    for name, value in step.items():
      if name == "row":
        continue
      value = np.asarray(value)
      if name not in out:
        out[name] = np.zeros((n,) + value.shape[1:], value.dtype)
      out[name][row[keep]] = value[keep]
    out["seen"][row[keep]] = True
  return out


def _state_shardings(shapes: Any, axes: Any, optimizer: optax.GradientTransformation, mesh: jax.sharding.Mesh,
                     rules: sharding.Rules) -> state_lib.TrainState:
  """Params by their logical axes; every optimizer leaf that mirrors a parameter (its key path ends with the
  parameter's path, same shape: Adam's moments, also inside multi_transform's masked states) like that
  parameter; everything else (counts) replicated."""
  param_sh = sharding.tree_shardings(mesh, axes, rules, shapes)
  by_path = {tuple(path): (sh, leaf.shape) for (path, sh), leaf in
             zip(jax.tree_util.tree_leaves_with_path(param_sh), jax.tree.leaves(shapes))}
  replicated = NamedSharding(mesh, P())

  def like_param(path, leaf):
    path = tuple(path)
    for i in range(len(path)):
      match = by_path.get(path[i:])
      if match is not None and match[1] == leaf.shape:
        return match[0]
    return replicated

  opt_sh = jax.tree_util.tree_map_with_path(like_param, jax.eval_shape(optimizer.init, shapes))
  return state_lib.TrainState(step=replicated, params=param_sh, opt_state=opt_sh)


def build_aux_models(specs: dict[str, AuxModelSpec], mesh: jax.sharding.Mesh, rules: sharding.Rules,
                     key: jax.Array) -> dict[str, AuxModel]:
  """Every declared aux model, each initialised from its own key (folded with its position by name)."""
  return {name: AuxModel(name, specs[name], mesh, rules, jax.random.fold_in(key, i))
          for i, name in enumerate(sorted(specs))}

