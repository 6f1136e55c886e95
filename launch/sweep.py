"""Runs a sweep: every arm over the same warm starts and RL seeds, here (one run at a time, or --parallel=N) or
on a Cloud TPU slice (--tpu), resumable, comparing the arms after every run.

  python launch/sweep.py --protocol=configs/protocols/sge_coding.py --root=runs/protocol/sge_coding
  python launch/sweep.py --sweep=configs/sweeps/sge_ablations.py --root=runs/sweeps/sge_ablations  # = --protocol
  python launch/sweep.py ... --dry_run          # the planned commands; which runs are complete / partial / pending
  python launch/sweep.py ... --only=sge,grpo    # only these arms
  python launch/sweep.py ... --max_runs=3       # stop after 3 launches (a time-boxed session); run again to go on
  python launch/sweep.py ... --parallel=2       # two runs at a time, each its own process
  python launch/sweep.py ... --tpu=ej --zone=us-east5-a --bucket=my-bucket   # every run on the slice, in turn
  python launch/sweep.py ... --record=docs/results/protocol/sge_coding   # copy each finished run's results there

A sweep file's keys, and the arms its product and zip make: launch/sweep_file.py.

Run (arm, W, S) lives in root/<machine>/<arm>/ws<W>_seed<S> and is launch/train.py with --workdir and the
overrides, run from the repository root. <machine> is this machine's numerical environment
(explore_jax/train/provenance.py machine_tag: CPU, cores, versions): another machine computes another warm
start from the same sft.seed and another run from the same seeds (docs/determinism.md), so its runs are its
own. They are compared with everyone's, within warm starts (launch/compare.py), and never stand in for this
machine's. Runs go in an order that interleaves arms (seed 0 of every arm and warm start before
seed 1, ...), so a partial sweep is balanced. A run is complete when its workdir has summary.json; any other
run is launched (again): train.py resumes an interrupted run from its last checkpoint, so a killed sweep
started again with the same command continues where it stopped. A sweep taken down by SIGTERM passes it on to
its runs, and each finishes the iteration it is in and saves it (train/preemption.py) within --stop_grace_s,
or is killed then. A failed run (non-zero exit) is reported with
the tail of its stderr and the sweep goes on; the exit status is non-zero if any run failed. After every
completed run and at the end, launch/compare.py compares all complete runs, grouped by arm, into root/compare/.

--parallel=N keeps N runs going, each its own process, started in the same order; their output goes to each
run's sweep_stdout.log and sweep_stderr.log (with N = 1 it also passes through, as before). JAX takes 75% of a
GPU's memory per process when it starts, so N > 1 processes on one GPU would not all start: each is given
GPU_MEMORY_SHARE / N of it (run_environment) unless the environment already says how JAX allocates. A run waits while
another run of its warm start W is going, unless a run of W with the same SFT inputs (its own arm, or one that
differs only in RL settings) already has a checkpoint (the SFT warm start is then cached; two runs computing it
at once would both write its cache entry), and the next
run that may start goes first meanwhile (may_start): runs side by side come from different warm starts, or
from one already cached. Comparisons and records are made by the sweep alone, after each run ends, from the
runs that have ended (never from one still writing), and a --record directory is locked while written.

--tpu=NAME --zone=Z runs every run on that slice, one at a time, through `launch/tpu.py run --wait --fetch`
(set the slice up with tpu.py create and setup first): it starts the run on every worker unless worker 0 says
it is running or complete, waits for summary.json in the run's directory on the slice, gs://B/sweeps/<root
name>/<machine>/<arm>/ws<W>_seed<S> with --bucket=B (needed by multi-host slices, whose workers share no disk),
else sweeps/<root name>/... under ~/explore_jax on worker 0, and copies the run's small files back into its
directory here, where completion, resuming and comparing then work as for local runs. <machine> defaults to
the slice's name. --dry_run prints each run's tpu.py command line (tpu.py run ... --dry_run prints its gcloud
lines); whether a run is complete on the slice is only asked when the sweep runs. launch/train.py writes and
resumes a gs:// run directory (explore_jax/storage.py; tested on a local emulator). One limit, stated plainly:
no real slice has run this: the tests play gcloud, a worker and a bucket with a fake
(tests/launch/fake_pod.py), and the gcloud lines follow its documentation.

With --record=DIR the small files of every complete run (RECORDED_FILES: its config, metrics per iteration,
pass@k summary and provenance) are copied to DIR/<machine>/<arm>/ws<W>_seed<S>/ and the comparison to
DIR/compare/ after every run, so a long sweep's results can be committed as they come in (root itself holds
checkpoints and stays out of git). DIR is also read: a run recorded there under this machine's name counts as
complete (a fresh clone goes on where the recorded sweep stopped), and every machine's recorded runs enter
the comparison.

With --carry_warm_starts (and --record=DIR) the warm starts travel with the results: once a run has started from
an SFT warm start (its provenance.json names the warm start's cache key), the cached warm start is copied to
DIR/warm_starts/<key>/ (and its cached pass@k, once evaluated, to <key>.pass_at_k/), and before any run starts
every warm start kept there that this machine's cache lacks is copied into it, with its evaluations. A fresh
clone on any machine then starts its runs from the recorded warm starts, bit for bit (their runs record the same
start_digest), instead of computing them again: what lets a protocol whose SFT is a large part of a run's cost
go on across working sessions and machines. For small policies only: a warm start
of the tiny model is ~16 MB, and one over MAX_CARRIED_MB is left out with a note.
"""

