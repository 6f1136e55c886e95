"""The device-resident replay: a fixed-capacity ring of Records on the mesh, and pure jitted functions on it.

State: `ReplayState` holds C record rows sharded like any record batch (record axis "batch" -> data/fsdp
through the rules), a per-row use count, the ring's write index, its size and an insert counter. Every
function has fixed output shapes, so new values (versions, keys, limits) never recompile; new batch sizes do.

Decisions:
* insert: padding rows (valid False) of an incoming batch are skipped, not written: the valid rows are
  packed into consecutive ring slots, so padding never costs capacity and the ring order is the insertion
  order. When the ring is full the oldest rows are overwritten. A batch with more valid rows than the
  capacity keeps its last C. The state is donated: do not reuse the state passed in.
* Eligibility (what sample may return): a valid row with current_version - policy_version <= max_staleness
  (the staleness bound, as Marin's max_rollout_step_delay) and use_count < max_reuse (the reuse limit, as
  Marin's max_samples). None means unbounded.
* sample draws without replacement (uniform random subset, random order). With fewer eligible rows E
  than batch_size it returns all E and fills the rest with padding rows: valid False, padding values,
  index -1. With replace=True it draws i.i.d. uniformly among the eligible rows, so every row is valid
  whenever E > 0 (the reuse limit is then checked per call, not per draw).
* select / take_latest return matching rows in insertion order (oldest first), padded the same way; when
  more rows match than fit, the oldest batch_size come back and `num_eligible` says how many matched.
* Sampling does not count uses by itself (the functions stay read-only and the state is not donated):
  call `mark_used(state, indices)` for the rows the learner consumed. `Replay` does both in one call.
* The functional API keeps a sharded state's layout by XLA's propagation (elementwise updates and scatters
  on the record axis); `Replay` pins every output to the rules' shardings explicitly.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Union

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from explore_jax.parallel import sharding
from explore_jax.parallel.sharding import DEFAULT_RULES
from explore_jax.replay.record import RECORD_AXIS, RecordSpec, Records, take

Array = jax.Array
_UNBOUNDED = np.iinfo(np.int32).max


@flax.struct.dataclass
class ReplayState:
  """C record slots on the device, with the ring's bookkeeping; spec is static (part of the treedef)."""
  records: Records         # [C, ...]; rows never written are invalid padding rows
  use_count: Array         # [C] int32, times the row was handed out (mark_used); 0 when (re)written
  write_index: Array       # [] int32, slot of the next inserted row (the oldest row once the ring is full)
  size: Array              # [] int32, number of written slots, <= C
  total_inserted: Array    # [] int32, rows inserted since creation (wraps past 2**31)
  spec: RecordSpec = flax.struct.field(pytree_node=False)

  @property
  def capacity(self) -> int:
    return self.records.num_records


class ReplayBatch(NamedTuple):
  """Rows drawn from the replay: padding rows have records.valid False and index -1."""
  records: Records      # [B, ...]
  indices: Array        # [B] int32 slot of each row, -1 on padding
  num_eligible: Array   # [] int32, rows that were eligible (may exceed B for select / take_latest)


def state_logical_axes(spec: RecordSpec) -> ReplayState:
  """Logical axis names of every ReplayState leaf: rows over "batch", scalars replicated."""
  return ReplayState(records=spec.logical_axes(), use_count=(RECORD_AXIS,), write_index=(), size=(),
                     total_inserted=(), spec=spec)


def state_shapes(spec: RecordSpec, capacity: int) -> ReplayState:
  """jax.ShapeDtypeStruct of every ReplayState leaf."""
  scalar = jax.ShapeDtypeStruct((), jnp.int32)
  return ReplayState(records=spec.shapes(capacity), use_count=jax.ShapeDtypeStruct((capacity,), jnp.int32),
                     write_index=scalar, size=scalar, total_inserted=scalar, spec=spec)


def state_shardings(spec: RecordSpec, capacity: int, mesh: Mesh, rules: sharding.Rules = DEFAULT_RULES
                    ) -> ReplayState:
  """NamedShardings of a replay of `capacity` rows (an axis the mesh does not divide is replicated)."""
  return sharding.tree_shardings(mesh, state_logical_axes(spec), rules, state_shapes(spec, capacity))


def batch_shardings(spec: RecordSpec, batch_size: int, mesh: Mesh, rules: sharding.Rules = DEFAULT_RULES
                    ) -> ReplayBatch:
  """NamedShardings of a ReplayBatch of batch_size rows."""
  records = sharding.tree_shardings(mesh, spec.logical_axes(), rules, spec.shapes(batch_size))
  return ReplayBatch(records=records, indices=sharding.named_sharding(mesh, (RECORD_AXIS,), rules, (batch_size,)),
                     num_eligible=NamedSharding(mesh, P()))


