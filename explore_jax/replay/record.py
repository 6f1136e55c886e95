"""The record: one agent step as fixed-shape arrays, N records stacked on a leading record axis.

A `RecordSpec` (static, hashable) fixes the shapes: prompt length P, response length R, the names of the
K intrinsic reward terms and the method fields (`extras`). `Records` is the pytree of arrays itself.
Fixed shapes keep everything downstream (replay, advantages, the update) under one jit.

Layout conventions, shared with the sampler (`sampling/sampler.py: SampleOutput`):
* Prompts are LEFT-padded to P with `pad_id` (`prompt_mask` False on the padding prefix), so the last
  prompt token is always in column P-1 and `concat([prompt, response])` has no gap.
* Responses are RIGHT-padded to R: tokens `pad_id`, logprobs and temperatures 0, segment ids -1,
  `response_mask` False, exactly what the sampler writes after a row's end.
* `state_key` is int32: JAX runs without x64 by default, so an environment's (64-bit) observation hash is
  folded to 32 bits (`fold_state_key`). Keys only group equal observations (GiGPO, visitation counts);
  a rare 32-bit collision merges two states, which these estimators tolerate.
* Padding rows have `valid` False and padding values everywhere else; consumers mask by `valid`.
* Method fields live in `extras`, declared in the spec with their per-record shape and dtype. A method
  that is off declares nothing, and nothing is allocated for it.

Actors produce numpy; `from_host` turns their per-step dicts into a numpy `Records` for the learner.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence, Union

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

Array = Any  # jax.Array on the device, np.ndarray on the host
LogicalAxes = tuple[Optional[str], ...]

RECORD_AXIS = "batch"   # the record axis shards over the rules' batch axes (data, fsdp)
TOKEN_AXIS = "length"


@flax.struct.dataclass
class Records:
  """N agent steps; every leaf has the leading record axis N (see the module docstring)."""
  prompt_tokens: Array       # [N, P] int32, left-padded with pad_id
  prompt_mask: Array         # [N, P] bool, True on real prompt tokens
  response_tokens: Array     # [N, R] int32, right-padded with pad_id
  response_mask: Array       # [N, R] bool, True on real response tokens
  behaviour_logprobs: Array  # [N, R] float32, log-prob under the sampling distribution, 0 on padding
  temperatures: Array        # [N, R] float32, temperature each token was drawn at, 0 on padding
  segment_ids: Array         # [N, R] int32, segment of each token (strategy / rest / ...), -1 on padding
  task_reward: Array         # [N] float32
  format_reward: Array       # [N] float32
  intrinsic_rewards: Array   # [N, K] float32, K = len(spec.intrinsic_names), in that order
  group_id: Array            # [N] int32, task group (the G trajectories of one task share it)
  traj_id: Array             # [N] int32
  step_index: Array          # [N] int32, step t within the trajectory
  copy_id: Array             # [N] int32, parallel copy (DPEPO)
  actor_id: Array            # [N] int32
  state_key: Array           # [N] int32, observation hash folded to 32 bits
  visitation_depth: Array    # [N] int32
  policy_version: Array      # [N] int32, version of the policy that sampled the response
  done: Array                # [N] bool, last step of its trajectory
  valid: Array               # [N] bool, False on padding rows
  extras: dict[str, Array] = flax.struct.field(default_factory=dict)  # method fields, as declared

  @property
  def num_records(self) -> int:
    return self.valid.shape[0]


# Per-record trailing shape of each core field: "P", "R" and "K" stand for the spec's sizes.
_CORE: dict[str, tuple[tuple[str, ...], Any]] = {
    "prompt_tokens": (("P",), np.int32),
    "prompt_mask": (("P",), np.bool_),
    "response_tokens": (("R",), np.int32),
    "response_mask": (("R",), np.bool_),
    "behaviour_logprobs": (("R",), np.float32),
    "temperatures": (("R",), np.float32),
    "segment_ids": (("R",), np.int32),
    "task_reward": ((), np.float32),
    "format_reward": ((), np.float32),
    "intrinsic_rewards": (("K",), np.float32),
    "group_id": ((), np.int32),
    "traj_id": ((), np.int32),
    "step_index": ((), np.int32),
    "copy_id": ((), np.int32),
    "actor_id": ((), np.int32),
    "state_key": ((), np.int32),
    "visitation_depth": ((), np.int32),
    "policy_version": ((), np.int32),
    "done": ((), np.bool_),
    "valid": ((), np.bool_),
}
_AXIS_NAMES = {"P": TOKEN_AXIS, "R": TOKEN_AXIS, "K": None}
_TOKEN_FIELDS = ("prompt_tokens", "response_tokens")
_PER_TOKEN = ("behaviour_logprobs", "temperatures", "segment_ids")  # aligned with response_tokens


@dataclasses.dataclass(frozen=True)
class ExtraField:
  """A method field's per-record shape, dtype, logical axis names and host-side padding.

  pad: None (from_host requires the exact shape), "left" or "right": from_host accepts a shorter first
  axis and pads it on that side (with pad_id for integer fields, else 0), e.g. EMPO2's prompt without
  tips, left-padded like the prompt.
  """
  shape: tuple[int, ...]
  dtype: str
  axes: Optional[tuple[Optional[str], ...]] = None
  pad: Optional[str] = None

  def __post_init__(self):
    shape = tuple(int(s) for s in self.shape)
    axes = (None,) * len(shape) if self.axes is None else tuple(self.axes)
    if len(axes) != len(shape):
      raise ValueError(f"extra field axes {axes} do not match its shape {shape}")
    if self.pad not in (None, "left", "right") or (self.pad and not shape):
      raise ValueError(f"extra field pad must be None, 'left' or 'right' on a field with an axis, got {self.pad!r}")
    object.__setattr__(self, "shape", shape)
    object.__setattr__(self, "dtype", np.dtype(self.dtype).name)
    object.__setattr__(self, "axes", axes)


ExtraDecl = Union[ExtraField, tuple]


def _as_extra(name: str, decl: ExtraDecl) -> ExtraField:
  if isinstance(decl, ExtraField):
    return decl
  if not isinstance(decl, tuple) or not 2 <= len(decl) <= 4:
    raise ValueError(f"extra field {name!r}: declare it as ExtraField or (shape, dtype[, axes[, pad]]), got {decl!r}")
  return ExtraField(*decl)


@dataclasses.dataclass(frozen=True)
class RecordSpec:
  """Static shapes of a Records batch: prompt_len P, response_len R, intrinsic term names, method extras.

  extras maps a field name to an ExtraField or a tuple (shape, dtype[, axes[, pad]]); it is stored as a
  sorted tuple of (name, ExtraField) so the spec is hashable (a static jit argument).
  """
  prompt_len: int
  response_len: int
  intrinsic_names: tuple[str, ...] = ()
  extras: Any = ()
  pad_id: int = 0

  def __post_init__(self):
    if self.prompt_len < 1 or self.response_len < 1:
      raise ValueError(f"prompt_len and response_len must be positive, got {self.prompt_len}, {self.response_len}")
    names = tuple(self.intrinsic_names)
    if len(set(names)) != len(names):
      raise ValueError(f"intrinsic names repeat: {names}")
    items = self.extras.items() if isinstance(self.extras, Mapping) else self.extras
    extras = tuple(sorted((str(k), _as_extra(str(k), v)) for k, v in items))
    clash = [k for k, _ in extras if k in _CORE or k in ("intrinsic", "extras")]
    if clash:
      raise ValueError(f"extra fields {clash} reuse names of core record fields")
    object.__setattr__(self, "intrinsic_names", names)
    object.__setattr__(self, "extras", extras)

  @property
  def extra_fields(self) -> dict[str, ExtraField]:
    return dict(self.extras)

  @property
  def num_intrinsic(self) -> int:
    return len(self.intrinsic_names)

  def intrinsic(self, records: Records, name: str) -> Array:
    """The [N] column of intrinsic reward term `name`."""
    return records.intrinsic_rewards[:, self.intrinsic_names.index(name)]

  def _sizes(self) -> dict[str, int]:
    return {"P": self.prompt_len, "R": self.response_len, "K": self.num_intrinsic}

  def _layout(self) -> Records:
    """Records whose leaves are (trailing shape, dtype, logical axes, fill value) per field."""
    sizes = self._sizes()
    fill = {"prompt_tokens": self.pad_id, "response_tokens": self.pad_id, "segment_ids": -1}
    core = {name: (tuple(sizes[d] for d in dims), np.dtype(dtype), tuple(_AXIS_NAMES[d] for d in dims),
                   fill.get(name, 0))
            for name, (dims, dtype) in _CORE.items()}
    extras = {name: (f.shape, np.dtype(f.dtype), f.axes,
                     self.pad_id if f.pad and np.issubdtype(np.dtype(f.dtype), np.integer) else 0)
              for name, f in self.extras}
    return Records(**core, extras=extras)

  def _map(self, fn) -> Records:
    return jax.tree.map(lambda leaf: fn(*leaf), self._layout(), is_leaf=lambda x: isinstance(x, tuple))

  def shapes(self, n: int) -> Records:
    """Records of jax.ShapeDtypeStruct for n rows (for eval_shape and shardings)."""
    return self._map(lambda shape, dtype, axes, fill: jax.ShapeDtypeStruct((n,) + shape, dtype))

  def logical_axes(self) -> Records:
    """Logical axis names per field: the record axis is "batch", token axes "length", the rest None."""
    return self._map(lambda shape, dtype, axes, fill: (RECORD_AXIS,) + axes)

  def fill_values(self) -> Records:
    """The padding value of every field (pad_id tokens, segment id -1, zeros and False elsewhere)."""
    return self._map(lambda shape, dtype, axes, fill: fill)

  def empty(self, n: int) -> Records:
    """n invalid padding rows as writable numpy arrays (the host side, for actors to fill)."""
    return self._map(lambda shape, dtype, axes, fill: np.full((n,) + shape, fill, dtype))

  def zeros(self, n: int) -> Records:
    """n invalid padding rows as jax arrays (the device side)."""
    return jax.tree.map(jnp.asarray, self.empty(n))

  def check(self, records: Records) -> None:
    """Raises ValueError naming the first field whose shape differs from this spec's."""
    expected, got = set(self.extra_fields), set(records.extras)
    if expected != got:
      raise ValueError(f"record extras {sorted(got)} differ from the spec's {sorted(expected)}")
    n = records.num_records
    want = self.shapes(n)
    for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(records)):
      if tuple(g.shape) != w.shape:
        raise ValueError(f"record field {jax.tree_util.keystr(path)[1:]} has shape {tuple(g.shape)}, "
                         f"expected {w.shape}")


