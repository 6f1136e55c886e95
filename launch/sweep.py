"""Runs a protocol: every arm over the same warm starts and RL seeds, one run at a time, then compares arms.

  python launch/sweep.py --protocol=configs/protocols/sge_coding.py --root=runs/protocol/sge_coding
  python launch/sweep.py ... --dry_run          # the planned commands; which runs are complete / partial / pending
  python launch/sweep.py ... --only=sge,grpo    # only these arms
  python launch/sweep.py ... --max_runs=3       # stop after 3 launches (a time-boxed session); run again to go on
  python launch/sweep.py ... --record=docs/results/protocol/sge_coding   # copy each finished run's results there

A protocol file defines `get_protocol()` returning a dict (or ConfigDict):
  arms         [{"name": ..., "config": "configs/x.py[:variant]" (relative to the repo),
                 "overrides": ["--config.a.b=v", ...]}, ...]
  seeds        RL seeds (a list, or a count n for 0..n-1): --config.seed=S
  warm_starts  warm-start seeds (list or count): --config.sft.seed=W; runs with the same W share the cached warm start
  overrides    ["--config.a.b=v", ...] common to every arm (iterations, tasks)

Run (arm, W, S) lives in root/<machine>/<arm>/ws<W>_seed<S> and is launch/train.py with --workdir and the
overrides, run from the repository root. <machine> is this machine's numerical environment
(explore_jax/train/provenance.py machine_tag: CPU, cores, versions): another machine computes another warm
start from the same sft.seed and another run from the same seeds (docs/determinism.md), so its runs are its
own. They are compared with everyone's, within warm starts (launch/compare.py), and never stand in for this
machine's. Runs go in an order that interleaves arms (seed 0 of every arm and warm start before
seed 1, ...), so a partial sweep is balanced. A run is complete when its workdir has summary.json; any other
run is launched (again): train.py resumes an interrupted run from its last checkpoint, so a killed sweep
started again with the same command continues where it stopped. A failed run (non-zero exit) is reported with
the tail of its stderr and the sweep goes on; the exit status is non-zero if any run failed. After every
completed run and at the end, launch/compare.py compares all complete runs, grouped by arm, into root/compare/.

With --record=DIR the small files of every complete run (RECORDED_FILES: its config, metrics per iteration,
pass@k summary and provenance) are copied to DIR/<machine>/<arm>/ws<W>_seed<S>/ and the comparison to
DIR/compare/ after every run, so a long sweep's results can be committed as they come in (root itself holds
checkpoints and stays out of git). DIR is also read: a run recorded there under this machine's name counts as
complete (a fresh clone goes on where the recorded sweep stopped), and every machine's recorded runs enter
the comparison.
"""

import collections
import fcntl
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from explore_jax.train import provenance  # noqa: E402

_PROTOCOL = flags.DEFINE_string("protocol", None, "Protocol file defining get_protocol().")
_ROOT = flags.DEFINE_string("root", None, "Sweep directory: root/<machine>/<arm>/ws<W>_seed<S>, root/compare/.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the plan and each run's state; launch nothing.")
_ONLY = flags.DEFINE_list("only", None, "Run only these arms (comparisons still cover every arm's complete runs).")
_MAX_RUNS = flags.DEFINE_integer("max_runs", None, "Stop after this many launches.")
_RECORD = flags.DEFINE_string("record", None, "Copy every complete run's small result files and the comparison "
                              "here (a directory to commit), after every run; runs recorded here count as done.")
_MACHINE = flags.DEFINE_string("machine", None, "Name of this machine's numerical environment (default: "
                               "provenance.machine_tag()). Give two machines one name only if their warm starts "
                               "are bit-identical (benchmarks/determinism.py).")
# Hidden in spirit: tests substitute a fake trainer / comparison. Paths relative to the repository root.
_TRAIN_SCRIPT = flags.DEFINE_string("train_script", "launch/train.py", "The trainer each run executes (tests).")
_COMPARE_SCRIPT = flags.DEFINE_string("compare_script", "launch/compare.py", "The comparison script (tests).")
flags.mark_flags_as_required(["protocol", "root"])

RESERVED = ("--config.seed=", "--config.sft.seed=", "--workdir=", "--config=")
RECORDED_FILES = ("config.json", "metrics.jsonl", "summary.json", "summary.md", "provenance.json")
STDERR_TAIL_LINES = 20
RUN_NAME = re.compile(r"ws(\d+)_seed(\d+)")  # a run's directory name: warm start, RL seed


class ProtocolError(ValueError):
  pass


Run = collections.namedtuple("Run", "arm warm_start seed workdir command")
Finished = collections.namedtuple("Finished", "arm machine workdir")


def _resolve(path: str) -> str:
  """`path` as given (from the current directory), else relative to the repository root."""
  return path if os.path.exists(path) else os.path.join(REPO, path)


