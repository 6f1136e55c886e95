"""Runs launch/train.py on a Cloud TPU slice (one or many hosts) through the gcloud CLI.

  python launch/tpu.py create --name=ej --zone=us-east5-a --accelerator_type=v5p-16
  python launch/tpu.py create --name=ej --zone=us-east5-a --accelerator_type=v5p-16 --queued --spot
  python launch/tpu.py setup  --name=ej --zone=us-east5-a    # the committed code (HEAD) + a venv on every worker
  python launch/tpu.py run    --name=ej --zone=us-east5-a --bucket=my-bucket -- --config.seed=1
  python launch/tpu.py delete --name=ej --zone=us-east5-a [--queued]
  python launch/tpu.py ... --dry_run                         # print the commands, run nothing

create makes a TPU VM slice (or, with --queued, a queued resource of the same name whose node is the slice;
--spot for spot capacity). The runtime version defaults to the one Google documents for JAX on the
accelerator's generation (RUNTIMES).

setup ships `git archive REF` (default HEAD: uncommitted edits do not travel) to every worker, unpacks it
into ~/explore_jax and installs there: a Python >= 3.11 venv (made with uv, which fetches that Python when the
image's is older), `jax[tpu]` resolved together with requirements.txt, and the project itself (INSTALL).

run starts the same command on every worker, in the background, its output in ~/explore_jax/<--log>:
  .venv/bin/python launch/train.py --config=CONFIG --workdir=WORKDIR [args after --]
then follows worker 0's log (Ctrl-C stops following; the run goes on; --no_follow skips it). A slice's
workers share no disk, so the run directory is a bucket path: --bucket=B gives gs://B/runs/<config name>,
--workdir any other. Arguments after `--` go to train.py as given (quoted for the remote shell).

run --wait is how launch/sweep.py --tpu runs one run of a sweep: it asks worker 0 for the run's state first
(state_command: 'complete' when summary.json is in the run directory, 'running' while its train.py lives,
else 'stopped'), starts the run only when it is stopped (train.py resumes from its last checkpoint), so a
sweep started again never runs one twice, then asks again every --poll_s seconds. It exits 0 once
summary.json is there, non-zero with the tail of worker 0's log when the run stopped without it. --fetch=DIR
then copies the run's small result files (RESULT_FILES) to DIR here, summary.json last. Tested against a fake
gcloud (tests/launch/fake_pod.py), not a real slice.

delete deletes the slice (with --queued: the queued resource, its node first), without asking.

Every command is printed before it runs and the first failure stops the rest. gcloud must be on PATH (and
git, for setup); --dry_run prints the command lines (shell-quoted, one per line) and needs neither.
"""

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The TPU software version for JAX per generation (cloud.google.com/tpu/docs/runtimes). v5e's accelerator
# types are named v5litepod-N.
RUNTIMES = {
    "v2": "tpu-ubuntu2204-base",
    "v3": "tpu-ubuntu2204-base",
    "v4": "tpu-ubuntu2204-base",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v5p": "v2-alpha-tpuv5",
    "v6e": "v2-alpha-tpuv6e",
}
ACCELERATOR = re.compile(r"(v[0-9a-z]+)-([1-9][0-9]*)")
NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")  # a TPU node's name, as Cloud TPU accepts it

REMOTE_DIR = "~/explore_jax"        # the checkout on every worker
REMOTE_HOME_DIR = "explore_jax"     # the same, as scp names it (relative to the home directory)
REMOTE_TARBALL = "explore_jax.tar.gz"  # in the worker's home directory
PYTHON = "3.11"                     # jax>=0.10 (requirements.txt) needs Python >= 3.11
# A finished run's small files, what launch/sweep.py records and compares. summary.json comes last: a run
# directory is complete once it holds one, so a copy that stops half way never looks complete.
RESULT_FILES = ("config.json", "metrics.jsonl", "summary.md", "provenance.json", "summary.json")
STATES = ("complete", "running", "stopped")  # a run's state, as state_command prints it
LOG_TAIL_LINES = 20                 # of worker 0's log, with every state and in a failure's report
MAX_STATE_FAILURES = 5              # consecutive unanswered state queries (ssh down) before --wait gives up

