"""The child's audit hook (`_runner.py` installs it before the program runs; Python cannot remove one).

Like the runner, this is not a module of the package: the parent compiles it once and sends it with the request,
and the runner runs it in a namespace of its own. `make_hook(box, deny)` returns the hook, which calls
`deny(what)` (the runner's: it ends the run as "blocked" and never returns) when the program opens a socket,
starts or signals another process, loads native code, writes, removes or links files outside its directory
`box`, opens a directory or a special file, reads /proc, or raises its limits. Reading files is allowed (the
standard library must load).

Every name the hook uses is bound when it is made, before the program runs: rebinding a module attribute or a
builtin cannot switch a check off.
"""

import os


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
