"""A sweep's runs on disk (launch/sweep.py): which are complete, which SFT inputs and warm start each started
from, and the copies a --record directory keeps of them (results, comparisons, with --carry_warm_starts the
warm starts themselves).
"""

import collections
import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from explore_jax import cache  # noqa: E402
from explore_jax.train import provenance  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "launch"))
import tpu  # noqa: E402

RECORDED_FILES = tpu.RESULT_FILES
RUN_NAME = re.compile(r"ws(\d+)_seed(\d+)")  # a run's directory name: warm start, RL seed
WARM_STARTS_DIR = "warm_starts"  # of a --record directory, with --carry_warm_starts
MAX_CARRIED_MB = 64  # the largest warm start --carry_warm_starts copies into a directory meant for git


Run = collections.namedtuple("Run", "arm warm_start seed workdir command")
Finished = collections.namedtuple("Finished", "arm machine workdir")


def is_complete(workdir: str) -> bool:
  try:
    with open(os.path.join(workdir, "summary.json")) as f:
      json.load(f)
    return True
  except (OSError, ValueError):
    return False


def state(workdir: str) -> str:
  """'complete', 'partial (checkpoint N)', 'started' (a workdir without checkpoints) or 'pending'."""
  if is_complete(workdir):
    return "complete"
  steps = [int(d) for d in list_dir(os.path.join(workdir, "checkpoints")) if d.isdigit()]
  if steps:
    return f"partial (checkpoint {max(steps)})"
  return "started" if os.path.isdir(workdir) else "pending"


def list_dir(path):
  try:
    return os.listdir(path)
  except OSError:
    return []


def finished(protocol: dict, directories: list[str], exclude: frozenset = frozenset()) -> list[Finished]:
  """Every machine's complete runs of the protocol's arms under the given sweep or record directories, in
  protocol order (arm, machine, seed, warm start). Runs of warm starts or seeds the protocol no longer
  plans (an earlier design of it) count too. A run found under several directories counts once (the first).
  Workdirs in `exclude` (runs still going, which may have written summary.json but not ended) are left out."""
  arms = [a["name"] for a in protocol["arms"]]
  found: dict[tuple, Finished] = {}
  for directory in directories:
    for machine in sorted(list_dir(directory)):
      for arm in arms:
        for name in list_dir(os.path.join(directory, machine, arm)):
          match = RUN_NAME.fullmatch(name)
          workdir = os.path.join(directory, machine, arm, name)
          key = (machine, arm, *map(int, match.groups())) if match else None
          if key and key not in found and workdir not in exclude and is_complete(workdir):
            found[key] = Finished(arm, machine, workdir)
  return [found[key] for key in sorted(found, key=lambda k: (arms.index(k[1]), k[0], k[3], k[2]))]


# The config fields that decide a warm start (explore_jax/train/warm_start.py: warm_start_key), as a run's
# config.json holds them: runs whose values differ start warm start W from different SFT inputs.
WARM_START_FIELDS = (("model", "checkpoint"), ("model", "lora"), ("sft",), ("env",), ("rollout", "max_prompt_tokens"),
                     ("rollout", "max_new_tokens"), ("system_prompt",), ("instruction",), ("history_steps",),
                     ("action_history",), ("eapo", "rollback"))
# ... (the last: EAPO's rollback cold start, between the warm start and RL, is cached with it) but not how often the SFT saves its progress, which changes nothing in its result.
NOT_WARM_START_FIELDS = (("sft", "checkpoint_every"),)
# ... and fields whose default the warm start's key leaves out (configs written before they existed lack them).
DEFAULT_WARM_START_FIELDS = ((("sft", "micro_batch_size"), 0),)


def warm_start_args(run: Run) -> tuple[str, ...]:
  """The arguments of the run's command that can change its warm start: its config and its overrides of
  WARM_START_FIELDS (or of fields within them), sorted. Overrides apply after the config file builds the
  config, so an override of any other field (a learning rate, the RL iterations) leaves the SFT inputs alone."""
  def decides(arg: str) -> bool:
    flag = arg.partition("=")[0]
    path = tuple(flag.split(".")[1:])  # --config.sft.steps: ("sft", "steps")
    return flag == "--config" or (flag.startswith("--config.") and path not in NOT_WARM_START_FIELDS and any(
        path[:len(f)] == f or f[:len(path)] == path for f in WARM_START_FIELDS))
  return tuple(sorted(arg for arg in run.command if decides(arg)))


