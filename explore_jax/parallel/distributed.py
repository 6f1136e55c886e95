"""Multi-host start-up: one `initialize()` call before any other jax use, then every process sees the
global device set (`jax.devices()`), and meshes, shardings and jitted steps span the hosts.

  from explore_jax.parallel import distributed
  distributed.initialize()                                    # single process: nothing happens
  distributed.initialize("10.0.0.1:1234", num_processes=2, process_id=1)   # explicit, e.g. CPU hosts
  distributed.initialize()                                    # on a Cloud TPU VM: jax detects the slice

What it does:
  * explicit settings (a coordinator address, a process count > 1 and this process's id) start jax's
    distributed runtime with them (`jax.distributed.initialize`); process 0 also runs the coordinator;
  * no settings on a Cloud TPU VM (or with JAX_COORDINATOR_ADDRESS in the environment) let jax detect the
    cluster itself (TPU metadata server, Slurm, Open MPI, ...);
  * otherwise (and for num_processes == 1) it does nothing: a single-process run is left exactly as before;
  * a second call is a no-op when it asks for the same (or nothing more specific), an error when it asks
    for something else.

The config's "not set" values are accepted as well: coordinator_address "", num_processes 0 and
process_id -1 (configs/base.py `c.distributed`) mean None.

CPU collectives across processes (what the 2-process loopback test needs): jax 0.10.2 creates its CPU client
with gloo TCP collectives over the distributed runtime's key-value store whenever the runtime is up, because
`jax_cpu_collectives_implementation` defaults to "gloo" there (jax/_src/config.py,
jax/_src/xla_bridge.py:make_cpu_client). Older jax versions defaulted to no cross-process CPU collectives,
so `initialize` sets "gloo" only where the option is unset (None) and leaves any explicit choice ("mpi") alone.
Like jax's own call, `initialize` must run before anything creates a backend (jax.devices(), any array).
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

import jax

def _unset(value, none_values) -> bool:
  return value is None or value in none_values


def on_cloud_tpu_vm() -> bool:
  """True on a Cloud TPU VM with libtpu (what jax's own import-time TPU check found); no backend is made."""
  try:
    from jax._src import cloud_tpu_init
  except ImportError:  # a jax without this module: detect nothing, require explicit settings
    return False
  return bool(getattr(cloud_tpu_init, "running_in_cloud_tpu_vm", False))


def _ensure_cpu_collectives() -> None:
  try:
    current = jax.config.jax_cpu_collectives_implementation
  except AttributeError:  # an option this jax does not have
    return
  if current is None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None,
               local_device_ids: Optional[Union[int, Sequence[int]]] = None,
               *, initialization_timeout: int = 300) -> bool:
  """Starts jax's multi-process runtime when asked (see the module docstring); returns True when this
  process is part of a multi-process run afterwards, False for a single-process run."""
  coordinator_address = None if _unset(coordinator_address, ("",)) else str(coordinator_address)
  num_processes = None if _unset(num_processes, (0, -1)) else int(num_processes)
  process_id = None if _unset(process_id, (-1,)) else int(process_id)
  if isinstance(local_device_ids, int):
    local_device_ids = [local_device_ids] if local_device_ids >= 0 else None
  elif local_device_ids is not None:
    local_device_ids = [int(i) for i in local_device_ids] or None

  if jax.distributed.is_initialized():
    _check_same(coordinator_address, num_processes, process_id)
    return True
  if num_processes == 1:
    return False
  explicit = coordinator_address is not None or num_processes is not None or process_id is not None
  if not explicit and not (on_cloud_tpu_vm() or os.environ.get("JAX_COORDINATOR_ADDRESS")):
    return False
  # Settings left None are filled in by jax's cluster detection (TPU metadata, Slurm, Open MPI, ...) or
  # reported by jax as missing.
  _ensure_cpu_collectives()
  jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                             process_id=process_id, local_device_ids=local_device_ids,
                             initialization_timeout=initialization_timeout)
  return True


def _check_same(coordinator_address, num_processes, process_id) -> None:
  """Raises when a repeated initialize() asks for another runtime than the one that is up."""
  from jax._src import distributed as _state  # where jax keeps what it was initialised with

  now = _state.global_state
  asked = {"coordinator_address": coordinator_address, "num_processes": num_processes, "process_id": process_id}
  have = {"coordinator_address": now.coordinator_address, "num_processes": now.num_processes,
          "process_id": now.process_id}
  differ = {k: (v, have[k]) for k, v in asked.items() if v is not None and have[k] is not None and v != have[k]}
  if differ:
    raise RuntimeError("jax.distributed is already initialised differently: " + ", ".join(
        f"{k}={v!r} asked, {h!r} in use" for k, (v, h) in differ.items()))


def is_initialized() -> bool:
  return jax.distributed.is_initialized()


def process_index() -> int:
  return jax.process_index()


def process_count() -> int:
  return jax.process_count()


def is_primary() -> bool:
  """True in the process that writes run-level files (metrics, summaries, provenance): process 0."""
  return jax.process_index() == 0


def fetch(tree: Any) -> Any:
  """jax.device_get that also reads arrays sharded across processes: every process gets their global value.

  A single-process run (and any tree whose arrays each process can read whole) takes jax.device_get itself;
  otherwise the sharded arrays are gathered collectively (`multihost_utils.process_allgather`), so every
  process must fetch the same arrays in the same order.
  """
  def spans_processes(x: Any) -> bool:
    return isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated)

  if not any(spans_processes(x) for x in jax.tree.leaves(tree)):
    return jax.device_get(tree)
  from jax.experimental import multihost_utils

  return jax.device_get(jax.tree.map(
      lambda x: multihost_utils.process_allgather(x, tiled=True) if spans_processes(x) else x, tree))
