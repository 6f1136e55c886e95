"""Run untrusted Python against tests in a fresh, limited, watched interpreter.

`run_program(program, tests)` starts a new interpreter for every call (`_runner.py`, the child side,
says what happens inside it). The layers, from the outside in:

- the parent's wall clock: `time_limit_s` plus a start-up allowance, then the whole process group
  is killed (SIGKILL) and reaped; the child's own timer normally stops the program first;
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

The request (program, compiled tests, limits, a random token) travels on an unnamed file as stdin,
and the child reports on another unnamed file descriptor, prefixing its report with the token: a
program that prints or writes a fake report cannot pass, and one that exits early or kills its own
interpreter leaves no report, which counts as a crash.

What the layers do not cover: reading files is allowed (the stdlib must load); RLIMIT_NPROC counts
every process of the user and is ignored for root, so the audit hook's refusal of fork, exec and
spawn is what stops fork bombs; and tests run in the program's interpreter, so a program can still
game them from inside (an object whose __eq__ always holds, a rebound builtin a test calls, or the
token read from the runner's frames). The sandbox contains programs; it does not make in-process
test results tamper-proof, which no harness that runs tests next to the program does.

Tests are Python statements run after the program in its namespace (`TestCase`); they are compiled
here, once per distinct test, after each `assert` is rewritten so that a failure says which assert
failed and, for `==`, the value it got: "assert f(5) == 8 (got 15)". A test with `stdin` runs the
program afresh on that input and checks its standard output, `__output__`.

No jax here: the sandbox runs in actor processes.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import marshal
import os
import secrets
import select
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import threading
import time
from typing import Sequence

STATUSES = ("passed", "failed", "timeout", "memory", "crashed", "blocked", "syntax_error")

_RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_runner.py")
_ASSERT_MARK = "__explore_jax_assert__"   # the runner recognises rewritten asserts by it
_GOT = "__explore_jax_got__"
_CLEAN_ENV = {"PATH": "/usr/bin:/bin"}
_STARTUP_ALLOWANCE_S = 1.0   # the parent's clock allows this much for interpreter start-up
_FILE_BYTES = 16 << 20       # largest file the program may write
_PROCESSES = 8               # RLIMIT_NPROC (threads count too; the program cannot fork anyway)
_MAX_REPORT_BYTES = 1 << 20
_UNSHARE_ARGS = ("--user", "--map-root-user", "--net", "--")
_PRINTABLE = frozenset(string.printable)


@dataclasses.dataclass(frozen=True)
class TestCase:
  """One test: Python run after the program, in its namespace (e.g. "assert f(2) == 6").

  With `stdin` set, the program is run afresh with that text as its standard input and `code` then
  runs in the program's namespace with the captured standard output in `__output__`.
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


# CPython 3.11 keeps the AST converter's recursion depth per interpreter, not per thread: when a
# thread switch lands inside a conversion (a finaliser running Python code is enough), a concurrent
# ast.parse or compile(tree) fails with "SystemError: AST constructor recursion depth mismatch"
# (python/cpython#106905). Environments run in threads, so every tree here goes through one lock.
_AST_LOCK = threading.Lock()


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
  """`ast.parse`, safe to call from several threads at once."""
  with _AST_LOCK:
    return ast.parse(source, filename)


class _AssertRewriter(ast.NodeTransformer):
  """`assert a == b` -> `assert (got := a) == b, (MARK, "assert a == b", got)`; others keep their
  test and get (MARK, source) as message, so the runner can say which assert failed."""

  def visit_Assert(self, node: ast.Assert) -> ast.Assert:
    source = "assert " + ast.unparse(node.test)
    if len(source) > 200:
      source = source[:197] + "..."
    test = node.test
    parts: list[ast.expr] = [ast.Constant(_ASSERT_MARK), ast.Constant(source)]
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
      got = ast.NamedExpr(target=ast.Name(_GOT, ast.Store()), value=test.left)
      test = ast.Compare(left=got, ops=test.ops, comparators=test.comparators)
      parts.append(ast.Name(_GOT, ast.Load()))
    rewritten = ast.copy_location(ast.Assert(test=test, msg=ast.Tuple(parts, ast.Load())), node)
    return ast.fix_missing_locations(rewritten)


@functools.lru_cache(maxsize=8192)
def _compile_trusted(source: str, filename: str):
  """A test's or setup's code object, asserts rewritten (tests come from tasks, not the model)."""
  try:
    tree = _AssertRewriter().visit(parse_python(source, filename))
    with _AST_LOCK:
      return compile(tree, filename, "exec", dont_inherit=True)
  except (SyntaxError, ValueError) as e:
    raise ValueError(f"{filename} does not compile: {e}") from None


def _clip(text: str, limit: int) -> str:
  """Printable text of at most `limit` characters (others become "?", the end becomes "...")."""
  text = "".join(c if c in _PRINTABLE else "?" for c in text[:limit + 1])
  return text if len(text) <= limit else text[:max(0, limit - 3)] + "..."


