"""Command-line plumbing shared by the launch scripts: flag parsing whose config errors are one line."""

from __future__ import annotations

import re
import sys
from typing import Sequence

from absl import flags


def _override_naming(argv: Sequence[str], key: str, config_flag: str) -> str:
  """The full `config.a.b` path of the override whose path contains `key` (else `key` itself)."""
  prefix = f"--{config_flag}."
  for arg in argv:
    if arg.startswith(prefix):
      path = arg[len(prefix):].split("=", 1)[0]
      if key in path.split("."):
        return f"{config_flag}.{path}"
  return key


def parse_flags(argv: Sequence[str], config_flag: str = "config") -> list[str]:
  """absl flag parsing for `app.run(main, flags_parser=parse_flags)`: a bad config file, variant,
  field or value exits with one line naming it instead of a traceback."""
  try:
    rest = flags.FLAGS(argv)
    flags.FLAGS[config_flag].value.keys()  # the config file loads lazily: make it fail here, if it does
    return rest
  except (flags.Error, OSError) as e:
    # absl embeds the config file's traceback; its last line is the error itself.
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    where = next((line for line in lines[:-1] if line.startswith("flag --")), "")
    sys.exit(f"error: {where.split(': Error whilst')[0] + ': ' if where else ''}{lines[-1]}")
  except (AttributeError, KeyError) as e:
    inner: object = e
    while isinstance(inner, BaseException) and inner.args:  # ConfigDict wraps a KeyError in an AttributeError
      inner = inner.args[0]
    text = str(inner)
    key = re.search(r"'([^']+)'", text)
    hint = re.search(r"Did you mean \"([^\"]+)\"", text)
    name = _override_naming(argv, key.group(1) if key else text, config_flag)
    sys.exit(f"error: unknown config field {name!r}" + (f" (did you mean {hint.group(1)!r}?)" if hint else ""))