def take(records: Records, indices: Array) -> Records:
  """Rows `indices` of every field."""
  return jax.tree.map(lambda x: x[indices], records)


# ---- the host side: actors' per-step dicts -> numpy Records ---------------------------------------------

_INT32_MIN, _INT32_MAX = -2**31, 2**31 - 1
_REQUIRED = ("prompt_tokens", "response_tokens", "behaviour_logprobs", "task_reward", "group_id", "traj_id",
             "step_index", "policy_version", "done")
_DEFAULTS = {"format_reward": 0.0, "copy_id": 0, "actor_id": 0, "state_key": 0, "visitation_depth": 0}


def fold_state_key(key: int) -> int:
  """An observation hash as int32: values already in int32 range are kept, wider ones XOR-folded to 32 bits."""
  key = int(key)
  if _INT32_MIN <= key <= _INT32_MAX:
    return key
  u = key & (2**64 - 1)
  folded = (u ^ (u >> 32)) & 0xFFFFFFFF
  return folded - 2**32 if folded > _INT32_MAX else folded


def _rows(data: Union[Sequence[Mapping[str, Any]], Mapping[str, Any]]) -> list[Mapping[str, Any]]:
  """A list of per-record dicts from either a list of dicts or a dict of columns."""
  if not isinstance(data, Mapping):
    return list(data)
  lengths = {k: len(v) for k, v in data.items() if k != "intrinsic" or not isinstance(v, Mapping)}
  if isinstance(data.get("intrinsic"), Mapping):
    lengths.update({f"intrinsic[{k!r}]": len(v) for k, v in data["intrinsic"].items()})
  if len(set(lengths.values())) > 1:
    raise ValueError(f"columns differ in length: {lengths}")
  n = next(iter(lengths.values()), 0)

  def row(i):
    out = {k: v[i] for k, v in data.items() if k != "intrinsic"}
    if "intrinsic" in data:
      col = data["intrinsic"]
      out["intrinsic"] = {k: v[i] for k, v in col.items()} if isinstance(col, Mapping) else col[i]
    return out

  return [row(i) for i in range(n)]