def warm_start_inputs(workdir: str) -> str | None:
  """The run's WARM_START_FIELDS from its config.json, as one comparable string (None: no readable config)."""
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      config = json.load(f)
  except (OSError, ValueError):
    return None
  for (*parents, key), default in [(f, None) for f in NOT_WARM_START_FIELDS] + list(DEFAULT_WARM_START_FIELDS):
    parent = config
    for p in parents:
      parent = parent.get(p) if isinstance(parent, dict) else None
    if isinstance(parent, dict) and (default is None or parent.get(key) == default):
      parent.pop(key, None)
  values = []
  for path in WARM_START_FIELDS:
    value = config
    for key in path:
      value = value.get(key) if isinstance(value, dict) else None
    values.append(value)
  return json.dumps(values, sort_keys=True, default=str)


def sft_inputs(workdir: str) -> str | None:
  """What decided the run's warm start: the warm start's cache key where its provenance.json holds one
  (train/warm_start.py's warm_start_key: every SFT input, the method's prompt hook included), else, for runs
  recorded before the key was, WARM_START_FIELDS of its config."""
  key = (provenance.load(workdir) or {}).get("warm_start")
  return f"key {key}" if key else warm_start_inputs(workdir)


def warm_start_mismatch(run: Run, directories: list[str]) -> str | None:
  """Why `run` cannot stand beside the complete runs already kept under its machine name: one of them started
  warm start W from other bits, with the same SFT inputs (sft_inputs; arms whose SFT inputs differ, a prompt
  that shows the action history or a method's own prompt hook say, compute other warm starts by design). Runs
  share a machine name only if they compute the same warm starts (--machine on two machines, or two CPUs that
  one tag cannot tell apart); the first finished run shows it."""
  digest = (provenance.load(run.workdir) or {}).get("start_digest")
  if not digest:
    return None
  inputs = sft_inputs(run.workdir)
  machine_dir = os.path.basename(os.path.dirname(os.path.dirname(run.workdir)))  # root/<machine>/<arm>/<run>
  for directory in directories:
    for arm in list_dir(os.path.join(directory, machine_dir)):
      for name in list_dir(os.path.join(directory, machine_dir, arm)):
        match = RUN_NAME.fullmatch(name)
        other = os.path.join(directory, machine_dir, arm, name)
        if not match or int(match.group(1)) != run.warm_start or os.path.realpath(other) == os.path.realpath(
            run.workdir) or not is_complete(other) or sft_inputs(other) != inputs:
          continue
        theirs = (provenance.load(other) or {}).get("start_digest")
        if theirs and theirs != digest:
          return (f"{run.workdir} started warm start {run.warm_start} from parameters {digest}, but {other} "
                  f"(the same machine name) started it from {theirs}: this machine computes other warm starts "
                  f"than the runs kept under {machine_dir!r} (docs/determinism.md)")
  return None


def compare(protocol: dict, directories: list[str], output: str, compare_script: str,
            exclude: frozenset = frozenset()) -> tuple[bool, str]:
  """launch/compare.py over every machine's complete runs (finished()), labelled by arm, into output/."""
  runs = finished(protocol, directories, exclude)
  if not runs:
    return True, "[sweep] no complete runs to compare yet"
  command = [sys.executable, compare_script, *[r.workdir for r in runs], f"--labels={','.join(r.arm for r in runs)}",
             f"--output={output}"]
  out = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
  if out.returncode != 0:
    return False, f"[sweep] compare failed ({shlex.join(command)}):\n{out.stderr.strip()[-3000:]}"
  counts = collections.Counter((r.arm, r.machine) for r in runs)
  return True, (out.stdout.rstrip() + "\n[sweep] compared the complete runs (" +
                ", ".join(f"{arm} on {machine}: {n}" for (arm, machine), n in counts.items()) + f") -> {output}")


def _copy_run(source: str, target: str) -> None:
  """RECORDED_FILES of a run, summary.json last (a half-done copy never looks complete)."""
  os.makedirs(target, exist_ok=True)
  for name in RECORDED_FILES:
    if os.path.isfile(os.path.join(source, name)):
      shutil.copyfile(os.path.join(source, name), os.path.join(target, name))


def record(protocol: dict, root: str, destination: str, exclude: frozenset = frozenset()) -> int:
  """Copies RECORDED_FILES of every complete run under root (any machine) to destination/<machine>/..., and
  root/compare/ to destination/compare/; returns the number of runs recorded."""
  runs = finished(protocol, [root], exclude)
  for r in runs:
    _copy_run(r.workdir, os.path.join(destination, os.path.relpath(r.workdir, root)))
  if os.path.isdir(os.path.join(root, "compare")):
    shutil.copytree(os.path.join(root, "compare"), os.path.join(destination, "compare"), dirs_exist_ok=True)
  return len(runs)


