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

A sweep file (a protocol: configs/protocols/, configs/sweeps/) defines `get_protocol()` returning a dict (or a
ConfigDict, whose keys cannot hold the dots of product/zip keys):
  arms         [{"name": ..., "config": "configs/x.py[:variant]" (relative to the repo; default: `config`),
                 "overrides": ["--config.a.b=v", ...]}, ...]
  config       the config file[:variant] of the arms that `product` and `zip` make
  product      {"config.a.b": [v1, v2], "config.c": {"label1": v1, "label2": v2}, ...}: an arm for every
               combination of the axes' values (the first axis varies slowest)
  zip          {"config.a.b": [v1, v2], "config.c.d": [w1, w2]}: values that go together, one row per arm (equal
               lengths); with `product`, the rows are one more axis of it (the last)
  seeds        RL seeds (a list, or a count n for 0..n-1): --config.seed=S
  warm_starts  warm-start seeds (list or count): --config.sft.seed=W; runs with the same W share the cached warm start
  overrides    ["--config.a.b=v", ...] common to every arm (iterations, tasks)
`arms`, `product` and `zip` may come together (explicit arms first). An arm that product/zip makes has the
overrides --config.a.b=v of its values (scalars: bool, int, float, str), and its name joins its values in axis
order with "_": a label where the axis gives {label: value}, else key=value with the key's last part (more
parts where two axes share it) and the value's characters other than letters, digits and . = + - made "-".
  {"config": "configs/sge_coding.py",
   "product": {"config.sge.p_failure": [0, 0.25], "config.rl.loss.eps_high": [0.2, 0.28]}}
makes p_failure=0_eps_high=0.2, p_failure=0_eps_high=0.28, p_failure=0.25_eps_high=0.2 and
p_failure=0.25_eps_high=0.28. Axis keys must be fields of `config` (checked by loading it), not set by the sweep
(seeds) nor by `overrides`.

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
import contextlib
import fcntl
import importlib.util
import itertools
import json
import os
import queue
import re
import shlex
import shutil
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

KEYS = ("arms", "config", "product", "zip", "seeds", "warm_starts", "overrides")  # of a sweep file's dict
RESERVED = ("--config.seed=", "--config.sft.seed=", "--workdir=", "--config=")
RECORDED_FILES = tpu.RESULT_FILES
STDERR_TAIL_LINES = 20
RUN_NAME = re.compile(r"ws(\d+)_seed(\d+)")  # a run's directory name: warm start, RL seed
AXIS = re.compile(r"config(\.[A-Za-z_][A-Za-z0-9_]*)+")  # a product / zip key: a config field's path
UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]")  # characters a made arm name never holds (commas separate --only's names)
MAX_NAME = 120  # characters of a made arm name; longer ones want labels
GPU_MEMORY_SHARE = 0.9  # of each GPU's memory, split between the runs going at once (the rest: their CUDA contexts)
# How JAX sizes its GPU memory pool (https://docs.jax.dev, "GPU memory allocation"): one of these set by the user wins.
JAX_MEMORY_VARIABLES = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE",
                        "XLA_PYTHON_CLIENT_ALLOCATOR")
WAIT_S = 1.0  # how often the scheduler looks again at runs held back by a warm start being computed
WARM_STARTS_DIR = "warm_starts"  # of a --record directory, with --carry_warm_starts
CARRY_EVERY_S = 30.0  # how often a sweep looks for warm starts to carry while its runs go on
MAX_CARRIED_MB = 64  # the largest warm start --carry_warm_starts copies into a directory meant for git


class ProtocolError(ValueError):
  pass


Run = collections.namedtuple("Run", "arm warm_start seed workdir command")
Finished = collections.namedtuple("Finished", "arm machine workdir")


def _resolve(path: str) -> str:
  """`path` as given (from the current directory), else relative to the repository root."""
  return path if os.path.exists(path) else os.path.join(REPO, path)


def _exec_file(path: str, name: str):
  """The module of the Python file at `path`, imported with the repository root on sys.path (configs/)."""
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.path.insert(0, REPO)
  try:
    spec.loader.exec_module(module)
  finally:
    sys.path.remove(REPO)
  return module


