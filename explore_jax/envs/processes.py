"""Child processes that never outlive their environment: a guardian `sh` in a session of its own, and a remover.

The GUI worlds (miniwob_browser.py's Chromium, desktop/'s X session) start their programs through `Guarded`:

- The guardian is a `sh -c SCRIPT` in a new session (so its process group is its own). SCRIPT starts the
  programs in the background, prints what the caller needs (pids, one a line), then waits on its stdin --
  the read end of a pipe whose write end only this process holds -- and, once the pipe closes, kills its
  process group (`kill -KILL 0`). The pipe closes on `stop()`, on garbage collection of the owner, or when
  this process dies in any way, SIGKILL included (a parent-death signal would not do: it fires when the
  *thread* that started the child ends, and EnvServer makes environments in request threads).
- The remover waits on the same pipe, then for the guardian's group to be gone (10 s at most), runs the
  caller's `cleanup` snippet (sh, with the folder as $0) and removes the folder. `stop()` does the same itself
  (killing the group, waiting until its last member has exited), then kills the remover: a remover only ever
  works after this process died first.
- `PipedChild` is the other kind: one program on pipes that leaves when its stdin closes (ALFWorld's game process,
  a Java world's JVM), so it cannot outlive this process either. It keeps what both owners need: the process, how
  many were started, the last lines of its stderr, and a finalizer that stops it once.
- `pid_alive` and `group_alive` treat a zombie as gone: it runs nothing and holds no files, and only its parent
  (a guardian, or whatever reaps orphans here) can reap it.

No jax, no selenium here: actors import this.
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import socket
import subprocess
import time
import weakref
from typing import Any, Callable, Mapping, Sequence

_STOP_TIMEOUT_S = 5.0
# The remover: waits on the guardian's pipe (so it wakes when this process dies, however it dies), then for the
# guardian's process group ($1) to be gone (10 s at most), runs the cleanup snippet ($2) and removes the folder ($0).
# (No "--" after kill's signal: dash, Debian's sh, takes it for a pid and fails at once.)
_REMOVER = r"""
cat >/dev/null
i=0
while kill -0 "-$1" 2>/dev/null && [ "$i" -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
[ -z "$2" ] || eval "$2"
exec rm -rf -- "$0"
"""


def pid_alive(pid: int | None) -> bool:
  """Whether process `pid` runs (a zombie does not): Linux's /proc, else signal 0."""
  if pid is None:
    return False
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
  except FileNotFoundError:
    return False
  except OSError:
    try:
      os.kill(pid, 0)
      return True
    except OSError:
      return False


def group_alive(pgid: int) -> bool:
  """Whether a process of process group `pgid` runs (zombies do not: a slow reaper may keep them a second):
  Linux's /proc, else signal 0 to the group (which counts zombies)."""
  try:
    entries = os.listdir("/proc")
  except OSError:
    try:
      os.killpg(pgid, 0)
      return True
    except OSError:
      return False
  for entry in entries:
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
      continue
    if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
      return True
  return False


def log_tail(path: str, lines: int, heading: str) -> str:
  """The end of an error message: the non-blank lines among the last `lines` of the log at `path`, after a line
  "<heading>:"; "" when there are none or the log cannot be read."""
  try:
    with open(path, errors="replace") as f:
      tail = [line.rstrip() for line in f.readlines()[-lines:] if line.strip()]
  except OSError:
    return ""
  return (f"\n{heading}:\n" + "\n".join(tail)) if tail else ""


def free_port() -> int:
  """A TCP port on 127.0.0.1 that was free a moment ago."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Guarded:
  """A guardian's process group and the remover of its folder (the module docstring).

  Args:
    script: the guardian's sh script; its arguments are `args` ($1, $2, ...); it must end by waiting on stdin
      (`cat >/dev/null`) and killing its group (`kill -KILL 0`).
    workdir: the folder the programs' files live in, removed by `stop()` or by the remover.
    env: the guardian's environment (None: this process's).
    cwd: the guardian's working folder (None: this process's).
    cleanup: a sh snippet run once the group is gone, before the folder goes ($0 is the folder).
    name: the guardian's $0, as `ps` shows it.
    prefix: a command the guardian's `sh` runs under, one that execs it in the same process (`unshare --net --`,
      `setpriv ... --`): the guardian keeps its pid and its session.
  """

  def __init__(self, script: str, args: Sequence[str], workdir: str, *, env: Mapping[str, str] | None = None,
               cwd: str | None = None, cleanup: str = "", name: str = "explore_jax-guardian",
               prefix: Sequence[str] = ()):
    self.workdir, self.cleanup = workdir, cleanup
    self._stopped = False
    read_end, write_end = os.pipe()
    try:
      self.guardian = subprocess.Popen(
          [*prefix, "sh", "-c", script, name, *args], stdin=read_end, stdout=subprocess.PIPE,
          stderr=subprocess.DEVNULL, start_new_session=True, env=None if env is None else dict(env), cwd=cwd)
      self.remover = subprocess.Popen(
          ["sh", "-c", _REMOVER, workdir, str(self.guardian.pid), cleanup], stdin=read_end,
          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except BaseException:
      os.close(write_end)  # a guardian already started stops with its pipe
      shutil.rmtree(workdir, ignore_errors=True)
      raise
    finally:
      os.close(read_end)
    self.lifeline = os.fdopen(write_end, "wb")  # the write end of the pipe both wait on

  @property
  def pid(self) -> int:
    """The guardian's pid, which is also its process group's id."""
    return self.guardian.pid

  @property
  def alive(self) -> bool:
    return not self._stopped and self.guardian.poll() is None

  def readline(self) -> str:
    """The guardian's next line of output ("" once it has ended)."""
    return self.guardian.stdout.readline().decode(errors="replace").strip()

  def read_pid(self, what: str) -> int:
    """The guardian's next line as a pid; OSError (naming `what`) when it ended without one."""
    line = self.readline()
    try:
      return int(line)
    except ValueError:
      raise OSError(f"{what} did not start (its guardian printed {line!r})") from None

  def stop(self) -> None:
    """Kill the group, run the cleanup and remove the folder (idempotent)."""
    if self._stopped:
      return
    self._stopped = True
    try:
      self.lifeline.close()  # EOF: the guardian kills its process group
      self.guardian.wait(timeout=_STOP_TIMEOUT_S)
    except Exception:
      pass
    try:
      os.killpg(self.guardian.pid, signal.SIGKILL)  # a guardian that hung, or was itself killed, left its group
    except OSError:
      pass
    self.guardian.wait()
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    while group_alive(self.guardian.pid) and time.monotonic() < deadline:  # members still exiting (closing files)
      time.sleep(0.01)
    if self.guardian.stdout is not None:
      self.guardian.stdout.close()
    if self.cleanup:
      subprocess.run(["sh", "-c", self.cleanup, self.workdir], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, check=False)
    shutil.rmtree(self.workdir, ignore_errors=True)
    self.remover.kill()  # the folder is gone already
    self.remover.wait()


