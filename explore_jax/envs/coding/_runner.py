"""The child side of `sandbox.run_program`: run one untrusted program and its tests, then report.

`sandbox.run_program` starts this file as `python -I -S -B _runner.py` (isolated mode, no site
packages, no bytecode written) in a fresh directory, inside `unshare -rn` where that works. It is a
script, not a module of the package, and imports only modules that are built in or loaded anyway
when the interpreter starts (json, traceback or signal would each add a third to its start-up
time). In order it:

1. reads one marshal'd request from stdin (the program's source, the setup and tests compiled by
   the parent, the limits and a random token), then points stdin at /dev/null;
2. limits itself (address space, CPU seconds, file size, processes, open files, core dumps),
   empties os.environ, captures stdout and stderr in memory and starts a wall-clock timer;
3. installs an audit hook (Python cannot remove one) that ends the run as "blocked" when the program
   opens a socket, starts or signals another process, loads native code, writes, removes or links
   files outside its directory, opens a directory or a special file, reads /proc, or raises its
   limits;
4. compiles the program, runs the setup and the program, then each test in the program's namespace
   (a test with `stdin` runs the program afresh on that input, its output in `__output__`);
5. writes "<token> <one 0/1 per test> <json>" to the result descriptor and leaves with os._exit,
   so no finalizer or atexit handler of the program runs after the report.

The program shares this interpreter, so everything the hook and the report rely on is bound to
local names before it runs: rebinding a module attribute or a builtin cannot switch a check off,
and the hook's closures are reachable from no object the program can get hold of. Only the parent
knows the token, so printed or written output cannot pass for a report. The hook keeps the program
from reaching outside the process, not from inspecting the interpreter it runs in: a program
written to search the runner's frames for the token could find it.
"""

import _signal as signal  # the C module: `signal` itself imports enum
import builtins
import io
import marshal
import os
import resource
import sys

ASSERT_MARK = "__explore_jax_assert__"   # first element of the message tuple of a rewritten assert


