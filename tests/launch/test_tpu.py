"""launch/tpu.py: the exact gcloud command lines of a TPU slice's life, --dry_run, and one-line errors.

No test here runs the real gcloud (or git): every subprocess gets a PATH of the test's own making, either
empty or holding fakes that record their arguments.
"""

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from tests.launch import fake_pod

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "launch"))
import tpu  # noqa: E402

SCRIPT = os.path.join(REPO, "launch", "tpu.py")
V5P = ["--name=ej-v5p", "--zone=us-east5-a"]
V6E = ["--name=ej-v6e", "--zone=europe-west4-a", "--project=my-project"]
INSTALL = ("mkdir -p ~/explore_jax && tar -xzf ~/explore_jax.tar.gz -C ~/explore_jax && cd ~/explore_jax"
           " && (test -x .venv/bin/pip || (python3 -m pip install --user --quiet uv && rm -rf .venv"
           " && python3 -m uv venv --seed --python 3.11 .venv))"
           ' && PATH="$PWD/.venv/bin:$PATH" .venv/bin/pip install --quiet -r requirements.txt "jax[tpu]"'
           " && .venv/bin/pip install --quiet --no-deps -e .")


def commands(*argv):
  args = tpu.parse_args(list(argv))
  return tpu.COMMANDS[args.command](args)


def tpu_py(*argv, path="/nonexistent/bin", timeout=60):
  """launch/tpu.py as a user runs it, with PATH set to `path` only (default: nothing on it)."""
  env = {**os.environ, "PATH": path}
  return subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True, timeout=timeout,
                        cwd=REPO, env=env)


def test_v5p_16_slice_commands():
  g = ["gcloud", "compute", "tpus"]
  assert commands("create", *V5P, "--accelerator_type=v5p-16") == [
      g + ["tpu-vm", "create", "ej-v5p", "--zone=us-east5-a", "--accelerator-type=v5p-16",
           "--version=v2-alpha-tpuv5"]]
  assert commands("create", *V5P, "--accelerator_type=v5p-16", "--queued", "--spot") == [
      g + ["queued-resources", "create", "ej-v5p", "--zone=us-east5-a", "--node-id=ej-v5p",
           "--accelerator-type=v5p-16", "--runtime-version=v2-alpha-tpuv5", "--spot"]]
  assert commands("setup", *V5P) == [
      ["git", "-C", REPO, "archive", "--format=tar.gz", "--output=/tmp/explore_jax-ej-v5p.tar.gz", "HEAD"],
      g + ["tpu-vm", "scp", "/tmp/explore_jax-ej-v5p.tar.gz", "ej-v5p:explore_jax.tar.gz", "--zone=us-east5-a",
           "--worker=all"],
      g + ["tpu-vm", "ssh", "ej-v5p", "--zone=us-east5-a", "--worker=all", "--command=" + INSTALL]]
  assert commands("run", *V5P, "--bucket=gs://my-bucket/", "--", "--config.seed=1") == [
      g + ["tpu-vm", "ssh", "ej-v5p", "--zone=us-east5-a", "--worker=all",
           "--command=cd ~/explore_jax && { nohup .venv/bin/python launch/train.py --config=configs/sge_coding.py "
           "--workdir=gs://my-bucket/runs/sge_coding --config.seed=1 > run.log 2>&1 < /dev/null & }"],
      g + ["tpu-vm", "ssh", "ej-v5p", "--zone=us-east5-a", "--worker=0",
           "--command=tail -n +1 -F ~/explore_jax/run.log"]]
  assert commands("delete", *V5P) == [g + ["tpu-vm", "delete", "ej-v5p", "--zone=us-east5-a", "--quiet"]]
  assert commands("delete", *V5P, "--queued") == [
      g + ["queued-resources", "delete", "ej-v5p", "--zone=us-east5-a", "--force", "--quiet"]]