import collections
import fcntl
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from explore_jax import cache  # noqa: E402
from explore_jax.train import provenance  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "launch"))
import tpu  # noqa: E402
from sweep_file import ProtocolError, load_protocol  # noqa: E402
from sweep_records import (  # noqa: E402
    WARM_STARTS_DIR, Run, list_dir, locked, bring_warm_starts, carry_warm_starts, compare, is_complete, record,
    restore, state, warm_start_args, warm_start_mismatch)

_PROTOCOL = flags.DEFINE_string("protocol", None, "Sweep (protocol) file defining get_protocol().")
flags.DEFINE_alias("sweep", "protocol")
_ROOT = flags.DEFINE_string("root", None, "Sweep directory: root/<machine>/<arm>/ws<W>_seed<S>, root/compare/.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the plan and each run's state; launch nothing.")
_ONLY = flags.DEFINE_list("only", None, "Run only these arms (comparisons still cover every arm's complete runs).")
_MAX_RUNS = flags.DEFINE_integer("max_runs", None, "Stop after this many launches.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs at a time, each its own process (local runs only).")
_RECORD = flags.DEFINE_string("record", None, "Copy every complete run's small result files and the comparison "
                              "here (a directory to commit), after every run; runs recorded here count as done.")
_CARRY = flags.DEFINE_bool("carry_warm_starts", False, "With --record=DIR: keep each run's SFT warm start in "
                           "DIR/warm_starts/ once computed, and put the ones kept there into this machine's cache "
                           "before any run starts (small policies: a tiny warm start is ~16 MB).")
_MACHINE = flags.DEFINE_string("machine", None, "Name of this machine's numerical environment (default: "
                               "provenance.machine_tag(), or the --tpu name). Give two machines one name only if "
                               "their warm starts are bit-identical (benchmarks/determinism.py).")
_TPU = flags.DEFINE_string("tpu", None, "Run every run on this Cloud TPU slice (launch/tpu.py run --wait).")
_ZONE = flags.DEFINE_string("zone", None, "The slice's zone (with --tpu).")
_PROJECT = flags.DEFINE_string("project", None, "The slice's Google Cloud project (with --tpu; default: gcloud's).")
_BUCKET = flags.DEFINE_string("bucket", None, "With --tpu: run directories under gs://BUCKET/sweeps/ (multi-host "
                              "slices need it); without, on worker 0's disk.")
