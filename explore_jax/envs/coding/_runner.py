"""The child side of `sandbox.run_program`: run one untrusted program and answer the tests' calls.

`sandbox.run_program` starts `python -I -S -B -c <bootstrap>` (isolated mode, no site packages, no
bytecode written) in a fresh directory, inside `unshare -rn` where that works. The bootstrap reads
one marshal'd request from stdin and runs this file's code, which the parent compiled once and sent
with it (a script is compiled from source at every start: that was a fifth of an attempt). It is not
a module of the package, and imports only modules that are built in or loaded anyway when the
interpreter starts (json, traceback or signal would each add a third to its start-up time).
`main(request)`, in order:

1. takes the request (the program's source, the setup, the plain-data codec `wire.py` and the audit
   hook `_audit.py` compiled by the parent, the names the tests use, the names of the task's classes,
   the limits, a random token and its two pipes) and points stdin at /dev/null;
2. limits itself (address space, CPU seconds, file size, processes, open files, core dumps),
   empties os.environ, captures stdout and stderr in memory and starts a wall-clock timer;
3. installs the audit hook (Python cannot remove one) that ends the run as "blocked" when the program
   opens a socket, starts or signals another process, loads native code, writes, removes or links
   files outside its directory, opens a directory or a special file, reads /proc, or raises its
   limits (`_audit.py`);
4. compiles the program, runs the setup and the program (not when every test is a stdin test), and
   says "ready" with what each of the tests' names is in the program's namespace: plain data, a
   module, or a handle (a number in this process's table of objects);
5. answers the parent's requests, one at a time: call a handle (the arguments come as plain data;
   the answer is the result as plain data, with the arguments again if the call changed them, a
   new handle for a class called without arguments such as LeetCode's `Solution()`, the exception
   the call raised, or why the result cannot cross), read an attribute of a handle, or run the
   program afresh on a stdin text and answer what it printed;
6. on "end", or when the program runs out of time or memory, breaks a rule, or fails before its
   tests, writes an "end" frame (the status, a message and what the program printed) and leaves
   with os._exit, so no finalizer or atexit handler of the program runs after it.

Frames are "<token> <kind> <length>\n<payload>", the payload in the `wire` format. The tests, their
expected values and the verdict never come here: the parent runs the tests and compares what comes
back, which can only be plain data. So the program can do what it likes in this interpreter (read
the token from the runner's frames, patch the codec, write frames of its own) and still only answer
the calls it is given; the token keeps stray output from passing for frames, and the layers above
keep the program inside its box.

Everything the hook and the frames rely on is bound to local names before the program runs:
rebinding a module attribute or a builtin cannot switch a check off, and the hook's closures are
reachable from no object the program can get hold of.
"""

import _signal as signal  # the C module: `signal` itself imports enum
import builtins
import io
import marshal
import os
import resource
import sys

ASSERT_MARK = "__explore_jax_assert__"   # first element of the message tuple of a rewritten assert


def timer_handler(running, timeout):
  """The SIGALRM and SIGXCPU handler: raise `timeout` while `running[0]`, and try again 50 ms later.

  Its own bindings, so that the program, which can reach signal handlers, reaches no name the
  frames use. While `running[0]` is False (a frame is being written) the timer only rearms.
  """
  setitimer, timer = signal.setitimer, signal.ITIMER_REAL

  def on_timer(signum, frame):
    setitimer(timer, 0.05)  # should the program swallow this one, or a frame be on its way
    if running[0]:
      raise timeout()

  return on_timer


class Capture:
  """A text stream that keeps the first `limit` characters written to it and counts the rest."""

  encoding, errors = "utf-8", "replace"

  def __init__(self, limit):
    self.limit, self.kept, self.size, self.dropped = limit, [], 0, 0

  def write(self, text):
    if not isinstance(text, str):
      raise TypeError(f"write() argument must be str, not {type(text).__name__}")
    room = self.limit - self.size
    if room > 0:
      self.kept.append(text[:room])
      self.size += min(room, len(text))
    self.dropped += max(0, len(text) - max(room, 0))
    return len(text)

  def text(self):
    text = "".join(self.kept)
    return text + f"\n... ({self.dropped} more characters)" if self.dropped else text

  def flush(self):
    pass

  def isatty(self):
    return False

  def writable(self):
    return True

  def readable(self):
    return False


