"""Group-relative advantage estimators over flat step records, chosen by name.

Every estimator maps a `StepRecords` batch (N flat per-step records with integer ids, any order,
padded with a validity mask) to one advantage per record, float [N], zero on padding. Group
statistics are segment reductions with a static number of segments, so estimators jit as a whole
and contain no Python loop over groups or records. Options (bools, floats) are static: jit an
estimator as `jax.jit(functools.partial(estimator, **options))`.

Ids may be arbitrary integers; they are then compacted by sorting. A producer that knows its ids
are dense says so in `StepRecords.layout` (static bounds travelling with the data), and the
kernels replace every sort by scatters: the fast path for large batches.

Usage:
  estimator = get_advantage_estimator("gigpo")
  advantages = jax.jit(functools.partial(estimator, omega=1.0, gamma=0.95))(records)

A multi-turn trajectory's advantage is later broadcast over the response tokens of each of its step
records (see `losses.broadcast_advantages`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Hashable, Iterable, Protocol

import chex
import jax
import jax.numpy as jnp
import numpy as np

from explore_jax.rl import returns as returns_lib

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class RecordLayout:
  """Static bounds of dense ids in a StepRecords batch; None means arbitrary ids (sorted).

  Attributes:
    num_groups: group_ids lie in [0, num_groups).
    num_trajectories: traj_ids lie in [0, num_trajectories).
    max_steps: step_ids lie in [0, max_steps), at most one record per (trajectory, step).
    num_states: state_ids lie in [0, num_states), e.g. interned per task group; with num_groups
      the anchor group of a record is group * num_states + state. Keep num_groups * num_states
      moderate: it is the size of the anchor statistics tables.
  """

  num_groups: int | None = None
  num_trajectories: int | None = None
  max_steps: int | None = None
  num_states: int | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StepRecords:
  """Flat per-step records of a rollout batch (a pytree; fields left as None are absent).

  Attributes:
    rewards: float [N] step reward r_t of each record. For single-turn data (no traj_ids) this
      is the sequence's scalar reward.
    group_ids: int [N] task group g (the G trajectories sampled for one task share it).
    valid: bool [N] mask of real records; padding records are ignored and get advantage 0.
    traj_ids: int [N] trajectory id; None means every record is its own trajectory.
    step_ids: int [N] step index t within the trajectory (orders the discounted returns).
    state_ids: int [N] key of the raw observation at the step (no history), e.g. from
      `intern_keys`; equal keys mean identical states.
    invalid_action: bool [N], True where the step's action failed to parse / was invalid.
    step_weights: float [N] DPEPO diversity weight W_t of the step (`diversity.py`).
    layout: static RecordLayout (not a pytree leaf): dense-id bounds enabling the fast path.
  """

  rewards: Array
  group_ids: Array | None = None
  valid: Array | None = None
  traj_ids: Array | None = None
  step_ids: Array | None = None
  state_ids: Array | None = None
  invalid_action: Array | None = None
  step_weights: Array | None = None
  layout: RecordLayout = dataclasses.field(default=RecordLayout(), metadata=dict(static=True))

  @property
  def num_records(self) -> int:
    return self.rewards.shape[0]

  def valid_mask(self) -> Array:
    if self.valid is None:
      return jnp.ones((self.num_records,), dtype=bool)
    return self.valid.astype(bool)


class AdvantageEstimator(Protocol):

  def __call__(self, records: StepRecords, **options) -> Array:
    ...


_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def register_advantage_estimator(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
  """Decorator registering `fn(records, **options) -> advantages [N]` under `name`."""

  def decorator(fn: AdvantageEstimator) -> AdvantageEstimator:
    if name in _ESTIMATORS:
      raise ValueError(f"advantage estimator {name!r} is already registered")
    _ESTIMATORS[name] = fn
    return fn

  return decorator


def get_advantage_estimator(name: str) -> AdvantageEstimator:
  """The estimator registered under `name` (a config string such as "grpo" or "gigpo")."""
  try:
    return _ESTIMATORS[name]
  except KeyError:
    raise KeyError(
        f"unknown advantage estimator {name!r}; registered: {sorted(_ESTIMATORS)}"
    ) from None


def list_advantage_estimators() -> list[str]:
  return sorted(_ESTIMATORS)


def intern_keys(items: Iterable[Hashable], groups: Iterable[Hashable] | None = None) -> np.ndarray:
  """Host-side: int32 ids, equal exactly for equal items (e.g. raw observation strings).

  Python's `hash` is salted per process and may collide; interning is exact and deterministic.
  With `groups`, ids are dense within each group (0, 1, ... per task group), which keeps
  RecordLayout.num_states = max id + 1 small for the anchor-group fast path.
  """
  items = list(items)
  groups = [None] * len(items) if groups is None else list(groups)
  if len(groups) != len(items):
    raise ValueError(f"{len(items)} items but {len(groups)} groups")
  tables: dict[Hashable, dict[Hashable, int]] = {}
  ids = []
  for group, item in zip(groups, items):
    table = tables.setdefault(group, {})
    ids.append(table.setdefault(item, len(table)))
  return np.asarray(ids, dtype=np.int32)


def _check(records: StepRecords, *required: str) -> None:
  chex.assert_rank(records.rewards, 1)
  n = records.num_records
  for name in ("group_ids", "valid", "traj_ids", "step_ids", "state_ids", "invalid_action",
               "step_weights"):
    value = getattr(records, name)
    if value is not None:
      chex.assert_shape(value, (n,))
  for name in required:
    if getattr(records, name) is None:
      raise ValueError(f"this estimator needs records.{name}")
  for name in ("group_ids", "traj_ids", "step_ids", "state_ids"):
    value = getattr(records, name)
    if value is not None:
      chex.assert_type(value, int)


def _task_groups(records: StepRecords) -> tuple[Array, int]:
  """Segment ids and static segment count for the task groups."""
  if records.layout.num_groups is None:
    return (returns_lib.dense_segment_ids((records.group_ids,), records.valid_mask()),
            records.num_records)
  return records.group_ids, records.layout.num_groups


def _anchor_groups(records: StepRecords, *extra_keys: Array) -> tuple[Array, int]:
  """Segment ids for the records of one task group that share a state (and any extra keys)."""
  layout = records.layout
  if not extra_keys and layout.num_groups is not None and layout.num_states is not None:
    size = layout.num_groups * layout.num_states
    if size >= 2**31:
      raise ValueError(f"num_groups * num_states = {size} overflows int32 anchor ids")
    return records.group_ids * layout.num_states + records.state_ids, size
  keys = (records.group_ids, records.state_ids) + extra_keys
  return returns_lib.dense_segment_ids(keys, records.valid_mask()), records.num_records


def _trajectory_index(records: StepRecords) -> returns_lib.TrajectoryIndex | None:
  """The (trajectory, step) sort shared by several quantities; None on the dense fast path."""
  if records.layout.num_trajectories is not None and records.layout.max_steps is not None:
    return None
  return returns_lib.trajectory_index(records.traj_ids, records.step_ids, records.valid_mask())


def _discounted_returns(records: StepRecords, rewards: Array, gamma: float,
                        index: returns_lib.TrajectoryIndex | None = None) -> Array:
  return returns_lib.discounted_returns(
      rewards, records.traj_ids, records.step_ids, records.valid_mask(), gamma=gamma,
      num_trajectories=records.layout.num_trajectories, max_steps=records.layout.max_steps,
      index=index)


def normalize_in_groups(
    values: Array,
    segment_ids: Array,
    weights: Array,
    num_segments: int,
    *,
    eps: float = 1e-6,
    normalize_std: bool = True,
    singleton: str = "keep",
) -> Array:
  """Group-relative score of each record: (x - mean_g) / (std_g + eps), or x - mean_g.

  Statistics use only records with nonzero weight (0/1 indicators: one representative per
  sample); std is the unbiased sample std, as verl's torch.std. A group with a single sample
  follows `singleton`: "keep" uses mean 0 and std 1 (verl's GRPO rule, the sample keeps its raw
  value), "zero" gives 0 (the sample's own mean, as GiGPO's step groups).

  Args:
    values: float [N] per-record values x.
    segment_ids: int [N] group of each record, in [0, num_segments).
    weights: 0/1 [N] which records are samples for the statistics.
    num_segments: static number of segments.
    eps: added to the std.
    normalize_std: divide by std + eps (False = Dr.GRPO, Liu et al. 2025, mean-centering only).
    singleton: "keep" or "zero".

  Returns:
    float [N] normalised values (also computed for records with weight 0, from their group's
    statistics).
  """
  if singleton not in ("keep", "zero"):
    raise ValueError(f"singleton must be 'keep' or 'zero', got {singleton!r}")
  chex.assert_rank(values, 1)
  chex.assert_equal_shape([values, segment_ids, weights])
  sample = weights > 0
  count = jax.ops.segment_sum(sample.astype(values.dtype), segment_ids, num_segments=num_segments)
  # Statistics are taken relative to one member of the group (its max): a group of equal values
  # then has exactly zero deviations, so it scores exactly 0 instead of rounding noise / eps, and
  # large reward offsets cost no precision.
  ref = jax.ops.segment_max(jnp.where(sample, values, -jnp.inf), segment_ids,
                            num_segments=num_segments)
  ref = jnp.where(jnp.isfinite(ref), ref, 0.0)
  offset = jnp.where(sample, values - ref[segment_ids], 0.0)
  mean_offset = (jax.ops.segment_sum(offset, segment_ids, num_segments=num_segments)
                 / jnp.maximum(count, 1.0))
  centred = jnp.where(sample, offset - mean_offset[segment_ids], 0.0)
  sq = jax.ops.segment_sum(centred * centred, segment_ids, num_segments=num_segments)
  std = jnp.sqrt(sq / jnp.maximum(count - 1.0, 1.0))
  singleton_group = count < 1.5
  std = jnp.where(singleton_group, 1.0, std)
  out = (values - ref[segment_ids]) - mean_offset[segment_ids]
  if singleton == "keep":
    # verl's rule: mean 0 for a lone sample, so it keeps its raw value.
    out = jnp.where(singleton_group[segment_ids], values, out)
  if normalize_std:
    out = out / (std[segment_ids] + eps)
  return out


def _sample_values(records: StepRecords, per_step_statistics: bool,
                   rewards: Array | None = None,
                   index: returns_lib.TrajectoryIndex | None = None) -> tuple[Array, Array]:
  """Per-record sample value R and 0/1 sample weights for outcome-level group statistics.

  With trajectories, R is the episode return sum_t r_t broadcast to the trajectory's steps, and
  each trajectory is one sample (its first record carries weight 1) unless per_step_statistics,
  where every step record is a sample (verl-agent's compute_mean_std_cross_steps=True).
  """
  valid = records.valid_mask()
  rewards = records.rewards if rewards is None else rewards
  if records.traj_ids is None:
    return jnp.where(valid, rewards, 0.0), valid
  num_trajectories = records.layout.num_trajectories
  if num_trajectories is None and index is None:
    index = returns_lib.trajectory_index(records.traj_ids, None, valid)
  value = returns_lib.episode_returns(rewards, records.traj_ids, valid,
                                      num_trajectories=num_trajectories, index=index)
  if per_step_statistics:
    return value, valid
  return value, returns_lib.first_record_mask(records.traj_ids, valid,
                                              num_trajectories=num_trajectories, index=index)


def _penalised_rewards(records: StepRecords, invalid_action_penalty: float) -> Array:
  if invalid_action_penalty == 0.0 or records.invalid_action is None:
    return records.rewards
  return records.rewards - invalid_action_penalty * records.invalid_action.astype(
      records.rewards.dtype)


@register_advantage_estimator("grpo")
def grpo_advantages(
    records: StepRecords,
    *,
    eps: float = 1e-6,
    normalize_std: bool = True,
    per_step_statistics: bool = False,
) -> Array:
  """GRPO group-relative outcome advantage, broadcast to every step of a trajectory.

  A_i = (R_i - mean_{j in g} R_j) / (std_{j in g} R_j + eps)  (DeepSeekMath, Shao et al. 2024,
  section 4.1.2, outcome supervision; the advantage of GRPO's objective, eq. 3), with verl's
  unbiased std, eps = 1e-6, and its singleton rule (a group with one sample uses mean 0, std 1). normalize_std=False is Dr.GRPO
  (Liu et al. 2025): A_i = R_i - mean. R_i is the record's reward when records.traj_ids is None,
  otherwise its trajectory's return sum_t r_t, and each trajectory counts once in the statistics.

  Args:
    records: StepRecords with rewards and group_ids (traj_ids optional).
    eps: added to the std.
    normalize_std: divide by the group std (GRPO) or not (Dr.GRPO).
    per_step_statistics: count every step record as a sample (verl-agent's cross-step
      statistics) instead of every trajectory (the papers).

  Returns:
    float [N] advantages, 0 on invalid records.
  """
  _check(records, "group_ids")
  segments, num_segments = _task_groups(records)
  values, weights = _sample_values(records, per_step_statistics)
  adv = normalize_in_groups(values, segments, weights, num_segments, eps=eps,
                            normalize_std=normalize_std, singleton="keep")
  return jnp.where(records.valid_mask(), adv, 0.0)


@register_advantage_estimator("rloo")
def rloo_advantages(
    records: StepRecords,
    *,
    per_step_statistics: bool = False,
) -> Array:
  """REINFORCE leave-one-out advantage: the sample's return minus the mean of the others'.

  A_i = R_i - 1/(n-1) sum_{j in g, j != i} R_j = n/(n-1) (R_i - mean_g R)  (Kool et al. 2019,
  "Buy 4 REINFORCE samples, get a baseline for free!"; RLOO in Ahmadian et al. 2024, section 3).
  A group with one sample has no baseline and keeps A = R (as verl).

  Args:
    records: StepRecords with rewards and group_ids (traj_ids optional, as in `grpo`).
    per_step_statistics: count step records rather than trajectories as samples.

  Returns:
    float [N] advantages, 0 on invalid records.
  """
  _check(records, "group_ids")
  segments, num_segments = _task_groups(records)
  values, weights = _sample_values(records, per_step_statistics)
  w = weights.astype(values.dtype)
  count = jax.ops.segment_sum(w, segments, num_segments=num_segments)[segments]
  total = jax.ops.segment_sum(w * values, segments, num_segments=num_segments)[segments]
  baseline = (total - values) / jnp.maximum(count - 1.0, 1.0)
  adv = jnp.where(count > 1.5, values - baseline, values)
  return jnp.where(records.valid_mask(), adv, 0.0)


@register_advantage_estimator("reinforce")
def reinforce_advantages(
    records: StepRecords,
    *,
    baseline: bool = False,
    gamma: float | None = None,
) -> Array:
  """Plain REINFORCE advantage: the return itself, optionally minus the batch-mean baseline.

  A_i = R_i - b, b = 0 or b = mean over all valid samples of R (Williams 1992, REINFORCE with
  a constant reinforcement baseline). R_i is the trajectory return sum_t r_t, or with `gamma`
  the discounted reward-to-go R_t = sum_k gamma^k r_{t+k} of the step (then every step record is a sample).

  Args:
    records: StepRecords with rewards (traj_ids and, with gamma, step_ids for multi-turn data).
    baseline: subtract the global mean.
    gamma: discount for per-step reward-to-go; None uses the undiscounted episode return.

  Returns:
    float [N] advantages, 0 on invalid records.
  """
  _check(records)
  valid = records.valid_mask()
  if gamma is not None and records.traj_ids is not None:
    if records.step_ids is None:
      raise ValueError("reinforce with gamma needs records.step_ids")
    values = _discounted_returns(records, records.rewards, gamma)
    weights = valid
  else:
    values, weights = _sample_values(records, per_step_statistics=False)
  if baseline:
    w = weights.astype(values.dtype)
    values = values - jnp.sum(w * values) / jnp.maximum(jnp.sum(w), 1.0)
  return jnp.where(valid, values, 0.0)


@register_advantage_estimator("gigpo")
def gigpo_advantages(
    records: StepRecords,
    *,
    omega: float = 1.0,
    gamma: float = 0.95,
    eps: float = 1e-6,
    normalize_std: bool = True,
    per_step_statistics: bool = False,
    invalid_action_penalty: float = 0.0,
) -> Array:
  """GiGPO: episode-level group advantage plus omega times the anchor-state step advantage.

  A = A^E(tau) + omega * A^S(a_t)  (Group-in-Group Policy Optimization, Feng et al. 2025, eq. 8),
  with
    A^E(tau_i) = (R(tau_i) - mean_g R) / (std_g R + eps), R(tau) = sum_t r_t      (eq. 3),
    R_t = sum_k gamma^k r_{t+k} over the trajectory's active steps               (eq. 5),
    anchor groups: records of one task group with an identical raw state key     (eq. 6),
    A^S(a_t) = (R_t - mean_s R) / (std_s R + eps) over the anchor group          (eq. 7),
  where a singleton anchor group gives A^S = 0 and the episode level follows GRPO's singleton
  rule. normalize_std=False uses F_norm = 1 at both levels (the paper's mean-norm variant).

  Args:
    records: StepRecords with rewards, group_ids, traj_ids, step_ids and state_ids
      (invalid_action for the penalty).
    omega: weight of the step advantage.
    gamma: discount of the step returns.
    eps: added to the stds.
    normalize_std: std normalisation at both levels.
    per_step_statistics: episode statistics over step records instead of trajectories
      (verl-agent's compute_mean_std_cross_steps=True; the paper uses trajectories).
    invalid_action_penalty: subtracted from the step reward r_t of every record whose
      invalid_action is True, before both R(tau) and R_t are formed (verl-agent uses 0.1; it
      subtracts it from the record's episode-level score only).

  Returns:
    float [N] advantages, 0 on invalid records.
  """
  _check(records, "group_ids", "traj_ids", "step_ids", "state_ids")
  valid = records.valid_mask()
  rewards = _penalised_rewards(records, invalid_action_penalty)

  index = _trajectory_index(records)
  segments, num_segments = _task_groups(records)
  episode, episode_weights = _sample_values(records, per_step_statistics, rewards, index)
  adv_episode = normalize_in_groups(episode, segments, episode_weights, num_segments, eps=eps,
                                    normalize_std=normalize_std, singleton="keep")

  step_returns = _discounted_returns(records, rewards, gamma, index)
  anchors, num_anchors = _anchor_groups(records)
  adv_step = normalize_in_groups(step_returns, anchors, valid, num_anchors, eps=eps,
                                 normalize_std=normalize_std, singleton="zero")
  return jnp.where(valid, adv_episode + omega * adv_step, 0.0)


@register_advantage_estimator("eapo")
def eapo_advantages(
    records: StepRecords,
    *,
    gamma: float = 0.9,
    eps: float = 1e-6,
    normalize_std: bool = True,
    groups: str = "state_depth",
) -> Array:
  """EAPO exploration-aware grouping: normalise step returns within (state, visitation depth).

  kappa(s_t) = #{k < t : s_k = s_t}                                                   (eq. 12),
  G(s, nu) = {transitions of the task group with s_t = s and kappa(s_t) = nu}         (eq. 13),
  A_t = (R_t - mean_{G(s_t, kappa(s_t))} R) / (std_{G} R + eps)                        (eq. 14),
  (Exploration-Aware Policy Optimization), with R_t the discounted reward-to-go of the step
  (eq. 4's reward-to-go; gamma = 0.9 from the paper's table 3) over the step rewards, which for
  EAPO are eq. 10's R_task + alpha1 R_format + alpha2 R_explore. eps (absent from eq. 14) keeps
  all-equal groups finite; a singleton group gives 0. The visitation depth needs records sorted
  by (trajectory, state, step), so EAPO sorts even with a dense layout.

  Args:
    records: StepRecords with rewards, group_ids, traj_ids, step_ids and state_ids.
    gamma: discount of the reward-to-go.
    eps: added to the std.
    normalize_std: divide by the group std.
    groups: "state_depth" (eqs. 12-14) or "task": the whole task group, plain group-relative normalisation
      of the same step returns (the paper's ablation of its grouping).

  Returns:
    float [N] advantages, 0 on invalid records.
  """
  if groups not in ("state_depth", "task"):
    raise ValueError(f"eapo groups must be 'state_depth' or 'task', got {groups!r}")
  _check(records, "group_ids", "traj_ids", "step_ids", "state_ids")
  valid = records.valid_mask()
  step_returns = _discounted_returns(records, records.rewards, gamma)
  if groups == "task":
    segments, num_segments = _task_groups(records)
    adv = normalize_in_groups(step_returns, segments, valid, num_segments, eps=eps,
                              normalize_std=normalize_std, singleton="zero")
    return jnp.where(valid, adv, 0.0)
  depth = returns_lib.visitation_depth(records.traj_ids, records.state_ids, records.step_ids,
                                       valid)
  groups, num_segments = _anchor_groups(records, depth)
  adv = normalize_in_groups(step_returns, groups, valid, num_segments, eps=eps,
                            normalize_std=normalize_std, singleton="zero")
  return jnp.where(valid, adv, 0.0)


def diversity_weighted_advantages(advantages: Array, step_weights: Array) -> Array:
  """DPEPO's step advantage from the trajectory advantage and the step's diversity weight.

  A_t = A * W_t if A >= 0 else A * (2 - W_t)  (DPEPO, eq. 8-9 as released in the authors' code):
  with W_t in (0, 1], redundant steps get less credit on success and more blame on failure.
  """
  chex.assert_equal_shape([advantages, step_weights])
  return jnp.where(advantages >= 0, advantages * step_weights, advantages * (2.0 - step_weights))


@register_advantage_estimator("dpepo")
def dpepo_advantages(
    records: StepRecords,
    *,
    eps: float = 1e-6,
    normalize_std: bool = True,
    per_step_statistics: bool = False,
) -> Array:
  """DPEPO: GRPO trajectory advantage scaled per step by the diversity weight W_t.

  A_traj = (R - mean_g R) / (std_g R + eps)                                  (DPEPO, eq. 7),
  A_t = A_traj * W_t if A_traj >= 0 else A_traj * (2 - W_t)                   (eq. 8-9),
  with W_t from `diversity.dpepo_step_weight` (records.step_weights). The paper normalises over
  the group's trajectories; the released code over its step records (per_step_statistics=True).

  Args:
    records: StepRecords with rewards, group_ids and step_weights (traj_ids for multi-turn).
    eps: added to the std (1e-6 in the code).
    normalize_std: divide by the group std.
    per_step_statistics: the released code's cross-step statistics.

  Returns:
    float [N] advantages, 0 on invalid records.
  """
  _check(records, "group_ids", "step_weights")
  adv = grpo_advantages(records, eps=eps, normalize_std=normalize_std,
                        per_step_statistics=per_step_statistics)
  return jnp.where(records.valid_mask(),
                   diversity_weighted_advantages(adv, records.step_weights), 0.0)


@register_advantage_estimator("screen_explorer")
def screen_explorer_advantages(
    records: StepRecords,
    *,
    eps: float = 1e-6,
    normalize_std: bool = True,
) -> Array:
  """ScreenExplorer: GRPO with one group made of every valid step record of the rollout buffer.

  A_t = (r_t - mean_B r) / (std_B r + eps) over all steps of all parallel environments of the
  episode (ScreenExplorer, section 3.4: A_i = (r_i - mean_B r) / std_B r; eps added here;
  group ids are ignored).

  Args:
    records: StepRecords with rewards (the per-step rewards).
    eps: added to the std.
    normalize_std: divide by the buffer std.

  Returns:
    float [N] advantages, 0 on invalid records.
  """
  _check(records)
  valid = records.valid_mask()
  segments = jnp.zeros((records.num_records,), jnp.int32)
  adv = normalize_in_groups(jnp.where(valid, records.rewards, 0.0), segments, valid, 1, eps=eps,
                            normalize_std=normalize_std, singleton="keep")
  return jnp.where(valid, adv, 0.0)
