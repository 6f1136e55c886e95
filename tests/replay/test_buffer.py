"""The replay: exact read-back, ring order, padding never written or sampled, staleness and reuse bounds,
no recompiles for new values, and identical results sharded on a (2, 2, 2) mesh."""

import contextlib

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest

from explore_jax.parallel import DEFAULT_RULES, make_mesh
from explore_jax.replay import (RecordSpec, Replay, from_host, init_state, insert, mark_used, num_eligible,
                                sample, select, state_shardings, take_latest)

SPEC = RecordSpec(prompt_len=5, response_len=3, intrinsic_names=("rnd",), extras={"weight": ((), "float32")})


def batch(ids, versions=None, valid=None, pad_to=None):
  """Host records whose traj_id is `ids[i]` (tokens and rewards derived from it); valid=False rows are padding."""
  versions = [0] * len(ids) if versions is None else versions
  rows = [dict(prompt_tokens=[100 + i, 200 + i][: 1 + i % 2], response_tokens=[i, i + 1, i + 2][: 1 + i % 3],
               behaviour_logprobs=[-0.1 * i] * (1 + i % 3), task_reward=float(i), group_id=i // 2, traj_id=i,
               step_index=i % 3, policy_version=v, done=bool(i % 2), intrinsic=[0.5 * i], weight=2.0 * i,
               state_key=1000 + i)
          for i, v in zip(ids, versions)]
  out = from_host(SPEC, rows, pad_to=pad_to)
  if valid is not None:
    out = out.replace(valid=out.valid & np.asarray(valid))
  return out


def ring(state):
  """traj_id of the valid rows in insertion order (oldest first)."""
  got = take_latest(state, state.capacity, since_version=-2**31)
  return np.asarray(got.records.traj_id)[np.asarray(got.records.valid)].tolist()


def test_insert_reads_back_exact_values():
  state = init_state(SPEC, 8)
  incoming = batch([5, 6, 7, 8], versions=[1, 2, 3, 4], valid=[True, False, True, True])
  old, state = state, insert(state, incoming)
  assert old.use_count.is_deleted()  # donated: updated in place
  assert int(state.size) == 3 and int(state.write_index) == 3 and int(state.total_inserted) == 3
  # The padding row (6) is skipped, not written: valid rows are packed into consecutive slots.
  expected = batch([5, 7, 8], versions=[1, 3, 4])
  for got, want in zip(jax.tree.leaves(jax.tree.map(lambda x: np.asarray(x)[:3], state.records)),
                       jax.tree.leaves(expected)):
    np.testing.assert_array_equal(got, want)
  assert not np.asarray(state.records.valid)[3:].any()
  assert (np.asarray(state.records.prompt_tokens)[3:] == SPEC.pad_id).all()


def test_ring_overwrites_oldest_in_order():
  state = init_state(SPEC, 6)
  state = insert(state, batch([0, 1, 2, 3]))
  assert ring(state) == [0, 1, 2, 3]
  state = insert(state, batch([4, 5, 6, 7], valid=[True, True, True, False]))
  assert ring(state) == [1, 2, 3, 4, 5, 6] and int(state.write_index) == 1 and int(state.size) == 6
  assert np.asarray(state.records.traj_id).tolist() == [6, 1, 2, 3, 4, 5]
  state = insert(state, batch(list(range(10, 18))))  # more valid rows than capacity: the last 6 survive
  assert ring(state) == [12, 13, 14, 15, 16, 17] and int(state.total_inserted) == 15


def test_overwritten_rows_reset_their_use_count():
  state = insert(init_state(SPEC, 4), batch([0, 1, 2, 3]))
  state = mark_used(state, np.array([0, 1, 1, -1]))
  assert np.asarray(state.use_count).tolist() == [1, 2, 0, 0]
  state = insert(state, batch([4]))
  assert np.asarray(state.use_count).tolist() == [0, 2, 0, 0]


def test_invalid_rows_never_sampled():
  state = insert(init_state(SPEC, 16), batch(list(range(8)), valid=[i % 3 != 0 for i in range(8)]))
  for seed in range(20):
    for replace in (False, True):
      out = sample(state, jax.random.key(seed), 8, current_version=0, replace=replace)
      idx, valid = np.asarray(out.indices), np.asarray(out.records.valid)
      assert set(idx[valid]) <= set(range(5)) and (idx[~valid] == -1).all()
      assert set(np.asarray(out.records.traj_id)[valid]) <= {1, 2, 4, 5, 7}
      assert valid.sum() == (8 if replace else 5) and int(out.num_eligible) == 5
  out = sample(init_state(SPEC, 16), jax.random.key(0), 4, current_version=0, replace=True)
  assert not np.asarray(out.records.valid).any() and (np.asarray(out.indices) == -1).all()
  # A batch larger than the capacity: every eligible row once, then padding.
  small = insert(init_state(SPEC, 4), batch([0, 1, 2], valid=[True, False, True]))
  out = sample(small, jax.random.key(1), 6, current_version=0)
  assert sorted(np.asarray(out.indices).tolist()) == [-1, -1, -1, -1, 0, 1]


