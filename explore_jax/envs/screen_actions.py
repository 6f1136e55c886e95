"""ScreenExplorer's GUI action grammar: a model's text response -> one mouse or keyboard action on a screen.

The grammar of ScreenExplorer (Table 2 and the prompt of its Appendix A, METHODS.md), as the GUI worlds of
this project read it. It is pure text processing (no browser, no selenium) so that it can be tested alone
and shared by every screen environment; `envs/miniwob.py` executes the parsed actions in Chromium.

Response := ACTION | JSON

  ACTION   one action on one line (surrounding whitespace is ignored):
             Move(x, y)  Click(x, y)  RightClick(x, y)  DoubleClick(x, y)  ScrollUp(x, y)  ScrollDown(x, y)
             Text(x, y, "text")   click at (x, y), then type the text
             Key("k")  Key("Enter")  Key("Shift+K")  Key("Ctrl+Shift+Tab")   a key, or modifiers + a key
  JSON     ScreenExplorer's reply: an object with the string "action" (an ACTION) and optionally the string
           "intent" (kept with the action: ScreenExplorer's r_des and r_inter compare it with the screens),
           no other keys, e.g. {"intent": "open the menu", "action": "Click(12, 40)"}

Forgiven: letter case in action names (click, CLICK), whitespace around every token (`Click ( 3 , 4 )`),
single or double quotes around strings, letter case in key names (enter, ENTER) and modifier aliases
(Control/Ctrl, Option/Alt, Cmd/Command/Super/Win/Meta, Return/Enter, Esc/Escape, Del/Delete, Up/ArrowUp,
PgUp/PageUp, ...).

Strict (each is an invalid action whose error names the expected form):
- Coordinates are whole pixels of the screenshot the agent sees, origin at its top-left corner:
  0 <= x < width and 0 <= y < height. A decimal (12.5) or a point off the screen (-1, or x = width) is
  invalid, not clamped: the model must learn where the screen is.
- Strings: printable ASCII between matching quotes; the escapes are \\\\ \\" \\' \\n (Enter) \\t (Tab); any
  other backslash, a missing closing quote or text after the closing parenthesis is invalid. Text types
  1 to MAX_TYPED_CHARS characters. A raw newline or tab inside the quotes is typed as Enter or Tab (only
  JSON's escapes can put one there: a bare ACTION is one line).
- Keys: one printable character ("k", "K", "1", "+"), a named key (NAMED_KEYS) or a modifier alone;
  a chord is modifiers joined by "+" before the key ("Ctrl++" is Ctrl and the plus key), each modifier
  at most once. In a chord, a letter's case follows Shift: "Shift+k" is "Shift+K" and "Ctrl+A" is
  "Ctrl+a" (they press the same keys); a lone "K" types a capital K.
- Not in the grammar: Drag, None(), several actions in one response, markdown code fences.

The canonical text of an action (`format_action`) is what info["action"] reports and what oracles
write: the names above in this spelling, ", " between arguments, double quotes with \\\\ \\" \\n \\t
escapes, modifiers in the order Ctrl, Alt, Shift, Meta. Parsing the canonical text gives the action back.
"""

from __future__ import annotations

import dataclasses
import json
import re
import string

from explore_jax.envs.base import excerpt

POINTER_ACTIONS = ("Move", "Click", "RightClick", "DoubleClick", "ScrollUp", "ScrollDown")
ACTION_NAMES = POINTER_ACTIONS + ("Text", "Key")
MODIFIER_ORDER = ("Ctrl", "Alt", "Shift", "Meta")
MAX_TYPED_CHARS = 128

_NAMES = {name.lower(): name for name in ACTION_NAMES}
_MODIFIERS = {"ctrl": "Ctrl", "control": "Ctrl", "alt": "Alt", "option": "Alt", "shift": "Shift",
              "meta": "Meta", "cmd": "Meta", "command": "Meta", "super": "Meta", "win": "Meta"}
