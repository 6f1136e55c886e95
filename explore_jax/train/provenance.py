"""Where a run's numbers came from: the machine it ran on and the bits of the policy it started from.

XLA's CPU arithmetic rounds differently on another CPU model or thread count (docs/determinism.md), so the
same config gives another SFT warm start, and another RL run from there, on another machine. Two runs are
only "from the same warm start" when their starting parameters are bit-identical, and a comparison that
holds warm starts fixed (launch/compare.py) must know that. Every training run writes provenance.json:

  {"start_digest": "3f9a…",            params_digest of the policy at iteration 0 (after the warm start)
   "warm_start": "49c8b40d0239",        the SFT warm start's cache key (train/warm_start.py), when there is one
   "machines": [{"tag": "amd-epyc-2c-1b2c3d", "cpu": …, "isa": …, "visible_cores": 2, "jax": …,
                 "jaxlib": …, "xla_flags": …, "iteration": 0}, …]}   one entry per machine it ran on

A resumed run appends its machine when it differs from the last one, so a run that crossed machines says so.
`machine_tag()` names a numerical environment: runs with the same tag compute the same bits, as far as we
know what decides them (CPU model, vector ISA, visible cores, jax and jaxlib versions, XLA_FLAGS, and the GPU
models where JAX computes on NVIDIA GPUs).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from importlib import metadata
from typing import Any

from explore_jax import storage

FILE = "provenance.json"
# The x86 vector extensions XLA's CPU code generation may use; the best of them changes the arithmetic.
ISA_FLAGS = ("sse4_2", "avx", "fma", "f16c", "avx2", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16")


def _cpuinfo() -> dict[str, str]:
  """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
  try:
    with open("/proc/cpuinfo") as f:
      first = f.read().split("\n\n")[0]
  except OSError:
    return {}
  fields = {}
  for line in first.splitlines():
    if ":" in line:
      key, value = line.split(":", 1)
      fields[key.strip()] = value.strip()
  return fields


def _version(package: str) -> str:
  try:
    return metadata.version(package)
  except metadata.PackageNotFoundError:
    return "?"


def _gpus() -> list[str]:
  """The NVIDIA GPUs JAX would compute on here, by model name ([] without any, or when JAX_PLATFORMS excludes
  them). Read from the driver's /proc files, so no jax or CUDA import is needed."""
  platforms = os.environ.get("JAX_PLATFORMS", "")
  if platforms and not {"cuda", "gpu"} & set(platforms.split(",")):
    return []
  names = []
  root = "/proc/driver/nvidia/gpus"
  for bus in sorted(os.listdir(root)) if os.path.isdir(root) else ():
    try:
      with open(os.path.join(root, bus, "information")) as f:
        model = re.search(r"^Model:\s*(.+)$", f.read(), re.MULTILINE)
    except OSError:
      continue
    names.append(model.group(1).strip() if model else "NVIDIA GPU")
  return names


def machine() -> dict[str, Any]:
  """What decides this process's floating-point results, as far as we know (no jax import needed).

  On a machine with NVIDIA GPUs the GPUs decide the model's arithmetic: they are listed under "gpus" and name
  the tag. CPU-only machines have no "gpus" entry, so their tags stay what they were.
  """
  import platform
  fields = _cpuinfo()
  flags = set(fields.get("flags", "").split())
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  info = {"cpu": fields.get("model name") or platform.processor() or platform.machine(),
          "vendor": fields.get("vendor_id", "?"), "isa": ",".join(f for f in ISA_FLAGS if f in flags),
          "visible_cores": cores, "jax": _version("jax"), "jaxlib": _version("jaxlib"),
          "xla_flags": os.environ.get("XLA_FLAGS", "")}
  gpus = _gpus()
  if gpus:
    info["gpus"] = gpus
  return info


def machine_tag(info: dict[str, Any] | None = None) -> str:
  """A directory-safe name for a numerical environment: readable CPU and cores, then a hash of all of it."""
  info = machine() if info is None else info
  digest = hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:6]
  if info.get("gpus"):        # e.g. "NVIDIA H100 80GB HBM3" x 1 -> nvidia-h100-1g-<digest>
    words = str(info["gpus"][0]).split()[:2]
    name = re.sub(r"[^a-z0-9]+", "-", " ".join(words).lower()).strip("-") or "gpu"
    return f"{name}-{len(info['gpus'])}g-{digest}"
  words = re.sub(r"\((R|TM|tm)\)|CPU|Processor|@.*", " ", str(info["cpu"])).split()[:2]
  name = re.sub(r"[^a-z0-9]+", "-", " ".join(words).lower()).strip("-") or "cpu"
  return f"{name}-{info['visible_cores']}c-{digest}"


def params_digest(params: Any) -> str:
  """A fingerprint of a parameter tree's exact bits, the same whatever the sharding or reduction order.

  Per leaf, two wrap-around uint32 sums of the elements' bit patterns (plain, and weighted by position so
  that swapped elements differ) are computed where the arrays live (integer sums are exact, so order does
  not matter); they are hashed on the host with each leaf's path, shape and dtype.
  """
  import jax
  import jax.numpy as jnp
  import numpy as np

  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}

  def sums(x):
    x = jnp.asarray(x)
    if x.dtype.itemsize not in unsigned:
      raise ValueError(f"params_digest: {x.dtype} leaves are not supported")
    bits = jax.lax.bitcast_convert_type(x, unsigned[x.dtype.itemsize]).astype(jnp.uint32).ravel()
    weights = (jnp.arange(bits.size, dtype=jnp.uint32) % jnp.uint32(65521)) + jnp.uint32(1)
    return jnp.stack([jnp.sum(bits, dtype=jnp.uint32), jnp.sum(bits * weights, dtype=jnp.uint32)])

  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  totals = jax.device_get(jax.jit(lambda ls: [sums(x) for x in ls])([x for _, x in leaves]))
  h = hashlib.sha256()
  for (path, x), total in zip(leaves, totals):
    dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
    h.update(f"{jax.tree_util.keystr(path)}|{tuple(np.shape(x))}|{dtype}|".encode())
    h.update(np.asarray(total, np.uint32).tobytes())
  return h.hexdigest()[:12]


def load(workdir: str) -> dict[str, Any] | None:
  """A run's provenance.json, or None for a run that has none (recorded before it existed)."""
  try:
    with storage.open(os.path.join(workdir, FILE)) as f:
      return json.load(f)
  except FileNotFoundError:
    return None


def record(workdir: str, iteration: int, start_params: Any = None, *, warm_start: str | None = None,
           write: bool = True) -> dict[str, Any]:
  """Writes or updates workdir/provenance.json for a run starting (iteration 0, with its starting
  parameters) or resuming at `iteration` on this machine, and the cache key of its SFT `warm_start` if it has
  one (launch/sweep.py --carry_warm_starts finds the warm start by it); returns what it wrote. In a multi-host
  run every process calls it (the digest is a computation over the global parameters) and only process 0
  writes."""
  info = load(workdir) or {"start_digest": None, "machines": []}
  if start_params is not None:
    info["start_digest"] = params_digest(start_params)
  if warm_start is not None:
    info["warm_start"] = warm_start
  here = machine()
  here["tag"] = machine_tag(here)
  last = info["machines"][-1] if info["machines"] else None
  if last is None or {k: v for k, v in last.items() if k != "iteration"} != here:
    info["machines"].append({**here, "iteration": iteration})
  if not write:
    return info
  storage.makedirs(workdir)
  storage.write_text(os.path.join(workdir, FILE), json.dumps(info, indent=2))
  return info