def test_sample_without_replacement_is_a_uniform_subset():
  state = insert(init_state(SPEC, 8), batch(list(range(6))))
  counts = np.zeros(8)
  for seed in range(300):
    out = sample(state, jax.random.key(seed), 2, current_version=0)
    idx = np.asarray(out.indices)
    assert len(set(idx)) == 2 and np.asarray(out.records.valid).all()
    np.add.at(counts, idx, 1)
  # 600 draws over 6 rows: 100 expected each; the bound is about 4 standard deviations.
  assert counts[6:].sum() == 0 and np.abs(counts[:6] - 100).max() < 40
  # Padding rows carry padding values, not a copy of some row.
  out = sample(state, jax.random.key(0), 8, current_version=0)
  pad = ~np.asarray(out.records.valid)
  assert pad.sum() == 2 and (np.asarray(out.records.traj_id)[pad] == 0).all()
  assert (np.asarray(out.records.segment_ids)[pad] == -1).all() and not np.asarray(out.records.prompt_mask)[pad].any()


SETTINGS = hypothesis.settings(max_examples=15, deadline=None, derandomize=True)


@SETTINGS
@hypothesis.given(seed=st.integers(0, 2**31 - 1), current=st.integers(0, 12), staleness=st.integers(0, 6),
                  replace=st.booleans(), max_reuse=st.sampled_from([None, 1, 2]))
def test_staleness_and_reuse_bounds_respected(seed, current, staleness, replace, max_reuse):
  rng = np.random.default_rng(seed)
  state = init_state(SPEC, 16)
  for k in range(3):  # 24 rows into 16 slots: some overwritten, some padding
    versions = rng.integers(0, 13, size=8)
    state = insert(state, batch(list(range(8 * k, 8 * k + 8)), versions.tolist(), valid=rng.random(8) < 0.8))
  state = mark_used(state, rng.integers(-1, 16, size=12))
  r = state.records
  fresh = np.asarray(r.valid) & (current - np.asarray(r.policy_version) <= staleness)
  if max_reuse is not None:
    fresh &= np.asarray(state.use_count) < max_reuse
  out = sample(state, jax.random.key(seed), 8, current_version=current, max_staleness=staleness,
               max_reuse=max_reuse, replace=replace)
  idx, valid = np.asarray(out.indices), np.asarray(out.records.valid)
  assert int(out.num_eligible) == fresh.sum()
  assert fresh[idx[valid]].all()
  assert (np.asarray(out.records.policy_version)[valid] >= current - staleness).all()
  np.testing.assert_array_equal(np.asarray(out.records.traj_id)[valid], np.asarray(r.traj_id)[idx[valid]])
  if replace:
    assert valid.sum() == (8 if fresh.any() else 0)
  else:
    assert valid.sum() == min(8, fresh.sum()) and len(set(idx[valid])) == valid.sum()


def test_reuse_limit_makes_rows_ineligible():
  replay = Replay(SPEC, 8)
  replay.insert(batch([0, 1, 2, 3], versions=[5, 5, 5, 5]))
  seen = np.zeros(8, int)
  for seed in range(4):  # 4 rows x 2 uses = 8 uses, 2 per draw
    out = replay.sample(jax.random.key(seed), 2, current_version=5, max_reuse=2)
    assert np.asarray(out.records.valid).all()
    np.add.at(seen, np.asarray(out.indices), 1)
  assert seen[:4].tolist() == [2, 2, 2, 2]
  out = replay.sample(jax.random.key(9), 2, current_version=5, max_reuse=2)
  assert not np.asarray(out.records.valid).any() and int(out.num_eligible) == 0
  assert replay.num_eligible(current_version=5, max_reuse=3) == 4
  # Without mark_used nothing is counted.
  before = np.asarray(replay.state.use_count).copy()
  replay.sample(jax.random.key(0), 2, current_version=5, mark_used=False)
  np.testing.assert_array_equal(replay.state.use_count, before)


def test_take_latest_and_select_for_on_policy_use():
  replay = Replay(SPEC, 8)
  replay.insert(batch([0, 1, 2], versions=[0, 0, 0]))
  replay.insert(batch([3, 4, 5, 6], versions=[1, 1, 1, 1], valid=[True, False, True, True]))
  out = replay.take_latest(4, since_version=1, max_reuse=1)
  assert np.asarray(out.records.traj_id)[np.asarray(out.records.valid)].tolist() == [3, 5, 6]
  assert np.asarray(out.indices).tolist() == [3, 4, 5, -1] and int(out.num_eligible) == 3
  assert not np.asarray(replay.take_latest(4, since_version=1, max_reuse=1).records.valid).any()
  # Overflow: the oldest batch_size come back and num_eligible tells how many matched.
  out = replay.select(lambda r: r.group_id >= 0, 2, mark_used=False)
  assert np.asarray(out.records.traj_id).tolist() == [0, 1] and int(out.num_eligible) == 6
  mask = np.zeros(8, bool)
  mask[[1, 5, 7]] = True  # slot 7 was never written: not valid, never selected
  out = select(replay.state, mask, 4)
  assert np.asarray(out.indices).tolist() == [1, 5, -1, -1]
  np.testing.assert_array_equal(out.records.extras["weight"], [2.0, 12.0, 0.0, 0.0])