def load_protocol(path: str) -> dict:
  """The checked dict of the protocol file at `path`."""
  path = _resolve(path)
  if not os.path.isfile(path):
    raise ProtocolError(f"no protocol file {path}")
  spec = importlib.util.spec_from_file_location("_protocol", path)
  module = importlib.util.module_from_spec(spec)
  sys.path.insert(0, REPO)  # a protocol may import from configs/
  try:
    spec.loader.exec_module(module)
  finally:
    sys.path.remove(REPO)
  if not hasattr(module, "get_protocol"):
    raise ProtocolError(f"{path} defines no get_protocol()")
  protocol = module.get_protocol()
  protocol = protocol.to_dict() if hasattr(protocol, "to_dict") else dict(protocol)
  unknown = set(protocol) - {"arms", "seeds", "warm_starts", "overrides"}
  if unknown:
    raise ProtocolError(f"unknown protocol keys {sorted(unknown)}; known: arms, seeds, warm_starts, overrides")

  def seeds(key):
    value = protocol.get(key, 1 if key == "warm_starts" else None)
    if value is None:
      raise ProtocolError(f"the protocol names no {key}")
    value = list(range(value)) if isinstance(value, int) else [int(v) for v in value]
    if not value or len(set(value)) != len(value):
      raise ProtocolError(f"{key} must be distinct integers, at least one: {value}")
    return value

  def overrides(values, where):
    values = list(values or ())
    for v in values:
      if not isinstance(v, str) or not v.startswith("--config.") or "=" not in v:
        raise ProtocolError(f"{where}: override {v!r} is not of the form --config.a.b=value")
      if v.startswith(RESERVED):
        raise ProtocolError(f"{where}: {v!r} is set by the sweep (seeds and workdir come from the protocol)")
    return values

  arms = []
  for arm in protocol.get("arms") or ():
    arm = dict(arm)
    name, config = arm.get("name"), arm.get("config")
    if not name or not isinstance(name, str) or os.sep in name or "," in name or name.startswith(".") \
        or name == "compare":
      raise ProtocolError(f"bad arm name {name!r} (a directory name without commas, not 'compare')")
    if not config or not os.path.isfile(os.path.join(REPO, config.split(":")[0])):
      raise ProtocolError(f"arm {name!r}: no config file {config!r} in {REPO}")
    arms.append({"name": name, "config": config, "overrides": overrides(arm.get("overrides"), f"arm {name!r}")})
  if not arms:
    raise ProtocolError("the protocol has no arms")
  names = [a["name"] for a in arms]
  if len(set(names)) != len(names):
    raise ProtocolError(f"arm names repeat: {names}")
  return {"arms": arms, "seeds": seeds("seeds"), "warm_starts": seeds("warm_starts"),
          "overrides": overrides(protocol.get("overrides"), "common overrides")}


def plan(protocol: dict, root: str, machine: str, train_script: str = "launch/train.py") -> list[Run]:
  """This machine's runs in launch order: seed-major, then warm start, then arm, so arms stay balanced."""
  runs = []
  for seed in protocol["seeds"]:
    for ws in protocol["warm_starts"]:
      for arm in protocol["arms"]:
        workdir = os.path.join(root, machine, arm["name"], f"ws{ws}_seed{seed}")
        command = [sys.executable, train_script, f"--config={arm['config']}", f"--workdir={_from_repo(workdir)}",
                   f"--config.seed={seed}", f"--config.sft.seed={ws}", *protocol["overrides"], *arm["overrides"]]
        runs.append(Run(arm["name"], ws, seed, workdir, command))
  return runs


def finished(protocol: dict, directories: list[str]) -> list[Finished]:
  """Every machine's complete runs of the protocol's arms under the given sweep or record directories, in
  protocol order (arm, machine, seed, warm start). Runs of warm starts or seeds the protocol no longer
  plans (an earlier design of it) count too. A run found under several directories counts once (the first)."""
  arms = [a["name"] for a in protocol["arms"]]
  found: dict[tuple, Finished] = {}
  for directory in directories:
    for machine in sorted(_listdir(directory)):
      for arm in arms:
        for name in _listdir(os.path.join(directory, machine, arm)):
          match = RUN_NAME.fullmatch(name)
          workdir = os.path.join(directory, machine, arm, name)
          key = (machine, arm, *map(int, match.groups())) if match else None
          if key and key not in found and is_complete(workdir):
            found[key] = Finished(arm, machine, workdir)
  return [found[key] for key in sorted(found, key=lambda k: (arms.index(k[1]), k[0], k[3], k[2]))]


