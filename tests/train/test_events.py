"""TensorBoard event files written by explore_jax/train/events.py read as tensorboardX's own: the same framing
(checked CRCs), the same Event and Summary messages, parsed by tensorboardX's protobufs."""

import struct

import google_crc32c
import numpy as np
import pytest

from explore_jax.train import events, metrics as metrics_lib

tensorboardX = pytest.importorskip("tensorboardX")
from tensorboardX.proto import event_pb2  # noqa: E402  (after the skip)


def _masked(data: bytes) -> int:
  crc = google_crc32c.value(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_events(path) -> list:
  """Every Event in a file, each record's two CRCs checked as TensorFlow's reader checks them."""
  data, out, i = open(path, "rb").read(), [], 0
  while i < len(data):
    header = data[i:i + 8]
    (length,) = struct.unpack("<Q", header)
    assert struct.unpack("<I", data[i + 8:i + 12])[0] == _masked(header)
    payload = data[i + 12:i + 12 + length]
    assert struct.unpack("<I", data[i + 12 + length:i + 16 + length])[0] == _masked(payload)
    out.append(event_pb2.Event.FromString(payload))
    i += 16 + length
  assert i == len(data)
  return out


def _scalars(evs) -> list:
  """(step, tag, value) of every scalar, in order."""
  return [(e.step, v.tag, v.simple_value) for e in evs for v in e.summary.value]


ROWS = [(1, {"success_rate": 0.1, "return": 1.5}), (2, {"success_rate": 0.25, "loss": -3.0e-7}),
        (300, {"return": 2.0, "kl/approx": 1e30}), (2**40, {"success_rate": 1.0})]


def test_our_event_file_reads_as_tensorboardxs(tmp_path):
  theirs = tensorboardX.SummaryWriter(str(tmp_path / "theirs"))
  for step, scalars in ROWS:
    for tag, v in scalars.items():
      theirs.add_scalar(tag, v, step)
  theirs.close()
  ours = events.EventFile(str(tmp_path / "ours"))
  for step, scalars in ROWS:
    ours.add_scalars(step, scalars)
    ours.flush()
  ours.close()
  [their_file] = (tmp_path / "theirs").iterdir()
  [our_file] = (tmp_path / "ours").iterdir()
  assert "tfevents" in our_file.name
  theirs, ours = read_events(their_file), read_events(our_file)
  assert ours[0].file_version == theirs[0].file_version == events.FILE_VERSION
  assert _scalars(ours) == _scalars(theirs) and len(_scalars(ours)) == 7
  assert all(e.wall_time > 1.7e9 for e in ours)
  assert ours[1].summary.value[0].simple_value == np.float32(0.1)  # stored as a 32-bit float, as theirs


def test_two_files_of_one_process_in_one_second_have_two_names(tmp_path):
  a, b = events.EventFile(str(tmp_path)), events.EventFile(str(tmp_path))
  a.close(), b.close()
  assert a.path != b.path and len(list(tmp_path.iterdir())) == 2


def test_metrics_writer_mirrors_finite_scalars_to_tensorboard(tmp_path):
  w = metrics_lib.MetricsWriter(str(tmp_path))
  w.write(1, {"success_rate": 0.5, "loss": float("nan"), "note": "text"})
  w.write(2, {"success_rate": 0.75, "return": np.float32(2.0)})
  w.close()
  [path] = (tmp_path / "tensorboard").iterdir()
  assert _scalars(read_events(path)) == [(1, "success_rate", 0.5), (2, "success_rate", 0.75), (2, "return", 2.0)]
