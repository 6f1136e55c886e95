"""The learner: it owns the policy's train state and the method's aux models, and only updates them.

  rewards      extrinsic (task, format, overlong) + the method's intrinsic terms, kept per record
  advantages   the estimator named by the config over StepRecords (step weights, anchor states, ...)
  update       minibatch epochs of the clipped policy loss (train/rl_step.py), after the method's batch
               rewrite, with the KL term against the starting policy when its coefficient is positive
  aux models   trained in the phase each declares (train/aux_models.py)
  sft          SFT requests on the policy's own parameters (the warm start is one, at iteration 0)
  checkpoint   {"train": policy, "aux": {name: aux state}, "method": method arrays} in one orbax step,
               every leaf with its sharding; the method's JSON state in the step's metadata
  LoRA         with config.model.lora, the starting checkpoint is frozen (`base_params`) and the policy's
               trainable parameters are LoRA adapters (models/lora.py): the train state, its optimizer state
               and checkpoints hold only them, and so does every "params" the loop hands around (the
               sampler merges them into the base, train/inference.py)

A learner never talks to actors: the loop hands it records.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from explore_jax.images import ImageLayout
from explore_jax.methods import Method
from explore_jax.methods.base import STEP_WEIGHT_FIELD, BuildContext, SFTRequest
from explore_jax.models import Model
from explore_jax.models import lora as lora_lib
from explore_jax.rl.advantages import RecordLayout, StepRecords, get_advantage_estimator, intern_keys
from explore_jax.train import aux_models as aux_lib
from explore_jax.train import checkpoint, rollout, sft, sft_data
from explore_jax.train import rl_step as rl_step_lib
from explore_jax.train import state as state_lib
from explore_jax.train.rl_step import make_reference_logprobs, make_rl_step

# Named seeds of the learner's host random streams (each also folded with (seed, iteration)).
MINIBATCH_STREAM = 7
BATCH_REWRITE_STREAM = 11
SFT_STREAM = 99
# Prompt columns that are padding in every row are dropped in steps of this many (few compiled widths).
PROMPT_BUCKET = 64


def micro_batch_count(size: int, micro: int, names: tuple[str, str]) -> int:
  """How many micro-batches of `micro` rows a batch of `size` rows is taken in (micro 0: one, the whole batch);
  an error names the two settings (`names`: the micro-batch's, the batch's) when `micro` does not divide it."""
  if micro < 0 or (micro and size % micro):
    raise ValueError(f"{names[0]} must divide {names[1]} ({size}) or be 0 (the whole batch); got {micro}")
  return size // micro if micro else 1


RL_MICRO_BATCH_FIELDS = ("config.rl.micro_batch_size", "config.rl.minibatch_size")


def micro_batch_size(rl: Any) -> int:
  """`rl.micro_batch_size`, checked: 0 (the whole minibatch) or a divisor of `rl.minibatch_size`."""
  micro = int(rl.get("micro_batch_size", 0) or 0)
  micro_batch_count(int(rl.minibatch_size), micro, RL_MICRO_BATCH_FIELDS)
  return micro


class Learner:
  """Policy and aux-model updates on records (see the module docstring)."""

  def __init__(self, config: Any, model: Model, method: Method, initial_params: Any, ctx: BuildContext,
               key: jax.Array, *, tokenizer: Any, prompt_len: int, response_len: int, max_steps: int,
               lora: Optional[lora_lib.LoraConfig] = None):
    """`initial_params` are the starting checkpoint's; with `lora` they stay frozen as `base_params` and
    `initial_params` become fresh adapters (equal to the base as a policy)."""
    self.config, self.model, self.method = config, model, method
    self.tokenizer, self.lora = tokenizer, lora
    self.base_params = initial_params if lora is not None else None
    self.prompt_len, self.response_len, self.max_steps = prompt_len, response_len, max_steps
    o = config.optimizer
    self.optimizer = state_lib.make_optimizer(o.learning_rate, weight_decay=o.weight_decay, b1=o.b1, b2=o.b2,
                                              eps=o.eps, max_grad_norm=o.max_grad_norm, warmup_steps=o.warmup_steps)
    self.shardings = state_lib.state_shardings(model, self.optimizer, model.mesh, model.rules, lora)
    if lora is not None:
      initial_params = jax.jit(lambda: lora_lib.init(model.config, lora), out_shardings=self.shardings.params)()
    self.initial_params = initial_params
    self.loss_config = method.loss_config()
    self.micro_batch_size = micro_batch_size(config.rl)
    # Micro-batches of rows sorted by length, each cut to its own width (the step takes them as parts), or
    # interleaved rows at the batch's width under one lax.scan; a whole minibatch is taken as it is.
    self.by_length = bool(config.rl.get("micro_batches_by_length", True)) and self.micro_batch_size > 0
    scanned = 1 if self.by_length else micro_batch_count(config.rl.minibatch_size, self.micro_batch_size,
                                                         RL_MICRO_BATCH_FIELDS)
    self.rl_step = make_rl_step(model, self.optimizer, self.loss_config, self.shardings, lora=lora,
                                base=self.base_params, micro_batches=scanned)
    self.reference_logprobs = make_reference_logprobs(model) if self.loss_config.kl_coef > 0 else None
    self.aux = aux_lib.build_aux_models(method.aux_models(ctx), model.mesh, model.rules, key)
    self.state: Optional[state_lib.TrainState] = None
    self.reference_params: Any = None

  # ---- state -----------------------------------------------------------------------------------------
  def init(self, params: Any) -> None:
    """The policy starts from `params` (the warm start); the KL term, when on, is measured against them, and aux
    models declaring `from_policy` restart from them."""
    self.state = state_lib.create_train_state(params, self.optimizer, self.shardings)
    self.reference_params = params if self.reference_logprobs is not None else None
    starting = [model for model in self.aux.values() if model.spec.from_policy is not None]
    if starting:  # aux models that start as copies of the policy RL starts from
      full = params if self.lora is None else lora_lib.merge(self.base_params, params, self.lora)
      for model in starting:
        model.start_from_policy(full)

  def model_params(self, params: Any) -> Any:
    """What `Model.apply` takes for the trainable `params`: themselves, or the base with the adapters."""
    return params if self.lora is None else lora_lib.adapted(self.base_params, params, self.lora)

  def aux_params(self) -> dict[str, Any]:
    return {name: model.params for name, model in self.aux.items()}

  def aux_outputs(self) -> dict[str, Any]:
    """The per-record outputs of the aux models that keep them (AuxModelSpec.keep_outputs), from their last
    training."""
    return {name: model.outputs for name, model in self.aux.items() if model.spec.keep_outputs}

  def checkpoint_tree(self) -> dict[str, Any]:
    tree: dict[str, Any] = {"train": self.state}
    if self.aux:
      tree["aux"] = {name: model.state for name, model in self.aux.items()}
    arrays = self.method.array_state()
    if arrays is not None:
      tree["method"] = arrays
    return tree

  def abstract_checkpoint(self) -> dict[str, Any]:
    """The restore target: every part's shapes with the shardings it trains with."""
    train = checkpoint.abstract_like(
        jax.eval_shape(lambda: state_lib.create_train_state(self.initial_params, self.optimizer)), self.shardings)
    tree: dict[str, Any] = {"train": train}
    if self.aux:
      tree["aux"] = {name: model.abstract_state() for name, model in self.aux.items()}
    arrays = self.method.array_state()
    if arrays is not None:
      replicated = jax.sharding.NamedSharding(self.model.mesh, jax.sharding.PartitionSpec())
      tree["method"] = checkpoint.abstract_like(jax.eval_shape(lambda: arrays),
                                                jax.tree.map(lambda _: replicated, arrays))
    return tree

  def load_checkpoint_tree(self, tree: dict[str, Any]) -> None:
    self.state = tree["train"]
    for name, model in self.aux.items():
      model.state = tree["aux"][name]
    if "method" in tree:
      self.method.load_array_state(jax.tree.map(np.asarray, tree["method"]))

  # ---- rewards and advantages ------------------------------------------------------------------------
  def rewards(self, records: Any) -> tuple[Any, np.ndarray, dict[str, float]]:
    """(records with their intrinsic terms filled in, the scalar reward per record, metrics)."""
    valid = np.asarray(records.valid)
    rewards = self.method.extrinsic_rewards(records)
    terms = self.method.intrinsic_rewards(records, self.aux_params(), aux_outputs=self.aux_outputs())
    metrics = {}
    if self.method.intrinsic_names:
      missing = set(self.method.intrinsic_names) ^ set(terms)
      if missing:
        raise ValueError(f"method {self.method.name!r} declared intrinsic terms {self.method.intrinsic_names} "
                         f"but returned {sorted(terms)}")
      columns = [np.asarray(terms[name], np.float32) for name in self.method.intrinsic_names]
      for name, column in zip(self.method.intrinsic_names, columns):
        rewards = rewards + column
        metrics[f"reward/{name}"] = float(column[valid].mean()) if valid.any() else 0.0
      records = records.replace(intrinsic_rewards=np.stack(columns, axis=-1) * valid[:, None])
    return records, rewards, metrics

  def step_records(self, records: Any, rewards: np.ndarray, valid: np.ndarray) -> StepRecords:
    """The estimators' view of the records: rewards, ids, interned anchor states, invalid actions, and the
    method's step weights when it declares them."""
    r = self.config.rollout
    group = np.asarray(records.group_id)
    weights = records.extras.get(STEP_WEIGHT_FIELD)
    return StepRecords(
        rewards=jnp.asarray(rewards, jnp.float32), group_ids=jnp.asarray(group), valid=jnp.asarray(valid),
        traj_ids=jnp.asarray(records.traj_id), step_ids=jnp.asarray(records.step_index),
        state_ids=jnp.asarray(intern_keys(np.asarray(records.state_key).tolist(), group.tolist())),
        invalid_action=jnp.asarray(np.asarray(records.format_reward) < 1.0),
        step_weights=None if weights is None else jnp.asarray(weights, jnp.float32),
        # Ids are dense (state ids per group), so the estimators skip sorting; a group holds at most
        # G * max_steps distinct states.
        layout=RecordLayout(num_groups=r.num_tasks, num_trajectories=r.num_tasks * r.group_size,
                            max_steps=self.max_steps, num_states=r.group_size * self.max_steps))

  def advantages(self, records: Any, rewards: np.ndarray) -> tuple[jax.Array, np.ndarray]:
    """(advantage per record, the records that enter the update): groups are kept or dropped on their
    trajectories' outcome returns (DAPO), the estimator sees the full step rewards."""
    valid = np.asarray(records.valid)
    group = np.asarray(records.group_id)
    outcomes = _group_returns(np.asarray(records.task_reward), group, np.asarray(records.traj_id), valid)
    valid = valid & np.isin(group, list(self.method.keep_groups(outcomes)))
    estimator = get_advantage_estimator(self.method.advantage_name)
    options = tuple(sorted(self.method.advantage_options().items()))
    return _jit_estimator(estimator, options)(self.step_records(records, rewards, valid)), valid

  # ---- updates ---------------------------------------------------------------------------------------
  def update_batch(self, records: Any, advantages: jax.Array, valid: np.ndarray, iteration: int) -> dict[str, Any]:
    batch = {"prompt_tokens": jnp.asarray(records.prompt_tokens), "prompt_mask": jnp.asarray(records.prompt_mask),
             "response_tokens": jnp.asarray(records.response_tokens),
             "response_mask": jnp.asarray(records.response_mask), "temperatures": jnp.asarray(records.temperatures),
             "behaviour_logprobs": jnp.asarray(records.behaviour_logprobs), "advantages": advantages,
             "valid": jnp.asarray(valid)}
    if rollout.IMAGES in records.extras:  # a vision-language policy's records: images and mRoPE positions
      fields = rl_step_lib.image_batch_fields(
          self.model.config, np.asarray(records.prompt_tokens), np.asarray(records.prompt_mask),
          np.asarray(records.response_tokens), np.asarray(records.response_mask),
          np.asarray(records.extras[rollout.IMAGES]), np.asarray(records.extras[rollout.IMAGE_COUNT]))
      batch.update({k: jnp.asarray(v) for k, v in fields.items()})
    rng = np.random.default_rng([self.config.seed, iteration, BATCH_REWRITE_STREAM])
    return self.method.update_batch(batch, records, rng)

  def update(self, batch: dict[str, Any], iteration: int) -> dict[str, float]:
    """Minibatch epochs of the policy loss over the batch's valid rows, in a seeded order. In micro-batches
    (rl.micro_batch_size) and by length (rl.micro_batches_by_length, the default) each minibatch goes to the
    step as `length_sorted_parts`: its rows in order of prompt length, each part cut to its longest prompt."""
    c = self.config.rl
    if iteration < int(c.get("first_update", 0)):
      return {"update_delayed": 1.0}
    valid_idx = np.flatnonzero(np.asarray(batch["valid"]))
    if valid_idx.size == 0:
      return {"update_skipped_no_signal": 1.0}
    batch = _trim_prompt_padding(batch, valid_idx)
    prompt_lengths = np.asarray(batch["prompt_mask"]).sum(1)
    if self.reference_logprobs is not None:
      # Through the host: the jitted result is committed to the mesh (replicated), which the step's batch
      # sharding would reject on more than one device; uncommitted, it is placed like the other batch arrays.
      batch = {**batch, "ref_logprobs": jnp.asarray(self._reference(batch))}
    rng = np.random.default_rng([self.config.seed, iteration, MINIBATCH_STREAM])
    M = c.minibatch_size
    # Real tokens per row (prompt + response) and causal (query, key) pairs among them: the work counted by
    # train/throughput.py; every epoch sees each valid row once.
    lengths = (prompt_lengths[valid_idx].astype(np.float64) + np.asarray(batch["response_mask"])[valid_idx].sum(1))
    sums: dict[str, float] = {}
    count, computed = 0, 0
    t0 = time.perf_counter()
    for _ in range(c.epochs):
      order = rng.permutation(valid_idx)
      for start in range(0, len(order), M):
        idx = order[start:start + M]
        idx = np.concatenate([idx, np.full(M - len(idx), idx[0])])
        pad = np.arange(M) >= len(order[start:start + M])
        mb = {k: jnp.take(v, idx, axis=0) for k, v in batch.items()}
        mb["valid"] = mb["valid"] & ~jnp.asarray(pad)
        if self.by_length:
          parts = [part for _, part in length_sorted_parts(mb, prompt_lengths[idx], self.micro_batch_size)]
          computed += sum(_padded_tokens(part) for part in parts)
          self.state, m = self.rl_step(self.state, parts)
        else:
          computed += _padded_tokens(mb)
          self.state, m = self.rl_step(self.state, mb)
        for k, v in jax.device_get(m).items():
          sums[k] = sums.get(k, 0.0) + float(v)
        count += 1
    return {f"update/{k}": v / count for k, v in sums.items()} | {
        "update/minibatches": float(count), "time_policy_update_s": time.perf_counter() - t0,
        "update/tokens": float(c.epochs * lengths.sum()), "update/padded_tokens": float(computed),
        "update/attention_pairs": float(c.epochs * (lengths * (lengths + 1) / 2).sum())}

  def _reference(self, batch: dict[str, Any]) -> np.ndarray:
    """The reference policy's log-probs of every row's response, in passes as the update takes them: all at
    once, or rl.micro_batch_size rows at a time, sorted by prompt length and cut to their widths
    (rl.micro_batches_by_length) or in order (a last short pass filled up with repeats of its first row)."""
    params = self.model_params(self.reference_params)
    micro = self.micro_batch_size
    if self.by_length:
      out = np.zeros(batch["response_tokens"].shape, np.float32)
      for idx, part in length_sorted_parts(batch, np.asarray(batch["prompt_mask"]).sum(1), micro):
        out[idx] = np.asarray(jax.device_get(self.reference_logprobs(params, part)))[:len(idx)]
      return out
    if not micro:
      return np.asarray(jax.device_get(self.reference_logprobs(params, batch)))
    rows = int(batch["valid"].shape[0])
    parts = []
    for start in range(0, rows, micro):
      idx = np.arange(start, start + micro)
      idx[idx >= rows] = start
      part = self.reference_logprobs(params, {k: jnp.take(v, idx, axis=0) for k, v in batch.items()})
      parts.append(np.asarray(jax.device_get(part))[:rows - start])
    return np.concatenate(parts)

  def train_aux(self, phase: str, records: Any) -> dict[str, float]:
    """Trains every aux model whose phase this is on the records."""
    metrics: dict[str, float] = {}
    for model in self.aux.values():
      if model.spec.phase == phase:
        metrics.update(model.train(records))
    return metrics

  def sft(self, request: SFTRequest, progress: Optional[Callable[[int, float], None]] = None) -> dict[str, float]:
    """Runs an SFT request on the policy's parameters; the RL optimizer's state is kept."""
    params, losses = finetune(self.model, self.state.params, request, self.tokenizer, self.prompt_len,
                              self.response_len, progress=progress, lora=self.lora, base=self.base_params)
    self.state = self.state.replace(params=jax.device_put(params, self.shardings.params))
    return {f"{request.label}/loss_first": losses[0], f"{request.label}/loss_last": float(np.mean(losses[-10:])),
            f"{request.label}/steps": float(len(losses)),
            f"{request.label}/demonstrations": float(len(request.demonstrations))}