def _from_repo(path: str) -> str:
  """`path` as the commands (run from the repository root) name it: relative when it is inside the repo."""
  rel = os.path.relpath(path, REPO)
  return path if rel == ".." or rel.startswith(".." + os.sep) else rel


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
  steps = [int(d) for d in _listdir(os.path.join(workdir, "checkpoints")) if d.isdigit()]
  if steps:
    return f"partial (checkpoint {max(steps)})"
  return "started" if os.path.isdir(workdir) else "pending"


def _listdir(path):
  try:
    return os.listdir(path)
  except OSError:
    return []


def _die_with_parent():
  """In the child: get SIGTERM if the sweep dies (even by SIGKILL), so no orphan trains beside its successor."""
  try:
    import ctypes
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
  except Exception:  # not Linux: the SIGTERM handler below still covers a polite kill
    pass


def launch(run: Run) -> tuple[int, list[str]]:
  """Runs one training run from the repository root, stdout and stderr passed through (stderr also appended
  to workdir/sweep_stderr.log); returns its exit status and the tail of its stderr."""
  os.makedirs(run.workdir, exist_ok=True)
  with open(os.path.join(run.workdir, "sweep_command.txt"), "a") as f:
    f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(run.command)}\n")
  tail: collections.deque = collections.deque(maxlen=64)
  proc = subprocess.Popen(run.command, cwd=REPO, stderr=subprocess.PIPE, preexec_fn=_die_with_parent)

  def tee():
    with open(os.path.join(run.workdir, "sweep_stderr.log"), "ab") as log:
      for chunk in iter(lambda: proc.stderr.read1(4096), b""):
        sys.stderr.buffer.write(chunk)
        sys.stderr.flush()
        log.write(chunk)
        tail.append(chunk)

  reader = threading.Thread(target=tee, daemon=True)
  reader.start()
  previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
  try:
    code = proc.wait()
  except BaseException:  # Ctrl-C or SIGTERM: take the run down with the sweep; it resumes next time
    proc.terminate()
    try:
      proc.wait(30)
    except subprocess.TimeoutExpired:
      proc.kill()
    raise
  finally:
    signal.signal(signal.SIGTERM, previous)
  reader.join(10)
  lines = b"".join(tail).decode(errors="replace").replace("\r", "\n").splitlines()
  return code, "\n".join(line for line in lines if line.strip())[-4000:].splitlines()[-STDERR_TAIL_LINES:]


def warm_start_mismatch(run: Run, directories: list[str]) -> str | None:
  """Why `run` cannot stand beside the complete runs already kept under its machine name: one of them started
  warm start W from other bits. Runs share a machine name only if they compute the same warm starts
  (--machine on two machines, or two CPUs that one tag cannot tell apart); the first finished run shows it."""
  digest = (provenance.load(run.workdir) or {}).get("start_digest")
  if not digest:
    return None
  machine_dir = os.path.basename(os.path.dirname(os.path.dirname(run.workdir)))  # root/<machine>/<arm>/<run>
  for directory in directories:
    for arm in _listdir(os.path.join(directory, machine_dir)):
      for name in _listdir(os.path.join(directory, machine_dir, arm)):
        match = RUN_NAME.fullmatch(name)
        other = os.path.join(directory, machine_dir, arm, name)
        if not match or int(match.group(1)) != run.warm_start or os.path.realpath(other) == os.path.realpath(
            run.workdir) or not is_complete(other):
          continue
        theirs = (provenance.load(other) or {}).get("start_digest")
        if theirs and theirs != digest:
          return (f"{run.workdir} started warm start {run.warm_start} from parameters {digest}, but {other} "
                  f"(the same machine name) started it from {theirs}: this machine computes other warm starts "
                  f"than the runs kept under {machine_dir!r} (docs/determinism.md)")
  return None


def compare(protocol: dict, directories: list[str], output: str, compare_script: str) -> tuple[bool, str]:
  """launch/compare.py over every machine's complete runs (finished()), labelled by arm, into output/."""
  runs = finished(protocol, directories)
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
  os.makedirs(target, exist_ok=True)
  for name in RECORDED_FILES:
    if os.path.isfile(os.path.join(source, name)):
      shutil.copyfile(os.path.join(source, name), os.path.join(target, name))