def make_hook(box, deny):
  """The audit hook: calls `deny(what)` (which never returns) for an operation outside the rules."""
  # Bound once: the program may rebind any module attribute or builtin, not these names.
  getpid, getcwd, lstat, readlink = os.getpid, os.getcwd, os.lstat, os.readlink
  str_, bytes_, int_, type_, len_, tuple_ = str, bytes, int, type, len, tuple
  write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
  devnull, box_prefix = os.devnull, box + "/"
  imports = {
      "ctypes": "loading native code", "_ctypes": "loading native code",
      "_posixsubprocess": "starting processes", "_multiprocessing": "starting processes",
      "_posixshmem": "shared memory", "_xxsubinterpreters": "a sub-interpreter",
      "_xxinterpchannels": "a sub-interpreter", "posix": "reloading the os module"}
  processes = frozenset({"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec",
                         "os.system", "subprocess.Popen", "pty.spawn"})
  refused = {
      "os.chmod": "change file permissions", "os.chown": "change file ownership",
      "os.chflags": "change file flags", "os.lchflags": "change file flags",
      "os.setxattr": "change file attributes", "os.removexattr": "change file attributes",
      "os.link": "create a link", "os.symlink": "create a link",
      "os.killpg": "send a signal to a process group",
      "resource.setrlimit": "change its resource limits",
      "resource.prlimit": "change its resource limits",
      "fcntl.ioctl": "control a device (ioctl)",
      "sqlite3.enable_load_extension": "load native code",
      "sqlite3.load_extension": "load native code",
      "syslog.openlog": "write to the system log", "syslog.syslog": "write to the system log"}
  # event: (verb, indexes of its path arguments, indexes of its directory-descriptor arguments)
  changes = {
      "os.remove": ("remove", (0,), (1,)), "os.rmdir": ("remove", (0,), (1,)),
      "shutil.rmtree": ("remove", (0,), (1,)), "os.mkdir": ("create", (0,), (2,)),
      "os.truncate": ("truncate", (0,), ()), "os.utime": ("change", (0,), (3,)),
      "os.rename": ("move", (0, 1), (2, 3)), "sqlite3.connect": ("open a database at", (0,), ())}

  def shown(path):
    text = repr(path) if type_(path) is not str_ else path
    return text if len_(text) <= 80 else text[:77] + "..."

  def as_text(path):
    if type_(path) is bytes_:
      return path.decode("utf-8", "surrogateescape")
    return path

  def resolve(path):
    """The absolute path with every symbolic link followed (os.path.realpath, from bound names)."""
    if not path.startswith("/"):
      path = getcwd() + "/" + path
    pending = path.split("/")[::-1]
    parts, links = [], 0
    while pending:
      part = pending.pop()
      if part == "" or part == ".":
        continue
      if part == "..":
        if parts:
          parts.pop()
        continue
      candidate = "/" + "/".join(parts + [part])
      try:
        mode = lstat(candidate).st_mode
      except OSError:
        parts.append(part)
        continue
      if mode & 0o170000 == 0o120000 and links < 40:
        links += 1
        target = readlink(candidate)
        if target.startswith("/"):
          parts = []
        pending.extend(target.split("/")[::-1])
      else:
        parts.append(part)
    return "/" + "/".join(parts)

  def inside(real):
    return real == box or real.startswith(box_prefix)

  def check_open(args):
    path, mode, flags = args[0], args[1], args[2]
    if type_(path) is int_:
      return  # a descriptor the process already holds
    if type_(path) is not str_ and type_(path) is not bytes_:
      deny(f"open a path given as {type_(path).__name__}")
    text = as_text(path)
    real = resolve(text)
    plain = text if text.startswith("/") else getcwd() + "/" + text
    for name in (plain, real):
      if name == "/proc" or name.startswith("/proc/") or name.startswith("/dev/fd/"):
        deny(f"read {shown(path)}")
    writing = flags & write_flags or (type_(mode) is str_ and (
        "w" in mode or "a" in mode or "x" in mode or "+" in mode))
    try:
      kind = lstat(real).st_mode & 0o170000
    except OSError:
      kind = None
    if kind == 0o040000:
      deny(f"open the directory {shown(path)}")
    if writing and real != devnull and not inside(real):
      deny(f"write to {shown(path)} outside its directory")
    if kind is not None and kind != 0o100000 and inside(real):
      deny(f"open the special file {shown(path)}")

  def check_change(event, args):
    verb, path_indexes, fd_indexes = changes[event]
    for i in fd_indexes:
      if i < len_(args) and args[i] is not None and args[i] != -1:
        deny(f"{verb} a file relative to a directory descriptor")
    for i in path_indexes:
      path = args[i]
      if type_(path) is int_ and event == "os.truncate":
        continue
      if type_(path) is not str_ and type_(path) is not bytes_:
        deny(f"{verb} a path given as {type_(path).__name__}")
      if not inside(resolve(as_text(path))):
        deny(f"{verb} {shown(path)} outside its directory")

  def check_import(args):
    name = args[0]
    if type_(name) is str_:
      for part in name.split("."):
        if part in imports:
          deny(f"import {name} ({imports[part]} is not allowed)")
        if part.startswith("_test"):
          deny(f"import {name}")

  def hook(event, args):
    if type_(args) is not tuple_:
      return
    if event == "open":
      check_open(args)
    elif event == "import":
      check_import(args)
    elif event in changes and event != "sqlite3.connect":
      check_change(event, args)
    elif event in processes:
      deny(f"start a process ({event})")
    elif event == "os.kill":
      if args[0] != getpid():
        deny("send a signal to another process")
    elif event in refused:
      deny(refused[event])
    elif event == "sqlite3.connect":
      database = args[0]
      if type_(database) is str_ and database.startswith("file:"):
        deny("open a database by URI")
      if not (type_(database) is str_ and (database == ":memory:" or database == "")):
        check_change(event, args)
    elif event.startswith("socket."):
      deny("open a network socket")
    elif event.startswith("ctypes."):
      deny("load native code (ctypes)")

  return hook


def timer_handler(running, timeout):
  """The SIGALRM and SIGXCPU handler: raise `timeout` while `running[0]`, and again 50 ms later.

  Its own bindings, so that the program, which can reach signal handlers, reaches no name the
  report uses.
  """
  setitimer, timer = signal.setitimer, signal.ITIMER_REAL

  def on_timer(signum, frame):
    if running[0]:
      setitimer(timer, 0.05)  # should the program swallow this one
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


