"""What a desktop's programs run as: an unprivileged user and a network namespace of their own (probed once).

- As root: the guardian starts in a new network namespace (`unshare --net`), still root, and starts every
  program through `setpriv` as nobody:nogroup (no supplementary groups, no capabilities, an empty bounding set,
  no_new_privs, so a setuid program gains nothing). The session's folder is root's; the home, runtime and
  temporary folders and the framebuffer (until Xvfb has opened it) are nobody's; the cookie is root's, which
  the group nogroup may read.
- As another user: the programs already lack root's privileges; the guardian starts in a new user and network
  namespace (`unshare --user --map-current-user --net`, else `unshare -rn`) where user namespaces work.

The namespace's only interface is a loopback that is down. X still works across it: clients fall back from
the abstract socket (per namespace) to /tmp/.X11-unix/X<n> (one for the machine). What the machine refuses
is left out, with one RuntimeWarning per process that names it.
"""

from __future__ import annotations

import dataclasses
import functools
import grp
import os
import pwd
import shutil
import subprocess
import threading
import warnings

UNPRIVILEGED_USER = "nobody"
UNPRIVILEGED_GROUPS = ("nogroup", "nobody")
_SETPRIV_FLAGS = ("--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs")
_PROBE_TIMEOUT_S = 30
_PROBE_LOCK = threading.Lock()  # environments start in threads: one probe, one warning


@dataclasses.dataclass(frozen=True)
class Confinement:
  """How one process's desktops run.

  Attributes:
    guardian: the prefix of the guardian's command (a new network namespace; () when there is none).
    program: the prefix of every program the guardian starts (setpriv to `uid`:`gid`; () when not dropping).
    uid, gid: the programs' user and group (this process's when not dropping).
    user: the programs' user name (USER, LOGNAME).
    network: whether the programs have a network namespace of their own.
    missing: what the machine refused, as the warning says it.
  """

  guardian: tuple[str, ...]
  program: tuple[str, ...]
  uid: int
  gid: int
  user: str
  network: bool
  missing: tuple[str, ...] = ()

  @property
  def drops_privileges(self) -> bool:
    return bool(self.program)


def _works(command: list[str]) -> bool:
  try:
    return subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=_PROBE_TIMEOUT_S, check=False).returncode == 0
  except (OSError, subprocess.SubprocessError):
    return False


def _unprivileged_ids() -> tuple[int, int, str] | None:
  try:
    user = pwd.getpwnam(UNPRIVILEGED_USER)
  except KeyError:
    return None
  gid = user.pw_gid
  for name in UNPRIVILEGED_GROUPS:
    try:
      gid = grp.getgrnam(name).gr_gid
      break
    except KeyError:
      continue
  return user.pw_uid, gid, user.pw_name


def confinement() -> Confinement:
  """This process's Confinement, probed on first use (the tools run, `true` in the namespace as the user)."""
  with _PROBE_LOCK:
    return _probe()


@functools.lru_cache(maxsize=1)
def _probe() -> Confinement:
  unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
  missing: list[str] = []
  uid, gid = os.getuid(), os.getgid()
  try:
    user = pwd.getpwuid(uid).pw_name
  except KeyError:
    user = str(uid)
  program: tuple[str, ...] = ()
  if uid == 0:
    ids = _unprivileged_ids()
    if ids is None or setpriv is None:
      missing.append(f"no unprivileged user ({'no user ' + UNPRIVILEGED_USER if ids is None else 'no setpriv'}): "
                     f"the programs run as root")
    else:
      candidate = (setpriv, f"--reuid={ids[0]}", f"--regid={ids[1]}", *_SETPRIV_FLAGS, "--")
      if _works([*candidate, "true"]):
        program, (uid, gid, user) = candidate, ids
      else:
        missing.append("no unprivileged user (setpriv failed): the programs run as root")
  guardian: tuple[str, ...] = ()
  if unshare is not None:
    options = ([("--net",)] if os.getuid() == 0 else
               [("--user", "--map-current-user", "--net"), ("--user", "--map-root-user", "--net")])
    for option in options:
      if _works([unshare, *option, "--", *program, "true"]):
        guardian = (unshare, *option, "--")
        break
  if not guardian:
    missing.append("no network namespace (" + ("`unshare --net` failed" if unshare else "no unshare")
                   + "): the programs share this machine's network")
  if missing:
    warnings.warn("Desktop-v0 cannot fully confine its programs here: " + "; ".join(missing), RuntimeWarning,
                  stacklevel=4)
  return Confinement(guardian, program, uid, gid, user, bool(guardian), tuple(missing))


def hand_over(path: str, confined: Confinement) -> None:
  """Make `path` (a folder, recursively, or a file) the programs' own (nothing to do when not dropping)."""
  if not confined.drops_privileges:
    return
  os.chown(path, confined.uid, confined.gid, follow_symlinks=False)
  for root, dirs, names in os.walk(path):
    for name in (*dirs, *names):
      os.chown(os.path.join(root, name), confined.uid, confined.gid, follow_symlinks=False)
