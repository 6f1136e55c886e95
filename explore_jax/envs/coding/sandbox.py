"""Run untrusted Python against tests: the program in a fresh, limited, watched interpreter, the
tests and the verdict outside it.

`run_program(program, tests)` starts a new interpreter for every call (`_runner.py`, the child side,
says what happens inside it). The layers that contain the program, from the outside in:

- the parent's wall clock: `time_limit_s` plus a start-up allowance, then the whole process group
  is killed (SIGKILL) and reaped; the child's own timer normally stops the program first; the
  parent never waits on the child's pipe past that deadline (poll with a timeout);
- `unshare -rn` where the machine allows it (probed once per process): a new user namespace without
  privileges outside it and a network namespace whose only interface is a loopback that is down;
- a private temporary directory as the working directory (removed afterwards, also after a kill),
  a clean environment (PATH only) and `python -I -S -B` (no site packages, no user variables);
- resource limits the child sets on itself before the program runs: CPU seconds, address space
  (`memory_mb`), file size, processes, open files, no core dumps (no preexec_fn, so calls from
  several threads at once are safe);
- an audit hook inside the child that ends the run as "blocked" on sockets, new or signalled
  processes, native code, writes, removals and links outside the working directory, directory and
  special files, /proc, raised limits; `os.environ` is empty.

The verdict. The tests run here, in the calling process, which the program never runs in; the child
only answers their calls. Before the tests, the parent runs the task's setup in a namespace of its
own, and every name the tests read that neither they, the setup nor the builtins define is looked
up in the program's namespace (the names go with the request; the child answers "ready" once the
program has run): plain data is copied in, a module becomes the parent's own import of that
standard-library module, anything else (the entry point, a class like LeetCode's `Solution`)
becomes a proxy. Calling a proxy sends the arguments to
the child, which calls the program's object and answers with the result; reading an attribute of
a proxy works the same way. The tests then compare builtin values with builtin code: an assert of any
form (`==`, `abs(x - y) < tol`, `is True`) is decided here. A program can rebind builtins, patch
modules, read frames or the garbage collector, install exit hooks or leave early in its own process
as it likes: none of that reaches the tests, their expected values or this process.

What crosses from the child is plain data only (`wire.py`: the format, checked with exact types):
None, bool, int, float, str, bytes, and lists, tuples, dicts, sets and frozensets of them, at most
`wire.MAX_BYTES` (4 MiB) of encoding and `wire.MAX_DEPTH` (100) levels of nesting per value, and no
more than `wire.MAX_COLLISIONS` distinct hashable values sharing one hash. Anything else fails the
test that asked for it, by name: "f returned an object of type Evil; only plain data is compared".
Arguments cross the same way (a test that passes a function fails: "f cannot be given an object of
type function"), except that a proxy passed back to the program is its own object again. Results
are copies: `f(a) is a` is False even where the program returns its argument. The decisions for
what is not a plain value:

- arguments changed in place (a test that checks a list was sorted in place): the child compares the
  arguments after the call with a fresh decoding of what it was sent; if they differ it sends them
  back and the parent writes them into the tests' own argument objects (lists, dicts and sets in
  place, keeping every nested list, dict and set that is still where it was). Arguments are copies:
  aliasing between two arguments is not kept, and a test that reads an argument after the call sees
  what the program left in it, as it would in one interpreter;
- generators and other iterators returned by a call: drained in the child, within the limits, and
  the test gets an iterator over the items (so `list(f())` and `sorted(f())` work, `f() == [...]`
  fails as it would). Other non-plain iterables (range, dict views, Counter, deque, subclasses) are
  refused by name;
- the task's own classes (those its setup defines, e.g. LeetCode's ListNode and TreeNode): their
  instances cross both ways as objects of the receiving side's class of that name, attributes
  copied as plain data (objects travel in a table, so a long linked list is not deep nesting), and
  changes to the objects a call was given come back into the tests' objects, identity kept;
- a class of the program called without arguments (LeetCode's and APPS's `Solution()`) gives a new
  proxy, whose methods the test then calls; the proxy is equal to nothing and has no truth value or
  length (it raises TypeError), so only plain results can pass an assert; `is` is the one thing it
  answers, so a test of `f() is not None` against such a class passes for any instance;
- an exception raised by the program comes back as its type's name, its text and the program's end
  of the traceback, raised here as a `ProgramError` that is also an instance of the builtin exception
  of that name (so `except ValueError` in a test works); SystemExit, KeyboardInterrupt and the like
  are only ProgramErrors, and leaving early (exit, os._exit, a signal to itself) ends the attempt as
  "crashed".

Whatever a test takes from the program's namespace is the program's: a test comparing with a helper
the program defines or imports compares nothing. Helpers belong in the task's setup, which runs
here (the program gets its own copy of the setup, and a name both define is the setup's in the
tests). What the child reports is never trusted: a program that took over its interpreter can send
frames of its own, but they hold nothing but plain values, as a function's answers could.

The request (program, the runner's, the audit hook's and the codec's code compiled here once, the compiled setup, the
names, limits, a random token) travels on an unnamed file as stdin; calls and answers travel on two
pipes, every answer prefixed with the token:
printed or written output cannot pass for an answer, and a program that exits early or kills its
own interpreter leaves no "end" frame, which counts as a crash.

What the layers do not cover: reading files is allowed (the stdlib must load), so a program can
read whatever the machine lets any user read (a dataset's file with its expected outputs, where one
is on the machine); RLIMIT_NPROC counts every process of the user and is
ignored for root, so the audit hook's refusal of fork, exec and spawn is what stops fork bombs; and
the tests' own work on the program's answers (a comparison, a sort) runs here, bounded by the size
limit and the deadline between calls, not by the child's limits.

Tests are Python statements (`TestCase`); they are compiled here, once per distinct test, after each
`assert` is rewritten so that a failure says which assert failed and, for `==`, the value it got:
"assert f(5) == 8 (got 15)". A test with `stdin` has the child run the program afresh on that input;
only the text it printed comes back, as `__output__`, and the test checks it here.

The parts: this module starts the child, holds its limits and turns how the attempt ended into the verdict
(`_result`); `_attempt.py` is the parent's end of the channel (frames, proxies, the answers' checks);
`_judge.py` compiles the tests and runs them here; `_runner.py` and `wire.py` are the child's side and the format.

No jax here: the sandbox runs in actor processes.
"""