NAMED_KEYS = ("Enter", "Tab", "Space", "Backspace", "Delete", "Escape", "ArrowUp", "ArrowDown", "ArrowLeft",
              "ArrowRight", "Home", "End", "PageUp", "PageDown", "Insert") + tuple(f"F{i}" for i in range(1, 13))
_KEY_ALIASES = {"return": "Enter", "esc": "Escape", "del": "Delete", "up": "ArrowUp", "down": "ArrowDown",
                "left": "ArrowLeft", "right": "ArrowRight", "pgup": "PageUp", "pgdn": "PageDown",
                "pagedn": "PageDown", "ins": "Insert"}
_KEYS = {**{k.lower(): k for k in NAMED_KEYS}, **_KEY_ALIASES}
_ESCAPES = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t"}
# What a string may hold: printable ASCII; \n and \t only from escapes (or raw, through JSON's escapes).
_STRING_CHARS = frozenset(string.printable) - frozenset("\r\x0b\x0c")
_KEY_CHARS = frozenset(string.printable) - frozenset(string.whitespace)
_INT = re.compile(r"[+-]?[0-9]+(?![0-9.])")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclasses.dataclass(frozen=True)
class ScreenAction:
  """One parsed action. `x`, `y` are screenshot pixels (pointer actions and Text); `text` is what Text
  types (escapes decoded); `modifiers` (canonical order) and `key` (a NAMED_KEYS name, "Ctrl" etc. for
  a lone modifier, or one character) are Key's. `intent` is the JSON reply's intent ("" without one);
  it does not take part in equality: two responses that act alike are the same action."""

  kind: str
  x: int | None = None
  y: int | None = None
  text: str | None = None
  modifiers: tuple[str, ...] = ()
  key: str | None = None
  intent: str = dataclasses.field(default="", compare=False)

  @property
  def chord(self) -> str:
    """Key's canonical chord text, e.g. "Ctrl+Shift+K"."""
    return "+".join((*self.modifiers, self.key or ""))


def quote(text: str) -> str:
  """`text` as the grammar's canonical double-quoted string."""
  body = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
  return f'"{body}"'


def format_action(action: ScreenAction) -> str:
  """The canonical text of an action (the module docstring's spelling)."""
  if action.kind in POINTER_ACTIONS:
    return f"{action.kind}({action.x}, {action.y})"
  if action.kind == "Text":
    return f"Text({action.x}, {action.y}, {quote(action.text or '')})"
  return f"Key({quote(action.chord)})"


def response_format(width: int, height: int) -> str:
  """The sentence an invalid action's observation ends with: the forms, and where the screen is."""
  return (f'Reply with one action, e.g. Click(12, 40), or {{"intent": "...", "action": "Click(12, 40)"}}. '
          f'Actions: Move, Click, RightClick, DoubleClick, ScrollUp or ScrollDown(x, y), Text(x, y, "text"), '
          f'Key("Enter"), Key("Shift+K"); x in 0..{width - 1}, y in 0..{height - 1}.')


def parse_response(text: str, width: int, height: int) -> tuple[ScreenAction | None, str]:
  """(action, "") for a well-formed response on a `width` x `height` screen, else (None, what was
  wrong). Never raises on any string."""
  if not isinstance(text, str):
    return None, f"The response must be text, got {type(text).__name__}."
  stripped = text.strip()
  if not stripped:
    return None, "The response is empty."
  if stripped.startswith("{"):
    return _parse_json(stripped, width, height)
  if "\n" in stripped:
    return None, f"The response has {len(stripped.splitlines())} lines; one action takes one line."
  return parse_action(stripped, width, height)


