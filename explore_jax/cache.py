"""The project's local cache: the built-in checkpoints, SFT warm starts and their pass@k, generated games,
compiled XLA programs. Everything in it can be computed again; nothing in it is a run's result.

Jax-free, so that launch/sweep.py and the ALFWorld generator can find it without importing jax.
"""

from __future__ import annotations

import os


def root() -> str:
  """EXPLORE_JAX_CACHE, else ~/.cache/explore_jax."""
  return os.path.abspath(os.environ.get("EXPLORE_JAX_CACHE", os.path.expanduser("~/.cache/explore_jax")))


def xla_root() -> str:
  """Where compiled XLA programs are kept (train/xla_cache.py: a folder per machine tag): EXPLORE_JAX_XLA_CACHE,
  else <root>/xla. A variable of its own, so that runs with a fresh cache root (a clean warm start, a test's)
  can still load what was compiled before: a loaded program is the one compiled then, so no result changes."""
  return os.path.abspath(os.environ.get("EXPLORE_JAX_XLA_CACHE", os.path.join(root(), "xla")))


def warm_start_dir(key: str) -> str:
  """Where the SFT warm start of `key` (train/warm_start.py's warm_start_key, or its start_key: the warm start and
  a method's cold start) is cached: an orbax checkpoint directory whose one committed step holds the parameters."""
  return os.path.join(root(), "sft", key)


def warm_start_evaluations_dir(key: str) -> str:
  """Where the evaluations of the warm start of `key` are cached (train/evaluator.py: its pass@k, one JSON file
  per way of evaluating it), beside the warm start, so that they travel with it (launch/sweep.py)."""
  return warm_start_dir(key) + ".pass_at_k"


def is_committed_checkpoint(directory: str) -> bool:
  """Whether an orbax checkpoint directory holds a committed step (a directory named by its step number; orbax
  writes a step under a temporary name and renames it on commit)."""
  try:
    return any(name.isdigit() and os.path.isdir(os.path.join(directory, name)) for name in os.listdir(directory))
  except OSError:
    return False
