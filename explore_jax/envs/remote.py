"""Remote environments: an HTTP/JSON server hosting gymnasium text environments, and its client.

For environments that live on another machine or in another process (an Android emulator, a browser
farm), as SGE ran AndroidWorld. The server hosts any number of instances, each made with
`gymnasium.make(env_id, **kwargs)`; `RemoteEnv` is a `gymnasium.Env` that forwards to one of them,
so an actor cannot tell it from a local environment (same observation, reward, terminated, truncated
and info, after a JSON round trip: tuples arrive as lists, numpy scalars as Python numbers).

Protocol: POST a JSON object to /create {env_id, kwargs} -> {id, observation_space, action_space};
/reset {id, seed, options} -> {observation, info}; /step {id, action} -> {observation, reward,
terminated, truncated, info}; /call {id, method, args} -> {result} (only the server's
`callable_methods`, e.g. oracle_action); /close {id}. GET /health -> {ok, envs}. A failure answers
with an HTTP error status and {error, type, traceback}; the client raises `RemoteEnvError` with the
server's message. Observation and action spaces may be Text, Box (images) or a Dict of them; an array
in an observation travels as {"__ndarray__": base64 of its bytes, "dtype", "shape"} and arrives as the same
array, bit for bit (a MiniWoB screenshot, 160 x 210 x 3 bytes, is about 134 kB of JSON).

Serve: `python -m explore_jax.envs.remote --port=8765 [--host=127.0.0.1] [--import=my.envs]`.
The server binds to 127.0.0.1 unless told otherwise: it runs whatever environment a client names.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import http.client
import importlib
import itertools
import json
import sys
import threading
import traceback
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Sequence

import gymnasium
import numpy as np
from gymnasium import spaces

DEFAULT_PORT = 8765
_MAX_BODY = 64 << 20


class RemoteEnvError(RuntimeError):
  """A remote environment call failed: the server reported an error, or it could not be reached."""


class RemoteEnvTimeout(RemoteEnvError, TimeoutError):
  """The server did not answer within the client's timeout."""


class _RequestError(Exception):
  """A client mistake (unknown route, unknown id, bad body): answered with HTTP 400."""


def _to_json(value: Any) -> Any:
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  if isinstance(value, (set, frozenset)):
    return sorted(value)
  raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _dumps(payload: Any) -> bytes:
  return json.dumps(payload, default=_to_json).encode("utf-8")


def encode_observation(observation: Any) -> Any:
  """An observation as JSON can carry it: arrays tagged with their bytes, dtype and shape; dicts per key."""
  if isinstance(observation, np.ndarray):
    data = np.ascontiguousarray(observation)
    return {"__ndarray__": base64.b64encode(data.tobytes()).decode("ascii"), "dtype": data.dtype.str,
            "shape": list(data.shape)}
  if isinstance(observation, dict):
    return {key: encode_observation(value) for key, value in observation.items()}
  return observation


def decode_observation(observation: Any) -> Any:
  """The inverse of `encode_observation`."""
  if isinstance(observation, dict):
    if "__ndarray__" in observation:
      data = base64.b64decode(observation["__ndarray__"])
      return np.frombuffer(data, np.dtype(observation["dtype"])).reshape(observation["shape"]).copy()
    return {key: decode_observation(value) for key, value in observation.items()}
  return observation


def space_to_spec(space: gymnasium.Space) -> dict[str, Any]:
  """The JSON description of a Text, Box or Dict space (the kinds the protocol carries)."""
  if isinstance(space, spaces.Text):
    return dict(type="Text", min_length=space.min_length, max_length=space.max_length,
                charset=space.characters)
  if isinstance(space, spaces.Box):
    return dict(type="Box", shape=list(space.shape), dtype=space.dtype.str, low=encode_observation(space.low),
                high=encode_observation(space.high))
  if isinstance(space, spaces.Dict):
    return dict(type="Dict", spaces={key: space_to_spec(sub) for key, sub in space.spaces.items()})
  raise TypeError(f"remote environments carry Text, Box and Dict spaces, got {space}")


def space_from_spec(spec: dict[str, Any]) -> gymnasium.Space:
  """The space a `space_to_spec` description stands for."""
  kind = spec.get("type")
  if kind == "Text":
    return spaces.Text(int(spec["max_length"]), min_length=int(spec["min_length"]), charset=spec["charset"])
  if kind == "Box":
    return spaces.Box(decode_observation(spec["low"]), decode_observation(spec["high"]), tuple(spec["shape"]),
                      np.dtype(spec["dtype"]))
  if kind == "Dict":
    return spaces.Dict({key: space_from_spec(sub) for key, sub in spec["spaces"].items()})
  raise RemoteEnvError(f"unsupported space description {spec!r}")


