"""Test setup: eight fake CPU devices for sharding tests (XLA_FLAGS must be set before jax loads); one store of
compiled programs for every run and for the test processes themselves; the files with slow tests first; a local
Cloud Storage emulator for the tests of bucket run directories; a nano model."""
import os

import pytest

from explore_jax import cache

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()

# Runs the tests start share the machine's compiled programs (train/xla_cache.py), those with a fresh cache root of
# their own too: a loaded program is the one compiled before, so no result changes, and a run compiles only what
# no earlier run on this machine did.
os.environ.setdefault("EXPLORE_JAX_XLA_CACHE", cache.xla_root())

# The test processes themselves keep and load their compiled programs there as well (under their own machine tag:
# XLA_FLAGS above is part of it), down to the small ones: most of an in-process test's time on the CPU is
# compiling the tiny models' programs, many of them the same from one test to the next and from one `make test` to
# the next. (tests/train/test_learner.py alone on 2 cores: 147 s without the store, 78 s loading what took 0.5 s
# or more to compile, 53 s with this threshold.)
from explore_jax.train import xla_cache  # noqa: E402  (jax loads here, after XLA_FLAGS)

xla_cache.enable(min_compile_seconds=0.05)

GCS_BUCKET = "test-bucket"


def pytest_collection_modifyitems(config, items):
  """Files with a slow test run first. `make test` hands whole files to its two workers (--dist=loadfile) in
  collection order, so a long file collected last would finish alone while the other worker sits idle."""
  slow = {item.path for item in items if item.get_closest_marker("slow")}
  items.sort(key=lambda item: item.path not in slow)  # stable: the order within each part is kept


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
  """gs://test-bucket on a local Cloud Storage emulator (tests/gcs_emulator.py), started on first use and kept for
  the session (gcsfs keeps its client per process), with this process pointed at it; yields the emulator's URL
  for child processes' STORAGE_EMULATOR_HOST. Each test writes under a prefix of its own."""
  from tests import gcs_emulator

  with gcs_emulator.emulator(GCS_BUCKET, str(tmp_path_factory.mktemp("gcs"))) as url, \
      gcs_emulator.this_process_on(url):
    yield url


# A model a tenth of the tiny one's compute (2 layers of width 64, the tiny tokenizer), for the end-to-end tests of
# the run's mechanics: exact resume, buckets, overlapped rollouts, several processes. What they check holds for any
# model; the tiny model's own behaviour (learning, parity with transformers) is tested with the tiny model.
NANO = dict(hidden_size=64, intermediate_size=128, num_layers=2, head_dim=8)  # the tiny's 8 heads, 4 for K and V


@pytest.fixture(scope="session")
def nano_checkpoint(tmp_path_factory) -> str:
  """The nano model (random weights) as a local Hugging Face directory, as a user's own checkpoint is given:
  `--config.model.checkpoint=<it>`."""
  import jax

  from explore_jax import hf
  from explore_jax.models import Model
  from explore_jax.models.config import PRESETS

  config = PRESETS["tiny"].replace(**NANO)
  params = Model(config).init(jax.random.key(0))
  return hf.save_pretrained(str(tmp_path_factory.mktemp("nano")), config, params, hf.load_tokenizer(hf.TINY_ASSETS))
