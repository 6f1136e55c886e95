"""Remote environments: a loopback EnvServer and RemoteEnv behave like the local environment."""

import json
import os
import socket
import string
import subprocess
import sys
import time
import urllib.error
import urllib.request

import gymnasium
import numpy as np
import pytest

from explore_jax.envs import (EnvServer, KeyDoorEnv, ParallelCopies, RemoteEnv, RemoteEnvError,
                              RemoteEnvTimeout)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def server():
  with EnvServer(port=0) as server:
    yield server


def _episode(env, seed, policy):
  """(observation, reward, terminated, truncated, info) of every reset and step of one episode."""
  observation, info = env.reset(seed=seed)
  trace = [(observation, info)]
  while True:
    result = env.step(policy())
    trace.append(result)
    if result[2] or result[3]:
      return trace


def test_an_oracle_episode_through_the_server_equals_the_local_one(server):
  remote = RemoteEnv(server.url, "explore_jax/KeyDoor-v0", env_kwargs=dict(num_rooms=5))
  local = KeyDoorEnv(num_rooms=5)
  assert remote.observation_space == local.observation_space
  assert remote.action_space == local.action_space
  for seed in range(3):
    remote_trace = _episode(remote, seed, remote.oracle_action)
    assert remote_trace == _episode(local, seed, local.oracle_action)
    assert remote_trace[-1][1] == 1.0 and remote_trace[-1][4]["success"]
  remote.close()
  remote.close()  # closing twice is allowed, as gymnasium asks


def test_malformed_actions_and_parallel_copies_travel_unchanged(server):
  remote = RemoteEnv(server.url, "explore_jax/Parallel-v0",
                     env_kwargs=dict(env="explore_jax/KeyDoor-v0", num_copies=2))
  local = ParallelCopies("explore_jax/KeyDoor-v0", num_copies=2)
  assert remote.reset(seed=5) == local.reset(seed=5)
  for response in [None, "", "ключ", "<parallel><env_2>go left</env_2></parallel>"]:
    assert remote.step(response) == local.step(response)
  remote.close()


def test_a_server_side_error_raises_on_the_client_with_the_servers_message(server):
  with pytest.raises(RemoteEnvError, match="create failed .*NameNotFound: Environment `NoSuchEnv`"):
    RemoteEnv(server.url, "explore_jax/NoSuchEnv-v0")
  with pytest.raises(RemoteEnvError, match="create failed .*num_rooms must be at least 2"):
    RemoteEnv(server.url, "explore_jax/KeyDoor-v0", env_kwargs=dict(num_rooms=1))
  remote = RemoteEnv(server.url, "explore_jax/KeyDoor-v0", env_kwargs=dict(max_steps=1))
  remote.reset(seed=0)
  remote.step("go left")
  with pytest.raises(RemoteEnvError, match="step failed .*RuntimeError: no episode is running"):
    remote.step("go left")
  with pytest.raises(RemoteEnvError, match="'close' is not callable remotely"):
    remote.call("close")
  remote.close()
  with pytest.raises(RemoteEnvError, match="closed"):
    remote.reset()


def test_unknown_instances_and_bad_bodies_are_client_errors(server):
  request = urllib.request.Request(f"{server.url}/step", data=b"[1, 2]", method="POST")
  with pytest.raises(urllib.error.HTTPError) as error:
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=5)
  assert error.value.code == 400
  assert json.loads(error.value.read())["error"] == "the request body must be a JSON object"
  remote = RemoteEnv(server.url, "explore_jax/KeyDoor-v0")
  remote._id = "env-999"
  with pytest.raises(RemoteEnvError, match="no environment 'env-999'"):
    remote.reset()


def test_a_server_that_never_answers_times_out_on_the_client():
  with socket.socket() as silent:  # accepts connections (backlog) but never reads or replies
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    start = time.monotonic()
    with pytest.raises(RemoteEnvTimeout, match="no answer"):
      RemoteEnv(url, "explore_jax/KeyDoor-v0", timeout=0.3)
    assert time.monotonic() - start < 3.0


def test_an_unreachable_server_is_a_clear_error():
  with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]  # nothing listens on it once the probe closes
  with pytest.raises(RemoteEnvError, match="cannot reach"):
    RemoteEnv(f"http://127.0.0.1:{port}", "explore_jax/KeyDoor-v0", timeout=2)


def test_the_remote_id_is_registered_with_gymnasium(server):
  hosted = server.num_envs
  env = gymnasium.make("explore_jax/Remote-v0", url=server.url, env_id="explore_jax/KeyDoor-v0")
  assert server.num_envs == hosted + 1
  assert env.reset(seed=4)[0] == KeyDoorEnv().reset(seed=4)[0]
  env.close()
  assert server.num_envs == hosted


def test_the_command_line_server_serves_on_loopback():
  process = subprocess.Popen(
      [sys.executable, "-m", "explore_jax.envs.remote", "--port=0"], cwd=ROOT,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    line = process.stdout.readline()
    assert line.startswith("serving environments on http://127.0.0.1:"), process.stderr.read()
    url = line.split()[-1]
    remote = RemoteEnv(url, "explore_jax/KeyDoor-v0", timeout=10)
    assert remote.reset(seed=1)[0] == KeyDoorEnv().reset(seed=1)[0]
    remote.close()
  finally:
    process.terminate()
    process.wait(timeout=10)


class _Screen(gymnasium.Env):
  """A Dict observation of a screenshot and a text, as MiniWoB-v0's, on a tiny screen."""

  def __init__(self):
    self.observation_space = gymnasium.spaces.Dict({
        "screenshot": gymnasium.spaces.Box(0, 255, (6, 5, 3), np.uint8),
        "text": gymnasium.spaces.Text(64, charset=string.printable)})
    self.action_space = gymnasium.spaces.Text(64)

  def _observation(self):
    pixels = self.np_random.integers(0, 256, (6, 5, 3), dtype=np.uint8)
    return {"screenshot": pixels, "text": f"Task: click {int(pixels[0, 0, 0])}"}

  def reset(self, seed=None, options=None):
    super().reset(seed=seed)
    return self._observation(), {"step": 0}

  def step(self, action):
    return self._observation(), 0.5, action == "stop", False, {"step": 1, "pixels": np.arange(3)}


gymnasium.register("test_remote/Screen-v0", entry_point=_Screen)


def test_image_observations_and_their_spaces_travel_bit_for_bit(server):
  remote = RemoteEnv(server.url, "test_remote/Screen-v0", render_mode="ansi")
  local = _Screen()
  assert remote.observation_space == local.observation_space and remote.action_space == local.action_space
  for seed in (0, 1):
    (got, info), (want, want_info) = remote.reset(seed=seed), local.reset(seed=seed)
    assert info == want_info and got["text"] == want["text"]
    assert got["screenshot"].dtype == np.uint8 and np.array_equal(got["screenshot"], want["screenshot"])
    assert remote.observation_space.contains(got)
    got, reward, terminated, truncated, info = remote.step("stop")
    want = local.step("stop")
    assert np.array_equal(got["screenshot"], want[0]["screenshot"]) and got["text"] == want[0]["text"]
    assert (reward, terminated, truncated) == want[1:4] and info == {"step": 1, "pixels": [0, 1, 2]}
  assert remote.render() == got["text"]
  remote.close()