def stop(guarded: Guarded | None, closing: Any = None) -> None:
  """A finalizer's body: `closing.close()` first when given (a client of the programs), then `guarded.stop()`."""
  if closing is not None:
    try:
      closing.close()
    except Exception:
      pass
  if guarded is not None:
    guarded.stop()


def end_on_eof(process: subprocess.Popen) -> None:
  """Stop a child that leaves when its stdin closes: close its stdin, and kill it if it has not gone in 5 s."""
  if process.poll() is None:
    try:
      process.stdin.close()
      process.wait(timeout=_STOP_TIMEOUT_S)
    except Exception:
      process.kill()
      process.wait()


class PipedChild:
  """An environment's child program on pipes, restarted by its owner after a crash (see the module docstring).

  A subclass's start() calls close() first, launches the program, then `_own(process, stop, *args)`: close(), or
  the owner's garbage collection, runs stop(*args) exactly once.

  Args:
    name: the owner's name in error messages.
    stderr_lines: how many of the program's last stderr lines are kept for them.
  """

  def __init__(self, name: str, stderr_lines: int = 20):
    self.name = name
    self.starts = 0  # programs started so far, restarts included
    self.process: subprocess.Popen | None = None
    self._stderr: collections.deque[str] = collections.deque(maxlen=stderr_lines)
    self._finalizer: weakref.finalize | None = None

  @property
  def alive(self) -> bool:
    return self.process is not None and self.process.poll() is None

  @property
  def ready(self) -> bool:
    """Whether calls can go to the program without a start() first."""
    return self.alive

  @property
  def pid(self) -> int | None:
    return None if self.process is None else self.process.pid

  def start(self) -> None:
    raise NotImplementedError

  def ensure_running(self) -> bool:
    """Start the program unless it is ready; True when a new one was started."""
    if self.ready:
      return False
    self.start()
    return True

  def _own(self, process: subprocess.Popen, stop: Callable[..., None], *args: Any) -> None:
    self.process = process
    self._finalizer = weakref.finalize(self, stop, *args)
    self.starts += 1

  def close(self) -> None:
    """Stop the program (idempotent)."""
    if self._finalizer is not None:
      self._finalizer()  # runs stop at most once
    self._finalizer = None
    self.process = None