@dataclasses.dataclass
class _Hosted:
  env: gymnasium.Env
  lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class EnvServer:
  """Hosts gymnasium text environments for `RemoteEnv` clients over HTTP with JSON bodies.

  Args:
    host: interface to bind; 127.0.0.1 by default (anything wider exposes environment creation).
    port: TCP port; 0 picks a free one (see `url`).
    callable_methods: environment methods clients may call through /call.
    verbose: log every request to stderr.
  """

  def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
               callable_methods: Sequence[str] = ("oracle_action",), verbose: bool = False):
    self.callable_methods = frozenset(callable_methods)
    self._envs: dict[str, _Hosted] = {}
    self._lock = threading.Lock()
    self._ids = itertools.count()
    self._thread: threading.Thread | None = None
    self.httpd = ThreadingHTTPServer((host, port), _handler_class(self, verbose))
    self.httpd.daemon_threads = True

  @property
  def url(self) -> str:
    host, port = self.httpd.server_address[:2]
    return f"http://{host}:{port}"

  def serve_forever(self) -> None:
    self.httpd.serve_forever()

  def start(self) -> "EnvServer":
    """Serve from a daemon thread; returns self."""
    self._thread = threading.Thread(target=self.serve_forever, name="EnvServer", daemon=True)
    self._thread.start()
    return self

  def shutdown(self) -> None:
    """Stop serving and close every hosted environment."""
    if self._thread is not None:
      self.httpd.shutdown()
      self._thread.join()
      self._thread = None
    self.httpd.server_close()
    with self._lock:
      hosted, self._envs = list(self._envs.values()), {}
    for entry in hosted:
      entry.env.close()

  def __enter__(self) -> "EnvServer":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.shutdown()

  @property
  def num_envs(self) -> int:
    with self._lock:
      return len(self._envs)

  def handle(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
    """Answer one request; `_RequestError` for client mistakes, anything else for env errors."""
    if route == "create":
      return self._create(body)
    if route not in ("reset", "step", "call", "close"):
      raise _RequestError(f"unknown route /{route}")
    handle = body.get("id")
    with self._lock:
      entry = self._envs.get(handle) if isinstance(handle, str) else None
      if route == "close" and entry is not None:
        del self._envs[handle]
    if entry is None:
      raise _RequestError(f"no environment {handle!r} on this server")
    if route == "close":
      with entry.lock:
        entry.env.close()
      return dict(closed=True)
    with entry.lock:
      env = entry.env
      if route == "reset":
        observation, info = env.reset(seed=body.get("seed"), options=body.get("options"))
        return dict(observation=encode_observation(observation), info=info)
      if route == "step":
        observation, reward, terminated, truncated, info = env.step(body.get("action"))
        return dict(observation=encode_observation(observation), reward=float(reward), terminated=bool(terminated),
                    truncated=bool(truncated), info=info)
      method = body.get("method")
      if method not in self.callable_methods:
        raise _RequestError(f"method {method!r} is not callable remotely; "
                            f"allowed: {sorted(self.callable_methods)}")
      return dict(result=env.get_wrapper_attr(method)(*body.get("args", [])))

  def _create(self, body: dict[str, Any]) -> dict[str, Any]:
    env_id, kwargs = body.get("env_id"), body.get("kwargs") or {}
    if not isinstance(env_id, str) or not isinstance(kwargs, dict):
      raise _RequestError("create needs {env_id: str, kwargs: object}")
    env = gymnasium.make(env_id, **kwargs)
    try:
      reply = dict(observation_space=space_to_spec(env.observation_space),
                   action_space=space_to_spec(env.action_space))
    except TypeError:
      env.close()
      raise
    handle = f"env-{next(self._ids)}"
    with self._lock:
      self._envs[handle] = _Hosted(env)
    return dict(id=handle, **reply)


def _handler_class(server: EnvServer, verbose: bool) -> type[BaseHTTPRequestHandler]:

  class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
      if self.path.rstrip("/") == "/health":
        self._reply(200, dict(ok=True, envs=server.num_envs))
      else:
        self._reply(404, dict(error=f"unknown route {self.path}", type="NotFound", traceback=""))

    def do_POST(self) -> None:
      try:
        body = self._read_body()
        payload = _dumps(server.handle(self.path.strip("/"), body))
      except _RequestError as e:
        self._error(400, e)
        return
      except Exception as e:  # the environment's error goes back to the client, not to a log
        self._error(500, e)
        return
      self._send(200, payload)

    def _read_body(self) -> dict[str, Any]:
      try:
        length = int(self.headers.get("Content-Length") or 0)
      except ValueError:
        raise _RequestError("bad Content-Length") from None
      if length > _MAX_BODY:
        raise _RequestError(f"request body of {length} bytes exceeds {_MAX_BODY}")
      try:
        body = json.loads(self.rfile.read(length) or b"{}")
      except json.JSONDecodeError as e:
        raise _RequestError(f"the request body is not JSON: {e}") from None
      if not isinstance(body, dict):
        raise _RequestError("the request body must be a JSON object")
      return body

    def _error(self, status: int, error: Exception) -> None:
      self._reply(status, dict(error=str(error), type=type(error).__name__,
                               traceback=traceback.format_exc()))

    def _reply(self, status: int, payload: dict[str, Any]) -> None:
      self._send(status, _dumps(payload))

    def _send(self, status: int, payload: bytes) -> None:
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(payload)))
      self.end_headers()
      self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
      if verbose:
        super().log_message(format, *args)

  return Handler


