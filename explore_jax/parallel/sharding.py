"""Logical-axis sharding: arrays name their axes, a rules table in the config maps names to mesh axes.

A rule is `(logical_name, mesh_axes)` with mesh_axes None (replicated), one mesh axis name, or a tuple of
them. The first rule naming a logical axis wins, as in MaxText's `logical_axis_rules`. Changing a layout
is an edit of the table, never of model code.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional, Sequence, Union

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MeshAxes = Union[None, str, tuple[str, ...]]
Rules = Sequence[tuple[str, MeshAxes]]
LogicalAxes = tuple[Optional[str], ...]

# Batch over data and fsdp, weights over fsdp (ZeRO-3 style) and tensor (Megatron style).
DEFAULT_RULES: tuple[tuple[str, MeshAxes], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("cache_length", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("layers", None),
    ("act_embed", None),
)


def _as_tuple(axes: MeshAxes) -> tuple[str, ...]:
  if axes is None:
    return ()
  return (axes,) if isinstance(axes, str) else tuple(axes)


def logical_to_spec(logical_axes: LogicalAxes, rules: Rules, mesh: Mesh | None = None,
                    shape: Sequence[int] | None = None) -> P:
  """PartitionSpec for an array whose axes carry `logical_axes` names.

  With `mesh` and `shape`, a mesh axis that does not divide its dimension (e.g. 4 KV heads over
  tensor=8) or that an earlier dimension already uses is dropped, so that dimension is replicated
  instead of failing: small models run on any mesh.
  """
  table: dict[str, tuple[str, ...]] = {}
  for name, axes in rules:
    table.setdefault(name, _as_tuple(axes))
  used: set[str] = set()
  spec = []
  for dim, name in enumerate(logical_axes):
    if name is not None and name not in table:
      raise KeyError(f"logical axis {name!r} has no sharding rule; rules cover {sorted(table)}")
    chosen = []
    size = 1
    for axis in (table[name] if name is not None else ()):
      if axis in used:
        continue
      if mesh is not None:
        if axis not in mesh.shape:
          raise KeyError(f"sharding rule for {name!r} names mesh axis {axis!r}; mesh has {tuple(mesh.shape)}")
        if shape is not None and shape[dim] % (size * mesh.shape[axis]):
          continue
        size *= mesh.shape[axis]
      chosen.append(axis)
    used.update(chosen)
    spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
  return P(*spec)


def named_sharding(mesh: Mesh, logical_axes: LogicalAxes, rules: Rules,
                   shape: Sequence[int] | None = None) -> NamedSharding:
  return NamedSharding(mesh, logical_to_spec(logical_axes, rules, mesh, shape))


def _is_axes(x: Any) -> bool:
  return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def tree_shardings(mesh: Mesh, axes_tree: Any, rules: Rules, shapes_tree: Any = None) -> Any:
  """NamedShardings for a pytree, given the matching pytree of logical axes (and optionally shapes)."""
  if shapes_tree is None:
    return jax.tree.map(lambda a: named_sharding(mesh, a, rules), axes_tree, is_leaf=_is_axes)
  return jax.tree.map(lambda a, s: named_sharding(mesh, a, rules, s.shape), axes_tree, shapes_tree,
                      is_leaf=_is_axes)


def constrain(x: jax.Array, logical_axes: LogicalAxes, mesh: Mesh | None, rules: Rules | None) -> jax.Array:
  """with_sharding_constraint by logical names; a no-op without a mesh (single device)."""
  if mesh is None or rules is None or math.prod(mesh.shape.values()) == 1:
    return x
  return jax.lax.with_sharding_constraint(x, named_sharding(mesh, logical_axes, rules, x.shape))


def rules_from_config(rules: Iterable[Any]) -> tuple[tuple[str, MeshAxes], ...]:
  """Normalise a rules table read from a config (lists become tuples, so it is hashable)."""
  out = []
  for rule in rules:
    name, axes = rule
    if axes is not None and not isinstance(axes, str):
      axes = tuple(axes)
    out.append((str(name), axes))
  return tuple(out)
