"""XLA's persistent compilation cache for runs: compiled programs kept on disk, so the next run (a sweep's next
seed, a resumed run, `make run` again) loads them instead of compiling again.

A loaded program is the one compiled before, so results are bit for bit those of a fresh compile (the
kill-and-resume tests run with it: the resumed process loads what the first one compiled). The directory is
per machine tag (train/provenance.py: CPU, cores, library versions) under cache.xla_root() (<cache root>/xla, or
EXPLORE_JAX_XLA_CACHE), so two kinds of machines sharing a home directory never load each other's code; it is
capped at MAX_BYTES (least recently used programs go first). `config.train.compilation_cache = False` turns it
off.
"""

from __future__ import annotations

import os
from typing import Optional

import jax

MAX_BYTES = 2 << 30
MIN_COMPILE_SECONDS = 0.5  # programs that compile faster than this are not worth a file


def enable(directory: Optional[str] = None, min_compile_seconds: float = MIN_COMPILE_SECONDS) -> str:
  """Turns the cache on for this process (before the first compilation), keeping programs that took at least
  `min_compile_seconds` to compile; returns its directory."""
  if directory is None:
    from explore_jax import cache
    from explore_jax.train import provenance

    directory = os.path.join(cache.xla_root(), provenance.machine_tag())
  os.makedirs(directory, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
  jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
  return directory