_POLL_S = flags.DEFINE_float("poll_s", 60.0, "With --tpu: seconds between queries of a run's state.")
_STOP_GRACE_S = flags.DEFINE_float("stop_grace_s", 900.0, "Taken down (SIGTERM, an error), the sweep gives each "
                                   "run this long to finish its iteration and save it before killing it.")
# Hidden in spirit: tests substitute a fake trainer / comparison. Paths relative to the repository root.
_TRAIN_SCRIPT = flags.DEFINE_string("train_script", "launch/train.py", "The trainer each run executes (tests).")
_COMPARE_SCRIPT = flags.DEFINE_string("compare_script", "launch/compare.py", "The comparison script (tests).")
flags.mark_flags_as_required(["protocol", "root"])

STDERR_TAIL_LINES = 20
GPU_MEMORY_SHARE = 0.9  # of each GPU's memory, split between the runs going at once (the rest: their CUDA contexts)
# How JAX sizes its GPU memory pool (https://docs.jax.dev, "GPU memory allocation"): one of these set by the user wins.
JAX_MEMORY_VARIABLES = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE",
                        "XLA_PYTHON_CLIENT_ALLOCATOR")
WAIT_S = 1.0  # how often the scheduler looks again at runs held back by a warm start being computed
CARRY_EVERY_S = 30.0  # how often a sweep looks for warm starts to carry while its runs go on


def pod_workdir(workdir: str, root: str, bucket: str | None) -> str:
  """A run's directory on the slice: sweeps/<root name>/<machine>/<arm>/<run>, in the bucket or on worker 0."""
  path = "/".join(["sweeps", os.path.basename(root), *os.path.relpath(workdir, root).split(os.sep)])
  return tpu.bucket_path(bucket, path) if bucket else path


def pod_command(run_args: list[str], arm: dict, workdir: str, root: str, pod: dict) -> list[str]:
  """launch/tpu.py run --wait --fetch for one run on the slice `pod` (name, zone, project, bucket, poll_s)."""
  machine, arm_name, run_name = os.path.relpath(workdir, root).split(os.sep)
  argv = ["run", f"--name={pod['name']}", f"--zone={pod['zone']}",
          *([f"--project={pod['project']}"] if pod.get("project") else []), f"--config={arm['config']}",
          f"--workdir={pod_workdir(workdir, root, pod.get('bucket'))}",
          f"--log={os.path.basename(root)}.{machine}.{arm_name}.{run_name}.log", "--wait",
          f"--fetch={_from_repo(workdir)}", f"--poll_s={pod.get('poll_s', 60.0):g}", "--", *run_args]
  tpu.parse_args(argv)  # a bad name or zone is a one-line error now, not at every run
  return [sys.executable, "launch/tpu.py", *argv]


def plan(protocol: dict, root: str, machine: str, train_script: str = "launch/train.py",
         pod: dict | None = None) -> list[Run]:
  """This machine's runs in launch order: seed-major, then warm start, then arm, so arms stay balanced. With
  `pod`, each run's command is launch/tpu.py's, which runs it on the slice and copies its results here."""
  runs = []
  for seed in protocol["seeds"]:
    for ws in protocol["warm_starts"]:
      for arm in protocol["arms"]:
        workdir = os.path.join(root, machine, arm["name"], f"ws{ws}_seed{seed}")
        run_args = [f"--config.seed={seed}", f"--config.sft.seed={ws}", *protocol["overrides"], *arm["overrides"]]
        if pod:
          command = pod_command(run_args, arm, workdir, root, pod)
        else:
          command = [sys.executable, train_script, f"--config={arm['config']}", f"--workdir={_from_repo(workdir)}",
                     *run_args]
        runs.append(Run(arm["name"], ws, seed, workdir, command))
  return runs


