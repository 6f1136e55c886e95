"""Checkpoints of a training run: state pytree, RNG key and JSON metadata per step, over orbax.

One step directory holds three orbax items: `state` (any pytree of arrays: params, optimizer state,
step counter), `rng` (the key's raw uint32 data) and `metadata` (a JSON dict: config, metrics, data
iterator position). Typed keys (`jax.random.key`) are stored as their key data, with the PRNG
implementation's name in the step's orbax metadata, and come back typed.

Orbax writes a step into `<step>.orbax-checkpoint-tmp*` and renames it on commit, so a writer killed
mid-save leaves the last committed step intact; step listing ignores the unfinished directory. In a bucket
(`gs://...`, which has no renames) it writes the step in place and commits it with a `commit_success.txt` file;
a step without one counts as unfinished and is never listed. Arrays go through tensorstore's GCS driver there
(explore_jax/storage.py points it at an emulator's endpoint when STORAGE_EMULATOR_HOST is set).

  ckpt = Checkpointer("/runs/x/ckpt", max_to_keep=3)
  ckpt.save(step, state, rng=rng, metadata={"config": cfg, "data_pos": pos})
  restored = ckpt.restore(abstract_like(state))          # latest step
  restored = ckpt.restore(abstract_like(shapes, shardings_on_new_mesh), step=100)   # reshards

Like orbax's `CheckpointManager`, a `Checkpointer` assumes it is the only writer of its directory.
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple, Optional, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy

from explore_jax import storage

_STATE, _RNG, _METADATA = "state", "rng", "metadata"
# The step's orbax custom metadata records which items were saved and the key's {"shape", "impl"}
# (impl None for a raw key), so restore knows what to ask for before reading any item.
_ITEMS, _RNG_INFO = "items", "rng_info"


class Restored(NamedTuple):
  """What `Checkpointer.restore` returns; `rng`/`metadata` are None when the step saved none."""

  step: int
  state: Any
  rng: Optional[jax.Array]
  metadata: Optional[dict]


def abstract_like(state: Any, shardings: Any = None) -> Any:
  """Pytree of `jax.ShapeDtypeStruct` (with sharding) describing `state`, the target of a restore.

  `state` may be concrete arrays (their own shardings are used) or `jax.eval_shape` output.
  `shardings` overrides them: one `jax.sharding.Sharding` for every leaf, or a pytree of shardings
  with the structure of `state` (e.g. the `out_shardings` of the jitted init on a new mesh).
  """
  if shardings is None:
    shardings = jax.tree.map(lambda x: getattr(x, "sharding", None), state)
  elif isinstance(shardings, jax.sharding.Sharding):
    shardings = jax.tree.map(lambda _: shardings, state)

  def leaf(path, x, sharding):
    if sharding is None:
      raise ValueError(f"no sharding for leaf {jax.tree_util.keystr(path)}; pass `shardings=`")
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

  # Missing shardings are None leaves, which tree.map would treat as empty subtrees.
  return jax.tree.map_with_path(leaf, state, shardings, is_leaf=lambda x: x is None)


def _split_key(rng: jax.Array) -> tuple[jax.Array, Optional[str]]:
  """(raw uint32 data, impl name or None) for a typed or raw key array."""
  if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(rng), str(jax.random.key_impl(rng))
  if rng.dtype != np.uint32:
    raise TypeError(f"rng must be a typed PRNG key or a raw uint32 key, got dtype {rng.dtype}")
  return rng, None


def _default_rng_sharding(abstract_state: Any) -> jax.sharding.Sharding:
  """Replicated over the mesh of the state's first NamedSharding, else on the first device."""
  for leaf in jax.tree.leaves(abstract_state):
    sharding = getattr(leaf, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):
      return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
  return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def _global_key_data(key_data: jax.Array, state: Any) -> jax.Array:
  """With several processes orbax saves only global arrays; a process-local key (a run's
  `jax.random.key(seed)`, the same in every process) becomes one replicated over the state's mesh."""
  if jax.process_count() == 1 or not getattr(key_data, "is_fully_addressable", False):
    return key_data
  host = np.asarray(jax.device_get(key_data))
  return jax.make_array_from_callback(host.shape, _default_rng_sharding(state), lambda index: host[index])