def finetune(model: Model, params: Any, request: SFTRequest, tokenizer: Any, prompt_len: int, response_len: int,
             *, progress: Optional[Callable[[int, float], None]] = None, lora: Optional[lora_lib.LoraConfig] = None,
             base: Any = None, image_layout: Optional[ImageLayout] = None, checkpoint_dir: Optional[str] = None,
             checkpoint_every: int = 0) -> tuple[Any, list[float]]:
  """`request.steps` next-token steps on its demonstrations from `params` under a fresh AdamW; returns the
  new params and the per-step losses. `progress(step, loss)` is called after each step. With `lora`,
  `params` (and the result) are adapters on the frozen `base`. Demonstrations with images (a
  vision-language policy) are laid out by `image_layout`, by default the model's own.

  With `checkpoint_dir`, the optimizer state and the losses so far are saved there every `checkpoint_every`
  steps, and a call that finds a save there goes on from it: batch i is the i-th draw of the request's seeded
  stream whatever the step it starts from, so a finetune that was killed and called again ends with exactly
  the params of one that never stopped. The directory is left for the caller to remove."""
  if not request.demonstrations:
    raise ValueError(f"SFT request {request.label!r} has no demonstrations")
  demos = list(request.demonstrations)
  if image_layout is None and hasattr(model.config, "vision"):
    image_layout = ImageLayout.from_config(model.config)
  arrays = sft_data.tokenize_demos(tokenizer, demos, prompt_len, response_len, image_layout)
  # Columns that are padding in every row cost compute and change nothing: drop them (in steps of 16).
  first = int(np.argmax(arrays["attention_mask"].any(0))) // 16 * 16
  arrays.update({k: arrays[k][:, first:] for k in ("tokens", "attention_mask", "loss_mask")})
  if "images" in arrays:  # and the multimodal positions of what is left
    arrays.update(sft.image_fields(model.config, arrays["tokens"], arrays["attention_mask"], arrays["images"],
                                   arrays["image_count"]))
  micro_batches = micro_batch_count(request.batch_size, request.micro_batch_size,
                                    (f"SFT request {request.label!r}: micro_batch_size", "its batch_size"))
  opt = state_lib.make_optimizer(request.learning_rate, max_grad_norm=1.0)
  sh = state_lib.state_shardings(model, opt, model.mesh, model.rules, lora)
  st = state_lib.create_train_state(params, opt, sh)
  # Targets are the response's, in the last response_len columns: the prompt is never projected onto the vocabulary.
  step = sft.make_train_step(model, opt, sh, functools.partial(sft.next_token_loss, last=response_len), lora=lora,
                             base=base, micro_batches=micro_batches, totals_fn=sft.next_token_totals)
  rng = np.random.default_rng([request.seed, SFT_STREAM])

  def draw():
    return rng.choice(len(demos), size=request.batch_size, replace=len(demos) < request.batch_size)

  losses: list[float] = []
  saves = None
  if checkpoint_dir is not None:
    saves = checkpoint.Checkpointer(checkpoint_dir, max_to_keep=1, cleanup_tmp=True)
    if saves.latest_step() is not None:
      restored = saves.restore(checkpoint.abstract_like(jax.eval_shape(lambda: st), sh))
      st, losses = restored.state, list(restored.metadata["losses"])
      for _ in range(len(losses)):  # the batches already trained on, drawn again to reach the next one
        draw()
  try:
    for i in range(len(losses), request.steps):
      idx = draw()
      st, m = step(st, {k: v[idx] for k, v in arrays.items()})
      losses.append(float(m["loss"]))
      if progress is not None:
        progress(i + 1, losses[-1])
      if saves is not None and checkpoint_every > 0 and (i + 1) % checkpoint_every == 0 and i + 1 < request.steps:
        saves.save(i + 1, st, metadata={"losses": losses})
  finally:
    if saves is not None:
      saves.close()
  return st.params, losses