# The install on every worker, one shell line. A working venv is kept; otherwise uv (pip-installed for the
# user) makes one with Python PYTHON, downloading that Python when the image has an older one. jax[tpu]
# resolves with requirements.txt so libtpu matches the pinned jax. The venv's bin is first on PATH while
# installing: packages that compile (fast-downward for TextWorld's PDDL games) run `python` in their builds.
INSTALL = (
    f"mkdir -p {REMOTE_DIR} && tar -xzf ~/{REMOTE_TARBALL} -C {REMOTE_DIR} && cd {REMOTE_DIR}"
    f" && (test -x .venv/bin/pip || (python3 -m pip install --user --quiet uv && rm -rf .venv"
    f" && python3 -m uv venv --seed --python {PYTHON} .venv))"
    ' && PATH="$PWD/.venv/bin:$PATH" .venv/bin/pip install --quiet -r requirements.txt "jax[tpu]"'
    " && .venv/bin/pip install --quiet --no-deps -e ."
)


class _Parser(argparse.ArgumentParser):
  """argparse whose errors are one line (`error: ...`) and exit non-zero, like the other launch scripts."""

  def error(self, message):
    sys.exit(f"error: {message} (see: python launch/tpu.py {self.prog.split()[-1]} --help)"
             if " " in self.prog else f"error: {message} (see: python launch/tpu.py --help)")


def _parser() -> argparse.ArgumentParser:
  common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
  common.add_argument("--name", required=True, help="The TPU VM (node) name; also the queued resource's.")
  common.add_argument("--zone", required=True, help="The zone of the slice, e.g. us-east5-a.")
  common.add_argument("--project", help="The Google Cloud project (default: gcloud's configured one).")
  common.add_argument("--dry_run", action="store_true", help="Print the command lines; run nothing.")

  parser = _Parser(prog="tpu.py", description=__doc__.split("\n")[0], allow_abbrev=False)
  sub = parser.add_subparsers(dest="command", required=True, metavar="{create,setup,run,delete}")
  shared = dict(parents=[common], allow_abbrev=False)
  create = sub.add_parser("create", help="Create the slice (or a queued resource).", **shared)
  create.add_argument("--accelerator_type", required=True, help="GENERATION-SIZE, e.g. v5p-16, v6e-8, v4-32.")
  create.add_argument("--runtime_version", help="TPU software version (default: RUNTIMES[generation]).")
  create.add_argument("--spot", action="store_true", help="Spot capacity (may be preempted).")
  create.add_argument("--queued", action="store_true", help="Request it as a queued resource named --name.")

  setup = sub.add_parser("setup", help="Ship the code to every worker and install it.", **shared)
  setup.add_argument("--ref", default="HEAD", help="The git commit (or branch, tag) to ship.")

  run = sub.add_parser("run", help="Start train.py on every worker; follow worker 0.", **shared)
  run.add_argument("--config", default="configs/sge_coding.py", help="train.py's --config (file[:variant]).")
  run.add_argument("--bucket", help="A GCS bucket: the run directory is gs://BUCKET/runs/<config name>.")
  run.add_argument("--workdir", help="train.py's --workdir (instead of --bucket).")
  run.add_argument("--log", default="run.log", help=f"Each worker's output file, in {REMOTE_DIR}.")
  run.add_argument("--no_follow", action="store_true", help="Do not follow worker 0's log after starting.")
  run.add_argument("--wait", action="store_true", help="Start the run unless it is running or complete, then "
                   "wait for summary.json (asking worker 0 every --poll_s) instead of following the log.")
  run.add_argument("--fetch", metavar="DIR", help="With --wait: copy the finished run's small files here.")
  run.add_argument("--poll_s", type=float, default=60.0, help="With --wait: seconds between state queries.")

  delete = sub.add_parser("delete", help="Delete the slice (or the queued resource).", **shared)
  delete.add_argument("--queued", action="store_true", help="Delete the queued resource --name and its node.")
  return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
  """The checked arguments of `argv` (without the program name). What follows the first `--` is train.py's
  (`train_args`). A bad value exits with one line naming its flag."""
  if "--" in argv:
    at = argv.index("--")
    argv, train_args = argv[:at], argv[at + 1:]
  else:
    train_args = []
  parser = _parser()
  args = parser.parse_args(argv)
  args.train_args = train_args
  if not NAME.fullmatch(args.name):
    sys.exit(f"error: --name={args.name!r} is not a TPU name (lowercase letters, digits and '-', starting with a "
             "letter, at most 63)")
  if not args.zone:
    sys.exit("error: --zone is empty")
  if args.command == "create":
    match = ACCELERATOR.fullmatch(args.accelerator_type)
    if not match or match.group(1) not in RUNTIMES:
      hint = "; v5e is v5litepod-N" if args.accelerator_type.startswith("v5e") else ""
      sys.exit(f"error: unknown --accelerator_type={args.accelerator_type!r}: expected GENERATION-SIZE with "
               f"GENERATION one of {', '.join(RUNTIMES)} (e.g. v5p-16){hint}")
    args.runtime_version = args.runtime_version or RUNTIMES[match.group(1)]
  if args.command == "setup" and (not args.ref or args.ref.startswith("-")):
    sys.exit(f"error: --ref={args.ref!r} is not a git commit")
  if args.command != "run" and train_args:
    sys.exit(f"error: arguments after -- are train.py's, for run only; {args.command} got {shlex.join(train_args)}")
  if args.command == "run":
    if not os.path.isfile(os.path.join(REPO, args.config.split(":")[0])):
      sys.exit(f"error: --config={args.config!r}: no such config file in {REPO}")
    for arg in train_args:
      flag = arg.split("=", 1)[0]
      if flag in ("--workdir", "--config"):
        sys.exit(f"error: give {flag} to tpu.py run ({flag}=...), not after --")
      if flag in ("--dry_run", "--no_follow"):  # would start a real run that train.py then rejects
        sys.exit(f"error: {flag} after -- would go to train.py; put it before --")
    if args.bucket and args.workdir:
      sys.exit("error: give --bucket or --workdir, not both")
    if not args.bucket and not args.workdir:
      sys.exit("error: run needs --bucket=BUCKET (the run directory becomes gs://BUCKET/runs/<config name>) or "
               "--workdir: the workers of a slice share no disk")
    if not args.log or "/" in args.log or args.log.startswith("."):
      sys.exit(f"error: --log={args.log!r} is not a file name")
    if args.fetch is not None and not args.wait:
      sys.exit("error: --fetch copies a finished run's files, so it needs --wait")
    if args.fetch == "":
      sys.exit("error: --fetch is empty")
    if not args.poll_s > 0:
      sys.exit(f"error: --poll_s={args.poll_s} must be positive")
  return args