class RemoteEnv(gymnasium.Env):
  """A gymnasium.Env whose instance lives on an `EnvServer`; behaves like the local environment.

  Args:
    url: the server, e.g. "http://127.0.0.1:8765".
    env_id: gymnasium id the server makes (it must be registered there).
    env_kwargs: keyword arguments for the server's `gymnasium.make`.
    timeout: seconds to wait for any one answer before raising `RemoteEnvTimeout`.
    render_mode: None or "ansi" (render() returns the last observation; nothing is asked remotely).
  """

  metadata = {"render_modes": ["ansi"], "render_fps": 1}  # a frame rate only to quiet check_env

  def __init__(self, url: str, env_id: str, env_kwargs: dict[str, Any] | None = None,
               timeout: float = 60.0, render_mode: str | None = None):
    self.url = url.rstrip("/")
    self.timeout = timeout
    self.render_mode = render_mode
    # Direct connections: proxy settings from the environment must not reroute a loopback server.
    self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    self._closed = True
    reply = self._post("create", env_id=env_id, kwargs=dict(env_kwargs or {}))
    self._id = reply["id"]
    self._closed = False
    self.observation_space = space_from_spec(reply["observation_space"])
    self.action_space = space_from_spec(reply["action_space"])
    self._last_observation: Any = None

  def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
    super().reset(seed=seed)
    reply = self._post("reset", id=self._id, seed=seed, options=options)
    observation = self._last_observation = decode_observation(reply["observation"])
    return observation, reply["info"]

  def step(self, action: Any):
    reply = self._post("step", id=self._id, action=action)
    observation = self._last_observation = decode_observation(reply["observation"])
    return (observation, float(reply["reward"]), bool(reply["terminated"]),
            bool(reply["truncated"]), reply["info"])

  def call(self, method: str, *args: Any) -> Any:
    """Call one of the server's `callable_methods` on the remote environment."""
    return self._post("call", id=self._id, method=method, args=list(args))["result"]

  def oracle_action(self) -> str:
    """The remote environment's oracle action (when it has one and the server allows it)."""
    return self.call("oracle_action")

  def render(self) -> str | None:
    if self.render_mode != "ansi":
      return None
    last = self._last_observation
    return last.get("text") if isinstance(last, dict) else last

  def close(self) -> None:
    if self._closed:
      return
    try:
      self._post("close", id=self._id)
    finally:
      self._closed = True  # a failed close is not retried: the server may be gone for good

  def _post(self, route: str, **payload: Any) -> dict[str, Any]:
    if self._closed and route != "create":
      raise RemoteEnvError(f"the remote environment is closed; cannot {route}")
    try:
      data = json.dumps(payload).encode("utf-8")
    except (TypeError, ValueError) as e:
      raise TypeError(f"{route}: the request is not JSON serializable ({e})") from None
    request = urllib.request.Request(f"{self.url}/{route}", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    timed_out = RemoteEnvTimeout(f"{route}: no answer from {self.url} within {self.timeout} s")
    try:
      with self._opener.open(request, timeout=self.timeout) as response:
        body = response.read()
    except urllib.error.HTTPError as e:
      raise RemoteEnvError(f"{route} failed on {self.url}: {_server_message(e)}") from None
    except urllib.error.URLError as e:  # urllib wraps a timeout while connecting, not while reading
      if isinstance(e.reason, TimeoutError):
        raise timed_out from None
      raise RemoteEnvError(f"{route}: cannot reach {self.url}: {e.reason}") from None
    except TimeoutError:
      raise timed_out from None
    except (OSError, http.client.HTTPException) as e:
      raise RemoteEnvError(f"{route}: connection to {self.url} failed: {e!r}") from None
    try:
      return json.loads(body)
    except json.JSONDecodeError:
      raise RemoteEnvError(f"{route}: {self.url} answered with something other than JSON") from None


def _server_message(error: urllib.error.HTTPError) -> str:
  try:
    reply = json.loads(error.read())
    return f"{reply['type']}: {reply['error']}"
  except Exception:  # a proxy or a foreign server: fall back to the status line
    return f"HTTP {error.code} {error.reason}"


def main(argv: Sequence[str] | None = None) -> None:
  """Serve environments until interrupted."""
  parser = argparse.ArgumentParser(prog="python -m explore_jax.envs.remote", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default loopback)")
  parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (0: any free one)")
  parser.add_argument("--import", dest="modules", action="append", default=[],
                      help="module to import for its gymnasium registrations (repeatable)")
  parser.add_argument("--verbose", action="store_true", help="log every request")
  args = parser.parse_args(argv)
  importlib.import_module("explore_jax.envs")
  for module in args.modules:
    importlib.import_module(module)
  server = EnvServer(args.host, args.port, verbose=args.verbose)
  print(f"serving environments on {server.url}", flush=True)
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    server.shutdown()


if __name__ == "__main__":
  main(sys.argv[1:])
