"""The desktop's home folder, written afresh for every episode, and the environment its programs run in.

What an episode starts from (the same bytes and file times every time):

- ~/Desktop: four launchers -- Terminal (xterm), Text Editor (mousepad), Calculator (galculator), Files
  (pcmanfm's file manager on the home folder) -- and two things to open: notes.txt (opens in the editor) and
  the folder Documents (report.txt, todo.txt). pcmanfm draws them as icons at fixed cells (`ITEMS`, column by
  column from the top-left corner); a double-click opens one (libfm's quick_exec: no "execute?" question).
- openbox: one virtual desktop, no animations, window placement by openbox's deterministic "Smart" policy; a
  right-click on the empty desktop opens its menu with the same four programs (no Exit item).
- GTK: no blinking carets, no animations (gtk-3.0/settings.ini; GSETTINGS_BACKEND=memory, so nothing that an
  episode changes in GSettings survives it).
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import re

FILE_TIME = 1_704_067_200  # 2024-01-01 00:00 UTC: every template file's time, so file lists look alike
CELL_WIDTH, CELL_HEIGHT = 96, 100  # the grid pcmanfm's icons are placed on (one icon and its label)
_MARGIN = 8
BACKGROUND = "#3a6ea5"  # the desktop's colour, where no icon is
BACKGROUND_RGB = tuple(int(BACKGROUND[i:i + 2], 16) for i in (1, 3, 5))


@dataclasses.dataclass(frozen=True)
class DesktopItem:
  """One icon on the desktop: its file name in ~/Desktop, the label pcmanfm draws, and what opens."""

  file: str
  label: str
  command: str = ""  # a launcher's program ("" for a file or folder)


ITEMS = (
    DesktopItem("terminal.desktop", "Terminal", "xterm"),
    DesktopItem("editor.desktop", "Text Editor", "mousepad"),
    DesktopItem("calculator.desktop", "Calculator", "galculator"),
    DesktopItem("files.desktop", "Files", "pcmanfm"),
    DesktopItem("notes.txt", "notes.txt"),
    DesktopItem("Documents", "Documents"),
)
LAUNCHERS = tuple(item for item in ITEMS if item.command)

_LAUNCHER_ICONS = {"xterm": "utilities-terminal", "mousepad": "org.xfce.mousepad",
                   "galculator": "accessories-calculator", "pcmanfm": "system-file-manager"}
_LAUNCHER_EXEC = {"xterm": "xterm", "mousepad": "mousepad %F", "galculator": "galculator", "pcmanfm": "pcmanfm %U"}
_FILES = {
    "Desktop/notes.txt": "Things to look at:\n- the calculator\n- the file manager\n- the terminal\n",
    "Desktop/Documents/report.txt": "Quarterly report\n\nNothing to report yet.\n",
    "Desktop/Documents/todo.txt": "1. Open the editor\n2. Write something\n3. Save it\n",
    ".config/libfm/libfm.conf": "[config]\nquick_exec=1\nsingle_click=0\nconfirm_del=1\n\n[ui]\nbig_icon_size=48\n",
    ".config/gtk-3.0/settings.ini": ("[Settings]\ngtk-cursor-blink=false\ngtk-enable-animations=false\n"
                                     "gtk-recent-files-enabled=false\n"),
    ".config/mimeapps.list": ("[Default Applications]\ntext/plain=org.xfce.mousepad.desktop\n"
                              "inode/directory=pcmanfm.desktop\n"),
    ".config/openbox/menu.xml": ('<?xml version="1.0" encoding="UTF-8"?>\n'
                                 '<openbox_menu xmlns="http://openbox.org/3.4/menu">\n'
                                 '<menu id="root-menu" label="Desktop">\n'
                                 + "".join(f'  <item label="{item.label}"><action name="Execute"><command>'
                                           f'{item.command}</command></action></item>\n' for item in LAUNCHERS)
                                 + "</menu>\n</openbox_menu>\n"),
    ".bashrc": "PS1='\\w$ '\n",
}
_SYSTEM_OPENBOX_RC = "/etc/xdg/openbox/rc.xml"


def item_cells(width: int, height: int) -> dict[str, tuple[int, int]]:
  """Each desktop item's cell (its top-left corner), column by column from the screen's top-left corner."""
  rows = max(1, (height - _MARGIN) // CELL_HEIGHT)
  return {item.file: (_MARGIN + CELL_WIDTH * (i // rows), _MARGIN + CELL_HEIGHT * (i % rows))
          for i, item in enumerate(ITEMS)}


def icon_centre(cell: tuple[int, int]) -> tuple[int, int]:
  """The centre of the icon pcmanfm draws in a cell (48-pixel icons, horizontally centred, label below)."""
  return cell[0] + CELL_WIDTH // 2, cell[1] + 30


def openbox_rc(system_rc: str) -> str:
  """Debian's openbox rc.xml with one virtual desktop, no iconify animation and only our menu file."""
  rc, n = re.subn(r"(<desktops>.*?<number>)\d+(</number>)", r"\g<1>1\g<2>", system_rc, count=1, flags=re.S)
  rc, m = re.subn(r"<animateIconify>yes</animateIconify>", "<animateIconify>no</animateIconify>", rc)
  rc = re.sub(r"\s*<file>/var/lib/openbox/debian-menu.xml</file>", "", rc)
  if not (n and m):
    raise ValueError("openbox's rc.xml has no <desktops><number> or <animateIconify> to set")
  return rc