def _gcloud(args: argparse.Namespace, *words: str) -> list[str]:
  """`gcloud compute tpus WORDS`: the positional words, --zone, the flags among WORDS, --project if given."""
  command, flags = [w for w in words if not w.startswith("--")], [w for w in words if w.startswith("--")]
  return ["gcloud", "compute", "tpus", *command, f"--zone={args.zone}", *flags] + (
      [f"--project={args.project}"] if args.project else [])


def _storage(args: argparse.Namespace, *words: str) -> list[str]:
  """`gcloud storage WORDS` (--project if given)."""
  return ["gcloud", "storage", *words] + ([f"--project={args.project}"] if args.project else [])


def bucket_path(bucket: str, path: str) -> str:
  """gs://BUCKET/PATH, whether the bucket was given as B, gs://B or gs://B/."""
  return f"gs://{bucket.removeprefix('gs://').strip('/')}/{path}"


def tarball(args: argparse.Namespace) -> str:
  """The local archive setup makes and ships."""
  return f"/tmp/explore_jax-{args.name}.tar.gz"


def workdir(args: argparse.Namespace) -> str:
  """The run directory train.py gets on every worker."""
  if args.workdir:
    return args.workdir
  config_name = os.path.splitext(os.path.basename(args.config.split(":")[0]))[0]
  return bucket_path(args.bucket, f"runs/{config_name}")


def train_command(args: argparse.Namespace) -> list[str]:
  """The trainer's command line on every worker, run from REMOTE_DIR."""
  return [".venv/bin/python", "launch/train.py", f"--config={args.config}", f"--workdir={workdir(args)}",
          *args.train_args]


def create_commands(args: argparse.Namespace) -> list[list[str]]:
  spot = ["--spot"] if args.spot else []
  if args.queued:
    return [_gcloud(args, "queued-resources", "create", args.name, f"--node-id={args.name}",
                    f"--accelerator-type={args.accelerator_type}", f"--runtime-version={args.runtime_version}",
                    *spot)]
  return [_gcloud(args, "tpu-vm", "create", args.name, f"--accelerator-type={args.accelerator_type}",
                  f"--version={args.runtime_version}", *spot)]