def _from_repo(path: str) -> str:
  """`path` as the commands (run from the repository root) name it: relative when it is inside the repo."""
  rel = os.path.relpath(path, REPO)
  return path if rel == ".." or rel.startswith(".." + os.sep) else rel


def _die_with_parent():
  """In the child: get SIGTERM if the sweep dies (even by SIGKILL), so no orphan trains beside its successor."""
  try:
    import ctypes
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
  except Exception:  # not Linux: the SIGTERM handler in main() still covers a polite kill
    pass


def run_environment(parallel: int, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
  """The environment of each local run: `environ`, and with `parallel` > 1 runs at a time a share of each GPU's
  memory (XLA_PYTHON_CLIENT_MEM_FRACTION = GPU_MEMORY_SHARE / parallel) unless one of JAX_MEMORY_VARIABLES is
  set. A CPU run ignores the variable."""
  env = dict(environ)
  if parallel > 1 and not any(name in environ for name in JAX_MEMORY_VARIABLES):
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{GPU_MEMORY_SHARE / parallel:.3f}"
  return env


class Launched:
  """One run's process from the repository root, in `env` (default: this process's environment): its stderr
  appended to workdir/sweep_stderr.log (and passed through when `echo`; its stdout then too, else into
  workdir/sweep_stdout.log); put on `ended` once it exits."""

  def __init__(self, run: Run, echo: bool, ended: queue.Queue, env: Mapping[str, str] | None = None):
    os.makedirs(run.workdir, exist_ok=True)
    with open(os.path.join(run.workdir, "sweep_command.txt"), "a") as f:
      f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(run.command)}\n")
    self.run, self.start, self.code = run, time.time(), None
    self._tail: collections.deque = collections.deque(maxlen=64)
    stdout = None if echo else open(os.path.join(run.workdir, "sweep_stdout.log"), "ab")
    try:
      self.proc = subprocess.Popen(run.command, cwd=REPO, stdout=stdout, stderr=subprocess.PIPE, env=env,
                                   preexec_fn=_die_with_parent)
    finally:
      if stdout:
        stdout.close()
    reader = threading.Thread(target=self._copy_stderr, args=(echo,), daemon=True)
    reader.start()
    threading.Thread(target=self._wait, args=(reader, ended), daemon=True).start()

  def _copy_stderr(self, echo: bool) -> None:
    with open(os.path.join(self.run.workdir, "sweep_stderr.log"), "ab") as log:
      for chunk in iter(lambda: self.proc.stderr.read1(4096), b""):
        if echo:
          sys.stderr.buffer.write(chunk)
          sys.stderr.flush()
        log.write(chunk)
        log.flush()  # the log is what a user tails while the run goes
        self._tail.append(chunk)

  def _wait(self, reader: threading.Thread, ended: queue.Queue) -> None:
    code = self.proc.wait()
    reader.join(10)  # a grandchild may hold stderr open after the run exits
    self.code = code
    ended.put(self)

  def tail(self) -> list[str]:
    """The last lines of the run's stderr."""
    lines = b"".join(self._tail).decode(errors="replace").replace("\r", "\n").splitlines()
    return "\n".join(line for line in lines if line.strip())[-4000:].splitlines()[-STDERR_TAIL_LINES:]