def _signal_name(number: int) -> str:
  try:
    return signal.Signals(number).name
  except ValueError:
    return f"signal {number}"


def run_program(program: str, tests: Sequence[TestCase], *, setup: str = "",
                time_limit_s: float = 2.0, memory_mb: int = 1024, max_output_chars: int = 2000,
                isolate_network: bool | str = "auto") -> ExecutionResult:
  """Run `setup`, then `program`, then each test in a fresh sandboxed interpreter.

  Args:
    program: untrusted Python source.
    tests: the tests, run in order after the program in its namespace (names must be distinct).
    setup: trusted Python run before the program in the same namespace (e.g. imports).
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
  compiled = [(t.name, _compile_trusted(t.code, f"<{t.name}>"), t.code, t.stdin) for t in tests]
  setup_code = _compile_trusted(setup, "<setup>") if setup.strip() else None

  token = secrets.token_hex(16)
  command = [sys.executable, "-I", "-S", "-B", _RUNNER]
  if isolate:
    command = [_unshare_path(), *_UNSHARE_ARGS, *command]
  start = time.monotonic()
  with tempfile.TemporaryDirectory(prefix="explore-jax-code-", ignore_cleanup_errors=True) as box, \
      tempfile.TemporaryFile() as request_file, tempfile.TemporaryFile() as report_file, \
      tempfile.TemporaryFile() as output_file:
    request = dict(token=token, result_fd=report_file.fileno(), box=os.path.realpath(box),
                   program=program, tests=compiled, setup=setup_code, setup_source=setup,
                   time_limit=float(time_limit_s), memory_bytes=int(memory_mb) << 20,
                   file_bytes=_FILE_BYTES, processes=_PROCESSES, max_output=int(max_output_chars))
    request_file.write(marshal.dumps(request))
    request_file.seek(0)
    process = subprocess.Popen(
        command, stdin=request_file, stdout=output_file, stderr=subprocess.STDOUT, cwd=box,
        env=_CLEAN_ENV, pass_fds=(report_file.fileno(),), start_new_session=True)
    timed_out = False
    try:
      timed_out = not _wait(process, time_limit_s + _STARTUP_ALLOWANCE_S)
    finally:
      if process.returncode is None:  # also when this thread is interrupted
        try:
          os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
          pass
        process.kill()
        process.wait()
    seconds = time.monotonic() - start
    report_file.seek(0)
    report = report_file.read(_MAX_REPORT_BYTES)
    output_file.seek(0)
    raw_output = output_file.read(4 * max_output_chars).decode("utf-8", "replace")
  return _result(report, token, names, raw_output, process.returncode, timed_out, seconds,
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


def _parse_report(report: bytes, token: str, count: int):
  """(status, bits, message, output) from the runner's last report line, or None."""
  marker = token.encode("ascii") + b" "
  at = report.rfind(marker)
  if at < 0:
    return None
  line = report[at + len(marker):].split(b"\n", 1)[0]
  bits, _, body = line.partition(b" ")
  try:
    status, message, output = json.loads(body.decode("utf-8", "replace"))
  except (ValueError, TypeError):
    return None
  if (status not in STATUSES or not isinstance(message, str) or not isinstance(output, str)
      or len(bits) != count or bits.strip(b"01")):
    return None
  return status, tuple(b == ord("1") for b in bits), message, output


def _result(report: bytes, token: str, names: list[str], raw_output: str, returncode: int,
            timed_out: bool, seconds: float, time_limit_s: float,
            max_output_chars: int) -> ExecutionResult:
  parsed = _parse_report(report, token, len(names))
  if parsed is not None:
    status, passed, message, output = parsed
    if status == "passed" and not all(passed):
      status = "failed"
    if status == "failed" and all(passed):
      status = "passed"
  else:
    passed = (False,) * len(names)
    output = ""
    tail = raw_output.strip()[-400:]
    if timed_out:
      status, message = "timeout", f"Time limit of {time_limit_s} s exceeded"
    elif returncode < 0 and -returncode == signal.SIGXCPU:
      status, message = "timeout", f"CPU time limit exceeded ({_signal_name(-returncode)})"
    elif "MemoryError" in raw_output:
      status, message = "memory", "Memory limit exceeded"
    elif returncode < 0:
      status, message = "crashed", f"The program was killed by {_signal_name(-returncode)}"
    else:
      status = "crashed"
      message = f"The program ended (exit status {returncode}) before its tests finished"
    if tail:
      message += "\n" + tail
  if raw_output:
    output = f"{output}\n{raw_output}" if output else raw_output
  failing = tuple(sorted(name for name, ok in zip(names, passed) if not ok))
  return ExecutionResult(status=status, test_passed=passed, failing=failing,
                         message=_clip(message, max_output_chars), seconds=seconds,
                         output=_clip(output, max_output_chars))