def setup_commands(args: argparse.Namespace) -> list[list[str]]:
  """Archive REF here, copy it to every worker, unpack and install there (INSTALL)."""
  return [
      ["git", "-C", REPO, "archive", "--format=tar.gz", f"--output={tarball(args)}", args.ref],
      _gcloud(args, "tpu-vm", "scp", tarball(args), f"{args.name}:{REMOTE_TARBALL}", "--worker=all"),
      _gcloud(args, "tpu-vm", "ssh", args.name, "--worker=all", f"--command={INSTALL}"),
  ]


def run_commands(args: argparse.Namespace) -> list[list[str]]:
  """Start train.py in the background on every worker (ssh returns at once), then follow worker 0's log."""
  log = f"{REMOTE_DIR}/{shlex.quote(args.log)}"
  # The braces put only train.py in the background, its output redirected: nothing else keeps ssh's streams.
  start = (f"cd {REMOTE_DIR} && {{ nohup {shlex.join(train_command(args))} > {shlex.quote(args.log)} 2>&1 "
           "< /dev/null & }")
  commands = [_gcloud(args, "tpu-vm", "ssh", args.name, "--worker=all", f"--command={start}")]
  if not args.no_follow and not args.wait:
    commands.append(_gcloud(args, "tpu-vm", "ssh", args.name, "--worker=0", f"--command=tail -n +1 -F {log}"))
  return commands


def _ere(text: str) -> str:
  """`text` matched literally in a POSIX extended regular expression (pgrep's)."""
  return re.sub(r"([.\[\]()*+?{}|^$\\])", r"\\\1", text)


def state_command(args: argparse.Namespace) -> list[str]:
  """ssh to worker 0 printing the run's state (STATES) on the first line, then the last lines of its log.
  Worker 0 answers for the slice: every worker runs the same train.py, and the run is complete when its
  summary.json is in the run directory (a bucket path is looked up with the worker's own gcloud)."""
  summary = f"{workdir(args).rstrip('/')}/summary.json"
  exists = f"gcloud storage ls {shlex.quote(summary)}" if summary.startswith("gs://") else \
      f"test -f {shlex.quote(summary)}"
  # The process is train_command()'s: `[l]` keeps the pattern from matching the shell that runs this script,
  # and the run directory ends at a space or the end, so runs/a does not match runs/ab.
  pattern = f"[l]aunch/train[.]py .*--workdir={_ere(workdir(args))}( |$)"
  script = (f"cd {REMOTE_DIR} && if {exists} > /dev/null 2>&1; then echo complete; "
            f"elif pgrep -f -- {shlex.quote(pattern)} > /dev/null; then echo running; else echo stopped; fi; "
            f"tail -n {LOG_TAIL_LINES} {shlex.quote(args.log)} 2> /dev/null; true")
  return _gcloud(args, "tpu-vm", "ssh", args.name, "--worker=0", f"--command={script}")


def fetch_commands(args: argparse.Namespace, destination: str) -> list[list[str]]:
  """Copy RESULT_FILES from the run directory to the local `destination`: first all but summary.json (a
  config may not write some; missing ones are skipped), then summary.json, which must be there."""
  run_dir = workdir(args).rstrip("/")
  *rest, summary = RESULT_FILES
  if run_dir.startswith("gs://"):
    return [_storage(args, "cp", "--continue-on-error", *[f"{run_dir}/{f}" for f in rest], destination),
            _storage(args, "cp", f"{run_dir}/{summary}", destination)]
  remote = run_dir if os.path.isabs(run_dir) else f"{REMOTE_HOME_DIR}/{run_dir}"  # on worker 0's disk
  return [_gcloud(args, "tpu-vm", "scp", *[f"{args.name}:{remote}/{f}" for f in rest], destination, "--worker=0"),
          _gcloud(args, "tpu-vm", "scp", f"{args.name}:{remote}/{summary}", destination, "--worker=0")]


def wait_commands(args: argparse.Namespace) -> list[list[str]]:
  """run --wait's command lines in the order they first run: the state query (repeated while waiting), the
  start (only when the run is stopped), the copies back (with --fetch)."""
  return [state_command(args), *run_commands(args), *(fetch_commands(args, args.fetch) if args.fetch else [])]


def delete_commands(args: argparse.Namespace) -> list[list[str]]:
  if args.queued:  # --force deletes the queued resource's node first
    return [_gcloud(args, "queued-resources", "delete", args.name, "--force", "--quiet")]
  return [_gcloud(args, "tpu-vm", "delete", args.name, "--quiet")]


COMMANDS = {"create": create_commands, "setup": setup_commands, "run": run_commands, "delete": delete_commands}