def test_v6e_8_slice_commands():
  g = ["gcloud", "compute", "tpus"]
  project = "--project=my-project"
  assert commands("create", *V6E, "--accelerator_type=v6e-8", "--spot") == [
      g + ["tpu-vm", "create", "ej-v6e", "--zone=europe-west4-a", "--accelerator-type=v6e-8",
           "--version=v2-alpha-tpuv6e", "--spot", project]]
  assert commands("setup", *V6E, "--ref=v0.1") == [
      ["git", "-C", REPO, "archive", "--format=tar.gz", "--output=/tmp/explore_jax-ej-v6e.tar.gz", "v0.1"],
      g + ["tpu-vm", "scp", "/tmp/explore_jax-ej-v6e.tar.gz", "ej-v6e:explore_jax.tar.gz",
           "--zone=europe-west4-a", "--worker=all", project],
      g + ["tpu-vm", "ssh", "ej-v6e", "--zone=europe-west4-a", "--worker=all", "--command=" + INSTALL, project]]
  # One host: a local run directory is fine; the config's variant and the log name pass through.
  assert commands("run", *V6E, "--config=configs/grpo_coding.py:paper", "--workdir=runs/grpo_paper",
                  "--log=grpo.log", "--no_follow") == [
      g + ["tpu-vm", "ssh", "ej-v6e", "--zone=europe-west4-a", "--worker=all",
           "--command=cd ~/explore_jax && { nohup .venv/bin/python launch/train.py "
           "--config=configs/grpo_coding.py:paper --workdir=runs/grpo_paper > grpo.log 2>&1 < /dev/null & }",
           project]]
  assert commands("delete", *V6E) == [
      g + ["tpu-vm", "delete", "ej-v6e", "--zone=europe-west4-a", "--quiet", project]]


@pytest.mark.parametrize("accelerator, runtime", [("v4-32", "tpu-ubuntu2204-base"),
                                                  ("v5litepod-16", "v2-alpha-tpuv5-lite"),
                                                  ("v3-8", "tpu-ubuntu2204-base")])
def test_runtime_version_per_generation(accelerator, runtime):
  (create,) = commands("create", *V5P, f"--accelerator_type={accelerator}")
  assert create[-1] == f"--version={runtime}"
  (create,) = commands("create", *V5P, f"--accelerator_type={accelerator}", "--runtime_version=custom-image")
  assert create[-1] == "--version=custom-image"


def test_dry_run_prints_the_command_lines_and_runs_nothing(tmp_path):
  """With nothing on PATH (no gcloud, no git) every subcommand's --dry_run prints its lines and exits 0."""
  cases = [["create", *V5P, "--accelerator_type=v5p-16"],
           ["create", *V5P, "--accelerator_type=v5p-16", "--queued", "--spot"],
           ["setup", "--name=dry-run-only", "--zone=us-east5-a"],
           ["run", *V5P, "--bucket=my-bucket", "--", "--config.seed=1"],
           ["delete", *V5P], ["delete", *V6E, "--queued"]]
  for argv in cases:
    out = tpu_py(*argv, "--dry_run") if "--" not in argv else tpu_py(*argv[:argv.index("--")], "--dry_run",
                                                                     *argv[argv.index("--"):])
    assert out.returncode == 0 and out.stderr == "", (argv, out.stderr)
    expected = commands(*argv)
    assert out.stdout.splitlines() == [shlex.join(c) for c in expected]
    assert [shlex.split(line) for line in out.stdout.splitlines()] == expected  # pastes back into a shell
  assert not os.path.exists("/tmp/explore_jax-dry-run-only.tar.gz")  # setup's git archive did not run
  create = tpu_py("create", *V5P, "--accelerator_type=v5p-16", "--dry_run")
  assert create.stdout == ("gcloud compute tpus tpu-vm create ej-v5p --zone=us-east5-a --accelerator-type=v5p-16 "
                           "--version=v2-alpha-tpuv5\n")


def test_without_gcloud_on_path_a_one_line_error(tmp_path):
  for argv in (["create", *V5P, "--accelerator_type=v5p-16"], ["setup", *V5P], ["delete", *V5P],
               ["run", *V5P, "--bucket=b"]):
    out = tpu_py(*argv, path=str(tmp_path))
    assert out.returncode != 0 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: gcloud not found on PATH") and "--dry_run" in lines[0]


FAKE = """#!{python}
import json, os, sys
with open({log!r}, "a") as f:
  f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
if os.path.basename(sys.argv[0]) == "git":  # git archive --output=PATH: make the archive
  open(next(a for a in sys.argv if a.startswith("--output="))[len("--output="):], "w").write("tar")
sys.exit(int(os.environ.get("FAKE_STATUS", "0")))
"""


def _fakes(tmp_path):
  """A PATH directory with fake gcloud and git that log their argv to calls.jsonl; returns (path, log)."""
  bin_dir, log = tmp_path / "bin", str(tmp_path / "calls.jsonl")
  bin_dir.mkdir()
  for tool in ("gcloud", "git"):
    (bin_dir / tool).write_text(FAKE.format(python=sys.executable, log=log))
    (bin_dir / tool).chmod(0o755)
  return str(bin_dir), log