def main(request):
  """Serve one attempt: `request` is the parent's (the bootstrap read it from stdin)."""
  write, read, exit_ = os.write, os.read, os._exit
  setitimer, timer = signal.setitimer, signal.ITIMER_REAL
  set_handler, ignore = signal.signal, signal.SIG_IGN
  timer_signals = (signal.SIGALRM, signal.SIGXCPU)
  exec_, compile_, isinstance_, len_, str_, type_ = exec, compile, isinstance, len, str, type
  callable_, getattr_, max_, tuple_, repr_, join, view, loads, from_bytes = (
      callable, getattr, max, tuple, repr, b"".join, memoryview, marshal.loads, int.from_bytes)
  text_wrapper, bytes_io, open_, os_open, lseek, unlink, dup2, close = (
      io.TextIOWrapper, io.BytesIO, io.open, os.open, os.lseek, os.unlink, os.dup2, os.close)

  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)
  os.close(null)

  token, call_fd, reply_fd, box = (request["token"], request["call_fd"], request["reply_fd"],
                                   request["box"])
  program, setup_code, stdin_only = request["program"], request["setup"], request["stdin_only"]
  names, class_names = tuple(request["names"]), frozenset(request["classes"])
  time_limit = request["time_limit"]
  sources = {"<program>": program, "<setup>": request["setup_source"]}
  # The codec gets a copy of the builtins as they are now: the program may rebind the module's.
  codec = {"__name__": "wire", "__builtins__": dict(vars(builtins))}
  exec_(request["wire"], codec)
  audit = {"__name__": "_audit", "__builtins__": builtins}
  exec_(request["audit"], audit)
  make_hook = audit["make_hook"]
  encode, decode, WireError = codec["encode"], codec["decode"], codec["WireError"]
  plain_types, max_bytes = codec["PLAIN_TYPES"], codec["MAX_BYTES"]
  time_message = f"Time limit of {time_limit} s exceeded"
  memory_message = f"Memory limit exceeded ({request['memory_bytes'] >> 20} MB)"
  capture = Capture(request["max_output"])
  header = token.encode("ascii") + b" "

  class Timeout(BaseException):
    pass

  running = [True]  # whether the timer interrupts: False while a frame is written, and at the end

  # ---- frames -----------------------------------------------------------------------------------

  def strings(*texts):
    """A tuple of str in the wire format, built without the codec (which the program can reach)."""
    parts = [b"t", len_(texts).to_bytes(4, "little")]
    for text in texts:
      encoded = text.encode("utf-8", "surrogatepass")
      parts += [b"s", len_(encoded).to_bytes(4, "little"), encoded]
    return join(parts)

  def send(kind, payload):
    """Write one frame whole: the timer only rearms while it is on its way."""
    frame = view(header + kind + b" " + str_(len_(payload)).encode("ascii") + b"\n" + payload)
    running[0] = False
    try:
      while frame:
        frame = frame[write(reply_fd, frame):]
    except OSError:
      exit_(0)  # the parent is gone
    running[0] = True

  def finish(status, message):
    """The last frame: the status, a message and the program's output; then leave."""
    try:
      for number in timer_signals:
        set_handler(number, ignore)
      setitimer(timer, 0)
      output = str_(capture.text())
    except BaseException:
      output = ""
    try:
      send(b"end", strings(status, message, output))
    finally:
      exit_(0)

  pending = [b""]  # what was read of the parent's next requests

  def read_exactly(n):
    parts, n = [pending[0]], n - len_(pending[0])
    while n > 0:
      chunk = read(call_fd, max_(n, 1 << 16))
      if not chunk:
        exit_(0)  # the parent is gone
      parts.append(chunk)
      n -= len_(chunk)
    data = join(parts)
    pending[0] = data[len_(data) + n:] if n < 0 else b""
    return data[:len_(data) + n] if n < 0 else data

  def receive():
    """The parent's next request (trusted: marshal'd, eight bytes of length first)."""
    return loads(read_exactly(from_bytes(read_exactly(8), "little")))

  # ---- limits, environment, timer ---------------------------------------------------------------

  def limit(which, soft, hard=None):
    hard = soft if hard is None else hard
    current = resource.getrlimit(which)[1]
    if current != resource.RLIM_INFINITY:
      soft, hard = min(soft, current), min(hard, current)
    resource.setrlimit(which, (soft, hard))

  cpu_seconds = int(-(-time_limit // 1)) + 1
  limit(resource.RLIMIT_CPU, cpu_seconds, cpu_seconds + 1)
  limit(resource.RLIMIT_AS, request["memory_bytes"])
  limit(resource.RLIMIT_FSIZE, request["file_bytes"])
  limit(resource.RLIMIT_NPROC, request["processes"])
  limit(resource.RLIMIT_NOFILE, 256)
  limit(resource.RLIMIT_CORE, 0)
  os.environ.clear()
  for name in ("mknod", "mkfifo"):  # file creation without an audit event
    for module in (os, sys.modules["posix"]):
      if hasattr(module, name):
        delattr(module, name)

  def leave(code=None):
    raise SystemExit(code)

  builtins.exit = builtins.quit = leave  # what the site module would have defined
  sys.stdout = sys.stderr = capture
  empty_stdin = io.StringIO("")
  sys.stdin = empty_stdin

  on_timer = timer_handler(running, Timeout)
  signal.signal(signal.SIGALRM, on_timer)
  signal.signal(signal.SIGXCPU, on_timer)
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the size limit fails instead
  setitimer(timer, time_limit)
  reserve = [bytearray(1 << 22)]  # freed after a MemoryError to make room for the last frame

  # ---- messages ---------------------------------------------------------------------------------

  def short_repr(value, limit_chars=120):
    try:
      text = str_(repr_(value))
    except BaseException:
      text = f"<{type_(value).__name__} that cannot be shown>"
    return text if len_(text) <= limit_chars else text[:limit_chars - 3] + "..."

  def exception_line(error):
    name = type_(error).__name__
    try:
      text = str_(error)
    except BaseException:
      text = ""
    if len_(text) > 300:
      text = text[:297] + "..."
    return f"{name}: {text}" if text else name

  def frames_of(error):
    """The last lines of the traceback within the program and the setup, recursion collapsed."""
    frames = []
    tb = error.__traceback__
    while tb is not None:
      code = tb.tb_frame.f_code
      source = sources.get(code.co_filename)
      if source is not None:
        lines = source.splitlines()
        number = tb.tb_lineno or 0
        line = lines[number - 1].strip() if 0 < number <= len_(lines) else ""
        frames.append(f'  File "{code.co_filename}", line {number}, in {code.co_name}'
                      + (f"\n    {line}" if line else ""))
      tb = tb.tb_next
    lines, repeats = [], 0
    for frame in frames + [None]:  # collapse recursion as Python does
      if lines and frame == lines[-1]:
        repeats += 1
        continue
      if repeats:
        lines.append(f"  [Previous line repeated {repeats} more times]")
        repeats = 0
      if frame is not None:
        lines.append(frame)
    return tuple_(lines[-3:])

  def syntax_message(error):
    if not isinstance_(error, SyntaxError):
      return exception_line(error)
    lines = [f'  File "<program>", line {error.lineno}']
    if error.text:
      text = error.text.rstrip("\n")
      stripped = text.lstrip()
      lines.append("    " + stripped)
      if error.offset:
        lines.append("    " + " " * max_(0, error.offset - 1 - (len_(text) - len_(stripped))) + "^")
    lines.append(f"{type_(error).__name__}: {error.msg}")
    return "\n".join(lines)

  def described(error):
    return "\n".join(frames_of(error) + (exception_line(error),))

  # ---- the run ----------------------------------------------------------------------------------

  sys.addaudithook(make_hook(box, lambda what: finish(
      "blocked", "Blocked: the program tried to " + what)))
  del request

  module_type, modules = type(sys), sys.modules

  def new_namespace(name):
    """A module's namespace for the program, registered as `name` and as __main__ (so that
    dataclasses and pickle find it, and `import __main__` does not give the runner)."""
    module = module_type(name)
    module.__dict__["__builtins__"] = builtins
    modules[name] = modules["__main__"] = module
    return module.__dict__

  # A function-style program is not __main__, so its `if __name__ == "__main__":` demo does not run
  # (as in HumanEval's own harness); a stdin/stdout program is.
  namespace = new_namespace("solution")
  handles, numbers = {}, {}  # the objects the parent holds proxies of, by number, and back

  def remember(obj):
    number = len_(handles)
    handles[number] = obj
    numbers[id(obj)] = number  # the table keeps the object, and so its id
    return number

  def number_of(obj):
    return numbers.get(id(obj))

  def run_on_input(code, stdin):
    """Run the program afresh with `stdin` as its input; what it printed."""
    fresh = new_namespace("__main__")
    if setup_code is not None:
      exec_(setup_code, fresh)
    path = box + "/.stdin"
    fd = os_open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)  # 0 if the program closed it
    try:
      payload = stdin.encode("utf-8")
      while payload:
        payload = payload[write(fd, payload):]
      lseek(fd, 0, 0)
      unlink(path)
      if fd != 0:
        dup2(fd, 0)
    finally:
      if fd != 0:
        close(fd)
    out = text_wrapper(bytes_io(), encoding="utf-8", errors="replace")
    sys.stdin, sys.stdout = open_(0, "r", encoding="utf-8", errors="replace", closefd=False), out
    try:
      exec_(code, fresh)
    except SystemExit as error:
      if error.code is not None and error.code != 0:
        raise
    finally:
      sys.stdin, sys.stdout = empty_stdin, capture
    out.flush()
    return out.buffer.getvalue().decode("utf-8", "replace")

  def start():
    """Compile and run the program: (code, None), or (None, (status, message)) when it cannot
    serve its tests; Timeout and MemoryError pass."""
    try:
      code = compile_(program, "<program>", "exec", dont_inherit=True)
    except (Timeout, MemoryError):
      raise
    except Exception as error:
      return None, ("syntax_error", syntax_message(error))
    if not stdin_only:
      try:
        if setup_code is not None:
          exec_(setup_code, namespace)
        exec_(code, namespace)
      except (Timeout, MemoryError):
        raise
      except SystemExit as error:
        return None, ("crashed", f"The program exited (SystemExit: {short_repr(error.code)}) "
                      "before its tests ran")
      except BaseException as error:
        return None, ("crashed",
                      "The program raised an exception before its tests ran:\n" + described(error))
    return code, None

  def resolve():
    """What each name the tests use is in the program's namespace, in the wire format."""
    found = {}
    for name in names:
      if name not in namespace:
        continue
      value = namespace[name]
      kind = type_(value)
      if kind is module_type:
        found[name] = ("module",)
        continue
      if kind in plain_types:
        try:
          encode(value, class_names)
          found[name] = ("value", value)
          continue
        except WireError:
          pass
      found[name] = ("handle", remember(value), str_(kind.__name__), isinstance_(value, type_))
    return encode(found, class_names)[0]

  def answer(first, second=b""):
    send(b"value", len_(first).to_bytes(4, "little") + first + second)

  def refuse(kind, detail=""):
    send(b"refused", strings(kind, str_(detail)))

  def raised(error):
    try:
      text = exception_line(error).partition(": ")[2]
      payload = encode((str_(type_(error).__name__), text, frames_of(error)))[0]
    except (Timeout, MemoryError):
      raise
    except BaseException:
      payload = encode(("Exception", "an exception that cannot be shown", ()))[0]
    send(b"raised", payload)

  def call(number, raw, mutable):
    """Call handle `number` with the encoded (args, kwargs); the arguments come back too when the
    call changed them (compared with a second decoding of `raw`)."""
    target = handles[number]
    classes = {name: namespace.get(name) for name in class_names}
    try:
      (args, kwargs), objects = decode(raw, classes, (), handles)
      before = decode(raw, classes, (), handles)[0] if mutable else None
    except (Timeout, MemoryError):
      raise
    except WireError as error:
      if error.kind == "type":
        return refuse("argument", f"it has no class {error.detail} to build them with")
      return refuse("argument", f"{error.kind} {error.detail}".strip())
    except BaseException as error:
      return refuse("argument", exception_line(error))
    try:
      result = target(*args, **kwargs)
    except (Timeout, MemoryError):
      raise
    except BaseException as error:
      return raised(error)
    if not args and not kwargs and isinstance_(target, type_) and type_(result) not in plain_types:
      return send(b"handle", encode((remember(result), str_(type_(result).__name__)))[0])
    changed = None
    if mutable:
      try:
        same = (before == (args, kwargs)) is True
      except (Timeout, MemoryError):
        raise
      except BaseException:
        same = False
      if not same:
        changed = (args, kwargs)
    try:
      first = encode(result, class_names, None, objects, True)[0]
      second = (encode(changed, class_names, number_of, objects)[0] if changed is not None
                else b"")
    except (Timeout, MemoryError):
      raise
    except WireError as error:
      return refuse(error.kind, error.detail)
    except BaseException as error:  # a generator raised while it was drained
      return raised(error)
    answer(first, second)

  def attribute(number, name):
    """Read attribute `name` of handle `number`: plain data, or a handle for a callable."""
    try:
      value = getattr_(handles[number], name)
    except (Timeout, MemoryError):
      raise
    except BaseException as error:
      return raised(error)
    if type_(value) in plain_types:
      try:
        return answer(encode(value, class_names)[0])
      except WireError as error:
        return refuse(error.kind, error.detail)
    if callable_(value):
      return send(b"handle", encode((remember(value), str_(type_(value).__name__)))[0])
    refuse("type", str_(type_(value).__name__))

  def on_input(code, stdin):
    try:
      out = run_on_input(code, stdin)
    except (Timeout, MemoryError):
      raise
    except BaseException as error:
      return raised(error)
    try:
      answer(encode(out)[0])
    except WireError as error:
      refuse(error.kind, error.detail)

  def serve(code):
    while True:
      message = receive()
      if message[0] == "call":
        call(message[1], message[2], message[3])
      elif message[0] == "attribute":
        attribute(message[1], message[2])
      elif message[0] == "stdin":
        on_input(code, message[1])
      else:
        finish("bye", "")

  try:
    code, failure = start()
    if failure is not None:
      finish(*failure)
    try:
      ready = resolve()
    except WireError:
      ready = None
    if ready is None:
      finish("crashed", f"The names the tests use hold more than {max_bytes} bytes of data")
    send(b"ready", ready)
    serve(code)
  except Timeout:
    running[0] = False
    finish("timeout", time_message)
  except MemoryError:
    running[0] = False
    reserve.clear()
    finish("memory", memory_message)