def _run_all(args: argparse.Namespace, commands: list[list[str]]) -> None:
  """Runs `commands` in order, each printed first; the first failure exits with one line."""
  following = args.command == "run" and not args.no_follow and not args.wait
  for i, command in enumerate(commands):
    if following and i == len(commands) - 1:
      print(f"[tpu] started on every worker; following worker 0's {REMOTE_DIR}/{args.log} (Ctrl-C stops "
            "following, the run goes on)", flush=True)
    print(f"+ {shlex.join(command)}", flush=True)
    try:
      code = subprocess.run(command).returncode
    except KeyboardInterrupt:
      if following and i == len(commands) - 1:
        print(f"\n[tpu] stopped following worker 0's log; the run goes on (its output: {REMOTE_DIR}/{args.log} "
              f"on every worker; delete the slice with: python launch/tpu.py delete --name={args.name} "
              f"--zone={args.zone}" + (f" --project={args.project}" if args.project else "") + ")", flush=True)
        return
      raise
    if code != 0:
      sys.exit(f"error: {command[0]} exited with status {code}: {shlex.join(command)[:300]}")


def _state(args: argparse.Namespace) -> tuple[str, list[str]]:
  """The run's state and the last lines of its log, from worker 0; ('unknown', why) when no answer came."""
  out = subprocess.run(state_command(args), capture_output=True, text=True)
  lines = out.stdout.splitlines()
  if out.returncode != 0 or not lines or lines[0] not in STATES:
    why = (out.stderr.strip() or out.stdout.strip() or f"status {out.returncode}").splitlines()
    return "unknown", why[-LOG_TAIL_LINES:]
  return lines[0], lines[1:]


def wait(args: argparse.Namespace) -> None:
  """run --wait: start the run unless it is running or complete, wait until it is complete (exit 0, after
  --fetch) or stopped (exit 1, worker 0's log tail on stderr)."""
  print(f"+ {shlex.join(state_command(args))}", flush=True)
  state, tail = _state(args)
  if state == "unknown":
    sys.exit(f"error: no state of the run from worker 0 of {args.name}: {' / '.join(tail)[-300:]}")
  if state == "running":
    print(f"[tpu] {workdir(args)} is already running on {args.name}; waiting for it", flush=True)
  elif state == "stopped":
    _run_all(args, run_commands(args))
  failures, shown = 0, None
  while state != "complete":
    time.sleep(args.poll_s)
    state, tail = _state(args)
    if state == "unknown":
      failures += 1
      if failures >= MAX_STATE_FAILURES:
        sys.exit(f"error: {failures} state queries of {args.name} unanswered (the run may go on; run the same "
                 f"command again to wait for it): {' / '.join(tail)[-300:]}")
      print(f"[tpu] no state from worker 0 ({failures}/{MAX_STATE_FAILURES}): {' / '.join(tail)[-200:]}",
            flush=True)
      continue
    failures = 0
    last = next((line for line in reversed(tail) if line.strip()), "").split("\r")[-1].strip()
    if state == "running" and last != shown:
      print(f"[tpu] running: {last[-200:]}", flush=True)
      shown = last
    if state == "stopped":
      print(f"[tpu] {workdir(args)} stopped without summary.json; worker 0's {REMOTE_DIR}/{args.log} ends:\n  "
            + "\n  ".join(tail), file=sys.stderr, flush=True)
      sys.exit(1)
  print(f"[tpu] complete: {workdir(args)}/summary.json", flush=True)
  if args.fetch:
    os.makedirs(args.fetch, exist_ok=True)
    rest, summary = fetch_commands(args, args.fetch)
    print(f"+ {shlex.join(rest)}", flush=True)
    subprocess.run(rest)  # its failure is a missing optional file; summary.json's copy decides
    _run_all(args, [summary])


def main(argv: list[str]) -> None:
  args = parse_args(argv)
  waiting = args.command == "run" and args.wait
  commands = wait_commands(args) if waiting else COMMANDS[args.command](args)
  if args.dry_run:
    for command in commands:
      print(shlex.join(command))
    return
  for tool in sorted({c[0] for c in commands}):
    if shutil.which(tool) is None:
      sys.exit(f"error: {tool} not found on PATH" + (
          "; install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install), or print the commands "
          "with --dry_run" if tool == "gcloud" else ""))
  try:
    wait(args) if waiting else _run_all(args, commands)
  finally:
    if args.command == "setup" and os.path.exists(tarball(args)):
      os.remove(tarball(args))


if __name__ == "__main__":
  main(sys.argv[1:])