def _calls(log):
  return [json.loads(line) for line in open(log)] if os.path.exists(log) else []


def test_without_dry_run_the_same_commands_run_in_order(tmp_path):
  path, log = _fakes(tmp_path)
  for argv in (["create", *V5P, "--accelerator_type=v5p-16", "--queued", "--spot"],
               ["setup", "--name=fake-setup", "--zone=us-east5-a"],
               ["run", *V5P, "--bucket=b", "--", "--config.seed=2"], ["delete", *V5P]):
    os.remove(log) if os.path.exists(log) else None
    out = tpu_py(*argv, path=path)
    assert out.returncode == 0, out.stderr
    assert _calls(log) == commands(*argv)
    assert [line[2:] for line in out.stdout.splitlines() if line.startswith("+ ")] == [
        shlex.join(c) for c in commands(*argv)]
  assert not os.path.exists("/tmp/explore_jax-fake-setup.tar.gz")  # the shipped archive is removed

  os.remove(log)
  failed = subprocess.run([sys.executable, SCRIPT, "setup", "--name=fake-fail", "--zone=us-east5-a"],
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "PATH": path, "FAKE_STATUS": "3"})
  assert failed.returncode != 0 and len(failed.stderr.strip().splitlines()) == 1
  assert failed.stderr.startswith("error: git exited with status 3: git -C")
  assert len(_calls(log)) == 1  # the first failure stops the rest
  assert not os.path.exists("/tmp/explore_jax-fake-fail.tar.gz")  # and its archive is gone too


@pytest.mark.parametrize("argv, message", [
    (["create", *V5P, "--accelerator_type=v9-8"], "unknown --accelerator_type='v9-8'"),
    (["create", *V5P, "--accelerator_type=v5e-8"], "v5e is v5litepod-N"),
    (["create", *V5P, "--accelerator_type=v5p"], "unknown --accelerator_type='v5p'"),
    (["create", "--name=ej", "--accelerator_type=v5p-16"], "the following arguments are required: --zone"),
    (["create", *V5P], "the following arguments are required: --accelerator_type"),
    (["delete", "--zone=us-east5-a", "--zone=us-east5-a"], "required: --name"),
    (["delete", "--name=EJ_1", "--zone=us-east5-a"], "--name='EJ_1' is not a TPU name"),
    (["delete", *V5P, "--zone="], "--zone is empty"),
    (["create", *V5P, "--accelerator_type=v5p-16", "--acc=v4-8"], "unrecognized arguments: --acc=v4-8"),
    (["run", *V5P], "run needs --bucket"),
    (["run", *V5P, "--bucket=b", "--workdir=gs://b/x"], "--bucket or --workdir, not both"),
    (["run", *V5P, "--bucket=b", "--config=configs/nope.py"], "--config='configs/nope.py': no such config"),
    (["run", *V5P, "--bucket=b", "--", "--workdir=gs://b/y"], "give --workdir to tpu.py run"),
    (["run", *V5P, "--bucket=b", "--", "--config", "configs/grpo_coding.py"], "give --config to tpu.py run"),
    (["run", *V5P, "--bucket=b", "--", "--config.seed=1", "--dry_run"], "--dry_run after -- would go to train.py"),
    (["run", *V5P, "--bucket=b", "--fetch=/tmp/x"], "--fetch copies a finished run's files, so it needs --wait"),
    (["run", *V5P, "--bucket=b", "--wait", "--poll_s=0"], "--poll_s=0.0 must be positive"),
    (["delete", *V5P, "--", "--config.seed=1"], "arguments after -- are train.py's, for run only"),
    (["launch", *V5P], "invalid choice: 'launch'"),
])
def test_bad_input_is_a_one_line_error_naming_it(tmp_path, argv, message):
  path, log = _fakes(tmp_path)  # even with a gcloud at hand, nothing runs
  out = tpu_py(*argv, path=path)
  assert out.returncode != 0 and out.stdout == ""
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], out.stderr
  assert _calls(log) == []