class Checkpointer:
  """Saves and restores (state, rng, metadata) per step in one directory, keeping the newest few.

  Args:
    directory: where step directories go; a relative path is made absolute (orbax needs that) and
      the directory is created. A bucket path (gs://BUCKET/...) is used as it is; its bucket must exist.
    max_to_keep: newest steps kept; older ones are deleted after each save. None keeps all.
    keep_steps: steps never deleted for `max_to_keep`, besides the newest (e.g. 0, the policy a run started
      from, which its KL term needs on every resume).
    save_interval_steps: `save` skips steps that are not a multiple of this unless `force=True`;
      the first save into an empty directory always happens (orbax's initial-save rule).
    async_save: if True, `save` returns once arrays are copied to host and writes in the background;
      `wait()`, `restore()` and `close()` wait for it.
    cleanup_tmp: on opening, delete unfinished `<step>.orbax-checkpoint-tmp*` directories left by
      a killed writer. Only for the run's writer: a second process doing it could delete a save
      the writer has in flight. Unfinished directories are ignored by listing and restore anyway.
  """

  def __init__(self, directory: str | os.PathLike, *, max_to_keep: Optional[int] = 3,
               keep_steps: Sequence[int] = (), save_interval_steps: int = 1, async_save: bool = False,
               cleanup_tmp: bool = False):
    self.directory = storage.resolve(directory)
    storage.makedirs(self.directory)
    # orbax takes either max_to_keep or a preservation policy; the policy says both at once.
    keep = dict(max_to_keep=max_to_keep) if not keep_steps else dict(
        preservation_policy=preservation_policy.AnyPreservationPolicy([
            preservation_policy.LatestN(max_to_keep),
            preservation_policy.CustomSteps([int(step) for step in keep_steps])]))
    options = ocp.CheckpointManagerOptions(
        **keep,
        save_interval_steps=save_interval_steps,
        enable_async_checkpointing=async_save,
        cleanup_tmp_directories=cleanup_tmp,
        create=True,
    )
    # Registering every item's handlers up front: a fresh manager otherwise learns them only from
    # the first save/restore args and logs "found in the checkpoint, but could not be restored"
    # for each item whenever it reads step metadata before that.
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    for item, save_args, restore_args in ((_STATE, ocp.args.StandardSave, ocp.args.StandardRestore),
                                          (_RNG, ocp.args.StandardSave, ocp.args.StandardRestore),
                                          (_METADATA, ocp.args.JsonSave, ocp.args.JsonRestore)):
      registry.add(item, save_args)
      registry.add(item, restore_args)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          handler_registry=registry)

  def latest_step(self) -> Optional[int]:
    """Newest saved step or None; with async_save it may still be in flight until `wait()`."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Saved steps in increasing order (the same in-flight caveat as `latest_step`)."""
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: Any, *, rng: Optional[jax.Array] = None,
           metadata: Optional[dict] = None, force: bool = False, overwrite: bool = False) -> bool:
    """Saves `state`, `rng` and JSON `metadata` as `step`; False if `save_interval_steps` skips it.

    `force=True` saves off the interval. A step that already exists raises FileExistsError unless
    `overwrite=True`, which deletes it first (so a kill between delete and commit loses that step,
    never an older one). A step older than the latest raises ValueError: orbax would skip it
    silently, and keeping it would make "latest" mean something other than "newest".
    """
    step = int(step)
    if metadata is not None:
      # Fail here, before anything is written, rather than inside orbax's (possibly async) writer.
      json.dumps(metadata)
    if step in self._manager.all_steps():
      if not overwrite:
        raise FileExistsError(
            f"checkpoint step {step} already exists in {self.directory}; pass overwrite=True to "
            "replace it")
      self.wait()
      self._manager.delete(step)
    else:
      latest = self.latest_step()
      if latest is not None and step < latest:
        raise ValueError(
            f"step {step} is older than the latest checkpoint {latest} in {self.directory}; "
            "delete() the newer steps first to branch from an earlier one")
      if not force and not self._manager.should_save(step):
        return False

    items = {_STATE: ocp.args.StandardSave(state)}
    custom_metadata: dict[str, Any] = {}
    if rng is not None:
      key_data, impl = _split_key(rng)
      key_data = _global_key_data(key_data, state)
      items[_RNG] = ocp.args.StandardSave({"key_data": key_data})
      custom_metadata[_RNG_INFO] = {"shape": list(key_data.shape), "impl": impl}
    if metadata is not None:
      items[_METADATA] = ocp.args.JsonSave(metadata)
    custom_metadata[_ITEMS] = sorted(items)
    # force=True: the interval decision is made above; orbax's own check would also skip the
    # re-save of an overwritten step that is older than the latest one.
    saved = self._manager.save(step, args=ocp.args.Composite(**items), force=True,
                               custom_metadata=custom_metadata)
    if not saved:
      raise RuntimeError(f"orbax declined to save step {step} in {self.directory}")
    return True

  def restore(self, abstract_state: Any, step: Optional[int] = None, *,
              rng_sharding: Optional[jax.sharding.Sharding] = None) -> Restored:
    """Restores `step` (default: the latest) onto `abstract_state`'s shapes, dtypes and shardings.

    `abstract_state` comes from `abstract_like`; arrays are placed with its shardings, so a state
    saved on one mesh restores onto another. The key goes to `rng_sharding`, by default replicated
    on the state's mesh.
    """
    self.wait()
    available = self.all_steps()
    if step is None:
      if not available:
        raise FileNotFoundError(f"no checkpoint to restore in {self.directory}")
      step = available[-1]
    elif step not in available:
      raise FileNotFoundError(
          f"no checkpoint for step {step} in {self.directory}; available steps: {available}")

    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_state)[0]:
      if getattr(leaf, "sharding", None) is None:
        # Without a sharding orbax restores numpy arrays or reuses the saved (maybe absent) devices.
        raise ValueError(f"abstract_state leaf {jax.tree_util.keystr(path)} has no sharding; "
                         "build the target with abstract_like(state, shardings)")

    saved = self._manager.metadata(step).custom_metadata or {}
    rng_info = saved.get(_RNG_INFO)
    has_metadata = _METADATA in saved.get(_ITEMS, ())
    items = {_STATE: ocp.args.StandardRestore(abstract_state)}
    if rng_info is not None:
      sharding = rng_sharding or _default_rng_sharding(abstract_state)
      items[_RNG] = ocp.args.StandardRestore({"key_data": jax.ShapeDtypeStruct(
          tuple(rng_info["shape"]), np.uint32, sharding=sharding)})
    if has_metadata:
      items[_METADATA] = ocp.args.JsonRestore()
    restored = self._manager.restore(step, args=ocp.args.Composite(**items))

    rng = None
    if rng_info is not None:
      rng = restored[_RNG]["key_data"]
      if rng_info["impl"] is not None:
        rng = jax.random.wrap_key_data(rng, impl=rng_info["impl"])
    metadata = restored[_METADATA] if has_metadata else None
    return Restored(step=step, state=restored[_STATE], rng=rng, metadata=metadata)

  def delete(self, step: int) -> None:
    """Deletes a saved step; FileNotFoundError if there is none."""
    self.wait()
    self._manager.delete(int(step))

  def wait(self) -> None:
    """Blocks until an in-flight async save has committed."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and deletions, then releases orbax's resources."""
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
