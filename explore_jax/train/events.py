"""TensorBoard event files of scalars, written with the standard library and google-crc32c (through
explore_jax.storage, so in a bucket too).

An event file is a sequence of records, each framed as TensorFlow's TFRecord: the payload's length (uint64,
little-endian), a masked CRC-32C of those 8 bytes, the payload, and a masked CRC-32C of the payload. Every payload
is a serialised `tensorflow.Event`: first one naming the file format ("brain.Event:2"), then one per logged step
holding a `Summary` of (tag, simple_value) pairs. Those three protobuf messages need only seven fields, encoded
here by hand (field numbers from tensorflow/core/util/event.proto and tensorflow/core/framework/summary.proto).

This is what the run's metrics need of TensorBoard. A general writer (tensorboardX) imports torch when it is
installed, ~3 s of CPU in every learner process for a feature the learner never uses.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from typing import Mapping, Optional

import google_crc32c

from explore_jax import storage

FILE_VERSION = "brain.Event:2"


def _varint(n: int) -> bytes:
  out = bytearray()
  n &= (1 << 64) - 1  # a negative int64 is written as its two's complement
  while True:
    byte, n = n & 0x7F, n >> 7
    out.append(byte | (0x80 if n else 0))
    if not n:
      return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
  return _varint(number << 3 | wire_type) + payload


def _length_delimited(number: int, payload: bytes) -> bytes:
  return _field(number, 2, _varint(len(payload)) + payload)


def encode_event(wall_time: float, step: int = 0, *, file_version: Optional[str] = None,
                 scalars: Optional[Mapping[str, float]] = None) -> bytes:
  """A serialised Event: wall_time (1, double), step (2, int64), file_version (3, string) or a summary (5), whose
  Summary.value (1) entries are each Summary.Value{tag (1, string), simple_value (2, float)}."""
  out = _field(1, 1, struct.pack("<d", wall_time))
  if step:
    out += _field(2, 0, _varint(step))
  if file_version is not None:
    out += _length_delimited(3, file_version.encode())
  if scalars:
    values = b"".join(_length_delimited(1, _length_delimited(1, tag.encode()) + _field(2, 5, struct.pack("<f", v)))
                      for tag, v in scalars.items())
    out += _length_delimited(5, values)
  return out


def _masked_crc(data: bytes) -> int:
  crc = google_crc32c.value(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(payload: bytes) -> bytes:
  """`payload` as one TFRecord."""
  length = struct.pack("<Q", len(payload))
  return length + struct.pack("<I", _masked_crc(length)) + payload + struct.pack("<I", _masked_crc(payload))


_files = itertools.count()


def file_name(wall_time: float) -> str:
  """A new event file's name as TensorBoard's writers give it (TensorBoard reads any name containing "tfevents"):
  the time, host and process, and a count of the files this process opened, so two never share a name."""
  return f"events.out.tfevents.{int(wall_time):010d}.{socket.gethostname()}.{os.getpid()}.{next(_files)}"


class EventFile:
  """A new event file in `directory` (local or a bucket, explore_jax.storage), written at each flush: appended to
  locally; in a bucket, whose objects cannot be appended to, uploaded whole (its bytes are kept for that)."""

  def __init__(self, directory: str):
    now = time.time()
    storage.makedirs(directory)
    self.path = os.path.join(directory, file_name(now))
    self._remote = storage.is_remote(directory)
    self._pending = bytearray(frame(encode_event(now, file_version=FILE_VERSION)))
    self._written = bytearray()

  def add_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    self._pending += frame(encode_event(time.time(), step, scalars=scalars))

  def flush(self) -> None:
    if self._remote:
      self._written += self._pending
      with storage.open(self.path, "wb") as f:
        f.write(bytes(self._written))
    elif self._pending:
      with open(self.path, "ab") as f:
        f.write(self._pending)
    self._pending.clear()

  close = flush