def stop_all(active: list[Launched], grace_s: float) -> None:
  """Takes the runs down with the sweep (Ctrl-C, SIGTERM, an error); they resume next time. SIGTERM to each at
  once: a training run saves the iteration it is in and leaves (train/preemption.py); whichever is still going
  `grace_s` seconds later is killed."""
  going = [a.proc for a in active if a.proc.poll() is None]
  for proc in going:
    proc.terminate()
  deadline = time.monotonic() + grace_s
  for proc in going:
    try:
      proc.wait(max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()


def may_start(run: Run, going: list[Run], planned: list[Run]) -> bool:
  """Whether `run` may start beside the runs `going` without two processes computing one SFT warm start at
  once (each would compute it and write the same cache entry). The cache key holds sft.seed, so runs of other
  warm starts never share it: they always may. Of one warm start, runs of other arms may use other SFT inputs,
  so `run` waits for them, unless a run with the same SFT inputs (warm_start_args: the same config and
  overrides of the warm start's fields, so arms that differ only in RL knobs share it) from the same warm start
  has a checkpoint here: train.py saves step 0 only after the warm start is cached. Runs restored from a
  record hold no checkpoints, so a fresh clone computes each warm start once before sharing it."""
  inputs = warm_start_args(run)
  return not any(g.warm_start == run.warm_start for g in going) or any(
      r.warm_start == run.warm_start and warm_start_args(r) == inputs
      and list_dir(os.path.join(r.workdir, "checkpoints")) for r in planned)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _PARALLEL.value < 1:
    sys.exit(f"error: --parallel={_PARALLEL.value} must be at least 1")
  pod = None
  if _TPU.value is not None:
    if not _ZONE.value:
      sys.exit("error: --tpu needs --zone (the slice's zone)")
    if _PARALLEL.value != 1:
      sys.exit("error: --parallel is for local runs; a slice runs one run of the sweep at a time")
    if flags.FLAGS["train_script"].present:
      sys.exit("error: --train_script is for local runs; on a slice tpu.py runs launch/train.py")
    pod = {"name": _TPU.value, "zone": _ZONE.value, "project": _PROJECT.value, "bucket": _BUCKET.value,
           "poll_s": _POLL_S.value}
  else:
    given = [f"--{f.name}" for f in (_ZONE, _PROJECT, _BUCKET, _POLL_S) if flags.FLAGS[f.name].present]
    if given:
      sys.exit(f"error: {given[0]} is for runs on a slice (--tpu=NAME)")
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
  machine = _MACHINE.value or (pod["name"] if pod else provenance.machine_tag())
  record_dir = os.path.abspath(_RECORD.value) if _RECORD.value else None
  if _CARRY.value and not record_dir:
    sys.exit("error: --carry_warm_starts keeps the warm starts in the --record directory, and none is given")
  if _CARRY.value and pod:
    sys.exit("error: --carry_warm_starts is for local runs (a slice's warm starts are in its own cache)")
  planned = plan(protocol, root, machine, _TRAIN_SCRIPT.value, pod)
  runs = [r for r in planned if not only or r.arm in only]

  def recorded(r: Run) -> bool:
    return bool(record_dir) and is_complete(os.path.join(record_dir, os.path.relpath(r.workdir, root)))

  states = {r.workdir: "complete" if not is_complete(r.workdir) and recorded(r) else state(r.workdir) for r in runs}
  todo = [r for r in runs if states[r.workdir] != "complete"]
  counts = collections.Counter(s.split(" ")[0] for s in states.values())
  print(f"[sweep] {_PROTOCOL.value}: {len(runs)} runs ({len(protocol['arms']) if not only else len(only)} arms x "
        f"{len(protocol['warm_starts'])} warm starts x {len(protocol['seeds'])} seeds) on machine {machine} in "
        f"{root}; " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), flush=True)

  if _DRY_RUN.value:
    where = (f", on TPU {pod['name']} through launch/tpu.py run --wait (the states are those of the copies here; "
             "the slice is asked only when the sweep runs)" if pod else
             f", {_PARALLEL.value} at a time" if _PARALLEL.value > 1 else "")
    print(f"[sweep] commands run from {REPO}{where}:")
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
    with locked(record_dir):
      restored = restore(runs, root, record_dir)
      brought = bring_warm_starts(record_dir) if _CARRY.value else []
    if restored:
      print(f"[sweep] {restored} runs of this machine recorded in {record_dir} count as complete", flush=True)
    for key in brought:
      print(f"[sweep] warm start {key} recorded in {record_dir} put into the cache ({cache.warm_start_dir(key)})",
            flush=True)

  last_carry = 0.0

  def carry(now: bool = False) -> None:
    """Carries the warm starts of the runs going or ended (a run names its warm start once it has one), at
    most every CARRY_EVERY_S unless `now`."""
    nonlocal last_carry
    if not _CARRY.value or (not now and time.time() - last_carry < CARRY_EVERY_S):
      return
    last_carry = time.time()
    with locked(record_dir):
      for path in carry_warm_starts(runs, record_dir):
        print(f"[sweep] kept {os.path.join(record_dir, WARM_STARTS_DIR, path)}", flush=True)

  sources = [root] + ([record_dir] if record_dir else [])  # whose complete runs are compared
  output = os.path.join(root, "compare")
  total = len(todo) if _MAX_RUNS.value is None else min(_MAX_RUNS.value, len(todo))

  failed, launched, table, going = [], 0, None, frozenset()
  environment = run_environment(_PARALLEL.value)
  active: list[Launched] = []
  ended: queue.Queue = queue.Queue()
  previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
  try:
    while True:
      while len(active) < _PARALLEL.value and launched < total:
        r = next((r for r in todo if may_start(r, [a.run for a in active], planned)), None)
        if r is None:
          break
        todo.remove(r)
        launched += 1
        print(f"[sweep] run {launched}/{total}: {r.arm} ws{r.warm_start} seed{r.seed} ({state(r.workdir)}): "
              f"python {shlex.join(r.command[1:])}", flush=True)
        active.append(Launched(r, echo=_PARALLEL.value == 1, ended=ended, env=environment))
      if not active:
        break
      try:
        done = ended.get(timeout=WAIT_S)
      except queue.Empty:
        carry()
        continue
      carry(now=True)
      active.remove(done)
      r, code, tail = done.run, done.code, done.tail()
      if code == 0 and not is_complete(r.workdir):
        code, tail = 1, tail + [f"exited 0 but wrote no summary.json in {r.workdir} (does the config ask for pass@k?)"]
      if code != 0:
        failed.append(r)
        print(f"[sweep] FAILED ({code}) after {time.time() - done.start:.0f} s: {r.arm} ws{r.warm_start} "
              f"seed{r.seed}; stderr tail (all of it in {os.path.join(r.workdir, 'sweep_stderr.log')}):\n  "
              + "\n  ".join(tail), flush=True)
        continue
      print(f"[sweep] done in {time.time() - done.start:.0f} s: {r.arm} ws{r.warm_start} seed{r.seed}", flush=True)
      mismatch = warm_start_mismatch(r, sources)
      if mismatch:
        os.rename(r.workdir, r.workdir + ".mismatch")  # kept for inspection, no longer a run of this machine
        sys.exit(f"error: {mismatch}. Its workdir is now {r.workdir}.mismatch; run this machine under its own "
                 f"name (without --machine, its tag is {provenance.machine_tag()}).")
      going = frozenset(a.run.workdir for a in active)
      with locked(record_dir):
        table = compare(protocol, sources, output, _COMPARE_SCRIPT.value, going)
        print(table[1] if not table[0] else table[1].splitlines()[-1], flush=True)
        if record_dir:
          print(f"[sweep] recorded {record(protocol, root, record_dir, going)} complete runs in {record_dir}",
                flush=True)
  finally:
    stop_all(active, _STOP_GRACE_S.value)  # Ctrl-C, SIGTERM or an error: the runs go down with the sweep
    signal.signal(signal.SIGTERM, previous)

  if table is None or going:  # none compared yet, or the last comparison left out runs then going: compare now
    with locked(record_dir):
      table = compare(protocol, sources, output, _COMPARE_SCRIPT.value)
  compared, text = table
  print(text, flush=True)
  carry(now=True)
  if record_dir:
    with locked(record_dir):
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