def record(protocol: dict, root: str, destination: str) -> int:
  """Copies RECORDED_FILES of every complete run under root (any machine) to destination/<machine>/..., and
  root/compare/ to destination/compare/; returns the number of runs recorded."""
  runs = finished(protocol, [root])
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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    protocol = load_protocol(_PROTOCOL.value)
  except ProtocolError as e:
    sys.exit(f"error: {e}")
  root = os.path.abspath(_ROOT.value)
  names = [a["name"] for a in protocol["arms"]]
  only = _ONLY.value
  if only:
    unknown = [n for n in only if n not in names]
    if unknown:
      sys.exit(f"error: --only names unknown arm {unknown[0]!r}; arms: {', '.join(names)}")
  if _MACHINE.value is not None and (not _MACHINE.value or os.sep in _MACHINE.value or _MACHINE.value == "compare"):
    sys.exit(f"error: --machine={_MACHINE.value!r} is not a directory name")
  machine = _MACHINE.value or provenance.machine_tag()
  record_dir = os.path.abspath(_RECORD.value) if _RECORD.value else None
  runs = [r for r in plan(protocol, root, machine, _TRAIN_SCRIPT.value) if not only or r.arm in only]

  def recorded(r: Run) -> bool:
    return bool(record_dir) and is_complete(os.path.join(record_dir, os.path.relpath(r.workdir, root)))

  states = {r.workdir: "complete" if not is_complete(r.workdir) and recorded(r) else state(r.workdir) for r in runs}
  todo = [r for r in runs if states[r.workdir] != "complete"]
  counts = collections.Counter(s.split(" ")[0] for s in states.values())
  print(f"[sweep] {_PROTOCOL.value}: {len(runs)} runs ({len(protocol['arms']) if not only else len(only)} arms x "
        f"{len(protocol['warm_starts'])} warm starts x {len(protocol['seeds'])} seeds) on machine {machine} in "
        f"{root}; " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), flush=True)

  if _DRY_RUN.value:
    print(f"[sweep] commands run from {REPO}:")
    for r in runs:
      print(f"{states[r.workdir]:>24}  python {shlex.join(r.command[1:])}")
    if _MAX_RUNS.value is not None:
      print(f"[sweep] --max_runs={_MAX_RUNS.value}: would launch {min(_MAX_RUNS.value, len(todo))} of {len(todo)}")
    return

  os.makedirs(root, exist_ok=True)
  lock = open(os.path.join(root, ".sweep.lock"), "w")
  try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    sys.exit(f"error: another sweep is running in {root}")
  if record_dir:
    restored = restore(runs, root, record_dir)
    if restored:
      print(f"[sweep] {restored} runs of this machine recorded in {record_dir} count as complete", flush=True)
  sources = [root] + ([record_dir] if record_dir else [])  # whose complete runs are compared
  output = os.path.join(root, "compare")

  failed, launched, table = [], 0, None
  for r in todo:
    if _MAX_RUNS.value is not None and launched >= _MAX_RUNS.value:
      break
    launched += 1
    print(f"[sweep] run {launched}/{len(todo) if _MAX_RUNS.value is None else min(_MAX_RUNS.value, len(todo))}: "
          f"{r.arm} ws{r.warm_start} seed{r.seed} ({state(r.workdir)}): python {shlex.join(r.command[1:])}", flush=True)
    start = time.time()
    code, tail = launch(r)
    if code == 0 and not is_complete(r.workdir):
      code, tail = 1, tail + [f"exited 0 but wrote no summary.json in {r.workdir} (does the config ask for pass@k?)"]
    if code != 0:
      failed.append(r)
      print(f"[sweep] FAILED ({code}) after {time.time() - start:.0f} s: {r.arm} ws{r.warm_start} seed{r.seed}; "
            f"stderr tail (all of it in {os.path.join(r.workdir, 'sweep_stderr.log')}):\n  " + "\n  ".join(tail),
            flush=True)
      continue
    print(f"[sweep] done in {time.time() - start:.0f} s: {r.arm} ws{r.warm_start} seed{r.seed}", flush=True)
    mismatch = warm_start_mismatch(r, sources)
    if mismatch:
      os.rename(r.workdir, r.workdir + ".mismatch")  # kept for inspection, no longer a run of this machine
      sys.exit(f"error: {mismatch}. Its workdir is now {r.workdir}.mismatch; run this machine under its own "
               f"name (without --machine, its tag is {provenance.machine_tag()}).")
    table = compare(protocol, sources, output, _COMPARE_SCRIPT.value)
    print(table[1] if not table[0] else table[1].splitlines()[-1], flush=True)
    if record_dir:
      print(f"[sweep] recorded {record(protocol, root, record_dir)} complete runs in {record_dir}", flush=True)

  if table is None:  # nothing compared since the last run completed (or none did): compare now
    table = compare(protocol, sources, output, _COMPARE_SCRIPT.value)
  compared, text = table
  print(text, flush=True)
  if record_dir:
    print(f"[sweep] recorded {record(protocol, root, record_dir)} complete runs in {record_dir}", flush=True)
  remaining = [r for r in runs if not is_complete(r.workdir)]
  print(f"[sweep] launched {launched}, failed {len(failed)}, {len(runs) - len(remaining)} of {len(runs)} complete"
        + (f"; {len(remaining)} to go: run the same command again" if remaining else ""), flush=True)
  for r in failed:
    print(f"[sweep] failed: {r.workdir}", flush=True)
  if failed or not compared:
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