def init_state(spec: RecordSpec, capacity: int, shardings: Optional[ReplayState] = None) -> ReplayState:
  """An empty replay of `capacity` invalid rows, created directly in `shardings` when given."""
  if capacity < 1:
    raise ValueError(f"replay capacity must be positive, got {capacity}")

  def init():
    zero = jnp.zeros((), jnp.int32)
    fills = spec.fill_values()
    records = jax.tree.map(lambda s, f: jnp.full(s.shape, f, s.dtype), spec.shapes(capacity), fills)
    return ReplayState(records=records, use_count=jnp.zeros((capacity,), jnp.int32), write_index=zero,
                       size=zero, total_inserted=zero, spec=spec)

  return jax.jit(init, out_shardings=shardings)()


# ---- the pure functions (traced once per shape; the jitted forms are below) --------------------------

def _insert(state: ReplayState, batch: Records) -> ReplayState:
  state.spec.check(batch)
  C = state.capacity
  valid = batch.valid.astype(bool)
  n_valid = jnp.sum(valid, dtype=jnp.int32)
  position = jnp.cumsum(valid, dtype=jnp.int32) - 1  # rank of each valid row among the valid rows
  # Only the last C valid rows can survive; dropping the others keeps the scatter indices unique.
  kept = valid & (position >= n_valid - C)
  slot = jnp.where(kept, (state.write_index + position) % C, C)  # C is out of bounds: dropped
  records = jax.tree.map(lambda buf, x: buf.at[slot].set(x.astype(buf.dtype), mode="drop"),
                         state.records, batch)
  return state.replace(
      records=records,
      use_count=state.use_count.at[slot].set(0, mode="drop"),
      write_index=(state.write_index + n_valid) % C,
      size=jnp.minimum(state.size + n_valid, C),
      total_inserted=state.total_inserted + n_valid)


def _eligible(state: ReplayState, current_version: Array, max_staleness: Array, max_reuse: Array) -> Array:
  r = state.records
  # The age, not version - bound, is compared: an unbounded max_staleness (int32 max) must not overflow.
  fresh = current_version - r.policy_version <= max_staleness
  return r.valid & fresh & (state.use_count < max_reuse)


def _gather(state: ReplayState, indices: Array, num_eligible: Array) -> ReplayBatch:
  """Rows at `indices` (-1 = padding row), padding rows blanked to the spec's padding values."""
  real = indices >= 0
  rows = take(state.records, jnp.maximum(indices, 0))

  def blank(x, fill):
    keep = real.reshape(real.shape + (1,) * (x.ndim - 1))
    return jnp.where(keep, x, jnp.asarray(fill, x.dtype))

  rows = jax.tree.map(blank, rows, state.spec.fill_values())
  rows = rows.replace(valid=rows.valid & real)
  return ReplayBatch(records=rows, indices=indices.astype(jnp.int32), num_eligible=num_eligible)


def _pad_indices(indices: Array, batch_size: int) -> Array:
  missing = batch_size - indices.shape[0]
  return indices if missing <= 0 else jnp.concatenate([indices, jnp.full((missing,), -1, indices.dtype)])


def _sample(state: ReplayState, rng: Array, current_version: Array, max_staleness: Array, max_reuse: Array,
            *, batch_size: int, replace: bool) -> ReplayBatch:
  eligible = _eligible(state, current_version, max_staleness, max_reuse)
  n = jnp.sum(eligible, dtype=jnp.int32)
  if replace:
    # Draw u uniform in [0, n) and pick the u-th eligible row: the first slot whose running count exceeds u.
    u = jax.random.randint(rng, (batch_size,), 0, jnp.maximum(n, 1), dtype=jnp.int32)
    slot = jnp.searchsorted(jnp.cumsum(eligible, dtype=jnp.int32), u + 1, side="left").astype(jnp.int32)
    indices = jnp.where(n > 0, slot, -1)
  else:
    # The top batch_size of i.i.d. random scores is a uniform random subset; ineligible rows score -1.
    # 31-bit integer scores make ties (which would favour low slots) vanishingly rare, unlike float uniforms.
    bits = jax.random.bits(rng, (state.capacity,), jnp.uint32) >> 1
    score = jnp.where(eligible, bits.astype(jnp.int32), -1)
    top, slot = jax.lax.top_k(score, min(batch_size, state.capacity))
    indices = _pad_indices(jnp.where(top >= 0, slot, -1).astype(jnp.int32), batch_size)
  return _gather(state, indices, n)


