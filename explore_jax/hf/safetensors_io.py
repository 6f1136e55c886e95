"""Streaming safetensors reading and writing on NumPy (bfloat16 through ml_dtypes).

Reading memory-maps each file and hands out one tensor at a time, so importing a checkpoint never holds
more than the tensor being converted besides the result. Writing lays out the header first and then
streams each tensor's bytes, so exporting needs no second copy of the model either.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Callable, Iterable

import ml_dtypes
import numpy as np

_TO_NUMPY = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}
_FROM_NUMPY = {np.dtype(v): k for k, v in _TO_NUMPY.items()}

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class SafetensorsFile:
  """One .safetensors file, memory-mapped; `get(name)` returns a read-only NumPy view."""

  def __init__(self, path: str):
    self.path = path
    with open(path, "rb") as f:
      (header_len,) = struct.unpack("<Q", f.read(8))
      header = json.loads(f.read(header_len))
    self.metadata = header.pop("__metadata__", {}) or {}
    self.entries = header
    self._data_start = 8 + header_len
    self._map = np.memmap(path, dtype=np.uint8, mode="r") if os.path.getsize(path) > self._data_start else None

  def keys(self) -> list[str]:
    return list(self.entries)

  def get(self, name: str) -> np.ndarray:
    e = self.entries[name]
    if e["dtype"] not in _TO_NUMPY:
      raise ValueError(f"{self.path}: tensor {name!r} has unsupported dtype {e['dtype']}")
    begin, end = e["data_offsets"]
    raw = self._map[self._data_start + begin:self._data_start + end] if end > begin else np.zeros(0, np.uint8)
    return raw.view(_TO_NUMPY[e["dtype"]]).reshape(e["shape"])


class CheckpointReader:
  """All tensors of a checkpoint directory, single-file or sharded with an index."""

  def __init__(self, directory: str):
    single, index = os.path.join(directory, SINGLE_FILE), os.path.join(directory, INDEX_FILE)
    if os.path.exists(index):
      with open(index) as f:
        weight_map: dict[str, str] = json.load(f)["weight_map"]
      files = {fn: None for fn in weight_map.values()}
      for fn in files:
        if not os.path.exists(os.path.join(directory, fn)):
          raise FileNotFoundError(f"{index} names shard {fn}, which is missing from {directory}")
      opened = {fn: SafetensorsFile(os.path.join(directory, fn)) for fn in files}
      self._where = {name: opened[fn] for name, fn in weight_map.items()}
    elif os.path.exists(single):
      f = SafetensorsFile(single)
      self._where = {name: f for name in f.keys()}
    else:
      raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in {directory}")

  def keys(self) -> list[str]:
    return list(self._where)

  def __contains__(self, name: str) -> bool:
    return name in self._where

  def get(self, name: str) -> np.ndarray:
    if name not in self._where:
      raise KeyError(f"checkpoint has no tensor {name!r}")
    return self._where[name].get(name)


def write_checkpoint(directory: str, tensors: Iterable[tuple[str, tuple[int, ...], np.dtype]],
                     produce: Callable[[str], np.ndarray], max_shard_bytes: int = 5 * 2**30) -> list[str]:
  """Writes tensors (name, shape, dtype) to `directory`, calling `produce(name)` for each one's data.

  Files above `max_shard_bytes` are split into shards with an index, as transformers does.
  Returns the file names written.
  """
  tensors = list(tensors)
  shards: list[list[tuple[str, tuple[int, ...], np.dtype]]] = [[]]
  size = 0
  for t in tensors:
    nbytes = int(np.prod(t[1], dtype=np.int64)) * np.dtype(t[2]).itemsize
    if shards[-1] and size + nbytes > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(t)
    size += nbytes
  if len(shards) == 1:
    names = [SINGLE_FILE]
  else:
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
  weight_map = {}
  for fn, shard in zip(names, shards):
    _write_file(os.path.join(directory, fn), shard, produce)
    weight_map.update({name: fn for name, _, _ in shard})
  if len(shards) > 1:
    total = sum(int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize for _, s, d in tensors)
    with open(os.path.join(directory, INDEX_FILE), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
  return names


def write_file(path: str, tensors: dict[str, np.ndarray]) -> None:
  """One safetensors file of in-memory arrays, for outputs small enough to hold at once (LoRA adapters)."""
  _write_file(path, [(name, arr.shape, arr.dtype) for name, arr in tensors.items()], tensors.__getitem__)


def _write_file(path: str, shard, produce) -> None:
  header: dict = {"__metadata__": {"format": "pt"}}
  offset = 0
  for name, shape, dtype in shard:
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if np.dtype(dtype) not in _FROM_NUMPY:
      raise ValueError(f"cannot write tensor {name!r} of dtype {dtype}")
    header[name] = {"dtype": _FROM_NUMPY[np.dtype(dtype)], "shape": list(shape),
                    "data_offsets": [offset, offset + nbytes]}
    offset += nbytes
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)  # keeps tensor data 8-byte aligned
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for name, shape, dtype in shard:
      arr = np.ascontiguousarray(produce(name), dtype=dtype)
      if arr.shape != tuple(shape):
        raise ValueError(f"tensor {name!r}: produced shape {arr.shape}, declared {tuple(shape)}")
      f.flush()
      arr.tofile(f)
  os.replace(tmp, path)