def _axis(where: str, key, values) -> list[tuple[str | None, object]]:
  """One product / zip axis as [(label or None, value)]: from a list of values or a {label: value} dict."""
  if not isinstance(key, str) or not AXIS.fullmatch(key):
    raise ProtocolError(f"{where}: {key!r} is not a config field path (config.a.b)")
  if key in ("config.seed", "config.sft.seed"):
    raise ProtocolError(f"{where}: {key} is set by the sweep (seeds and warm_starts come from the protocol)")
  if isinstance(values, dict):
    options = list(values.items())
    for label, _ in options:
      if not isinstance(label, str) or not label or UNSAFE.search(label) or label.startswith("."):
        raise ProtocolError(f"{where}: {key}: label {label!r} is not a name (letters, digits, . _ = + -)")
  elif isinstance(values, (list, tuple)):
    options = [(None, v) for v in values]
  else:
    raise ProtocolError(f"{where}: {key} needs a list of values or a {{label: value}} dict, not {values!r}")
  if not options:
    raise ProtocolError(f"{where}: {key} has no values")
  for _, value in options:
    if not isinstance(value, (bool, int, float, str)):
      raise ProtocolError(f"{where}: {key}: {value!r} is not a bool, int, float or str (set it in an arm instead)")
  return options


def _short_keys(keys: list[str]) -> dict[str, str]:
  """Each key's shortest tail of dotted parts that no other key ends with: p_failure, loss.clip beside x.clip."""
  parts = {key: key.split(".")[1:] for key in keys}
  short = {}
  for key, mine in parts.items():
    n = next((n for n in range(1, len(mine)) if all(theirs[-n:] != mine[-n:] for other, theirs in parts.items()
                                                    if other != key)), len(mine))
    short[key] = ".".join(mine[-n:])
  return short


def grid_arms(config: str, product: dict, zipped: dict) -> list[dict]:
  """The arms of a product and/or zip of override axes (the module docstring gives the rules), in order."""
  for what, axes in (("product", product), ("zip", zipped)):
    if not isinstance(axes, dict):
      raise ProtocolError(f"{what} must be a dict of config.a.b: values, not {axes!r}")
  both = [key for key in product if key in zipped]
  if both:
    raise ProtocolError(f"{both[0]} is in both product and zip")
  axes = [[[(key, label, value)] for label, value in _axis("product", key, values)]
          for key, values in product.items()]
  if zipped:
    columns = {key: _axis("zip", key, values) for key, values in zipped.items()}
    lengths = {key: len(column) for key, column in columns.items()}
    if len(set(lengths.values())) > 1:
      raise ProtocolError("zip needs lists of one length: " + ", ".join(f"{k} has {n}" for k, n in lengths.items()))
    axes.append([[(key, *columns[key][i]) for key in columns] for i in range(len(next(iter(columns.values()))))])
  short = _short_keys([*product, *zipped])
  arms = []
  for combination in itertools.product(*axes):
    settings = [setting for option in combination for setting in option]
    name = "_".join(label or f"{short[key]}={UNSAFE.sub('-', str(value))}" for key, label, value in settings)
    if len(name) > MAX_NAME:
      raise ProtocolError(f"arm name {name[:60]}... is {len(name)} characters: give the axes labels "
                          "({label: value} instead of [value, ...])")
    arms.append({"name": name, "config": config, "overrides": [f"--{key}={value}" for key, _, value in settings]})
  return arms


def check_fields(config: str, keys: list[str]) -> None:
  """Raises ProtocolError naming the first of `keys` (config.a.b) that is not a field of `config`, so a typo is
  found by a dry run rather than by every run failing."""
  path, _, variant = config.partition(":")
  try:
    module = _exec_file(os.path.join(REPO, path), "_sweep_config")
    c = module.get_config(variant) if ":" in config else module.get_config()
  except Exception as e:  # noqa: BLE001 - whatever a config file raises, name it
    raise ProtocolError(f"config {config!r} does not load: {type(e).__name__}: {e}") from e
  for key in keys:
    node, parts = c, key.split(".")
    for i, part in enumerate(parts[1:], 2):
      try:
        node = node[part]
      except (KeyError, TypeError, AttributeError, IndexError):
        raise ProtocolError(f"{key} is not a field of {config} (it has no {'.'.join(parts[:i])})") from None