def test_train_args_survive_both_shells(tmp_path):
  """The printed line goes through the local shell, its --command through the worker's: a value with spaces
  and quotes reaches train.py intact, the run goes to the background and the remote shell returns at once."""
  odd = "--config.env.kwargs.dataset=/data/my tasks's \"best\" $HOME.jsonl"
  out = tpu_py("run", *V5P, "--bucket=b", "--no_follow", "--dry_run", "--", odd, "--config.seed=7")
  assert out.returncode == 0, out.stderr
  (line,) = out.stdout.splitlines()
  remote = next(a for a in shlex.split(line) if a.startswith("--command="))[len("--command="):]

  # A worker's home: ~/explore_jax with a .venv/bin/python that records its argv, then lingers like a run.
  home = tmp_path / "home"
  venv_bin = home / "explore_jax" / ".venv" / "bin"
  venv_bin.mkdir(parents=True)
  argv_file = tmp_path / "argv.json"
  (venv_bin / "python").write_text(f"#!{sys.executable}\nimport json, sys, time\n"
                                   f"open({str(argv_file)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
                                   "print('training', flush=True)\ntime.sleep(5)\n")
  (venv_bin / "python").chmod(0o755)
  start = time.time()
  shell = subprocess.run(["bash", "-c", remote], capture_output=True, text=True, timeout=30,
                         env={"HOME": str(home), "PATH": "/usr/bin:/bin"})
  assert shell.returncode == 0 and time.time() - start < 4  # nothing held ssh's output open
  for _ in range(100):
    if argv_file.exists() and argv_file.read_text():
      break
    time.sleep(0.05)
  assert json.loads(argv_file.read_text()) == [
      "launch/train.py", "--config=configs/sge_coding.py", "--workdir=gs://b/runs/sge_coding", odd,
      "--config.seed=7"]
  for _ in range(100):
    if (home / "explore_jax" / "run.log").read_text():
      break
    time.sleep(0.05)
  assert (home / "explore_jax" / "run.log").read_text() == "training\n"


def test_install_line_is_one_valid_shell_command():
  assert tpu.INSTALL == INSTALL and "\n" not in INSTALL
  assert subprocess.run(["bash", "-n", "-c", INSTALL]).returncode == 0


# The trainer on the fake slice's worker: waits for FAKE_RELEASE (if set), fails when FAKE_FAIL says so, else
# writes a finished run's files (no summary.md: a config may not write every file the fetch asks for).
TRAINER = """
import os, sys, time
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if "=" in a)
open(os.environ["FAKE_TRAINED"], "a").write(args["workdir"] + "\\n")
while os.environ.get("FAKE_RELEASE") and not os.path.exists(os.environ["FAKE_RELEASE"]):
  time.sleep(0.05)
if os.environ.get("FAKE_FAIL"):
  print("step 1/3", flush=True)
  print("RuntimeError: boom", file=sys.stderr)
  sys.exit(3)
os.makedirs(args["workdir"], exist_ok=True)
for name in ("config.json", "metrics.jsonl", "provenance.json", "summary.json"):
  open(os.path.join(args["workdir"], name), "w").write("{}")
print("step 3/3")
"""


def _slice(tmp_path, **extra):
  (tmp_path / "train.py").write_text(TRAINER)
  env = {**os.environ, **fake_pod.make(tmp_path, str(tmp_path / "train.py")),
         "FAKE_TRAINED": str(tmp_path / "trained.txt"), **extra}
  return env


def _trained(tmp_path):
  path = tmp_path / "trained.txt"
  return path.read_text().splitlines() if path.exists() else []


def test_wait_starts_a_stopped_run_waits_for_it_and_fetches_its_files(tmp_path):
  bucket = f"bucket-{tmp_path.name}".lower().replace("_", "-")  # no other test's run matches this directory
  env = _slice(tmp_path)
  argv = ["run", *V5P, f"--bucket={bucket}", "--wait", f"--fetch={tmp_path / 'here'}", "--poll_s=0.05", "--",
          "--config.seed=3"]
  out = subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True, timeout=60, cwd=REPO,
                       env=env)
  assert out.returncode == 0, out.stdout + out.stderr
  run_dir = f"gs://{bucket}/runs/sge_coding"
  assert _trained(tmp_path) == [str(tmp_path / "gcs" / bucket / "runs" / "sge_coding")]
  state, start, fetch_rest, fetch_summary = tpu.wait_commands(tpu.parse_args(argv))
  calls = fake_pod.calls(env)
  # Asked first, started because it was stopped, asked until complete, then the files, summary.json last.
  assert calls[0] == state[1:] and calls[1] == start[1:] and calls[-2:] == [fetch_rest[1:], fetch_summary[1:]]
  assert "--config.seed=3" in start[-1] and f"--workdir={run_dir}" in start[-1]
  assert all(c == state[1:] for c in calls[2:-2])
  assert set(map(tuple, fake_pod.calls(env, "worker"))) == {("storage", "ls", f"{run_dir}/summary.json")}
  assert sorted(os.listdir(tmp_path / "here")) == ["config.json", "metrics.jsonl", "provenance.json", "summary.json"]
  assert f"[tpu] complete: {run_dir}/summary.json" in out.stdout

  # The same command again: complete on the slice, so nothing starts; the files are fetched again.
  os.remove(env["FAKE_CALLS"])
  again = subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True, timeout=60, cwd=REPO,
                         env=env)
  assert again.returncode == 0, again.stderr
  assert len(_trained(tmp_path)) == 1 and start[1:] not in fake_pod.calls(env)