def main():
  write, exit_, setitimer, timer = os.write, os._exit, signal.setitimer, signal.ITIMER_REAL
  set_handler, ignore = signal.signal, signal.SIG_IGN
  timer_signals = (signal.SIGALRM, signal.SIGXCPU)
  exec_, compile_, isinstance_, len_, str_, type_ = exec, compile, isinstance, len, str, type
  text_wrapper, bytes_io, open_, os_open, lseek, unlink, dup2, close = (
      io.TextIOWrapper, io.BytesIO, io.open, os.open, os.lseek, os.unlink, os.dup2, os.close)

  data = bytearray()
  while True:
    chunk = os.read(0, 1 << 20)
    if not chunk:
      break
    data += chunk
  request = marshal.loads(bytes(data))
  del data
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)
  os.close(null)

  token, result_fd, box = request["token"], request["result_fd"], request["box"]
  program, tests, setup_code = request["program"], request["tests"], request["setup"]
  time_limit = request["time_limit"]
  zeros = "0" * len_(tests)
  sources = {"<program>": program, "<setup>": request["setup_source"]}
  for name, _, source, _ in tests:  # tests: [(name, code object, source, stdin or None)]
    sources[f"<{name}>"] = source
  time_message = f"Time limit of {time_limit} s exceeded"
  memory_message = f"Memory limit exceeded ({request['memory_bytes'] >> 20} MB)"
  capture = Capture(request["max_output"])
  escapes = {i: "\\u%04x" % i for i in range(32)}
  escapes.update({ord('"'): '\\"', ord("\\"): "\\\\"})

  def quote(text):
    return '"' + text.translate(escapes) + '"'

  def report(status, bits, message):
    try:
      for number in timer_signals:
        set_handler(number, ignore)
      setitimer(timer, 0)
      output = str_(capture.text())
      body = "[" + quote(status) + "," + quote(message) + "," + quote(output) + "]"
    except BaseException:
      body = "[" + quote(status) + "," + quote(message) + ',""]'
    line = (token + " " + bits + " " + body + "\n").encode("utf-8", "replace")
    try:
      while line:
        line = line[write(result_fd, line):]
    finally:
      exit_(0)

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

  class Timeout(BaseException):
    pass

  running = [True]  # whether the timer interrupts: False once the runner handles the end
  on_timer = timer_handler(running, Timeout)
  signal.signal(signal.SIGALRM, on_timer)
  signal.signal(signal.SIGXCPU, on_timer)
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the size limit fails instead
  setitimer(timer, time_limit)
  reserve = [bytearray(1 << 22)]  # freed after a MemoryError to make room for the report

  # ---- messages ---------------------------------------------------------------------------------

  def short_repr(value, limit_chars=120):
    try:
      text = str_(repr(value))
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

  def describe(error, stdin=None):
    """A failure's message: a rewritten assert's source (and value), or a short traceback."""
    try:
      args = error.args if isinstance_(error, AssertionError) else ()
      if (len_(args) == 1 and type_(args[0]) is tuple and len_(args[0]) in (2, 3)
          and args[0][0] == ASSERT_MARK):
        text = str_(args[0][1])
        if len_(args[0]) == 3:
          text += f" (got {short_repr(args[0][2])})"
      else:
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
        text = "\n".join(lines[-3:] + [exception_line(error)])
      return f"On input {short_repr(stdin, 60)}: {text}" if stdin is not None else text
    except BaseException:
      return type_(error).__name__

  def syntax_message(error):
    if not isinstance_(error, SyntaxError):
      return exception_line(error)
    lines = [f'  File "<program>", line {error.lineno}']
    if error.text:
      text = error.text.rstrip("\n")
      stripped = text.lstrip()
      lines.append("    " + stripped)
      if error.offset:
        lines.append("    " + " " * max(0, error.offset - 1 - (len_(text) - len_(stripped))) + "^")
    lines.append(f"{type_(error).__name__}: {error.msg}")
    return "\n".join(lines)

  # ---- the run ----------------------------------------------------------------------------------

  sys.addaudithook(make_hook(box, lambda what: report(
      "blocked", zeros, "Blocked: the program tried to " + what)))
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
  progress = ["", ""]  # the bits so far and the test running, for a timeout's report

  def run_on_input(code, stdin):
    """Run the program afresh with `stdin` as its input; its namespace, with `__output__`."""
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
    fresh["__output__"] = out.buffer.getvalue().decode("utf-8", "replace")
    return fresh

  def run():
    """Compile and run the program and its tests: (status, bits, message) unless time or memory
    runs out (Timeout, MemoryError)."""
    try:
      code = compile_(program, "<program>", "exec", dont_inherit=True)
    except (Timeout, MemoryError):
      raise
    except Exception as error:
      return "syntax_error", zeros, syntax_message(error)
    if not tests or any(stdin is None for _, _, _, stdin in tests):
      try:
        if setup_code is not None:
          exec_(setup_code, namespace)
        exec_(code, namespace)
      except (Timeout, MemoryError):
        raise
      except SystemExit as error:
        return "crashed", zeros, (
            f"The program exited (SystemExit: {short_repr(error.code)}) before its tests ran")
      except BaseException as error:
        return "crashed", zeros, (
            "The program raised an exception before its tests ran:\n" + describe(error))
    bits, message = "", ""
    for name, test_code, _, stdin in tests:
      progress[0], progress[1] = bits, name
      try:
        exec_(test_code, namespace if stdin is None else run_on_input(code, stdin))
        bits += "1"
      except (Timeout, MemoryError):
        raise
      except BaseException as error:
        bits += "0"
        if not message:
          message = describe(error, stdin)
    return "passed" if bits == "1" * len_(tests) else "failed", bits, message

  try:
    status, bits, message = run()
  except Timeout:
    running[0] = False
    status, message = "timeout", time_message
    bits = (progress[0] + zeros)[:len_(zeros)]
  except MemoryError:
    running[0] = False
    reserve.clear()
    status, message = "memory", memory_message
    bits = (progress[0] + zeros)[:len_(zeros)]
  if status in ("timeout", "memory") and progress[1]:
    message += f" (in {progress[1]})"
  report(status, bits, message)

main()
