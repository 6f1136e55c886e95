"""One X desktop session: Xvfb, openbox and pcmanfm's desktop in one guarded process group, driven by xdotool.

See the package docstring (envs/desktop/__init__.py) for the process model; this module is its mechanics.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import weakref

import numpy as np

from explore_jax.envs import processes
from explore_jax.envs.desktop import confine, home
from explore_jax.envs.desktop.framebuffer import Framebuffer

PROGRAMS = ("Xvfb", "openbox", "pcmanfm", "xdotool", "xprop", "xterm", "mousepad", "galculator")
DEFAULT_TIMEOUT_S = 30.0
_POLL_S = 0.05
_STABLE_POLLS = 4       # the starting desktop counts as drawn once this many polls in a row read the same screen
_LOG_LINES = 15
_X_SOCKETS = "/tmp/.X11-unix"
_MAX_DISPLAYS = 20     # displays the guardian tries (one taken meanwhile by another server costs one try)
# The guardian ($1: the session's folder, $2: the screen as WxHxDEPTH, then the programs' prefix, confine.py's):
# picks the first display with neither a lock /tmp/.X<n>-lock nor a socket /tmp/.X11-unix/X<n>, writes a new
# cookie for it into $1/cookie (one Xauthority entry: FamilyWild 0xffff, no address, the display's number,
# MIT-MAGIC-COOKIE-1, 16 random bytes; every client's XAUTHORITY, this process's file that the programs' group
# may only read) and starts Xvfb on it, which takes
# the display's lock (another server that took it meanwhile makes Xvfb exit: the next display is tried); once
# the server answers (xprop, with the cookie), hands the framebuffer to this process's user (so the programs
# cannot shrink or rewrite it), starts openbox and, once openbox manages the screen, pcmanfm's desktop; prints
# the three pids and the display, one a line; then waits for its stdin to close and kills every process that
# carries this session's marker (a program the desktop started may have left the group: xterm's shell starts a
# session of its own) and its own process group. $1/xserver keeps "<Xvfb's pid> <display>" for the cleanup of
# the display's lock and socket.
_GUARDIAN = r"""
dir="$1"; screen="$2"; shift 2; log="$dir/session.log"
finish() {
  cat >/dev/null
  for f in $(grep -lzxF "EXPLORE_JAX_DESKTOP=$EXPLORE_JAX_DESKTOP" /proc/[0-9]*/environ 2>/dev/null); do
    p="${f#/proc/}"; p="${p%/environ}"
    [ "$p" = "$$" ] || kill -KILL "$p" 2>/dev/null
  done
  kill -KILL 0
}
n=0; tries=0; served=""
while [ -z "$served" ]; do
  while [ -e "/tmp/.X$n-lock" ] || [ -e "/tmp/.X11-unix/X$n" ]; do n=$((n + 1)); done
  tries=$((tries + 1))
  if [ "$tries" -gt MAX_DISPLAYS ]; then echo "Xvfb did not serve a display (tried $((tries - 1)))"; finish; fi
  cookie=""; for b in $(od -An -N16 -to1 /dev/urandom); do cookie="$cookie\\$b"; done
  entry="\\377\\377\\0\\0\\0\\$(printf %03o "${#n}")$n\\0\\22MIT-MAGIC-COOKIE-1\\0\\20$cookie"
  (umask 077; printf "$entry" >"$dir/cookie")
  export DISPLAY=":$n"
  "$@" Xvfb "$DISPLAY" -auth "$dir/cookie" -screen 0 "$screen" -fbdir "$dir" -nolisten tcp -s 0 -dpms -noreset \
    </dev/null >/dev/null 2>>"$log" &
  x="$!"
  i=0
  until xprop -root _NET_SUPPORTED >/dev/null 2>&1; do
    kill -0 "$x" 2>/dev/null || break
    if [ "$i" -ge 600 ]; then echo "Xvfb did not serve $DISPLAY"; finish; fi
    sleep 0.05; i=$((i + 1))
  done
  if kill -0 "$x" 2>/dev/null; then served=1; else n=$((n + 1)); fi
done
chown "$(id -u):$(id -g)" "$dir/Xvfb_screen0"; chmod 0644 "$dir/Xvfb_screen0"
echo "$x $DISPLAY" >"$dir/xserver"
echo "$x"
"$@" openbox </dev/null >/dev/null 2>>"$log" &
echo "$!"
i=0
until xprop -root _NET_SUPPORTING_WM_CHECK 2>/dev/null | grep -q "window id"; do
  [ "$i" -lt 600 ] || break
  sleep 0.05; i=$((i + 1))
done
"$@" pcmanfm --desktop </dev/null >/dev/null 2>>"$log" &
echo "$!"
echo "$DISPLAY"
finish
""".replace("MAX_DISPLAYS", str(_MAX_DISPLAYS))
# Removes what a killed Xvfb leaves of its display ($0 is the session's folder): its lock /tmp/.X<n>-lock (which
# holds its pid) and the socket /tmp/.X11-unix/X<n>, unless another server holds the display by then (a lock
# with another pid, or, for a server in this network namespace without a lock, a bound socket in /proc/net/unix).
_CLEANUP = r"""
if read x d <"$0/xserver" 2>/dev/null; then
  n="${d#:}"
  l="$(tr -d ' \n' <"/tmp/.X$n-lock" 2>/dev/null)"
  if [ -z "$l" ] || [ "$l" = "$x" ]; then
    grep -q " /tmp/.X11-unix/X$n\$" /proc/net/unix 2>/dev/null || rm -f "/tmp/.X11-unix/X$n"
    [ -z "$l" ] || rm -f "/tmp/.X$n-lock"
  fi
fi
"""


class DesktopError(RuntimeError):
  """The desktop failed: its X server, window manager or desktop died, or an X call failed. reset() starts anew."""


def check_programs() -> None:
  """RuntimeError naming what is missing when a program the desktop runs is not on PATH."""
  missing = [p for p in PROGRAMS if shutil.which(p) is None]
  if missing:
    raise RuntimeError(f"Desktop-v0 needs {', '.join(missing)} on PATH; run `make desktop` (apt-get install "
                       f"xvfb openbox xdotool x11-utils mousepad pcmanfm galculator xterm)")


class Session:
  """One running X desktop (the package docstring): its processes, its screen and its input.

  Args:
    width, height: the screen's size in pixels.
    timeout_s: the longest the start or one X call may take.
  """

  def __init__(self, width: int, height: int, timeout_s: float = DEFAULT_TIMEOUT_S):
    self.width, self.height, self.timeout_s = int(width), int(height), float(timeout_s)
    self.starts = 0
    self.workdir = ""
    self.display = ""
    self.xvfb_pid: int | None = None
    self.openbox_pid: int | None = None
    self.desktop_pid: int | None = None
    self.failed = False  # an X call failed: the session must not be trusted again
    self.framebuffer: Framebuffer | None = None
    self._group: processes.Guarded | None = None
    self._finalizer: weakref.finalize | None = None
    self._x_env: dict[str, str] = {}

  @property
  def home(self) -> str:
    return os.path.join(self.workdir, "home")

  @property
  def x_env(self) -> dict[str, str]:
    """The environment an X client of this desktop runs with (DISPLAY, XAUTHORITY, PATH, HOME)."""
    return dict(self._x_env)

  @property
  def alive(self) -> bool:
    return (self._group is not None and self._group.alive
            and all(processes.pid_alive(p) for p in (self.xvfb_pid, self.openbox_pid, self.desktop_pid)))

  def start(self) -> None:
    """Start a fresh desktop from the home template (closing the current one, if any); wait until it is drawn."""
    self.close()
    confined = confine.confinement()
    self.workdir = tempfile.mkdtemp(prefix="explore_jax-desktop-")
    try:
      os.chmod(self.workdir, 0o711)  # this process's: the programs reach their folders in it by name only
      for folder, mode in (("run", 0o700), ("tmp", 0o700)):
        os.mkdir(os.path.join(self.workdir, folder), mode)
      home.write_home(self.home, self.width, self.height)
      for name in ("cookie", "Xvfb_screen0"):  # the guardian fills them in; Xvfb opens them as the programs' user
        os.close(os.open(os.path.join(self.workdir, name), os.O_CREAT | os.O_WRONLY, 0o600))
      for name in ("home", "run", "tmp", "Xvfb_screen0"):
        confine.hand_over(os.path.join(self.workdir, name), confined)
      if confined.drops_privileges:  # theirs to read, not to change
        os.chown(os.path.join(self.workdir, "cookie"), os.getuid(), confined.gid)
        os.chmod(os.path.join(self.workdir, "cookie"), 0o640)
      if confined.drops_privileges and not os.path.isdir(_X_SOCKETS):  # root's, as X clients expect it to be
        os.makedirs(_X_SOCKETS, exist_ok=True)
        os.chmod(_X_SOCKETS, 0o1777)
    except BaseException:
      shutil.rmtree(self.workdir, ignore_errors=True)
      raise
    env = home.session_environment(self.workdir, marker=self.workdir, user=confined.user)
    self._group = processes.Guarded(_GUARDIAN, [self.workdir, f"{self.width}x{self.height}x24", *confined.program],
                                    self.workdir, env=env, cwd=self.home, cleanup=_CLEANUP,
                                    name="explore_jax-desktop", prefix=confined.guardian)
    self._finalizer = weakref.finalize(self, processes.stop, self._group)
    self.starts += 1
    self.failed = False
    try:
      self.xvfb_pid = self._group.read_pid("Xvfb")
      self.openbox_pid = self._group.read_pid("openbox")  # or the guardian's complaint that Xvfb failed
      self.desktop_pid = self._group.read_pid("pcmanfm's desktop")
      self.display = self._group.readline()
      if not self.display.startswith(":"):
        raise OSError(f"the guardian printed no display ({self.display!r})")
      self._x_env = {"DISPLAY": self.display, "XAUTHORITY": env["XAUTHORITY"], "PATH": env["PATH"],
                     "HOME": self.home}
      self.framebuffer = Framebuffer(os.path.join(self.workdir, "Xvfb_screen0"))
      if (self.framebuffer.width, self.framebuffer.height) != (self.width, self.height):
        raise ValueError(f"Xvfb's screen is {self.framebuffer.width}x{self.framebuffer.height}, not "
                         f"{self.width}x{self.height}")
      self._wait_until_drawn()
    except (OSError, ValueError, DesktopError) as e:
      error = e if isinstance(e, DesktopError) else DesktopError(
          f"the desktop did not start ({type(e).__name__}: {e}){self._log_tail()}")
      self.close()
      raise error from e

  def screenshot(self) -> np.ndarray:
    """The screen now as uint8 [height, width, 3] (a copy of Xvfb's framebuffer)."""
    if self.framebuffer is None:
      raise DesktopError("no desktop is running; reset() starts one")
    return self.framebuffer.read()

  def check(self, what: str) -> None:
    """DesktopError when a process the desktop needs has died (`what` names the call that found out)."""
    if self._group is None:
      raise DesktopError("no desktop is running; reset() starts one")
    if self.alive and not self.failed:
      return
    if self.alive:
      raise DesktopError(f"an earlier X call of this desktop failed, before {what}; the next reset() starts a new "
                         f"desktop")
    self.failed = True
    dead = [name for name, pid in (("Xvfb (the X server)", self.xvfb_pid), ("openbox (the window manager)",
                                   self.openbox_pid), ("pcmanfm's desktop", self.desktop_pid))
            if not processes.pid_alive(pid)] or ["the desktop's guardian"]
    raise DesktopError(f"{' and '.join(dead)} died before or during {what}; this episode is lost and the next "
                       f"reset() starts a new desktop{self._log_tail()}")

  def xdotool(self, what: str, args: list[str]) -> None:
    """Run xdotool with `args` on this display; DesktopError when it fails or a needed process died."""
    self.check(what)
    try:
      done = subprocess.run(["xdotool", *args], env=self._x_env, stdin=subprocess.DEVNULL, capture_output=True,
                            timeout=self.timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
      self.failed = True
      raise DesktopError(f"{what} failed ({type(e).__name__}: {e}); the next reset() starts a new desktop") from e
    if done.returncode != 0:
      self.check(what)  # a dead server is the likelier cause: say so
      self.failed = True
      detail = done.stderr.decode(errors="replace").strip().splitlines()
      raise DesktopError(f"{what} failed (xdotool exited with {done.returncode}: {detail[-1] if detail else ''}); "
                         f"the next reset() starts a new desktop")

  def close(self) -> None:
    """Stop the desktop and remove its folder (idempotent)."""
    if self._finalizer is not None:
      self._finalizer()  # runs processes.stop at most once
    self._finalizer = None
    self._group = None
    if self.framebuffer is not None:
      self.framebuffer.close()
    self.framebuffer = None
    self.xvfb_pid = self.openbox_pid = self.desktop_pid = None

  def _wait_until_drawn(self) -> None:
    """Wait until pcmanfm has drawn the starting desktop: the background colour in the empty corner, every item's
    icon over it, and the same screen for _STABLE_POLLS polls in a row."""
    cells = home.item_cells(self.width, self.height)
    icons = [home.icon_centre(cell) for cell in cells.values()]
    background = np.array(home.BACKGROUND_RGB, np.uint8)
    deadline = time.monotonic() + self.timeout_s
    previous, same = None, 0
    while True:
      self.check("the desktop's start")
      screen = self.framebuffer.read()
      corner = bool((screen[-2, -2] == background).all())
      drawn = [not (screen[max(0, y - 8):y + 8, max(0, x - 8):x + 8] == background).all(axis=-1).all()
               for x, y in icons if x < self.width and y < self.height]
      ready = corner and all(drawn)
      same = same + 1 if ready and previous is not None and np.array_equal(screen, previous) else 0
      if same >= _STABLE_POLLS:
        return
      if time.monotonic() > deadline:
        raise DesktopError(f"the desktop was not drawn in {self.timeout_s:g} s (the corner's colour "
                           f"{tuple(screen[-2, -2])}, {sum(drawn)} of {len(drawn)} icons){self._log_tail()}")
      previous = screen
      time.sleep(_POLL_S)

  def _log_tail(self) -> str:
    return processes.log_tail(os.path.join(self.workdir, "session.log"), _LOG_LINES, "The session's stderr")
