"""The parent's end of one attempt (sandbox.py): the child's pipes and deadline, the frames it sends, and
what the tests see of the program. `_runner.py` is the other end, in the child.

A name the tests read from the program's namespace becomes plain data, a standard-library module or a `Remote`
proxy; calling a proxy or reading its attribute sends a request and waits for the child's answer, until the
attempt's deadline. An answer that is not plain data, or breaks the protocol, is refused here: the tests see a
`ProgramError` (an exception of the program's, or why its answer cannot be used), and a broken channel ends the
attempt (`Attempt.over`). No jax here: the sandbox runs in actor processes.
"""

from __future__ import annotations

import builtins
import importlib
import marshal
import os
import select
import string
import sys
import time
from typing import Any, Sequence

from explore_jax.envs.coding import wire

PRINTABLE = frozenset(string.printable)
_FRAME_KINDS = frozenset({b"ready", b"value", b"handle", b"raised", b"refused", b"end"})
_END_STATUSES = frozenset({"bye", "timeout", "memory", "blocked", "crashed", "syntax_error"})
# Standard-library modules that act when imported: never imported here for a test.
_ACTIVE_MODULES = frozenset({"antigravity", "this", "__hello__", "__phello__", "idlelib",
                             "turtle", "turtledemo", "tkinter", "webbrowser"})


def clip(text: str, limit: int) -> str:
  """Printable text of at most `limit` characters (others become "?", the end becomes "...")."""
  text = "".join(c if c in PRINTABLE else "?" for c in text[:limit + 1])
  return text if len(text) <= limit else text[:max(0, limit - 3)] + "..."


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


def program_error(name: str, text: str, frames: Sequence[str] = ()) -> ProgramError:
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


class AttemptOver(BaseException):
  """The program can answer no more calls (it ended, broke a rule or the clock ran out)."""


def plain_name(text: str, limit: int = 80) -> str:
  """A type's name as the program reported it, made safe to show."""
  return clip(text.replace("\n", " "), limit)


def refusal(subject: str, kind: str, detail: str) -> ProgramError:
  """Why `subject` ("f returned", "Solution().x is") cannot be used, as the error a test sees."""
  if kind == "type":
    return program_error("TypeError", f"{subject} an object of type {plain_name(detail)}; "
                         "only plain data is compared")
  if kind == "bytes":
    return program_error("ValueError", f"{subject} more than {wire.MAX_BYTES} bytes "
                         f"({wire.MAX_BYTES >> 20} MiB) of data, the limit of one value")
  if kind == "depth":
    return program_error("ValueError", f"{subject} data nested deeper than {wire.MAX_DEPTH} "
                         "levels, the limit of one value")
  if kind == "collision":
    return program_error("ValueError", f"{subject} more than {wire.MAX_COLLISIONS} distinct "
                         "values with one hash, the limit of one value")
  if kind == "argument":
    return program_error("TypeError", f"{subject.rsplit(' ', 1)[0]} could not take its "
                         f"arguments: {plain_name(detail, 200)}")
  return program_error("ValueError", f"{subject} malformed data ({plain_name(detail)})")


class Remote:
  """A proxy, in the tests' namespace, for an object of the program's: calling it or reading an
  attribute asks the child. It is equal to nothing, and has no truth value, length, order or
  items: only the plain values its calls return can be compared."""

  __slots__ = ("_attempt", "_number", "_label", "_type", "_is_class")

  def __init__(self, attempt: Attempt, number: int, label: str, type_name: str, is_class: bool):
    self._attempt, self._number, self._label = attempt, number, label
    self._type, self._is_class = plain_name(type_name), is_class

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


def write_back(old: Any, new: Any) -> bool:
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
        if not write_back(old[i], item):
          old[i] = item
    return True
  if kind is dict:
    if list(old) != list(new):
      old.clear()
      old.update(new)
    else:
      for key, item in new.items():
        if not write_back(old[key], item):
          old[key] = item
    return True
  if kind is set:
    old.clear()
    old.update(new)
    return True
  if kind is tuple and len(old) == len(new):
    return all([write_back(a, b) for a, b in zip(old, new)])
  try:
    return (old == new) is True
  except Exception:
    return False


class Attempt:
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
    raise AttemptOver

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
      raise AttemptOver
    data = marshal.dumps(message)
    self._send(len(data).to_bytes(8, "little") + data)
    return self._receive()

  def _decode(self, data: bytes, subject: str, known: Sequence[Any] = (),
              handles: dict[int, Remote] | None = None) -> Any:
    try:
      return wire.decode(data, self.classes, known, handles)[0]
    except wire.WireError as error:
      raise refusal(subject, error.kind, error.detail) from None

  def _failure(self, kind: bytes, payload: bytes, subject: str):
    """Raise what a "raised" or "refused" frame says (anything else breaks the protocol)."""
    if kind == b"raised":
      what = self._decode(payload, subject)
      if (type(what) is tuple and len(what) == 3 and type(what[0]) is str and type(what[1]) is str
          and type(what[2]) is tuple and all(type(line) is str for line in what[2])):
        raise program_error(plain_name(what[0]), what[1], what[2][-3:])
    elif kind == b"refused":
      what = self._decode(payload, subject)
      if type(what) is tuple and len(what) == 2 and all(type(part) is str for part in what):
        raise refusal(subject, what[0], what[1])
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
        namespace[name] = Remote(self, what[1], name, what[2], what[3])

  def call(self, remote: Remote, args: tuple, kwargs: dict[str, Any]) -> Any:
    subject = f"{remote._label} returned"
    sent: dict[int, Remote] = {}  # proxies among the arguments: they may come back in them

    def handle_of(obj: Any) -> int | None:
      if type(obj) is not Remote or obj._attempt is not self:
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
          raise refusal(subject, "malformed", "arguments that do not match the call")
        for old, new in zip(args, changed[0]):
          write_back(old, new)
        for key, old in kwargs.items():
          write_back(old, changed[1][key])
      return result
    if kind == b"handle":
      number, type_name = self._handle(payload, subject)
      if remote._is_class and not args and not kwargs:
        return Remote(self, number, remote._label + "()", type_name, False)
      raise refusal(subject, "type", type_name)
    self._failure(kind, payload, subject)

  def attribute(self, remote: Remote, name: str) -> Any:
    label = f"{remote._label}.{name}"
    kind, payload = self._request(("attribute", remote._number, name))
    if kind == b"value":
      return self._decode(payload[4:], f"{label} is")
    if kind == b"handle":
      number, type_name = self._handle(payload, f"{label} is")
      return Remote(self, number, label, type_name, False)
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
    except AttemptOver:
      pass

