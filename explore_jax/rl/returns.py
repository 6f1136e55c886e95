"""Trajectory quantities over flat, unordered step records.

A batch of agent experience is a set of N step records, each with a trajectory id and a step index,
arriving in any order and padded to a fixed N with a validity mask. Every function here sorts once by
(validity, key...) and works in sorted order, so results do not depend on how records were shuffled,
shapes stay static under jit, and no Python loop runs over trajectories or records.

Ids may be any integers: they are compacted here into dense segment ids in [0, N), so `num_segments=N`
is always a valid static bound for `jax.ops.segment_sum`. Sorting is the expensive part on CPU
(~0.3 s per million records with XLA's comparison sort), so when the producer of the records knows
that trajectory ids are dense in [0, num_trajectories) and step ids in [0, max_steps), the functions
take those static bounds and use scatters onto a [num_trajectories, max_steps] grid instead.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp

Array = jax.Array


def _valid_or_all(valid: Array | None, n: int) -> Array:
  if valid is None:
    return jnp.ones((n,), dtype=bool)
  chex.assert_shape(valid, (n,))
  return valid.astype(bool)


def _changes(sorted_keys: Sequence[Array]) -> Array:
  """True at sorted position i when any key differs from position i - 1 (and at i = 0)."""
  n = sorted_keys[0].shape[0]
  differs = jnp.zeros((max(n - 1, 0),), dtype=bool)
  for key in sorted_keys:
    differs = differs | (key[1:] != key[:-1])
  return jnp.concatenate([jnp.ones((min(n, 1),), dtype=bool), differs])


def _sort_order(keys: Sequence[Array], valid: Array) -> Array:
  """Permutation sorting valid records by keys[0], keys[1], ..., padding records last.

  Padding gets the largest id instead of an extra validity sort key: each key costs a sort pass,
  and the sort dominates these kernels on CPU. (A real id equal to the dtype's maximum could mix
  with padding; ids are counts far below it.)
  """
  masked = [jnp.where(valid, key, jnp.iinfo(key.dtype).max) for key in keys]
  # jnp.lexsort treats its last key as the primary one.
  return jnp.lexsort(tuple(reversed(masked)))


def dense_segment_ids(keys: Sequence[Array], valid: Array | None = None) -> Array:
  """Dense ids in [0, N): records share an id iff their key tuples are equal and both are valid.

  The compaction lets callers key groups by arbitrary integers (hashed observations, composite
  keys such as (task group, state, visitation depth)) and still use `num_segments=N` under jit.
  Invalid (padding) records also receive ids, never shared with a valid record.

  Args:
    keys: integer arrays of shape [N]; the group key of record i is (keys[0][i], keys[1][i], ...).
    valid: optional bool [N] mask of real records.

  Returns:
    int32 [N] segment ids.
  """
  keys = tuple(keys)
  n = keys[0].shape[0]
  for key in keys:
    chex.assert_shape(key, (n,))
  valid = _valid_or_all(valid, n)
  order = _sort_order(keys, valid)
  sorted_keys = [key[order] for key in keys] + [valid[order]]
  ids_sorted = jnp.cumsum(_changes(sorted_keys).astype(jnp.int32)) - 1
  return jnp.zeros((n,), jnp.int32).at[order].set(ids_sorted)


class TrajectoryIndex(NamedTuple):
  """How flat records sit in their trajectories (computed once, reused by several quantities).

  Attributes:
    order: int [N] permutation sorting records by (validity, trajectory, step).
    traj_segment: int32 [N] dense trajectory id of each record, in [0, N).
    is_first: bool [N], True on exactly one valid record per trajectory (its earliest step).
    continues: bool [N] in *sorted* order: True when sorted record i + 1 is the next step of the
      same valid trajectory.
  """

  order: Array
  traj_segment: Array
  is_first: Array
  continues: Array


def trajectory_index(
    traj_ids: Array, step_ids: Array | None = None, valid: Array | None = None
) -> TrajectoryIndex:
  """Sorts records by (trajectory, step) and marks trajectory boundaries.

  Args:
    traj_ids: int [N] trajectory id of each record (any integers).
    step_ids: int [N] step index t within the trajectory; only the order matters, gaps are fine
      (inactive steps are simply absent). None when no quantity needs the step order.
    valid: optional bool [N] mask of real records.

  Returns:
    A TrajectoryIndex.
  """
  chex.assert_rank(traj_ids, 1)
  n = traj_ids.shape[0]
  valid = _valid_or_all(valid, n)
  if step_ids is None:
    step_ids = jnp.zeros_like(traj_ids)
  chex.assert_equal_shape([traj_ids, step_ids])
  order = _sort_order((traj_ids, step_ids), valid)
  traj_sorted = traj_ids[order]
  valid_sorted = valid[order]
  starts = _changes([traj_sorted, valid_sorted])
  segment_sorted = jnp.cumsum(starts.astype(jnp.int32)) - 1
  traj_segment = jnp.zeros((n,), jnp.int32).at[order].set(segment_sorted)
  is_first = jnp.zeros((n,), bool).at[order].set(starts & valid_sorted)
  continues = jnp.concatenate(
      [~starts[1:] & valid_sorted[1:], jnp.zeros((min(n, 1),), dtype=bool)]
  )
  return TrajectoryIndex(order, traj_segment, is_first, continues)


def _trajectory_segments(
    traj_ids: Array, valid: Array, num_trajectories: int | None, index: TrajectoryIndex | None
) -> tuple[Array, int]:
  if num_trajectories is not None:
    return traj_ids, num_trajectories
  if index is None:
    index = trajectory_index(traj_ids, None, valid)
  return index.traj_segment, traj_ids.shape[0]


def episode_returns(
    rewards: Array,
    traj_ids: Array,
    valid: Array | None = None,
    *,
    num_trajectories: int | None = None,
    index: TrajectoryIndex | None = None,
) -> Array:
  """Undiscounted episode return of each record's trajectory, broadcast to its steps.

  R(tau) = sum_t r_t over the trajectory's valid records (GiGPO, Feng et al. 2025, eq. 3's R(tau)).

  Args:
    rewards: float [N] step rewards r_t.
    traj_ids: int [N] trajectory ids.
    valid: optional bool [N] mask; invalid records contribute nothing and get 0.
    num_trajectories: static bound when traj_ids are dense in [0, num_trajectories) (no sort).
    index: a precomputed `trajectory_index(traj_ids, ..., valid)` to skip the sort.

  Returns:
    float [N] R(tau) per record.
  """
  chex.assert_rank(rewards, 1)
  chex.assert_equal_shape([rewards, traj_ids])
  n = rewards.shape[0]
  valid = _valid_or_all(valid, n)
  segments, num_segments = _trajectory_segments(traj_ids, valid, num_trajectories, index)
  r = jnp.where(valid, rewards, 0.0)
  totals = jax.ops.segment_sum(r, segments, num_segments=num_segments)
  return jnp.where(valid, totals[segments], 0.0)


def first_record_mask(
    traj_ids: Array,
    valid: Array | None = None,
    *,
    num_trajectories: int | None = None,
    index: TrajectoryIndex | None = None,
) -> Array:
  """True on exactly one valid record of every trajectory (so each trajectory counts once).

  Args:
    traj_ids: int [N] trajectory ids.
    valid: optional bool [N] mask.
    num_trajectories: static bound when traj_ids are dense in [0, num_trajectories) (no sort).
    index: a precomputed `trajectory_index`.

  Returns:
    bool [N].
  """
  chex.assert_rank(traj_ids, 1)
  n = traj_ids.shape[0]
  valid = _valid_or_all(valid, n)
  if num_trajectories is None:
    return (trajectory_index(traj_ids, None, valid) if index is None else index).is_first
  position = jnp.arange(n, dtype=jnp.int32)
  lowest = jax.ops.segment_min(jnp.where(valid, position, n), traj_ids,
                               num_segments=num_trajectories)
  return valid & (lowest[traj_ids] == position)


def _affine_compose(later, current):
  """Composes R_i = a_i + b_i R_{i+1} with the map of the records after it."""
  a_later, b_later = later
  a_cur, b_cur = current
  return a_cur + b_cur * a_later, b_cur * b_later


def _discounted_returns_on_grid(rewards, traj_ids, step_ids, valid, gamma, num_trajectories,
                                max_steps):
  """Reward-to-go on a [num_trajectories, max_steps] grid; absent cells pass returns through."""
  cells = num_trajectories * max_steps
  if cells >= 2**31:
    raise ValueError(f"num_trajectories * max_steps = {cells} overflows int32 cell ids")
  cell = jnp.where(valid, traj_ids * max_steps + step_ids, cells)
  r = jnp.zeros((cells,), rewards.dtype).at[cell].set(rewards, mode="drop")
  present = jnp.zeros((cells,), bool).at[cell].set(True, mode="drop")
  # An absent step is the identity map (0, 1), so present steps chain exactly as in sorted order.
  # Columns are scanned step by step: max_steps is small, num_trajectories wide.
  a = jnp.where(present, r, 0.0).reshape(num_trajectories, max_steps).T
  b = jnp.where(present, gamma, 1.0).astype(rewards.dtype).reshape(num_trajectories, max_steps).T

  def step_back(later, column):
    a_t, b_t = column
    now = a_t + b_t * later
    return now, now

  _, grid = jax.lax.scan(step_back, jnp.zeros((num_trajectories,), rewards.dtype), (a, b),
                         reverse=True)
  return grid.T.reshape(-1).at[cell].get(mode="fill", fill_value=0.0)


def discounted_returns(
    rewards: Array,
    traj_ids: Array,
    step_ids: Array,
    valid: Array | None = None,
    *,
    gamma: float = 0.95,
    num_trajectories: int | None = None,
    max_steps: int | None = None,
    index: TrajectoryIndex | None = None,
) -> Array:
  """Discounted reward-to-go of every step record, over its trajectory's active steps.

  R_t = sum_{k >= 0} gamma^k r_{t+k}, i.e. R_t = r_t + gamma * R_{t+1} with R after the last
  active step equal to 0 (GiGPO, Feng et al. 2025, eq. 5). The recursion runs as a reverse
  associative scan over records sorted by (trajectory, step), so it is O(N log N) under jit and
  independent of the input order. Steps are chained in step order; missing step indices are skipped.

  Args:
    rewards: float [N] step rewards r_t.
    traj_ids: int [N] trajectory ids.
    step_ids: int [N] step indices.
    valid: optional bool [N] mask; invalid records neither receive nor pass on return.
    gamma: discount factor.
    num_trajectories: with max_steps, static bounds of dense traj_ids in [0, num_trajectories)
      and step_ids in [0, max_steps), unique per trajectory; the scan then runs on a grid with
      no sort.
    max_steps: see num_trajectories.
    index: a precomputed `trajectory_index(traj_ids, step_ids, valid)` for the sorted path.

  Returns:
    float [N] R_t per record (0 for invalid records).
  """
  chex.assert_rank(rewards, 1)
  chex.assert_equal_shape([rewards, traj_ids, step_ids])
  n = rewards.shape[0]
  valid = _valid_or_all(valid, n)
  if num_trajectories is not None and max_steps is not None:
    returns = _discounted_returns_on_grid(jnp.where(valid, rewards, 0.0), traj_ids, step_ids,
                                          valid, gamma, num_trajectories, max_steps)
    return jnp.where(valid, returns, 0.0)
  if index is None:
    index = trajectory_index(traj_ids, step_ids, valid)
  r_sorted = jnp.where(valid, rewards, 0.0)[index.order]
  # Element i is the affine map R_i = a_i + b_i * R_{i+1}; a trajectory's end has b_i = 0.
  decay = jnp.where(index.continues, gamma, 0.0).astype(r_sorted.dtype)
  returns_sorted, _ = jax.lax.associative_scan(_affine_compose, (r_sorted, decay), reverse=True)
  returns = jnp.zeros_like(returns_sorted).at[index.order].set(returns_sorted)
  return jnp.where(valid, returns, 0.0)


def visitation_depth(
    traj_ids: Array, state_ids: Array, step_ids: Array, valid: Array | None = None
) -> Array:
  """How many earlier steps of the same trajectory were in the same state.

  kappa(s_t) = #{k < t : s_k = s_t} (EAPO, eq. 12). Computed by sorting records by
  (trajectory, state, step): within each run of equal (trajectory, state), the depth is the
  record's position in the run.

  Args:
    traj_ids: int [N] trajectory ids.
    state_ids: int [N] state keys (equal keys = identical environment state).
    step_ids: int [N] step indices.
    valid: optional bool [N] mask; invalid records are not counted and get 0.

  Returns:
    int32 [N] visitation depth per record.
  """
  chex.assert_rank(traj_ids, 1)
  chex.assert_equal_shape([traj_ids, state_ids, step_ids])
  n = traj_ids.shape[0]
  valid = _valid_or_all(valid, n)
  order = _sort_order((traj_ids, state_ids, step_ids), valid)
  starts = _changes([traj_ids[order], state_ids[order], valid[order]])
  position = jnp.arange(n, dtype=jnp.int32)
  run_start = jax.lax.cummax(jnp.where(starts, position, 0), axis=0)
  depth = jnp.zeros((n,), jnp.int32).at[order].set(position - run_start)
  return jnp.where(valid, depth, 0)
