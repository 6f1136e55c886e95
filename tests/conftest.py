"""Test setup: eight fake CPU devices for sharding tests (XLA_FLAGS must be set before jax loads); a local Cloud
Storage emulator for the tests of bucket run directories."""
import os

import pytest

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()

GCS_BUCKET = "test-bucket"


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
  """gs://test-bucket on a local Cloud Storage emulator (tests/gcs_emulator.py), started on first use and kept for
  the session (gcsfs keeps its client per process), with this process pointed at it; yields the emulator's URL
  for child processes' STORAGE_EMULATOR_HOST. Each test writes under a prefix of its own."""
  from tests import gcs_emulator

  with gcs_emulator.emulator(GCS_BUCKET, str(tmp_path_factory.mktemp("gcs"))) as url, \
      gcs_emulator.this_process_on(url):
    yield url