from __future__ import annotations

import dataclasses
import functools
import marshal
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Sequence

from explore_jax.envs.coding import wire
from explore_jax.envs.coding._attempt import Attempt, clip
from explore_jax.envs.coding._judge import AST_LOCK, compile_trusted, judge, names_used, setup_classes
from explore_jax.envs.coding._judge import parse_python  # noqa: F401  (the tasks' parser, re-exported)

STATUSES = ("passed", "failed", "timeout", "memory", "crashed", "blocked", "syntax_error")

_RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_runner.py")
_AUDIT = os.path.join(os.path.dirname(_RUNNER), "_audit.py")
# The child's whole script: read the request, run the runner's code (compiled here, once) on it.
_BOOTSTRAP = ("import marshal, os\n"
              "data = bytearray()\n"
              "while chunk := os.read(0, 1 << 20):\n"
              "    data += chunk\n"
              "request = marshal.loads(bytes(data))\n"
              "del data, chunk\n"
              "runner = {'__name__': '_runner', '__builtins__': __builtins__}\n"
              "exec(request.pop('runner'), runner)\n"
              "runner['main'](request)\n")
_CLEAN_ENV = {"PATH": "/usr/bin:/bin"}
_STARTUP_ALLOWANCE_S = 1.0   # the parent's clock allows this much for interpreter start-up
_FILE_BYTES = 16 << 20       # largest file the program may write
_PROCESSES = 8               # RLIMIT_NPROC (threads count too; the program cannot fork anyway)
_UNSHARE_ARGS = ("--user", "--map-root-user", "--net", "--")


@dataclasses.dataclass(frozen=True)
class TestCase:
  """One test: Python run in the tests' namespace, here, once the program is loaded in the child
  (e.g. "assert f(2) == 6": `f` is a proxy for the program's f).

  With `stdin` set, the child runs the program afresh with that text as its standard input, and
  `code` runs with what it printed in `__output__`.
  """

  __test__ = False  # not a pytest test class

  name: str
  code: str
  stdin: str | None = None


@dataclasses.dataclass(frozen=True)
class ExecutionResult:
  """What one run did.

  Attributes:
    status: "passed" | "failed" | "timeout" | "memory" | "crashed" | "blocked" | "syntax_error".
    test_passed: one bool per test; all False when the program never got to run them.
    failing: the names of the failing tests, sorted: the outcome key of the attempt.
    message: what went wrong (printable, truncated): the first failing test's assertion and the
      value it got, a traceback's last lines, or the limit or rule the program ran into.
    seconds: wall-clock time of the whole run, start-up included.
    output: what the program printed (printable, truncated).
  """

  status: str
  test_passed: tuple[bool, ...]
  failing: tuple[str, ...]
  message: str
  seconds: float
  output: str = ""

  @property
  def passed(self) -> bool:
    return self.status == "passed"


