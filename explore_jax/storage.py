"""Run directories on a local disk or in a bucket: the few file operations a run makes, for both.

A multi-host TPU slice shares no disk, so its run directory is a bucket path (`--workdir=gs://B/runs/x`).
Every read and write of a run's files goes through here: local paths with the plain `os` and `open` calls
(their behaviour is unchanged), paths with a scheme (`gs://`, `s3://`, ... whatever etils.epath serves; for
gs:// that is gcsfs, or TensorFlow's gfile where TensorFlow is installed) through etils.epath, the library
orbax itself uses for checkpoint directories. Caches (EXPLORE_JAX_CACHE) stay local and do not come here.

Objects in a bucket are written whole (a write is one upload, atomic: a reader sees the old object or the new
one) and cannot be appended to, so `open(path, "a")` on one raises rather than silently overwriting;
appenders (train/metrics.py) rewrite the object.

Without an emulator nothing is configured here: on a TPU VM gcsfs and tensorstore (through which orbax writes
arrays) both find the VM's default credentials and talk to Cloud Storage. An emulator is named the way Google's
clients and gcsfs expect, STORAGE_EMULATOR_HOST=http://host:port; tensorstore's GCS driver does not read that
variable, so every bucket access first points it at the same endpoint (`_point_at_emulator`).
"""

from __future__ import annotations

import builtins
import os
import re
import shutil
from typing import IO, Any

_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]*)://", re.IGNORECASE)


def scheme(path: str | os.PathLike) -> str | None:
  """The URI scheme of `path` ("gs" for gs://bucket/x), None for a local path."""
  m = _SCHEME.match(os.fspath(path))
  return m.group(1).lower() if m else None


def is_remote(path: str | os.PathLike) -> bool:
  return scheme(path) is not None


def resolve(path: str | os.PathLike) -> str:
  """A local path made absolute (orbax needs that); a bucket path as it is."""
  path = os.fspath(path)
  return path if is_remote(path) else os.path.abspath(path)


def _epath(path: str | os.PathLike) -> Any:
  from etils import epath

  _point_at_emulator()
  return epath.Path(os.fspath(path))


def makedirs(path: str | os.PathLike) -> None:
  """Creates a local directory and its parents. A bucket has no directories, so for a bucket path this only
  checks that the bucket exists: a misspelt bucket stops the run here, and is never created by the run."""
  if not is_remote(path):
    os.makedirs(path, exist_ok=True)
    return
  path = os.fspath(path)
  root = f"{scheme(path)}://{path.split('://', 1)[1].split('/')[0]}"
  if not _epath(root).exists():
    raise FileNotFoundError(f"no bucket {root} (the run directory {path} needs it; create it first)")


def exists(path: str | os.PathLike) -> bool:
  return _epath(path).exists() if is_remote(path) else os.path.exists(path)


def isdir(path: str | os.PathLike) -> bool:
  """A local directory; a bucket path with objects under it."""
  return _epath(path).is_dir() if is_remote(path) else os.path.isdir(path)


def open(path: str | os.PathLike, mode: str = "r") -> IO:  # noqa: A001 (the builtin's name, on purpose)
  """The file at `path`, opened as the builtin `open` would ("r", "w", "a", with "b"). A bucket object opened
  for writing is uploaded on close; appending to one raises ValueError (objects cannot be appended to)."""
  if not is_remote(path):
    return builtins.open(path, mode)
  if "a" in mode or "+" in mode:
    raise ValueError(f"{os.fspath(path)}: a bucket object is written whole; it cannot be opened with mode {mode!r}")
  return _epath(path).open(mode)


def write_text(path: str | os.PathLike, text: str) -> None:
  """Writes `text` so that no reader sees half of it: locally into `path`.tmp renamed over `path`, in a bucket
  as one upload (atomic there)."""
  if is_remote(path):
    _epath(path).write_text(text)
    return
  tmp = os.fspath(path) + ".tmp"
  with builtins.open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
  """Copies a file between any two places (a local cache into a bucket run directory, say)."""
  if not is_remote(src) and not is_remote(dst):
    shutil.copyfile(src, dst)
    return
  with open(src, "rb") as f:
    data = f.read()
  with open(dst, "wb") as f:
    f.write(data)


def save_figure(fig: Any, path: str | os.PathLike, **kwargs: Any) -> str:
  """A matplotlib figure saved as PNG at `path` (local or bucket); returns the path."""
  if not is_remote(path):
    fig.savefig(path, **kwargs)
  else:
    with open(path, "wb") as f:
      fig.savefig(f, format="png", **kwargs)
  return os.fspath(path)


def _point_at_emulator() -> None:
  """With STORAGE_EMULATOR_HOST set, sends tensorstore's GCS driver (orbax's arrays) to that endpoint too, and
  makes the clients ask it nothing an emulator cannot answer: tensorstore and gcsfs authenticate with no
  credentials (an emulator checks none; looking for them would ask the cloud metadata server), and gcsfs skips
  its zonal-bucket probe (a gRPC call to the Storage Control API, which emulators do not serve). Settings
  already in the environment win. Runs before every bucket access, so before the first one imports gcsfs."""
  host = os.environ.get("STORAGE_EMULATOR_HOST", "")
  if host in ("", "default"):
    return
  url = host if host.startswith(("http://", "https://")) else f"http://{host}"
  os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", url)
  os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
  os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
  import fsspec

  fsspec.config.conf.setdefault("gcs", {}).setdefault("token", "anon")
