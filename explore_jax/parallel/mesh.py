"""The device mesh from config: axes (data, fsdp, tensor), -1 takes the devices left over."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import jax
import jax.experimental.mesh_utils
import numpy as np
from jax.sharding import AxisType, Mesh

AXES = ("data", "fsdp", "tensor")


def resolve_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Replaces one -1 in `shape` by what makes the product equal to num_devices."""
  shape = tuple(int(s) for s in shape)
  if shape.count(-1) > 1:
    raise ValueError(f"mesh shape {shape}: at most one axis may be -1")
  known = math.prod(s for s in shape if s != -1)
  if any(s == 0 or s < -1 for s in shape) or num_devices % known:
    raise ValueError(f"mesh shape {shape} does not fit {num_devices} devices")
  shape = tuple(num_devices // known if s == -1 else s for s in shape)
  if math.prod(shape) != num_devices:
    raise ValueError(f"mesh shape {shape} uses {math.prod(shape)} devices; {num_devices} are present")
  return shape


def make_mesh(shape: Sequence[int] = (-1, 1, 1), axes: Sequence[str] = AXES,
              devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """A mesh with Auto axis types (so row-parallel matmuls shard implicitly), laid out for the topology."""
  devices = list(jax.devices() if devices is None else devices)
  shape = resolve_shape(shape, len(devices))
  if len(shape) != len(axes):
    raise ValueError(f"mesh shape {shape} and axes {tuple(axes)} differ in length")
  try:
    grid = jax.experimental.mesh_utils.create_device_mesh(shape, devices)
  except (AssertionError, NotImplementedError, ValueError):
    grid = np.asarray(devices).reshape(shape)  # topologies mesh_utils does not know (fake CPU devices)
  return Mesh(grid, tuple(axes), axis_types=(AxisType.Auto,) * len(axes))