def length_sorted_parts(batch: dict[str, Any], prompt_lengths: np.ndarray, rows: int,
                        bucket: int = PROMPT_BUCKET) -> list[tuple[np.ndarray, dict[str, Any]]]:
  """The batch's rows in order of prompt length (`prompt_lengths`, one per row), `rows` at a time: (the rows'
  indices, the part). A last short part is filled up with repeats of its first row. Each part keeps only the
  prompt columns its longest prompt needs (prompts are left-padded), in steps of `bucket`, so the compiled
  widths are few; on variable-length prompts most padded columns are gone, and the rows' computation is the
  same."""
  order = np.argsort(prompt_lengths, kind="stable")
  width = batch["prompt_tokens"].shape[1]
  parts = []
  for start in range(0, len(order), rows):
    idx = order[start:start + rows]
    taken = np.concatenate([idx, np.full(rows - len(idx), idx[0])])
    part = {k: jnp.take(v, taken, axis=0) for k, v in batch.items()}
    keep = min(width, max(1, -(-int(prompt_lengths[idx].max()) // bucket)) * bucket)
    parts.append((idx, _keep_prompt_columns(part, width - keep)))
  return parts


def _padded_tokens(batch: dict[str, Any]) -> int:
  """Tokens a step computes on, padding included: rows x (prompt + response columns)."""
  return int(batch["prompt_tokens"].shape[0] * (batch["prompt_tokens"].shape[1] + batch["response_tokens"].shape[1]))


def _keep_prompt_columns(batch: dict[str, Any], first: int) -> dict[str, Any]:
  """The batch without its first `first` prompt columns (and their multimodal positions)."""
  if first == 0:
    return batch
  trimmed = {**batch, "prompt_tokens": batch["prompt_tokens"][:, first:], "prompt_mask": batch["prompt_mask"][:, first:]}
  if "positions" in batch:  # [B, P + R, 3]: the same columns
    trimmed["positions"] = batch["positions"][:, first:]
  return trimmed


def _trim_prompt_padding(batch: dict[str, Any], rows: np.ndarray, bucket: int = PROMPT_BUCKET) -> dict[str, Any]:
  """Drops the prompt columns that are padding in every row used, in steps of `bucket` columns (so an
  iteration's update compiles for one of a few prompt widths). Prompts are left-padded, so the result is
  the same computation on fewer tokens."""
  used = np.asarray(batch["prompt_mask"])[rows].any(0)
  return _keep_prompt_columns(batch, int(np.argmax(used)) // bucket * bucket if used.any() else 0)


def _group_returns(rewards, group, traj, valid) -> dict[int, np.ndarray]:
  """Each group's per-trajectory sums of `rewards` over valid records."""
  totals: dict[tuple[int, int], float] = {}
  for r, g, t, v in zip(rewards, group, traj, valid):
    if v:
      totals[(int(g), int(t))] = totals.get((int(g), int(t)), 0.0) + float(r)
  out: dict[int, list[float]] = {}
  for (g, _), total in totals.items():
    out.setdefault(g, []).append(total)
  return {g: np.asarray(v) for g, v in out.items()}


@functools.lru_cache(maxsize=None)
def _jit_estimator(estimator, options: tuple):
  return jax.jit(functools.partial(estimator, **dict(options)))