def _parse_json(text: str, width: int, height: int) -> tuple[ScreenAction | None, str]:
  try:
    reply = json.loads(text)
  except (ValueError, RecursionError) as e:
    detail = e.msg if isinstance(e, json.JSONDecodeError) else type(e).__name__
    return None, f"The response starts with {{ but is not a JSON object ({detail})."
  if not isinstance(reply, dict):
    return None, "The response starts with { but is not a JSON object."
  extra = sorted(set(reply) - {"intent", "action"})
  if extra:
    return None, f'The JSON reply has keys other than "intent" and "action": {", ".join(map(repr, extra))}.'
  if "action" not in reply:
    return None, 'The JSON reply has no "action".'
  if not isinstance(reply["action"], str):
    return None, 'The JSON reply\'s "action" must be a string such as "Click(12, 40)".'
  intent = reply.get("intent", "")
  if not isinstance(intent, str):
    return None, 'The JSON reply\'s "intent" must be a string.'
  action, error = parse_action(reply["action"].strip(), width, height)
  if action is None:
    return None, error
  return dataclasses.replace(action, intent=intent), ""


def parse_action(text: str, width: int, height: int) -> tuple[ScreenAction | None, str]:
  """One ACTION (no surrounding whitespace) -> (action, "") or (None, what was wrong)."""
  name_match = _NAME.match(text)
  if name_match is None:
    return None, f'Expected an action such as Click(12, 40), found "{excerpt(text)}".'
  name = _NAMES.get(name_match.group().lower())
  if name is None:
    return None, (f'Unknown action "{excerpt(name_match.group())}"; the actions are '
                  f'{", ".join(ACTION_NAMES)}.')
  pos = _skip_space(text, name_match.end())
  if pos == len(text) or text[pos] != "(":
    return None, f"Expected ( after {name}: {_form(name)}."
  args, pos, error = _parse_args(text, pos + 1)
  if error:
    return None, f"{error} {name} is written {_form(name)}."
  if pos != len(text):
    return None, f'Unexpected text after {name}(...): "{excerpt(text[pos:])}". One action per response.'
  kinds = tuple("int" if isinstance(a, int) else "str" for a in args)
  expected = ("str",) if name == "Key" else ("int", "int", "str") if name == "Text" else ("int", "int")
  if kinds != expected:
    return None, f"{name} takes {_arity(name)}: {_form(name)}."
  if name == "Key":
    modifiers, key, error = parse_key(args[0])
    if error:
      return None, error
    return ScreenAction("Key", modifiers=modifiers, key=key), ""
  x, y = args[0], args[1]
  if not (0 <= x < width and 0 <= y < height):
    return None, (f"The point ({x}, {y}) is off the screen: x must be in 0..{width - 1} and y in "
                  f"0..{height - 1}.")
  if name == "Text":
    typed = args[2]
    if not typed:
      return None, 'Text types at least one character: Text(x, y, "text") (use Click(x, y) to click only).'
    if len(typed) > MAX_TYPED_CHARS:
      return None, f"Text types at most {MAX_TYPED_CHARS} characters, got {len(typed)}."
    return ScreenAction("Text", x, y, text=typed), ""
  return ScreenAction(name, x, y), ""