def restore(runs: list[Run], root: str, destination: str) -> int:
  """Copies this machine's runs recorded in destination, but not complete under root, back under root (a
  fresh clone has no root), so they count as complete; returns how many."""
  count = 0
  for r in runs:
    recorded = os.path.join(destination, os.path.relpath(r.workdir, root))
    if not is_complete(r.workdir) and is_complete(recorded):
      _copy_run(recorded, r.workdir)
      count += 1
  return count


def _copy_checkpoint(source: str, target: str) -> None:
  """A copy of the checkpoint directory `source` at `target`, made beside it and renamed into place, so a copy
  cut short never looks committed."""
  partial = target + ".partial"
  shutil.rmtree(partial, ignore_errors=True)
  shutil.copytree(source, partial)
  os.replace(partial, target)


def _copy_new_files(source: str, target: str) -> list[str]:
  """Copies the files of `source` that `target` lacks (each through a temporary name); returns their names."""
  names = [n for n in list_dir(source) if os.path.isfile(os.path.join(source, n)) and not n.endswith(".tmp")
           and not os.path.exists(os.path.join(target, n))]
  for n in names:
    os.makedirs(target, exist_ok=True)
    shutil.copyfile(os.path.join(source, n), os.path.join(target, n + ".tmp"))
    os.replace(os.path.join(target, n + ".tmp"), os.path.join(target, n))
  return names


def _size_mb(directory: str) -> float:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(directory) for f in files) / 2**20


_TOO_LARGE: set[str] = set()  # warm starts already named as too large to carry


def carry_warm_starts(runs: list[Run], destination: str, log=print) -> list[str]:
  """Copies the cached warm start of every run of `runs` that has started from one into
  destination/warm_starts/<key>/ unless it is there already, and its cached evaluations (the warm start's
  pass@k, computed after it) into <key>.pass_at_k/ as they appear; returns what it copied, as paths under
  destination/warm_starts/. A warm start over MAX_CARRIED_MB is left where it is, with a note."""
  kept = os.path.join(destination, WARM_STARTS_DIR)
  keys = dict.fromkeys(key for key in ((provenance.load(r.workdir) or {}).get("warm_start") for r in runs) if key)
  copied = []
  for key in keys:
    source = cache.warm_start_dir(key)
    if not cache.is_committed_checkpoint(source):
      continue
    if not cache.is_committed_checkpoint(os.path.join(kept, key)):
      size = _size_mb(source)
      if size > MAX_CARRIED_MB:
        if key not in _TOO_LARGE:
          _TOO_LARGE.add(key)
          log(f"[sweep] warm start {key} is {size:.0f} MB, over the {MAX_CARRIED_MB} MB that --carry_warm_starts "
              f"copies: not carried")
        continue
      _copy_checkpoint(source, os.path.join(kept, key))
      copied.append(key)
    evaluations = os.path.basename(cache.warm_start_evaluations_dir(key))
    copied += [os.path.join(evaluations, n) for n in
               _copy_new_files(cache.warm_start_evaluations_dir(key), os.path.join(kept, evaluations))]
  return copied


def bring_warm_starts(destination: str) -> list[str]:
  """Copies every warm start kept in destination/warm_starts/ that this machine's cache lacks into the cache,
  with the evaluations kept beside it that the cache lacks; returns the keys of the warm starts copied."""
  kept = os.path.join(destination, WARM_STARTS_DIR)
  brought = []
  for key in list_dir(kept):
    source, target = os.path.join(kept, key), cache.warm_start_dir(key)
    if not cache.is_committed_checkpoint(source):
      continue  # <key>.pass_at_k, or a copy cut short
    if not cache.is_committed_checkpoint(target):
      os.makedirs(os.path.dirname(target), exist_ok=True)
      shutil.rmtree(target, ignore_errors=True)  # holds no committed step: the kept one is complete
      _copy_checkpoint(source, target)
      brought.append(key)
    evaluations = cache.warm_start_evaluations_dir(key)
    _copy_new_files(os.path.join(kept, os.path.basename(evaluations)), evaluations)
  return brought


@contextlib.contextmanager
def locked(directory: str | None):
  """An exclusive lock on `directory` (none when None) while the block runs: sweeps of several roots (machines)
  may record into one directory, and one's comparison must not read another's half-copied run. The lock is
  the directory's own (flock), so nothing is left in a directory that is committed."""
  if directory is None:
    yield
    return
  os.makedirs(directory, exist_ok=True)
  fd = os.open(directory, os.O_RDONLY)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)