def test_wait_joins_a_running_run_and_reports_one_that_stopped(tmp_path):
  release = tmp_path / "release"
  env = _slice(tmp_path, FAKE_RELEASE=str(release))
  workdir = f"sweeps/{tmp_path.name}/run"  # on worker 0's disk: state by test -f, files back by scp
  base = ["run", *V5P, f"--workdir={workdir}", "--log=t.log"]
  started = subprocess.run([sys.executable, SCRIPT, *base, "--no_follow"], capture_output=True, text=True,
                           timeout=60, cwd=REPO, env=env)
  assert started.returncode == 0, started.stderr
  waiting = subprocess.Popen([sys.executable, SCRIPT, *base, "--wait", f"--fetch={tmp_path / 'here'}",
                              "--poll_s=0.05"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                             env=env)
  try:
    first = [waiting.stdout.readline() for _ in range(2)]
    assert "is already running on ej-v5p; waiting for it" in first[1], first
    release.write_text("")
    out, err = waiting.communicate(timeout=60)
  finally:
    waiting.kill()
  assert waiting.returncode == 0, out + err
  assert len(_trained(tmp_path)) == 1  # started once, by the first command
  assert sorted(os.listdir(tmp_path / "here")) == ["config.json", "metrics.jsonl", "provenance.json", "summary.json"]
  assert fake_pod.calls(env)[-1] == tpu.fetch_commands(tpu.parse_args([*base, "--wait"]), str(tmp_path / "here"))[
      -1][1:]

  # A run that dies: --wait exits non-zero with the tail of worker 0's log.
  failing = subprocess.run([sys.executable, SCRIPT, "run", *V5P, f"--workdir={workdir}-fails", "--log=f.log",
                            "--wait", "--poll_s=0.05"], capture_output=True, text=True, timeout=60, cwd=REPO,
                           env={**env, "FAKE_FAIL": "1"})
  assert failing.returncode == 1
  assert "stopped without summary.json" in failing.stderr and "RuntimeError: boom" in failing.stderr
  assert "step 1/3" in failing.stderr


def test_wait_dry_run_prints_the_state_query_start_and_fetch(tmp_path):
  argv = ["run", *V6E, "--bucket=b", "--wait", "--fetch=out/run", "--dry_run", "--", "--config.seed=1"]
  out = tpu_py(*argv)
  assert out.returncode == 0 and out.stderr == "", out.stderr
  state, start, rest, summary = [shlex.split(line) for line in out.stdout.splitlines()]
  g = ["gcloud", "compute", "tpus", "tpu-vm"]
  assert state[:8] == g + ["ssh", "ej-v6e", "--zone=europe-west4-a", "--worker=0"]
  script = state[8][len("--command="):]
  assert "gcloud storage ls gs://b/runs/sge_coding/summary.json" in script and "pgrep -f" in script
  assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0
  assert start == commands("run", *V6E, "--bucket=b", "--no_follow", "--", "--config.seed=1")[0]
  assert rest == ["gcloud", "storage", "cp", "--continue-on-error", "gs://b/runs/sge_coding/config.json",
                  "gs://b/runs/sge_coding/metrics.jsonl", "gs://b/runs/sge_coding/summary.md",
                  "gs://b/runs/sge_coding/provenance.json", "out/run", "--project=my-project"]
  assert summary == ["gcloud", "storage", "cp", "gs://b/runs/sge_coding/summary.json", "out/run",
                     "--project=my-project"]
