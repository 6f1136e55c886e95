"""Benchmark: jitted GRPO / GiGPO advantage kernels against a plain NumPy groupby.

1,000,000 step records in 10,000 task groups, shuffled. GRPO: single-turn records, 100 per group.
GiGPO: 10 trajectories x 10 steps per group, 20 distinct states per group (anchor groups of ~5).
Both implementations compute the same formula; outputs are checked to agree before timing.
"dense ids" is the fast path (RecordLayout bounds, no sort); "sorted ids" compacts arbitrary ids
by sorting. The NumPy references get the same knowledge: bincounts and a [trajectory, step] grid on
dense ids, or lexsort / np.unique for arbitrary ids.
Compile time is measured separately (lower + compile); steady-state times are the median of
several runs, each ending with block_until_ready.

  python benchmarks/advantages.py [--records 1000000] [--groups 10000] [--repeats 7]

The last line is `speedup_vs_numpy_groupby=<x>` for GRPO (NumPy time / jitted time).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from explore_jax.rl import advantages as adv_lib

EPS = 1e-6


def numpy_group_normalise(values, groups, weights, num_groups, singleton):
  """(x - mean_g) / (std_g + eps) per record with bincount group sums (unbiased std)."""
  count = np.bincount(groups, weights=weights, minlength=num_groups)
  mean = np.bincount(groups, weights=weights * values, minlength=num_groups) / np.maximum(count, 1)
  centred = (values - mean[groups]) * weights
  std = np.sqrt(np.bincount(groups, weights=centred**2, minlength=num_groups)
                / np.maximum(count - 1, 1))
  lone = count < 1.5
  if singleton == "keep":
    mean = np.where(lone, 0.0, mean)
  std = np.where(lone, 1.0, std)
  return (values - mean[groups]) / (std[groups] + EPS)


def numpy_grpo(rewards, group_ids, num_groups):
  return numpy_group_normalise(rewards, group_ids, np.ones_like(rewards), num_groups, "keep")


def numpy_gigpo_dense(rewards, group_ids, traj_ids, step_ids, state_ids, num_groups,
                      num_traj, max_steps, num_states, gamma, omega):
  """GiGPO with the same dense-id knowledge as the jitted fast path: bincounts and a step grid."""
  # Episode level: per-trajectory arrays, statistics over trajectories.
  episode = np.bincount(traj_ids, weights=rewards, minlength=num_traj)
  traj_group = np.zeros(num_traj, dtype=np.int64)
  traj_group[traj_ids] = group_ids
  adv_e = numpy_group_normalise(episode, traj_group, np.ones(num_traj), num_groups, "keep")
  # Step returns on a [trajectory, step] grid, walking the steps backwards.
  grid = np.zeros((num_traj, max_steps))
  grid[traj_ids, step_ids] = rewards
  running = np.zeros(num_traj)
  for k in range(max_steps - 1, -1, -1):
    running = grid[:, k] + gamma * running
    grid[:, k] = running
  step_returns = grid[traj_ids, step_ids]
  anchors = group_ids.astype(np.int64) * num_states + state_ids
  adv_s = numpy_group_normalise(step_returns, anchors, np.ones_like(rewards),
                                num_groups * num_states, "zero")
  return adv_e[traj_ids] + omega * adv_s


def numpy_gigpo(rewards, group_ids, traj_ids, step_ids, state_ids, num_groups, gamma, omega):
  """GiGPO for arbitrary ids: lexsort for trajectory order, np.unique for anchor groups."""
  n = rewards.shape[0]
  order = np.lexsort((step_ids, traj_ids))
  traj_sorted = traj_ids[order]
  first = np.ones(n, dtype=bool)
  first[1:] = traj_sorted[1:] != traj_sorted[:-1]
  # Episode level: one sample per trajectory.
  num_traj = int(traj_ids.max()) + 1
  episode = np.bincount(traj_ids, weights=rewards, minlength=num_traj)[traj_ids]
  is_first = np.zeros(n)
  is_first[order[first]] = 1.0
  adv_e = numpy_group_normalise(episode, group_ids, is_first, num_groups, "keep")
  # Step returns: walk positions backwards, vectorised over all trajectories at once.
  start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
  position = np.arange(n) - start
  has_next = np.zeros(n, dtype=bool)
  has_next[:-1] = ~first[1:]
  r_sorted = rewards[order]
  ret_sorted = np.zeros(n)
  for k in range(int(position.max()), -1, -1):
    at = np.flatnonzero(position == k)
    nxt = np.where(has_next[at], ret_sorted[np.minimum(at + 1, n - 1)], 0.0)
    ret_sorted[at] = r_sorted[at] + gamma * nxt
  step_returns = np.empty(n)
  step_returns[order] = ret_sorted
  # Anchor groups: (task group, state) factorised with np.unique, as a groupby would.
  anchors, anchor_ids = np.unique(group_ids.astype(np.int64) * (int(state_ids.max()) + 1)
                                  + state_ids, return_inverse=True)
  adv_s = numpy_group_normalise(step_returns, anchor_ids, np.ones(n), anchors.shape[0], "zero")
  return adv_e + omega * adv_s


def median_seconds(fn, repeats):
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def time_jitted(fn, args, repeats):
  jitted = jax.jit(fn)
  start = time.perf_counter()
  compiled = jitted.lower(*args).compile()
  compile_s = time.perf_counter() - start
  out = compiled(*args).block_until_ready()
  run_s = median_seconds(lambda: compiled(*args).block_until_ready(), repeats)
  return np.asarray(out), compile_s, run_s


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--records", type=int, default=1_000_000)
  parser.add_argument("--groups", type=int, default=10_000)
  parser.add_argument("--repeats", type=int, default=7)
  args = parser.parse_args()
  n, g = args.records, args.groups
  rng = np.random.default_rng(0)
  print(f"backend={jax.default_backend()} devices={jax.device_count()} records={n} groups={g}")

  # ------------------------------------------------------------------ GRPO
  rewards = rng.integers(0, 2, n).astype(np.float32) + rng.normal(0, 0.1, n).astype(np.float32)
  group_ids = rng.permutation(np.repeat(np.arange(g), n // g)).astype(np.int32)
  records = adv_lib.StepRecords(rewards=jnp.asarray(rewards), group_ids=jnp.asarray(group_ids))
  dense = dataclasses.replace(records, layout=adv_lib.RecordLayout(num_groups=g))
  ours, compile_dense, ours_s = time_jitted(adv_lib.grpo_advantages, (dense,), args.repeats)
  ours_sorted, compile_sorted, sorted_s = time_jitted(adv_lib.grpo_advantages, (records,),
                                                     args.repeats)
  rewards64 = rewards.astype(np.float64)
  reference = numpy_grpo(rewards64, group_ids, g)
  np_s = median_seconds(lambda: numpy_grpo(rewards64, group_ids, g), args.repeats)
  for out in (ours, ours_sorted):
    np.testing.assert_allclose(out, reference, rtol=1e-4, atol=1e-4)
  print(f"grpo  jax(dense ids)    run {ours_s * 1e3:8.2f} ms  compile {compile_dense:6.2f} s")
  print(f"grpo  jax(sorted ids)   run {sorted_s * 1e3:8.2f} ms  compile {compile_sorted:6.2f} s")
  print(f"grpo  numpy groupby     run {np_s * 1e3:8.2f} ms   (outputs agree, max |diff| "
        f"{np.max(np.abs(ours - reference)):.1e})")
  grpo_speedup = np_s / ours_s

  # ------------------------------------------------------------------ GiGPO
  trajs_per_group, steps, states = 10, n // g // 10, 20
  num_traj = g * trajs_per_group
  traj_ids = np.repeat(np.arange(num_traj), steps)
  step_ids = np.tile(np.arange(steps), num_traj)
  gig_groups = traj_ids // trajs_per_group
  state_ids = rng.integers(0, states, traj_ids.shape[0])
  success = rng.random(num_traj) < 0.3
  step_rewards = np.where((step_ids == steps - 1) & success[traj_ids], 10.0, 0.0)
  step_rewards += rng.normal(0, 0.1, step_rewards.shape[0])
  perm = rng.permutation(traj_ids.shape[0])
  cols = [c[perm] for c in (step_rewards, gig_groups, traj_ids, step_ids, state_ids)]
  step_rewards, gig_groups, traj_ids, step_ids, state_ids = cols
  gig_records = adv_lib.StepRecords(
      rewards=jnp.asarray(step_rewards, jnp.float32), group_ids=jnp.asarray(gig_groups, jnp.int32),
      traj_ids=jnp.asarray(traj_ids, jnp.int32), step_ids=jnp.asarray(step_ids, jnp.int32),
      state_ids=jnp.asarray(state_ids, jnp.int32))
  gig_dense = dataclasses.replace(gig_records, layout=adv_lib.RecordLayout(
      num_groups=g, num_trajectories=num_traj, max_steps=steps, num_states=states))
  gigpo = functools.partial(adv_lib.gigpo_advantages, gamma=0.95, omega=1.0)
  gig_ours, gig_compile, gig_s = time_jitted(gigpo, (gig_dense,), args.repeats)
  gig_sorted, gig_compile_sorted, gig_sorted_s = time_jitted(gigpo, (gig_records,), args.repeats)
  r64 = step_rewards.astype(np.float32).astype(np.float64)
  dense_args = (r64, gig_groups, traj_ids, step_ids, state_ids, g, num_traj, steps, states,
                0.95, 1.0)
  sorted_args = (r64, gig_groups, traj_ids, step_ids, state_ids, g, 0.95, 1.0)
  gig_reference = numpy_gigpo_dense(*dense_args)
  np.testing.assert_allclose(numpy_gigpo(*sorted_args), gig_reference, rtol=1e-9, atol=1e-9)
  gig_np_s = median_seconds(lambda: numpy_gigpo_dense(*dense_args), args.repeats)
  gig_np_sorted_s = median_seconds(lambda: numpy_gigpo(*sorted_args), args.repeats)
  for out in (gig_ours, gig_sorted):
    np.testing.assert_allclose(out, gig_reference, rtol=1e-3, atol=1e-3)
  print(f"gigpo jax(dense ids)    run {gig_s * 1e3:8.2f} ms  compile {gig_compile:6.2f} s")
  print(f"gigpo jax(sorted ids)   run {gig_sorted_s * 1e3:8.2f} ms  compile "
        f"{gig_compile_sorted:6.2f} s")
  print(f"gigpo numpy(dense ids)  run {gig_np_s * 1e3:8.2f} ms   (outputs agree, max |diff| "
        f"{np.max(np.abs(gig_ours - gig_reference)):.1e})")
  print(f"gigpo numpy(sorted ids) run {gig_np_sorted_s * 1e3:8.2f} ms")
  print(f"gigpo speedup_vs_numpy_groupby={gig_np_s / gig_s:.2f} (dense ids), "
        f"{gig_np_sorted_s / gig_sorted_s:.2f} (sorted ids)")
  print(f"speedup_vs_numpy_groupby={grpo_speedup:.2f}")


if __name__ == "__main__":
  main()
