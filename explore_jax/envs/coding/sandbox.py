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

The request (program, the runner's code and the codec's compiled here once, the compiled setup, the
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

No jax here: the sandbox runs in actor processes.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import importlib
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
from typing import Any, Sequence

from explore_jax.envs.coding import wire

STATUSES = ("passed", "failed", "timeout", "memory", "crashed", "blocked", "syntax_error")

_RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_runner.py")
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
_ASSERT_MARK = "__explore_jax_assert__"   # a rewritten assert's message tuple starts with it
_GOT = "__explore_jax_got__"
_CLEAN_ENV = {"PATH": "/usr/bin:/bin"}
_STARTUP_ALLOWANCE_S = 1.0   # the parent's clock allows this much for interpreter start-up
_FILE_BYTES = 16 << 20       # largest file the program may write
_PROCESSES = 8               # RLIMIT_NPROC (threads count too; the program cannot fork anyway)
_UNSHARE_ARGS = ("--user", "--map-root-user", "--net", "--")
_PRINTABLE = frozenset(string.printable)
_FRAME_KINDS = frozenset({b"ready", b"value", b"handle", b"raised", b"refused", b"end"})
_END_STATUSES = frozenset({"bye", "timeout", "memory", "blocked", "crashed", "syntax_error"})
_BUILTIN_NAMES = frozenset(dir(builtins))
# Standard-library modules that act when imported: never imported here for a test.
_ACTIVE_MODULES = frozenset({"antigravity", "this", "__hello__", "__phello__", "idlelib",
                             "turtle", "turtledemo", "tkinter", "webbrowser"})


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


@functools.lru_cache(maxsize=2)
def _child_code(path: str, filename: str):
  """A file of the child's side (the runner, the codec) compiled, once per process."""
  with open(path, encoding="utf-8") as f:
    source = f.read()
  with _AST_LOCK:
    return compile(source, filename, "exec", dont_inherit=True)


@functools.lru_cache(maxsize=8192)
def _names_used(source: str) -> frozenset[str]:
  """The names a test reads that it does not bind at its top level and that are not builtins."""
  tree = parse_python(source)
  loaded = {node.id for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
  bound = set()
  for statement in tree.body:
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      bound.add(statement.name)
    elif isinstance(statement, (ast.Import, ast.ImportFrom)):
      bound.update(alias.asname or alias.name.partition(".")[0] for alias in statement.names)
    else:
      bound.update(node.id for node in ast.walk(statement)
                   if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store))
  return frozenset(loaded - bound - _BUILTIN_NAMES)


@functools.lru_cache(maxsize=1024)
def _setup_classes(setup: str) -> tuple[str, ...]:
  """The classes the setup defines at its top level: the task's classes, which may cross."""
  if not setup.strip():
    return ()
  try:
    tree = parse_python(setup)
  except SyntaxError:
    return ()
  return tuple(node.name for node in tree.body if isinstance(node, ast.ClassDef))


# ---- what the tests see of the program --------------------------------------------------------------


class ProgramError(Exception):
  """What a call to the program gave instead of a value, as the tests see it: an exception the
  program raised (`name` its type's name, `text` its text, `frames` the program's end of the
  traceback), or why its answer could not be used (a TypeError or ValueError of ours)."""

  def __init__(self, name: str, text: str, frames: Sequence[str] = ()):
    Exception.__init__(self, text)
    self.name, self.text, self.frames = name, text, tuple(frames)

  @property
  def line(self) -> str:
    return f"{self.name}: {self.text}" if self.text else self.name


_ERROR_CLASSES: dict[str, type] = {}
_UNMAPPED = frozenset({"StopIteration", "StopAsyncIteration"})  # would end the tests' generators


def _program_error(name: str, text: str, frames: Sequence[str] = ()) -> ProgramError:
  """A ProgramError that is also an instance of the builtin exception `name`, where there is one
  that can be (ExceptionGroup, for one, cannot)."""
  base = getattr(builtins, name, None) if name.isidentifier() and name not in _UNMAPPED else None
  if isinstance(base, type) and issubclass(base, Exception):
    try:
      cls = _ERROR_CLASSES.get(name) or _ERROR_CLASSES.setdefault(
          name, type(name, (ProgramError, base), {"__module__": __name__}))
      return cls(name, text, frames)
    except TypeError:
      pass
  return ProgramError(name, text, frames)


class _AttemptOver(BaseException):
  """The program can answer no more calls (it ended, broke a rule or the clock ran out)."""


def _plain_name(text: str, limit: int = 80) -> str:
  """A type's name as the program reported it, made safe to show."""
  return _clip(text.replace("\n", " "), limit)


def _refusal(subject: str, kind: str, detail: str) -> ProgramError:
  """Why `subject` ("f returned", "Solution().x is") cannot be used, as the error a test sees."""
  if kind == "type":
    return _program_error("TypeError", f"{subject} an object of type {_plain_name(detail)}; "
                          "only plain data is compared")
  if kind == "bytes":
    return _program_error("ValueError", f"{subject} more than {wire.MAX_BYTES} bytes "
                          f"({wire.MAX_BYTES >> 20} MiB) of data, the limit of one value")
  if kind == "depth":
    return _program_error("ValueError", f"{subject} data nested deeper than {wire.MAX_DEPTH} "
                          "levels, the limit of one value")
  if kind == "collision":
    return _program_error("ValueError", f"{subject} more than {wire.MAX_COLLISIONS} distinct "
                          "values with one hash, the limit of one value")
  if kind == "argument":
    return _program_error("TypeError", f"{subject.rsplit(' ', 1)[0]} could not take its "
                          f"arguments: {_plain_name(detail, 200)}")
  return _program_error("ValueError", f"{subject} malformed data ({_plain_name(detail)})")


class _Remote:
  """A proxy, in the tests' namespace, for an object of the program's: calling it or reading an
  attribute asks the child. It is equal to nothing, and has no truth value, length, order or
  items: only the plain values its calls return can be compared."""

  __slots__ = ("_attempt", "_number", "_label", "_type", "_is_class")

  def __init__(self, attempt: _Attempt, number: int, label: str, type_name: str, is_class: bool):
    self._attempt, self._number, self._label = attempt, number, label
    self._type, self._is_class = _plain_name(type_name), is_class

  def __call__(self, *args, **kwargs):
    return self._attempt.call(self, args, kwargs)

  def __getattr__(self, name: str):
    if name.startswith("__") and name.endswith("__"):
      raise AttributeError(name)
    return self._attempt.attribute(self, name)

  def __repr__(self) -> str:
    return f"<the program's {self._label}: {self._type}>"

  def _refuse(self, *_):
    raise TypeError(f"{self._label} is the program's object of type {self._type}; only plain data "
                    "is compared")

  __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = _refuse
  __bool__ = __len__ = __iter__ = __contains__ = __getitem__ = _refuse


def _write_back(old: Any, new: Any) -> bool:
  """Make `old` (a test's argument) hold what `new` (the program's, after the call) holds, in
  place where it can, keeping nested lists, dicts and sets that are still where they were; whether
  `old` now does (False: the caller replaces it)."""
  if old is new:
    return True
  kind = type(old)
  if kind is not type(new):
    return False
  if kind is list:
    if len(old) != len(new):
      old[:] = new
    else:
      for i, item in enumerate(new):
        if not _write_back(old[i], item):
          old[i] = item
    return True
  if kind is dict:
    if list(old) != list(new):
      old.clear()
      old.update(new)
    else:
      for key, item in new.items():
        if not _write_back(old[key], item):
          old[key] = item
    return True
  if kind is set:
    old.clear()
    old.update(new)
    return True
  if kind is tuple and len(old) == len(new):
    return all([_write_back(a, b) for a, b in zip(old, new)])
  try:
    return (old == new) is True
  except Exception:
    return False


class _Attempt:
  """The parent's end of one attempt: the child's pipes, its deadline, and how the run ended.

  `over` is None while the program can answer, then (status, message): a status of the "end"
  frame ("bye" after the tests, or "timeout", "memory", "blocked", "crashed", "syntax_error"), or
  "deadline" (the parent's clock), "lost" (the pipe ended without an "end" frame) or "broken" (a
  frame that breaks the protocol).
  """

  def __init__(self, send_fd: int, receive_fd: int, token: str, deadline: float,
               names: frozenset[str], max_output_chars: int):
    self.send_fd, self.receive_fd = send_fd, receive_fd
    # The largest frame: a result and the changed arguments, or the program's output (UTF-8).
    self.max_frame = 2 * wire.MAX_BYTES + 4 * max_output_chars + (64 << 10)
    self.marker = token.encode("ascii") + b" "
    self.deadline = deadline
    self.names = names
    self.buffer = bytearray()
    self.readable, self.writable = select.poll(), select.poll()
    self.readable.register(receive_fd, select.POLLIN)
    self.writable.register(send_fd, select.POLLOUT)
    self.over: tuple[str, str] | None = None
    self.ended = False  # whether the child said its last (an "end" frame, or the pipe's end)
    self.closing = False  # whether the parent said "end" (only then may the child say "bye")
    self.output = ""
    self.classes: dict[str, type] = {}
    self.class_names: frozenset[str] = frozenset()
    self.test = ""  # the test running

  # ---- frames ---------------------------------------------------------------------------------

  def _end(self, status: str, message: str = ""):
    if self.over is None:
      self.over = (status, message)
    raise _AttemptOver

  def _wait(self, poller: select.poll) -> bool:
    """Wait for `poller` until the deadline (which ends the attempt); whether it is ready."""
    remaining = self.deadline - time.monotonic()
    if remaining <= 0:
      self._end("deadline")
    return bool(poller.poll(remaining * 1000.0))

  def _send(self, data: bytes):
    """Write all of `data` (the pipe does not block: a full one is waited on until the deadline)."""
    view = memoryview(data)
    while view:
      try:
        view = view[os.write(self.send_fd, view):]
      except BlockingIOError:
        self._wait(self.writable)
      except OSError:  # the child is gone: its last frame says why
        self._receive()
        self._end("broken", "an answer before the request")

  def _frame(self) -> tuple[bytes, bytes] | None:
    """The first whole frame in the buffer, skipping anything before the token; None if none."""
    buffer, marker = self.buffer, self.marker
    at = buffer.find(marker)
    if at < 0:
      del buffer[:max(0, len(buffer) - len(marker) + 1)]  # keep what may start a token
      return None
    del buffer[:at]
    header_end = buffer.find(b"\n", 0, len(marker) + 32)
    if header_end < 0:
      if len(buffer) > len(marker) + 32:
        self._end("broken", "a frame without a header")
      return None
    kind, _, size = bytes(buffer[len(marker):header_end]).partition(b" ")
    if kind not in _FRAME_KINDS or not size.isdigit() or int(size) > self.max_frame:
      self._end("broken", f"a frame {bytes(kind[:16])!r} of {size[:16].decode('ascii', 'replace')} "
                f"bytes (at most {self.max_frame})")
    end = header_end + 1 + int(size)
    if len(buffer) < end:
      return None
    payload = bytes(buffer[header_end + 1:end])
    del buffer[:end]
    return kind, payload

  def _receive(self) -> tuple[bytes, bytes]:
    """The child's next frame; its "end" frame, the pipe's end or the deadline end the attempt.

    The pipe does not block: a read is tried first (the child has often answered by the time the
    request's write returns), and the deadline is checked on every turn, also while the child
    keeps writing."""
    while True:
      frame = self._frame()
      if frame is not None:
        break
      if time.monotonic() > self.deadline:
        self._end("deadline")
      try:
        chunk = os.read(self.receive_fd, 1 << 20)
      except BlockingIOError:
        self._wait(self.readable)
        continue
      if not chunk:
        self.ended = True
        self._end("lost")
      self.buffer += chunk
    kind, payload = frame
    if kind == b"end":
      self.ended = True
      try:
        (status, message, output), _ = wire.decode(payload)
      except (wire.WireError, TypeError, ValueError):
        self._end("broken", "a malformed last frame")
      if status not in _END_STATUSES or type(message) is not str or type(output) is not str:
        self._end("broken", "a malformed last frame")
      if status == "bye" and not self.closing:
        self._end("broken", "a last frame before the tests were done")
      self.output = output
      self._end(status, message)
    return kind, payload

  def _request(self, message: tuple) -> tuple[bytes, bytes]:
    if self.over is not None:
      raise _AttemptOver
    data = marshal.dumps(message)
    self._send(len(data).to_bytes(8, "little") + data)
    return self._receive()

  def _decode(self, data: bytes, subject: str, known: Sequence[Any] = (),
              handles: dict[int, _Remote] | None = None) -> Any:
    try:
      return wire.decode(data, self.classes, known, handles)[0]
    except wire.WireError as error:
      raise _refusal(subject, error.kind, error.detail) from None

  def _failure(self, kind: bytes, payload: bytes, subject: str):
    """Raise what a "raised" or "refused" frame says (anything else breaks the protocol)."""
    if kind == b"raised":
      what = self._decode(payload, subject)
      if (type(what) is tuple and len(what) == 3 and type(what[0]) is str and type(what[1]) is str
          and type(what[2]) is tuple and all(type(line) is str for line in what[2])):
        raise _program_error(_plain_name(what[0]), what[1], what[2][-3:])
    elif kind == b"refused":
      what = self._decode(payload, subject)
      if type(what) is tuple and len(what) == 2 and all(type(part) is str for part in what):
        raise _refusal(subject, what[0], what[1])
    self._end("broken", f"an unexpected {kind.decode('ascii')} frame")

  def _handle(self, payload: bytes, subject: str) -> tuple[int, str]:
    what = self._decode(payload, subject)
    if not (type(what) is tuple and len(what) == 2 and type(what[0]) is int
            and type(what[1]) is str):
      self._end("broken", "a malformed handle")
    return what

  # ---- what the tests do --------------------------------------------------------------------------

  def bind(self, namespace: dict[str, Any]):
    """Wait for "ready" and give the tests' namespace the program's names it lacks."""
    kind, payload = self._receive()
    if kind != b"ready":
      self._end("broken", "no ready frame")
    found = self._decode(payload, "the program's namespace")
    if type(found) is not dict:
      self._end("broken", "a malformed ready frame")
    for name, what in found.items():
      if name not in self.names or name in namespace or type(what) is not tuple or not what:
        continue
      if what[0] == "value" and len(what) == 2:
        namespace[name] = what[1]
      elif what[0] == "module" and name in sys.stdlib_module_names and name not in _ACTIVE_MODULES:
        try:
          namespace[name] = importlib.import_module(name)
        except ImportError:
          pass
      elif (what[0] == "handle" and len(what) == 4 and type(what[1]) is int
            and type(what[2]) is str and type(what[3]) is bool):
        namespace[name] = _Remote(self, what[1], name, what[2], what[3])

  def call(self, remote: _Remote, args: tuple, kwargs: dict[str, Any]) -> Any:
    subject = f"{remote._label} returned"
    sent: dict[int, _Remote] = {}  # proxies among the arguments: they may come back in them

    def handle_of(obj: Any) -> int | None:
      if type(obj) is not _Remote or obj._attempt is not self:
        return None
      sent[obj._number] = obj
      return obj._number

    try:
      data, objects, mutable = wire.encode((list(args), kwargs), self.class_names, handle_of)
    except wire.WireError as error:
      what = ("an object of type " + error.detail if error.kind == "type"
              else f"an argument over the limit ({error.kind})")
      raise TypeError(f"{remote._label} cannot be given {what}; only plain data crosses to the "
                      "program") from None
    kind, payload = self._request(("call", remote._number, data, mutable))
    if kind == b"value":
      size = int.from_bytes(payload[:4], "little")
      result = self._decode(payload[4:4 + size], subject, objects)
      if len(payload) > 4 + size:
        changed = self._decode(payload[4 + size:], subject, objects, sent)
        if not (type(changed) is tuple and len(changed) == 2 and type(changed[0]) is list
                and len(changed[0]) == len(args) and type(changed[1]) is dict
                and changed[1].keys() == kwargs.keys()):
          raise _refusal(subject, "malformed", "arguments that do not match the call")
        for old, new in zip(args, changed[0]):
          _write_back(old, new)
        for key, old in kwargs.items():
          _write_back(old, changed[1][key])
      return result
    if kind == b"handle":
      number, type_name = self._handle(payload, subject)
      if remote._is_class and not args and not kwargs:
        return _Remote(self, number, remote._label + "()", type_name, False)
      raise _refusal(subject, "type", type_name)
    self._failure(kind, payload, subject)

  def attribute(self, remote: _Remote, name: str) -> Any:
    label = f"{remote._label}.{name}"
    kind, payload = self._request(("attribute", remote._number, name))
    if kind == b"value":
      return self._decode(payload[4:], f"{label} is")
    if kind == b"handle":
      number, type_name = self._handle(payload, f"{label} is")
      return _Remote(self, number, label, type_name, False)
    self._failure(kind, payload, f"{label} is")

  def stdin(self, text: str) -> str:
    """What the program printed, run afresh on `text`."""
    kind, payload = self._request(("stdin", text))
    if kind == b"value":
      output = self._decode(payload[4:], "the program printed")
      if type(output) is str:
        return output
      self._end("broken", "output that is not text")
    self._failure(kind, payload, "the program printed")

  def close(self):
    """Say "end" and take the last frame (its output)."""
    self.closing = True
    try:
      self._request(("end",))
      self._end("broken", "an answer where the last frame belonged")
    except _AttemptOver:
      pass


# ---- messages -------------------------------------------------------------------------------------


def _short_repr(value: Any, limit: int = 120) -> str:
  try:
    text = str(repr(value))
  except Exception:
    text = f"<{type(value).__name__} that cannot be shown>"
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _exception_line(error: BaseException) -> str:
  if isinstance(error, ProgramError):
    return error.line  # the child cut the text
  try:
    text = str(error)
  except Exception:
    text = ""
  if len(text) > 300:
    text = text[:297] + "..."
  return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _collapse(frames: Sequence[str]) -> list[str]:
  """Frames with runs of one frame collapsed, as Python's tracebacks do."""
  lines: list[str] = []
  repeats = 0
  for frame in [*frames, None]:
    if lines and frame == lines[-1]:
      repeats += 1
      continue
    if repeats:
      lines.append(f"  [Previous line repeated {repeats} more times]")
      repeats = 0
    if frame is not None:
      lines.append(frame)
  return lines


def _describe(error: BaseException, stdin: str | None, sources: dict[str, str]) -> str:
  """A failure's message: a rewritten assert's source (and value), or the last lines of the
  traceback through the tests and, for a call that failed, the program."""
  try:
    args = error.args if isinstance(error, AssertionError) else ()
    if (not isinstance(error, ProgramError) and len(args) == 1 and type(args[0]) is tuple
        and len(args[0]) in (2, 3) and args[0][0] == _ASSERT_MARK):
      text = str(args[0][1])
      if len(args[0]) == 3:
        text += f" (got {_short_repr(args[0][2])})"
    else:
      frames = []
      tb = error.__traceback__
      while tb is not None:
        code = tb.tb_frame.f_code
        source = sources.get(code.co_filename)
        if source is not None:
          lines = source.splitlines()
          number = tb.tb_lineno or 0
          line = lines[number - 1].strip() if 0 < number <= len(lines) else ""
          frames.append(f'  File "{code.co_filename}", line {number}, in {code.co_name}'
                        + (f"\n    {line}" if line else ""))
        tb = tb.tb_next
      if isinstance(error, ProgramError):
        frames.extend(error.frames)
      text = "\n".join(_collapse(frames)[-3:] + [_exception_line(error)])
    return f"On input {_short_repr(stdin, 60)}: {text}" if stdin is not None else text
  except Exception:
    return type(error).__name__


# ---- a run ----------------------------------------------------------------------------------------


def _judge(attempt: _Attempt, tests: list[tuple], setup_code, setup: str,
           class_names: tuple[str, ...]) -> tuple[list[bool], str]:
  """Run the setup and the tests here, the program's names bound to proxies: (one bool per test
  run, the first failure's message). Stops when the attempt is over."""
  namespace: dict[str, Any] = {"__name__": "__tests__", "__builtins__": builtins}
  sources = {"<setup>": setup}
  sources.update((f"<{name}>", source) for name, _, source, _ in tests)
  if setup_code is not None:
    try:
      exec(setup_code, namespace)
    except Exception as error:
      attempt.over = ("crashed", "The task's setup raised an exception:\n"
                      + _describe(error, None, sources))
      return [], ""
  attempt.classes = {name: namespace[name] for name in class_names
                     if isinstance(namespace.get(name), type)}
  attempt.class_names = frozenset(attempt.classes)
  try:
    attempt.bind(namespace)
  except _AttemptOver:
    return [], ""
  base = dict(namespace)
  passed: list[bool] = []
  message = ""
  for name, code, _, stdin in tests:
    attempt.test = name
    ok = False
    try:
      if stdin is None:
        exec(code, namespace)
      else:
        scope = dict(base)
        scope["__output__"] = attempt.stdin(stdin)
        exec(code, scope)
      ok = attempt.over is None
    except _AttemptOver:
      pass
    except Exception as error:
      if not message and attempt.over is None:
        message = _describe(error, stdin, sources)
    passed.append(ok)
    if attempt.over is not None:
      return passed, message
  attempt.test = ""
  return passed, message


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
  compiled = [(t.name, _compile_trusted(t.code, f"<{t.name}>"), t.code, t.stdin) for t in tests]
  setup_code = _compile_trusted(setup, "<setup>") if setup.strip() else None
  used = frozenset().union(*(_names_used(t.code) for t in tests))
  classes = _setup_classes(setup)

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
                     wire=_child_code(wire.__file__, "<wire>"), names=sorted(used), classes=classes,
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
      attempt = _Attempt(call_write, reply_read, token, deadline, used, max_output_chars)
      passed, message = _judge(attempt, compiled, setup_code, setup, classes)
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


def _result(attempt: _Attempt, passed: list[bool], message: str, names: list[str],
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
                         message=_clip(message, max_output_chars), seconds=seconds,
                         output=_clip(output, max_output_chars))