_network_lock = threading.Lock()
_network_available: bool | None = None


def _unshare_path() -> str | None:
  return shutil.which("unshare", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin", "/bin"]))


def network_isolation_available() -> bool:
  """Whether `unshare -rn` works here (probed on first use, then cached for the process)."""
  global _network_available
  with _network_lock:
    if _network_available is None:
      unshare = _unshare_path()
      ok = False
      if unshare is not None:
        try:
          ok = subprocess.run(
              [unshare, *_UNSHARE_ARGS, sys.executable, "-I", "-S", "-c", ""], env=_CLEAN_ENV,
              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
              timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
          ok = False
      _network_available = ok
    return _network_available


def _signal_name(number: int) -> str:
  try:
    return signal.Signals(number).name
  except ValueError:
    return f"signal {number}"


@functools.lru_cache(maxsize=4)
def _child_code(path: str, filename: str):
  """A file of the child's side (the runner, its audit hook, the codec) compiled, once per process."""
  with open(path, encoding="utf-8") as f:
    source = f.read()
  with AST_LOCK:
    return compile(source, filename, "exec", dont_inherit=True)


def run_program(program: str, tests: Sequence[TestCase], *, setup: str = "",
                time_limit_s: float = 2.0, memory_mb: int = 1024, max_output_chars: int = 2000,
                isolate_network: bool | str = "auto") -> ExecutionResult:
  """Run `setup` and `program` in a fresh sandboxed interpreter, and each test here against it.

  Args:
    program: untrusted Python source.
    tests: the tests, run in order (names must be distinct); they call the program's names.
    setup: trusted Python run before the program in its namespace (e.g. imports), and before the
      tests in theirs.
    time_limit_s: wall-clock limit for the program and all its tests together.
    memory_mb: address-space limit of the interpreter.
    max_output_chars: longest `message` and `output` returned.
    isolate_network: "auto" (a network namespace where `unshare -rn` works), True (required:
      raises RuntimeError where it does not work) or False.

  Returns:
    The ExecutionResult; a bad program never raises, bad arguments do (TypeError, ValueError).
  """
  if not isinstance(program, str):
    raise TypeError(f"program must be a str, got {type(program).__name__}")
  tests = tuple(tests)
  names = [t.name for t in tests]
  if len(set(names)) != len(names):
    raise ValueError(f"test names must be distinct, got {names}")
  if not time_limit_s > 0 or memory_mb < 64 or max_output_chars < 16:
    raise ValueError("need time_limit_s > 0, memory_mb >= 64 and max_output_chars >= 16, got "
                     f"{time_limit_s}, {memory_mb}, {max_output_chars}")
  if isolate_network not in ("auto", True, False):
    raise ValueError(f'isolate_network must be "auto", True or False, got {isolate_network!r}')
  isolate = isolate_network is True or (isolate_network == "auto" and network_isolation_available())
  if isolate_network is True and not network_isolation_available():
    raise RuntimeError("network isolation was requested, but `unshare -rn` does not work here "
                       "(no unshare, or unprivileged user namespaces are disabled)")
  compiled = [(t.name, compile_trusted(t.code, f"<{t.name}>"), t.code, t.stdin) for t in tests]
  setup_code = compile_trusted(setup, "<setup>") if setup.strip() else None
  used = frozenset().union(*(names_used(t.code) for t in tests))
  classes = setup_classes(setup)

  token = secrets.token_hex(16)
  command = [sys.executable, "-I", "-S", "-B", "-c", _BOOTSTRAP]
  if isolate:
    command = [_unshare_path(), *_UNSHARE_ARGS, *command]
  start = time.monotonic()
  deadline = start + time_limit_s + _STARTUP_ALLOWANCE_S
  with tempfile.TemporaryDirectory(prefix="explore-jax-code-", ignore_cleanup_errors=True) as box, \
      tempfile.TemporaryFile() as request_file, tempfile.TemporaryFile() as output_file:
    call_read, call_write = os.pipe()
    reply_read, reply_write = os.pipe()
    process, killed = None, False
    try:
      request = dict(token=token, call_fd=call_read, reply_fd=reply_write,
                     box=os.path.realpath(box), program=program, setup=setup_code,
                     setup_source=setup, runner=_child_code(_RUNNER, _RUNNER),
                     wire=_child_code(wire.__file__, "<wire>"), audit=_child_code(_AUDIT, "<audit>"),
                     names=sorted(used), classes=classes,
                     stdin_only=bool(tests) and all(t.stdin is not None for t in tests),
                     time_limit=float(time_limit_s), memory_bytes=int(memory_mb) << 20,
                     file_bytes=_FILE_BYTES, processes=_PROCESSES, max_output=int(max_output_chars))
      request_file.write(marshal.dumps(request))
      request_file.seek(0)
      try:
        process = subprocess.Popen(
            command, stdin=request_file, stdout=output_file, stderr=subprocess.STDOUT, cwd=box,
            env=_CLEAN_ENV, pass_fds=(call_read, reply_write), start_new_session=True)
      finally:
        os.close(call_read)
        os.close(reply_write)
      os.set_blocking(call_write, False)
      os.set_blocking(reply_read, False)
      attempt = Attempt(call_write, reply_read, token, deadline, used, max_output_chars)
      passed, message = judge(attempt, compiled, setup_code, setup, classes)
      attempt.close()
      if attempt.ended:
        _wait(process, min(1.0, max(0.05, deadline - time.monotonic())))
    finally:
      if process is not None and process.returncode is None:  # also when this thread is interrupted
        killed = True
        try:
          os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
          pass
        process.kill()
        process.wait()
      os.close(call_write)
      os.close(reply_read)
    seconds = time.monotonic() - start
    output_file.seek(0)
    raw_output = output_file.read(4 * max_output_chars).decode("utf-8", "replace")
  return _result(attempt, passed, message, names, raw_output, process.returncode, killed, seconds,
                 time_limit_s, max_output_chars)


def _wait(process: subprocess.Popen, timeout: float) -> bool:
  """Wait up to `timeout` seconds for the process to end; whether it did (and was reaped).

  A pidfd wakes the wait the moment the process ends; Popen.wait(timeout) polls with growing
  sleeps, which would add up to 16 ms to a run of 20 ms.
  """
  try:
    pidfd = os.pidfd_open(process.pid)
  except (AttributeError, OSError):
    try:
      process.wait(timeout=timeout)
      return True
    except subprocess.TimeoutExpired:
      return False
  try:
    ready, _, _ = select.select([pidfd], [], [], timeout)
  finally:
    os.close(pidfd)
  if not ready and process.poll() is None:
    return False
  process.wait()
  return True


def _result(attempt: Attempt, passed: list[bool], message: str, names: list[str],
            raw_output: str, returncode: int, killed: bool, seconds: float, time_limit_s: float,
            max_output_chars: int) -> ExecutionResult:
  """The verdict: the tests' results here, and how the attempt ended."""
  status, detail = attempt.over or ("broken", "no last frame")
  bits = (passed + [False] * len(names))[:len(names)]
  keep = True  # whether the tests that passed before the end count
  in_test = f" (in {attempt.test})" if attempt.test else ""
  tail = raw_output.strip()[-400:]
  if status == "bye":
    status = "passed" if all(bits) else "failed"
  elif status in ("timeout", "memory"):
    message = detail + in_test
  elif status == "deadline":
    status, message = "timeout", f"Time limit of {time_limit_s} s exceeded{in_test}"
    message += "\n" + tail if tail else ""
  elif status == "lost":
    if returncode < 0 and -returncode == signal.SIGXCPU:
      status, message = "timeout", f"CPU time limit exceeded ({_signal_name(-returncode)}){in_test}"
    elif "MemoryError" in raw_output:
      status, message = "memory", f"Memory limit exceeded{in_test}"
    else:
      keep = False
      if killed:
        status, message = "crashed", "The program stopped answering its tests"
      elif returncode < 0:
        status, message = "crashed", f"The program was killed by {_signal_name(-returncode)}"
      else:
        status = "crashed"
        message = f"The program ended (exit status {returncode}) before its tests finished"
    message += "\n" + tail if tail else ""
  elif status == "broken":
    keep = False
    status, message = "crashed", f"The program broke its channel to the tests: {detail}"
  else:  # blocked, crashed, syntax_error
    keep = False
    message = detail
  if not keep:
    bits = [False] * len(names)
  output = attempt.output
  if raw_output:
    output = f"{output}\n{raw_output}" if output else raw_output
  failing = tuple(sorted(name for name, ok in zip(names, bits) if not ok))
  return ExecutionResult(status=status, test_passed=tuple(bits), failing=failing,
                         message=clip(message, max_output_chars), seconds=seconds,
                         output=clip(output, max_output_chars))