def _real(row: Mapping[str, Any], name: str, mask_name: str, i: int) -> tuple[np.ndarray, Optional[np.ndarray]]:
  """A token row without its padding (its mask applied, when given), and that mask."""
  tokens = np.asarray(row[name])
  if tokens.ndim != 1:
    raise ValueError(f"record {i}: {name} must be 1-D, got shape {tokens.shape}")
  if mask_name not in row:
    return tokens, None
  mask = np.asarray(row[mask_name], dtype=bool)
  if mask.shape != tokens.shape:
    raise ValueError(f"record {i}: {mask_name} has shape {mask.shape}, {name} has {tokens.shape}")
  return tokens[mask], mask


def _scalar(row: Mapping[str, Any], name: str, i: int, dtype) -> Any:
  value = row[name] if name in row else _DEFAULTS[name]
  try:
    if name == "state_key":
      value = fold_state_key(value)
    if np.issubdtype(dtype, np.integer):
      if int(value) != value or not _INT32_MIN <= int(value) <= _INT32_MAX:
        raise ValueError("not an int32")
      return int(value)
    return dtype.type(value)
  except (TypeError, ValueError, OverflowError) as e:
    raise ValueError(f"record {i}: {name}={value!r} is not a {dtype.name} scalar ({e})") from None