def _select(state: ReplayState, mask: Array, *, batch_size: int) -> ReplayBatch:
  C = state.capacity
  # Rows were written to consecutive slots, so walking the ring from write_index visits them oldest first
  # (slots not yet written are invalid and skipped).
  order = (state.write_index + jnp.arange(C, dtype=jnp.int32)) % C
  matched = (mask & state.records.valid)[order]
  rank = jnp.cumsum(matched, dtype=jnp.int32) - 1
  dest = jnp.where(matched & (rank < batch_size), rank, batch_size)
  indices = jnp.full((batch_size,), -1, jnp.int32).at[dest].set(order, mode="drop")
  return _gather(state, indices, jnp.sum(matched, dtype=jnp.int32))


def _take_latest(state: ReplayState, since_version: Array, max_reuse: Array, *, batch_size: int) -> ReplayBatch:
  mask = (state.records.policy_version >= since_version) & (state.use_count < max_reuse)
  return _select(state, mask, batch_size=batch_size)


def _mark_used(state: ReplayState, indices: Array) -> ReplayState:
  slot = jnp.where(indices >= 0, indices, state.capacity)
  return state.replace(use_count=state.use_count.at[slot].add(1, mode="drop"))


def _and_mark(fn: Callable[..., ReplayBatch]) -> Callable[..., tuple[ReplayBatch, ReplayState]]:
  def run(state, *args, **kwargs):
    out = fn(state, *args, **kwargs)
    return out, _mark_used(state, out.indices)
  return run


_insert_jit = jax.jit(_insert, donate_argnums=0)
_sample_jit = jax.jit(_sample, static_argnames=("batch_size", "replace"))
_select_jit = jax.jit(_select, static_argnames=("batch_size",))
_take_latest_jit = jax.jit(_take_latest, static_argnames=("batch_size",))
_mark_used_jit = jax.jit(_mark_used, donate_argnums=0)
_eligible_count_jit = jax.jit(lambda *a: jnp.sum(_eligible(*a), dtype=jnp.int32))


def _i32(x: Any, unbounded_if_none: bool = False) -> Array:
  """A non-weak int32 scalar, so python ints and arrays share one compiled function."""
  if x is None:
    if not unbounded_if_none:
      raise ValueError("a version is required")
    x = _UNBOUNDED
  return jnp.asarray(x, jnp.int32)


# ---- the public functional API -------------------------------------------------------------------------

def insert(state: ReplayState, batch: Records) -> ReplayState:
  """The state with batch's valid rows written at the ring's head (oldest overwritten); donates `state`."""
  return _insert_jit(state, batch)


def num_eligible(state: ReplayState, *, current_version: Any, max_staleness: Optional[Any] = None,
                 max_reuse: Optional[Any] = None) -> Array:
  """How many rows `sample` may currently return."""
  return _eligible_count_jit(state, _i32(current_version), _i32(max_staleness, True), _i32(max_reuse, True))


def sample(state: ReplayState, rng: Array, batch_size: int, *, current_version: Any,
           max_staleness: Optional[Any] = None, max_reuse: Optional[Any] = None, replace: bool = False
           ) -> ReplayBatch:
  """batch_size rows drawn uniformly among the eligible ones (module docstring: eligibility, padding)."""
  return _sample_jit(state, rng, _i32(current_version), _i32(max_staleness, True), _i32(max_reuse, True),
                     batch_size=batch_size, replace=replace)


def select(state: ReplayState, predicate: Union[Array, Callable[[Records], Array]], batch_size: int
           ) -> ReplayBatch:
  """Valid rows where predicate holds, oldest first; predicate is a bool [C] mask or a Records -> mask."""
  mask = predicate(state.records) if callable(predicate) else predicate
  return _select_jit(state, jnp.asarray(mask, bool), batch_size=batch_size)


def take_latest(state: ReplayState, batch_size: int, *, since_version: Any, max_reuse: Optional[Any] = None
                ) -> ReplayBatch:
  """Everything inserted with policy_version >= since_version (and under the reuse limit), oldest first."""
  return _take_latest_jit(state, _i32(since_version), _i32(max_reuse, True), batch_size=batch_size)


def mark_used(state: ReplayState, indices: Array) -> ReplayState:
  """use_count + 1 at each index (>= 0; repeated indices count repeatedly); donates `state`."""
  return _mark_used_jit(state, jnp.asarray(indices, jnp.int32))


# ---- the learner's handle -------------------------------------------------------------------------------