@contextlib.contextmanager
def count_compiles():
  """Counts XLA backend compilations inside the block."""
  count = [0]

  def listener(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
      count[0] += 1

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield count
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


def test_no_recompilation_for_new_values():
  def functional(v, state):
    state = insert(state, batch([v, v + 10, v + 20, v + 30], versions=[v] * 4, valid=[True, v % 2 == 0] * 2))
    sample(state, jax.random.key(v), 4, current_version=v, max_staleness=v + 1, max_reuse=None if v % 2 else v)
    sample(state, jax.random.key(v), 4, current_version=v, replace=True)
    take_latest(state, 4, since_version=v, max_reuse=v if v % 2 else None)
    select(state, lambda r: r.group_id == v, 4)
    return mark_used(state, np.array([v, -1, 3, 3]))

  def wrapped(v, replay):
    replay.insert(batch([v, v + 10], versions=[v, v]))
    replay.sample(jax.random.key(v), 4, current_version=v, max_staleness=v, max_reuse=v + 1)
    replay.take_latest(2, since_version=v, max_reuse=None if v % 2 else 1)
    replay.select(lambda r: r.traj_id > v, 2)
    replay.mark_used(np.array([v, 1]))
    return replay

  state, replay = functional(0, init_state(SPEC, 16)), wrapped(0, Replay(SPEC, 16))  # compiles once
  with count_compiles() as compiles:
    for v in range(1, 5):
      state, replay = functional(v, state), wrapped(v, replay)
    jax.block_until_ready((state, replay.state))
  assert compiles[0] == 0


def _run_script(replay):
  """A fixed sequence of inserts and draws; returns everything drawn, as numpy."""
  drawn = []
  for k in range(3):
    replay.insert(batch(list(range(8 * k, 8 * k + 8)), versions=[k] * 8, valid=[i % 4 != 3 for i in range(8)]))
    drawn.append(replay.sample(jax.random.key(k), 8, current_version=k, max_staleness=1, max_reuse=2))
    drawn.append(replay.sample(jax.random.key(k), 4, current_version=k, replace=True))
  drawn.append(replay.take_latest(8, since_version=2))
  return jax.tree.map(np.asarray, (drawn, replay.state))


def test_sharded_equals_single_device_and_carries_rule_shardings():
  mesh = make_mesh((2, 2, 2))
  sharded = Replay(SPEC, 16, mesh=mesh, rules=DEFAULT_RULES)
  expected = state_shardings(SPEC, 16, mesh, DEFAULT_RULES)
  jax.tree.map(lambda x, s: np.testing.assert_(x.sharding.is_equivalent_to(s, x.ndim)), sharded.state, expected)
  assert sharded.state.records.prompt_tokens.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), None)

  got = _run_script(sharded)
  want = _run_script(Replay(SPEC, 16))
  jax.tree.map(np.testing.assert_array_equal, got, want)
  # The state keeps its shardings through donated updates; draws come out sharded by the same rules.
  jax.tree.map(lambda x, s: np.testing.assert_(x.sharding.is_equivalent_to(s, x.ndim)), sharded.state, expected)
  out = sharded.sample(jax.random.key(0), 8, current_version=2)
  assert out.records.response_tokens.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), None)
  assert out.records.response_tokens.sharding.mesh.shape == mesh.shape
  # The functional API keeps the layout too (by propagation).
  state = mark_used(insert(init_state(SPEC, 16, expected), batch([1, 2, 3])), np.array([0, 1]))
  jax.tree.map(lambda x, s: np.testing.assert_(x.sharding.is_equivalent_to(s, x.ndim)), state, expected)


def test_insert_rejects_mismatched_batches():
  replay = Replay(SPEC, 8)
  with pytest.raises(ValueError, match="extras"):
    replay.insert(RecordSpec(5, 3, ("rnd",)).empty(2))
  with pytest.raises(ValueError, match="prompt_tokens"):
    replay.insert(RecordSpec(6, 3, ("rnd",), extras={"weight": ((), "float32")}).empty(2))


def test_num_eligible_functional():
  state = insert(init_state(SPEC, 8), batch([0, 1, 2], versions=[0, 3, 4]))
  assert int(num_eligible(state, current_version=4, max_staleness=1)) == 2
  assert int(num_eligible(state, current_version=4)) == 3