def from_host(spec: RecordSpec, data: Union[Sequence[Mapping[str, Any]], Mapping[str, Any]], *,
              pad_to: Optional[int] = None) -> Records:
  """A numpy Records from actors' step records: a list of per-record dicts or a dict of columns.

  Per record: prompt_tokens / response_tokens are 1-D token ids; with prompt_mask / response_mask (e.g. a
  row of a left-padded prompt batch or of SampleOutput) only the masked-in tokens are kept. Prompts are
  left-padded to P, responses right-padded to R; a longer one raises ValueError naming the field (never
  truncated silently). behaviour_logprobs and the optional temperatures (default 1) and segment_ids
  (default 0) align with response_tokens. `intrinsic` is a {name: value} dict with the spec's names or
  a length-K sequence (required when K > 0). Declared extras are required, under their own names.
  Required scalars: task_reward, group_id, traj_id, step_index, policy_version, done; format_reward, copy_id,
  actor_id, state_key (folded to int32) and visitation_depth default to 0. Rows are valid; `pad_to` appends
  invalid padding rows up to that many (a fixed insert shape).
  """
  rows = _rows(data)
  n = len(rows) if pad_to is None else pad_to
  if len(rows) > n:
    raise ValueError(f"{len(rows)} records do not fit pad_to={pad_to}")
  out = spec.empty(n)
  extras = spec.extra_fields
  known = set(_CORE) | {"intrinsic"} | set(extras)
  known -= {"valid", "intrinsic_rewards"}
  P, R, K = spec.prompt_len, spec.response_len, spec.num_intrinsic
  for i, row in enumerate(rows):
    unknown = sorted(set(row) - known)
    if unknown:
      raise ValueError(f"record {i}: unknown field(s) {unknown}; known fields are {sorted(known)}")
    required = _REQUIRED + (("intrinsic",) if K else ()) + tuple(extras)
    missing = [k for k in required if k not in row]
    if missing:
      raise ValueError(f"record {i}: missing field(s) {missing}")

    prompt, _ = _real(row, "prompt_tokens", "prompt_mask", i)
    if len(prompt) > P:
      raise ValueError(f"record {i}: prompt_tokens has {len(prompt)} tokens, more than prompt_len={P}")
    out.prompt_tokens[i, P - len(prompt):] = prompt
    out.prompt_mask[i, P - len(prompt):] = True

    response, mask = _real(row, "response_tokens", "response_mask", i)
    if len(response) > R:
      raise ValueError(f"record {i}: response_tokens has {len(response)} tokens, more than response_len={R}")
    length = len(response)
    out.response_tokens[i, :length] = response
    out.response_mask[i, :length] = True
    for name, default in zip(_PER_TOKEN, (None, 1.0, 0)):
      if name not in row:
        getattr(out, name)[i, :length] = default
        continue
      values = np.asarray(row[name])
      if values.shape != np.asarray(row["response_tokens"]).shape:
        raise ValueError(f"record {i}: {name} has shape {values.shape}, response_tokens has "
                         f"{np.asarray(row['response_tokens']).shape}")
      getattr(out, name)[i, :length] = values if mask is None else values[mask]

    for name, (dims, dtype) in _CORE.items():
      if not dims and name != "valid":
        getattr(out, name)[i] = _scalar(row, name, i, np.dtype(dtype))
    out.valid[i] = True

    if K:
      terms = row["intrinsic"]
      if isinstance(terms, Mapping):
        if set(terms) != set(spec.intrinsic_names):
          raise ValueError(f"record {i}: intrinsic terms {sorted(terms)} differ from the spec's "
                           f"{sorted(spec.intrinsic_names)}")
        terms = [terms[k] for k in spec.intrinsic_names]
      terms = np.asarray(terms, np.float32)
      if terms.shape != (K,):
        raise ValueError(f"record {i}: intrinsic has shape {terms.shape}, expected ({K},)")
      out.intrinsic_rewards[i] = terms

    for name, field in extras.items():
      value = np.asarray(row[name], dtype=field.dtype)
      shape = field.shape
      if field.pad and value.shape[1:] == shape[1:] and value.ndim == len(shape):
        if value.shape[0] > shape[0]:
          raise ValueError(f"record {i}: {name} has {value.shape[0]} entries on its first axis, more than {shape[0]}")
        width = value.shape[0]
        where = slice(shape[0] - width, None) if field.pad == "left" else slice(0, width)
        out.extras[name][i, where] = value
      elif value.shape != shape:
        raise ValueError(f"record {i}: {name} has shape {value.shape}, expected {shape}")
      else:
        out.extras[name][i] = value
  return out