def write_home(home: str, width: int, height: int) -> None:
  """Write the starting home folder into `home` (an empty or missing folder)."""
  files = dict(_FILES)
  for item in LAUNCHERS:
    files[f"Desktop/{item.file}"] = (f"[Desktop Entry]\nType=Application\nName={item.label}\n"
                                     f"Exec={_LAUNCHER_EXEC[item.command]}\nIcon={_LAUNCHER_ICONS[item.command]}\n"
                                     f"Terminal=false\n")
  cells = item_cells(width, height)
  files[".config/pcmanfm/default/desktop-items-0.conf"] = (
      f"[*]\nwallpaper_mode=color\ndesktop_bg={BACKGROUND}\ndesktop_fg=#ffffff\ndesktop_shadow=#000000\n"
      "show_trash=0\nshow_documents=0\nshow_mounts=0\nshow_wm_menu=1\n"
      + "".join(f"\n[{name}]\nx={x}\ny={y}\n" for name, (x, y) in cells.items()))
  with open(_SYSTEM_OPENBOX_RC) as f:
    files[".config/openbox/rc.xml"] = openbox_rc(f.read())
  os.makedirs(os.path.join(home, "Desktop", "Documents"), exist_ok=True)
  for name in ("Templates", ".local/share", ".cache"):
    os.makedirs(os.path.join(home, name), exist_ok=True)
  for relative, text in files.items():
    path = os.path.join(home, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(text)
  for root, dirs, names in os.walk(home, topdown=False):
    for name in (*names, *dirs):
      os.utime(os.path.join(root, name), (FILE_TIME, FILE_TIME), follow_symlinks=False)
  os.utime(home, (FILE_TIME, FILE_TIME))


def session_environment(workdir: str, marker: str, user: str | None = None) -> dict[str, str]:
  """The variables every program of the session starts with: its own home, runtime and temporary folders, the
  display's Xauthority file, no session bus (GLib programs then run alone instead of finding each other), no
  accessibility bus, UTC, C.UTF-8; `marker` tags every descendant, so that the guardian finds those that left
  its process group; `user` names the programs' user (None: this process's)."""
  home = os.path.join(workdir, "home")
  user = user or pwd.getpwuid(os.getuid()).pw_name
  return {
      "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
      "HOME": home, "USER": user, "LOGNAME": user,
      "SHELL": "/bin/bash", "TERM": "xterm", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC",
      "XDG_CONFIG_HOME": os.path.join(home, ".config"), "XDG_DATA_HOME": os.path.join(home, ".local", "share"),
      "XDG_CACHE_HOME": os.path.join(home, ".cache"), "XDG_RUNTIME_DIR": os.path.join(workdir, "run"),
      "TMPDIR": os.path.join(workdir, "tmp"), "XAUTHORITY": os.path.join(workdir, "cookie"),
      "GSETTINGS_BACKEND": "memory", "NO_AT_BRIDGE": "1",
      "GTK_A11Y": "none", "DBUS_SESSION_BUS_ADDRESS": "disabled:", "XDG_CURRENT_DESKTOP": "LXDE",
      "EXPLORE_JAX_DESKTOP": marker,
  }
