"""The client side of an ALFWorld game process (worker.py): one process per environment, JSON lines on pipes.

textworld runs only in the game process, so the environment's own process never imports it. A request
that fails in the game raises ALFWorldError with the game's message; a process that dies or stops
answering raises it too, with its exit code and the last lines it wrote to stderr, and the owner starts
a new one (ALFWorldEnv does so on its next reset).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

from explore_jax.envs.processes import PipedChild, end_on_eof

_TIMEOUTS = {"load": 600.0, "step": 120.0, "plan": 600.0, "generate": 600.0}  # seconds per request


class ALFWorldError(RuntimeError):
  """The game process failed a request or died. reset() starts a new process where it died."""


def _stop(process: subprocess.Popen) -> None:
  end_on_eof(process)  # the process leaves when its stdin closes
  for stream in (process.stdin, process.stdout):
    try:
      stream.close()
    except Exception:
      pass


class GameProcess(PipedChild):
  """The game process (worker.py) of one environment: requests out, answers back, on pipes.

  Args:
    memoize: let the process skip textworld's repeated parsing and translating (worker.py).
    name: the name used in error messages.
  """

  def __init__(self, memoize: bool = True, name: str = "ALFWorld"):
    super().__init__(name)
    self.memoize = memoize

  def start(self) -> None:
    """Start a fresh process (stopping the current one, if any)."""
    self.close()
    self._stderr.clear()
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "explore_jax.envs.alfworld.worker"]
    if not self.memoize:
      command.append("--exact")
    try:
      process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env=env, bufsize=0)
    except OSError as e:
      raise ALFWorldError(f"{self.name}: the game process did not start ({e})") from e
    threading.Thread(target=self._drain, args=(process.stderr,), daemon=True).start()
    self._own(process, _stop, process)

  def _drain(self, stream: Any) -> None:
    for line in iter(stream.readline, b""):
      self._stderr.append(line.decode("utf-8", "replace").rstrip())
    stream.close()

  def call(self, op: str, **args: Any) -> dict[str, Any]:
    """Send a request and return its answer; any failure raises ALFWorldError."""
    if self.process is None:
      raise ALFWorldError(f"{self.name}: no game process is running; reset() starts one")
    try:
      self.process.stdin.write((json.dumps({"op": op, **args}) + "\n").encode("utf-8"))
      self.process.stdin.flush()
      line = self._read_line(_TIMEOUTS.get(op, 120.0), op)
    except (OSError, ValueError) as e:  # a closed pipe: the process is gone
      raise self._died(op) from e
    if not line:
      raise self._died(op)
    answer = json.loads(line)
    if not answer.pop("ok", False):
      raise ALFWorldError(f"{self.name}: {op} failed in the game process: {answer.get('error')}")
    return answer

  def _read_line(self, timeout: float, op: str) -> bytes:
    stdout = self.process.stdout
    chunks, deadline = [], time.monotonic() + timeout
    while True:
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([stdout], [], [], left)[0]:
        self.close()
        raise ALFWorldError(f"{self.name}: the game process did not answer {op} within "
                            f"{timeout:.0f} s and was stopped; the next reset() starts a new one")
      chunk = os.read(stdout.fileno(), 1 << 20)
      if not chunk:
        return b""
      chunks.append(chunk)
      if chunk.endswith(b"\n"):
        return b"".join(chunks)

  def _died(self, op: str) -> ALFWorldError:
    code = None
    if self.process is not None:
      try:
        code = self.process.wait(timeout=5)
      except subprocess.TimeoutExpired:
        code = None
    time.sleep(0.05)  # let the stderr reader catch the last lines
    lines = [line for line in self._stderr if line.strip()]
    tail = ("\ngame process stderr:\n" + "\n".join(lines)) if lines else ""
    return ALFWorldError(f"{self.name}: the game process died (exit code {code}) during {op}; the "
                         f"next reset() starts a new one{tail}")