def parse_key(chord: str) -> tuple[tuple[str, ...], str | None, str]:
  """A Key argument -> (modifiers in canonical order, key, "") or ((), None, what was wrong)."""
  if chord == " ":
    return (), "Space", ""
  stripped = chord.strip()
  if not stripped:
    return (), None, 'The key is empty; e.g. Key("Enter").'
  if len(stripped) == 1:
    parts, last = [], stripped
  elif stripped.endswith("++"):
    parts, last = stripped[:-2].split("+"), "+"
  else:
    *parts, last = stripped.split("+")
  modifiers: list[str] = []
  for part in parts:
    modifier = _MODIFIERS.get(part.strip().lower())
    if modifier is None:
      return (), None, (f'"{excerpt(part.strip())}" in Key("{excerpt(stripped)}") is not a modifier; a chord is '
                        f'modifiers ({", ".join(MODIFIER_ORDER)}) joined by + before one key, e.g. Key("Shift+K").')
    if modifier in modifiers:
      return (), None, f'{modifier} is named twice in Key("{excerpt(stripped)}").'
    modifiers.append(modifier)
  last = last.strip()
  if not last:
    return (), None, f'Key("{excerpt(stripped)}") ends without a key; e.g. Key("Shift+K").'
  if len(last) == 1:
    if last not in _KEY_CHARS:
      return (), None, "A key must be printable ASCII."
    key = last
    if last.isalpha() and modifiers:
      key = last.upper() if "Shift" in modifiers else last.lower()
  elif last.lower() in _MODIFIERS:
    key = _MODIFIERS[last.lower()]
    if key in modifiers:
      return (), None, f'{key} is named twice in Key("{excerpt(stripped)}").'
  elif last.lower() in _KEYS:
    key = _KEYS[last.lower()]
  else:
    return (), None, (f'Unknown key "{excerpt(last)}"; a key is one character or one of '
                      f'{", ".join(NAMED_KEYS[:15])}, F1..F12.')
  return tuple(m for m in MODIFIER_ORDER if m in modifiers), key, ""


def _parse_args(text: str, pos: int) -> tuple[list[int | str], int, str]:
  """The arguments after "(" up to and including ")": (args, position after ")", "") or an error."""
  args: list[int | str] = []
  pos = _skip_space(text, pos)
  if pos < len(text) and text[pos] == ")":
    return args, pos + 1, ""
  while True:
    pos = _skip_space(text, pos)
    if pos == len(text):
      return args, pos, "The parenthesis is not closed."
    if text[pos] in "\"'":
      value, pos, error = _parse_string(text, pos)
      if error:
        return args, pos, error
      args.append(value)
    else:
      number = _INT.match(text, pos)
      if number is not None:
        args.append(int(number.group()))
        pos = number.end()
      elif _NUMBER.match(text, pos) is not None:
        return args, pos, f'Coordinates are whole pixels, found "{excerpt(_NUMBER.match(text, pos).group())}".'
      else:
        return args, pos, f'Expected a number or a quoted string, found "{excerpt(text[pos:])}".'
    pos = _skip_space(text, pos)
    if pos == len(text):
      return args, pos, "The parenthesis is not closed."
    if text[pos] == ")":
      return args, pos + 1, ""
    if text[pos] != ",":
      return args, pos, f'Expected , or ) after an argument, found "{excerpt(text[pos:])}".'
    pos += 1


def _parse_string(text: str, pos: int) -> tuple[str, int, str]:
  """A quoted string starting at `pos`: (its value, position after the closing quote, "") or an error."""
  quote_char, pos, chars = text[pos], pos + 1, []
  while pos < len(text):
    c = text[pos]
    if c == quote_char:
      return "".join(chars), pos + 1, ""
    if c == "\\":
      if pos + 1 == len(text):
        break
      escaped = _ESCAPES.get(text[pos + 1])
      if escaped is None:
        return "", pos, (f'Unknown escape "\\{excerpt(text[pos + 1])}" in a string; the escapes are '
                         f'\\\\ \\" \\\' \\n \\t.')
      chars.append(escaped)
      pos += 2
      continue
    if c not in _STRING_CHARS:
      return "", pos, "Strings hold printable ASCII only."
    chars.append(c)
    pos += 1
  return "", pos, f"The string is not closed with {quote_char}."


def _skip_space(text: str, pos: int) -> int:
  while pos < len(text) and text[pos] in " \t":
    pos += 1
  return pos


def _form(name: str) -> str:
  return 'Key("Enter") or Key("Shift+K")' if name == "Key" else 'Text(x, y, "text")' if name == "Text" else \
      f"{name}(x, y)"


def _arity(name: str) -> str:
  if name == "Key":
    return "one quoted key"
  if name == "Text":
    return "two whole-pixel coordinates and a quoted string"
  return "two whole-pixel coordinates"