class Replay:
  """A replay state on a mesh with its jitted, sharding-pinned functions; methods replace `self.state`.

  Built from a spec, a capacity and optionally a mesh and rules (no mesh: single device). Inserts take
  numpy (from `from_host`) or device Records; draws return ReplayBatch sharded by the same rules and, with
  mark_used=True (the default), count a use of every row they return in the same compiled call.
  """

  def __init__(self, spec: RecordSpec, capacity: int, *, mesh: Optional[Mesh] = None,
               rules: sharding.Rules = DEFAULT_RULES):
    self.spec, self.capacity, self.mesh, self.rules = spec, capacity, mesh, tuple(rules)
    self.shardings = None if mesh is None else state_shardings(spec, capacity, mesh, self.rules)
    self.state = init_state(spec, capacity, self.shardings)
    self._jitted: dict[tuple, Callable] = {}

  def _jit(self, key: tuple, make: Callable[[], tuple[Callable, Any, tuple[int, ...]]],
           static: tuple[str, ...] = ()) -> Callable:
    """The jitted function under `key`, built once from make() -> (fn, out_shardings, donate_argnums)."""
    if key not in self._jitted:
      fn, out, donate = make()
      self._jitted[key] = jax.jit(fn, out_shardings=out, donate_argnums=donate, static_argnames=static)
    return self._jitted[key]

  def _update(self, name: str, fn: Callable, *args) -> None:
    """self.state = fn(self.state, *args), donated, with the state's shardings pinned."""
    self.state = self._jit((name,), lambda: (fn, self.shardings, (0,)))(self.state, *args)

  def _draw(self, name: str, fn: Callable, args: tuple, mark: bool, **static) -> ReplayBatch:
    """fn's ReplayBatch, laid out by the rules; with mark, also counts its uses (donating the state)."""
    def make():
      out = None if self.mesh is None else batch_shardings(self.spec, static["batch_size"], self.mesh, self.rules)
      if not mark:
        return fn, out, ()
      return _and_mark(fn), (None if out is None else (out, self.shardings)), (0,)

    jitted = self._jit((name, static["batch_size"], mark), make, tuple(static))
    if not mark:
      return jitted(self.state, *args, **static)
    out, self.state = jitted(self.state, *args, **static)
    return out

  def _put(self, batch: Records) -> Records:
    if self.mesh is None:
      return jax.tree.map(jnp.asarray, batch)
    shard = sharding.tree_shardings(self.mesh, self.spec.logical_axes(), self.rules,
                                    self.spec.shapes(batch.num_records))
    return jax.device_put(batch, shard)

  def insert(self, batch: Records) -> None:
    """Writes batch's valid rows (numpy or device Records of any fixed batch size)."""
    self.spec.check(batch)
    self._update("insert", _insert, self._put(batch))

  def sample(self, rng: Array, batch_size: int, *, current_version: Any, max_staleness: Optional[Any] = None,
             max_reuse: Optional[Any] = None, replace: bool = False, mark_used: bool = True) -> ReplayBatch:
    """`sample` on the current state (and `mark_used` of what it returns)."""
    args = (rng, _i32(current_version), _i32(max_staleness, True), _i32(max_reuse, True))
    return self._draw(f"sample-{replace}", _sample, args, mark_used, batch_size=batch_size,
                      replace=replace)

  def take_latest(self, batch_size: int, *, since_version: Any, max_reuse: Optional[Any] = None,
                  mark_used: bool = True) -> ReplayBatch:
    """`take_latest` on the current state (and `mark_used` of what it returns)."""
    args = (_i32(since_version), _i32(max_reuse, True))
    return self._draw("take_latest", _take_latest, args, mark_used, batch_size=batch_size)

  def select(self, predicate: Union[Array, Callable[[Records], Array]], batch_size: int, *,
             mark_used: bool = True) -> ReplayBatch:
    """`select` on the current state (and `mark_used` of what it returns)."""
    mask = predicate(self.state.records) if callable(predicate) else predicate
    return self._draw("select", _select, (jnp.asarray(mask, bool),), mark_used, batch_size=batch_size)

  def mark_used(self, indices: Array) -> None:
    """Counts one use of each row in indices (-1 entries ignored)."""
    self._update("mark_used", _mark_used, jnp.asarray(indices, jnp.int32))

  def num_eligible(self, *, current_version: Any, max_staleness: Optional[Any] = None,
                   max_reuse: Optional[Any] = None) -> int:
    """How many rows `sample` may currently return (a host sync)."""
    return int(num_eligible(self.state, current_version=current_version, max_staleness=max_staleness,
                            max_reuse=max_reuse))

  @property
  def size(self) -> int:
    return int(self.state.size)