def load_protocol(path: str) -> dict:
  """The checked dict of the sweep (protocol) file at `path`, every arm explicit."""
  path = _resolve(path)
  if not os.path.isfile(path):
    raise ProtocolError(f"no protocol file {path}")
  module = _exec_file(path, "_protocol")
  if not hasattr(module, "get_protocol"):
    raise ProtocolError(f"{path} defines no get_protocol()")
  protocol = module.get_protocol()
  protocol = protocol.to_dict() if hasattr(protocol, "to_dict") else dict(protocol)
  unknown = set(protocol) - set(KEYS)
  if unknown:
    raise ProtocolError(f"unknown protocol keys {sorted(unknown)}; known: {', '.join(KEYS)}")

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

  def config_file(config):
    return bool(config) and isinstance(config, str) and os.path.isfile(os.path.join(REPO, config.split(":")[0]))

  base, product, zipped = protocol.get("config"), protocol.get("product") or {}, protocol.get("zip") or {}
  common = overrides(protocol.get("overrides"), "common overrides")
  if base is not None and not config_file(base):
    raise ProtocolError(f"config: no config file {base!r} in {REPO}")
  grid = []
  if product or zipped:
    if base is None:
      raise ProtocolError("product and zip make arms of `config`, and the protocol names none")
    grid = grid_arms(base, product, zipped)
    keys = [*product, *zipped]
    twice = [key for key in keys if any(o.startswith(f"--{key}=") for o in common)]
    if twice:
      raise ProtocolError(f"{twice[0]} is set by both the common overrides and product/zip")
    check_fields(base, keys)

  arms = []
  for arm in [*(protocol.get("arms") or ()), *grid]:
    arm = dict(arm)
    name, config = arm.get("name"), arm.get("config") or base
    if not name or not isinstance(name, str) or os.sep in name or "," in name or name.startswith(".") \
        or name == "compare":
      raise ProtocolError(f"bad arm name {name!r} (a directory name without commas, not 'compare')")
    if not config_file(config):
      raise ProtocolError(f"arm {name!r}: no config file {config!r} in {REPO}")
    arms.append({"name": name, "config": config, "overrides": overrides(arm.get("overrides"), f"arm {name!r}")})
  if not arms:
    raise ProtocolError("the protocol has no arms")
  names = [a["name"] for a in arms]
  if len(set(names)) != len(names):
    raise ProtocolError(f"arm names repeat: {sorted({n for n in names if names.count(n) > 1})}")
  return {"arms": arms, "seeds": seeds("seeds"), "warm_starts": seeds("warm_starts"), "overrides": common}


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


def finished(protocol: dict, directories: list[str], exclude: frozenset = frozenset()) -> list[Finished]:
  """Every machine's complete runs of the protocol's arms under the given sweep or record directories, in
  protocol order (arm, machine, seed, warm start). Runs of warm starts or seeds the protocol no longer
  plans (an earlier design of it) count too. A run found under several directories counts once (the first).
  Workdirs in `exclude` (runs still going, which may have written summary.json but not ended) are left out."""
  arms = [a["name"] for a in protocol["arms"]]
  found: dict[tuple, Finished] = {}
  for directory in directories:
    for machine in sorted(_listdir(directory)):
      for arm in arms:
        for name in _listdir(os.path.join(directory, machine, arm)):
          match = RUN_NAME.fullmatch(name)
          workdir = os.path.join(directory, machine, arm, name)
          key = (machine, arm, *map(int, match.groups())) if match else None
          if key and key not in found and workdir not in exclude and is_complete(workdir):
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
      and _listdir(os.path.join(r.workdir, "checkpoints")) for r in planned)


# The config fields that decide a warm start (explore_jax/train/warm_start.py: warm_start_key), as a run's
# config.json holds them: runs whose values differ start warm start W from different SFT inputs.
WARM_START_FIELDS = (("model", "checkpoint"), ("model", "lora"), ("sft",), ("env",), ("rollout", "max_prompt_tokens"),
                     ("rollout", "max_new_tokens"), ("system_prompt",), ("instruction",), ("history_steps",),
                     ("action_history",))
# ... but not how often the SFT saves its progress, which changes nothing in its result.
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
    for arm in _listdir(os.path.join(directory, machine_dir)):
      for name in _listdir(os.path.join(directory, machine_dir, arm)):
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
  names = [n for n in _listdir(source) if os.path.isfile(os.path.join(source, n)) and not n.endswith(".tmp")
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
  for key in _listdir(kept):
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
def _locked(directory: str | None):
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
    with _locked(record_dir):
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
    with _locked(record_dir):
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
      with _locked(record_dir):
        table = compare(protocol, sources, output, _COMPARE_SCRIPT.value, going)
        print(table[1] if not table[0] else table[1].splitlines()[-1], flush=True)
        if record_dir:
          print(f"[sweep] recorded {record(protocol, root, record_dir, going)} complete runs in {record_dir}",
                flush=True)
  finally:
    stop_all(active, _STOP_GRACE_S.value)  # Ctrl-C, SIGTERM or an error: the runs go down with the sweep
    signal.signal(signal.SIGTERM, previous)

  if table is None or going:  # none compared yet, or the last comparison left out runs then going: compare now
    with _locked(record_dir):
      table = compare(protocol, sources, output, _COMPARE_SCRIPT.value)
  compared, text = table
  print(text, flush=True)
  carry(now=True)
  if record_dir:
    with _locked(record_dir):
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
