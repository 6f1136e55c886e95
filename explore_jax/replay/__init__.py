"""The device-resident replay: the fixed-shape record of one agent step and the ring buffer on the mesh."""

from explore_jax.replay.buffer import (Replay, ReplayBatch, ReplayState, batch_shardings, init_state, insert,
                                       mark_used, num_eligible, sample, select, state_logical_axes,
                                       state_shardings, state_shapes, take_latest)
from explore_jax.replay.record import ExtraField, RecordSpec, Records, fold_state_key, from_host, take

__all__ = [
    "ExtraField", "RecordSpec", "Records", "Replay", "ReplayBatch", "ReplayState", "batch_shardings",
    "fold_state_key", "from_host", "init_state", "insert", "mark_used", "num_eligible", "sample", "select",
    "state_logical_axes", "state_shapes", "state_shardings", "take", "take_latest",
]
