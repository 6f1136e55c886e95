"""ScreenExplorer's parsed actions (envs/screen_actions.py) as xdotool command lines on an X display.

One xdotool run per action, its commands chained: the pointer moves to the point, then clicks, scrolls
(wheel buttons 4 and 5) or clicks and types (newlines and tabs as the Return and Tab keys, in runs of their
own); Key presses a chord of X keysyms. The grammar's key names map to keysyms here (Enter -> Return,
ArrowUp -> Up, PageDown -> Next, "+" -> plus, Meta -> Super, ...).
"""

from __future__ import annotations

import re

from explore_jax.envs.screen_actions import ScreenAction

DOUBLE_CLICK_DELAY_MS = 60  # between a double-click's two clicks (GTK's double-click time is 400 ms)
SCROLL_DELAY_MS = 15        # between the wheel clicks of one scroll
SUBMIT_PAUSE_S = 0.25       # before the Return or Tab keys that end a Text (see _typing)

MODIFIERS = {"Ctrl": "ctrl", "Alt": "alt", "Shift": "shift", "Meta": "super"}
LONE_MODIFIERS = {"Ctrl": "Control_L", "Alt": "Alt_L", "Shift": "Shift_L", "Meta": "Super_L"}
NAMED_KEYS = {
    "Enter": "Return", "Tab": "Tab", "Space": "space", "Backspace": "BackSpace", "Delete": "Delete",
    "Escape": "Escape", "ArrowUp": "Up", "ArrowDown": "Down", "ArrowLeft": "Left", "ArrowRight": "Right",
    "Home": "Home", "End": "End", "PageUp": "Prior", "PageDown": "Next", "Insert": "Insert",
    **{f"F{i}": f"F{i}" for i in range(1, 13)},
}
PUNCTUATION = {
    " ": "space", "!": "exclam", '"': "quotedbl", "#": "numbersign", "$": "dollar", "%": "percent",
    "&": "ampersand", "'": "apostrophe", "(": "parenleft", ")": "parenright", "*": "asterisk", "+": "plus",
    ",": "comma", "-": "minus", ".": "period", "/": "slash", ":": "colon", ";": "semicolon", "<": "less",
    "=": "equal", ">": "greater", "?": "question", "@": "at", "[": "bracketleft", "\\": "backslash",
    "]": "bracketright", "^": "asciicircum", "_": "underscore", "`": "grave", "{": "braceleft", "|": "bar",
    "}": "braceright", "~": "asciitilde",
}
_BUTTONS = {"Click": "1", "RightClick": "3", "ScrollUp": "4", "ScrollDown": "5"}
_TYPED_KEYS = {"\n": "Return", "\t": "Tab"}


def keysym(key: str) -> str:
  """The X keysym name of one grammar key (a NAMED_KEYS name, a modifier alone, or one character)."""
  if key in NAMED_KEYS:
    return NAMED_KEYS[key]
  if key in LONE_MODIFIERS:
    return LONE_MODIFIERS[key]
  if len(key) == 1 and (key.isalnum() or key in PUNCTUATION):
    return PUNCTUATION.get(key, key)
  raise ValueError(f"no X keysym for the key {key!r}")


def chord(action: ScreenAction) -> str:
  """Key's chord as xdotool writes it, e.g. Key("Ctrl+Shift+K") -> "ctrl+shift+K"."""
  return "+".join((*(MODIFIERS[m] for m in action.modifiers), keysym(action.key or "")))


def xdotool_runs(action: ScreenAction, *, scroll_clicks: int = 3, type_delay_ms: int = 4) -> list[list[str]]:
  """The arguments of the xdotool runs that perform `action` (x, y already in screen pixels), one list a run."""
  if action.kind == "Key":
    return [["key", chord(action)]]
  run = ["mousemove", str(action.x), str(action.y)]
  kind = action.kind
  if kind in ("Click", "RightClick"):
    run += _click(_BUTTONS[kind])
  elif kind == "DoubleClick":
    run += [*_click("1"), "sleep", f"{DOUBLE_CLICK_DELAY_MS / 1e3:g}", *_click("1")]
  elif kind in ("ScrollUp", "ScrollDown"):
    run += ["click", "--repeat", str(scroll_clicks), "--delay", str(SCROLL_DELAY_MS), _BUTTONS[kind]]
  elif kind == "Text":
    return _typing(run + _click("1"), action.text or "", type_delay_ms)
  elif kind != "Move":
    raise ValueError(f"unknown action kind {kind!r}")
  return [run]


def _click(button: str) -> list[str]:
  # xdotool's click sleeps its --delay (100 ms unless told) after every click, the last one too.
  return ["click", "--delay", "0", button]


def _typing(run: list[str], text: str, delay_ms: int) -> list[list[str]]:
  """`run`, then `text` typed: its newlines and tabs pressed as the Return and Tab keys (xdotool's `type` sends a
  newline as Linefeed, which GTK ignores, and "\\r" types a Return that a dialog's entry does not take as its
  Enter). `type` takes the rest of its run's arguments, so each stretch of text ends a run. The keys that end
  the text, after typed text, come after SUBMIT_PAUSE_S: they usually submit it, and GTK's file chooser drops a
  Return that comes while it is still completing the name just typed."""
  runs, typed = [], False
  pieces = [piece for piece in re.split(r"([\n\t])", text) if piece]
  for i, piece in enumerate(pieces):
    if piece in _TYPED_KEYS:
      if typed and all(p in _TYPED_KEYS for p in pieces[i:]):
        run += ["sleep", f"{SUBMIT_PAUSE_S:g}"]
        typed = False
      run += ["key", _TYPED_KEYS[piece]]
    else:
      runs.append(run + ["type", "--delay", str(delay_ms), "--", piece])
      run, typed = [], True
  return runs + [run] if run else runs
