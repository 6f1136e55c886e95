"""launch/sweep.py: a protocol's plan, and resumable sweeps with a fake trainer (no test here trains)."""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from configs.protocols import sge_coding as sge_protocol
from explore_jax.train import provenance
from tests.launch import fake_pod
from tests.launch.sweep_helpers import REPO, sweep, write_sweep_file
from tests.polling import wait_until

sys.path.insert(0, os.path.join(REPO, "launch"))
import sweep as sweep_py  # noqa: E402
import sweep_records  # noqa: E402
import tpu  # noqa: E402

# Stands in for launch/train.py: logs its argv, resumes "checkpoints", fails where FAKE_FAIL says, else writes
# what a finished run has (config.json with method "sge" for every arm, metrics.jsonl, summary.json).
FAKE_TRAINER = textwrap.dedent("""
    import json, os, sys
    args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
    workdir = args["workdir"]
    with open(os.environ["FAKE_LOG"], "a") as f:
      f.write(json.dumps({"workdir": workdir, "argv": sys.argv[1:],
                          "resumed": os.path.isdir(os.path.join(workdir, "checkpoints"))}) + "\\n")
    if workdir.endswith(os.environ.get("FAKE_FAIL") or "<none>"):
      print("Traceback (most recent call last):\\nRuntimeError: boom in " + workdir, file=sys.stderr)
      sys.exit(3)
    os.makedirs(workdir, exist_ok=True)
    p1 = 0.5 + 0.1 * int(args["config.seed"])
    sft_steps = args.get("config.sft.steps")  # a warm start's SFT input: other steps, other warm start bits
    json.dump({"method": "sge", "sft": {"steps": sft_steps}}, open(os.path.join(workdir, "config.json"), "w"))
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      f.write(json.dumps({"iteration": 1, "success_rate": p1, "eval/success_rate": p1}) + "\\n")
    entry = {"pass_at_k": {str(k): p1 for k in (1, 2, 4, 8, 16)}, "tasks_solved_at_least_once": 3,
             "distinct_outcomes_per_task": 1.0}
    json.dump({"trained / train": entry}, open(os.path.join(workdir, "summary.json"), "w"))
    machine = os.path.basename(os.path.dirname(os.path.dirname(workdir)))  # root/<machine>/<arm>/<run>
    hook = "-tips" if "config.rollout.final_max_new_tokens" in args else ""  # a stand-in for a method's own hook
    inputs = args.get("config.sft.seed", "0") + (f"-sft{sft_steps}" if sft_steps else "") + hook  # of its warm start
    digest = os.environ.get("FAKE_DIGEST") or machine + "-ws" + inputs
    warm = {"warm_start": "k" + inputs} if os.environ.get("FAKE_RECORD_KEY") else {}
    if os.environ.get("FAKE_WARM_START_CACHE"):  # SFT warm starts cached as train/warm_start.py does, by key
      key = "k" + args.get("config.sft.seed", "0")
      params = os.path.join(os.environ["EXPLORE_JAX_CACHE"], "sft", key, "0", "params")
      evaluation = os.path.join(os.environ["EXPLORE_JAX_CACHE"], "sft", key + ".pass_at_k", "e.json")
      reused, evaluated = os.path.exists(params), os.path.exists(evaluation)
      if not reused:
        os.makedirs(os.path.dirname(params))
        open(params, "w").write(digest)
      if not evaluated:
        os.makedirs(os.path.dirname(evaluation), exist_ok=True)
        open(evaluation, "w").write("pass@k of " + open(params).read())
      digest, warm = open(params).read(), {"warm_start": key}
      with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(json.dumps({"workdir": workdir, "warm_start_reused": reused, "evaluated": evaluated}) + "\\n")
    json.dump({"start_digest": digest, "machines": [], **warm},
              open(os.path.join(workdir, "provenance.json"), "w"))
""")

PROTOCOL = textwrap.dedent("""
    def get_protocol():
      return {"arms": [{"name": "a", "config": "configs/sge_coding.py", "overrides": []},
                       {"name": "b", "config": "configs/sge_coding.py", "overrides": ["--config.sge.p_failure=0"]}],
              "seeds": 2, "warm_starts": WARM_STARTS, "overrides": ["--config.train.num_iterations=3"]}
""")


def _fixture(tmp_path, warm_starts=1):
  (tmp_path / "protocol.py").write_text(f"WARM_STARTS = {warm_starts}\n" + PROTOCOL)
  (tmp_path / "fake_train.py").write_text(FAKE_TRAINER)
  return str(tmp_path / "protocol.py"), f"--train_script={tmp_path / 'fake_train.py'}"


def _launched(log):
  return [json.loads(line) for line in open(log)] if os.path.exists(log) else []


def test_dry_run_plans_the_sge_protocol_interleaved(tmp_path):
  root = tmp_path / "root"
  os.makedirs(root / "m1" / "sge" / "ws0_seed0")
  (root / "m1" / "sge" / "ws0_seed0" / "summary.json").write_text("{}")
  os.makedirs(root / "m1" / "grpo" / "ws0_seed0" / "checkpoints" / "8")
  out = sweep("--protocol=configs/protocols/sge_coding.py", f"--root={root}", "--dry_run", "--machine=m1")
  assert out.returncode == 0, out.stderr[-2000:]
  lines = [line.split() for line in out.stdout.splitlines() if "launch/train.py" in line]
  arms = ["sge", "grpo", "sge_no_mixed_temperature", "sge_no_negative_reflection", "sge_no_positive_reflection",
          "sge_small", "grpo_small"]
  seeds, warm_starts = sge_protocol.SEEDS, sge_protocol.WARM_STARTS
  assert warm_starts >= 2 and seeds * warm_starts >= 4  # the permutation test needs 4 runs per arm to reach 0.05
  assert len(lines) == len(arms) * warm_starts * seeds
  workdirs = [next(a for a in line if a.startswith("--workdir=")) for line in lines]
  # seed-major, then warm start, then arm: partial results stay balanced across arms.
  expected = [f"--workdir={root}/m1/{arm}/ws{ws}_seed{seed}" for seed in range(seeds) for ws in range(warm_starts)
              for arm in arms]
  assert workdirs == expected
  assert lines[0][0] == "complete" and lines[1][:3] == ["partial", "(checkpoint", "8)"] and lines[2][0] == "pending"
  sge_ws1_seed0 = lines[len(arms)]
  assert "--config=configs/sge_coding.py" in sge_ws1_seed0 and "--config.seed=0" in sge_ws1_seed0
  assert "--config.sft.seed=1" in sge_ws1_seed0 and "--config.train.num_iterations=16" in sge_ws1_seed0
  assert "--config=configs/grpo_coding.py" in lines[1]
  assert lines[2][-1] == "--config.sge.strategy_temperature=0.7"
  assert lines[3][-1] == "--config.sge.p_failure=0" and lines[4][-1] == "--config.sge.p_success=0"
  assert "--config=configs/sge_coding.py:small" in lines[5] and "--config=configs/grpo_coding.py:small" in lines[6]
  pending = len(arms) * warm_starts * seeds - 2
  assert "1 complete" in out.stdout and "1 partial" in out.stdout and f"{pending} pending" in out.stdout
  assert sorted(os.listdir(root)) == ["m1"] and sorted(os.listdir(root / "m1")) == ["grpo", "sge"]  # creates nothing

  # The default machine is this one's provenance tag: the runs made under "m1" are another machine's.
  here = sweep("--protocol=configs/protocols/sge_coding.py", f"--root={root}", "--dry_run")
  assert here.returncode == 0 and f"on machine {provenance.machine_tag()}" in here.stdout
  assert f"{len(arms) * warm_starts * seeds} pending" in here.stdout

  only = sweep("--protocol=configs/protocols/sge_coding.py", f"--root={root}", "--dry_run", "--only=grpo,sge")
  assert only.returncode == 0
  assert sum("launch/train.py" in line for line in only.stdout.splitlines()) == 2 * warm_starts * seeds
  bad = sweep("--protocol=configs/protocols/sge_coding.py", f"--root={root}", "--dry_run", "--only=sgd")
  assert bad.returncode != 0 and "unknown arm 'sgd'" in bad.stderr


def test_sweep_skips_complete_resumes_partial_reports_failures_and_continues(tmp_path):
  protocol, train_script = _fixture(tmp_path)
  root, log = tmp_path / "root", str(tmp_path / "launched.jsonl")
  runs_dir = root / "m1"
  # a/ws0_seed0 is complete (made by the fake trainer itself); b/ws0_seed0 was interrupted after a checkpoint.
  subprocess.run([sys.executable, str(tmp_path / "fake_train.py"), f"--workdir={runs_dir / 'a' / 'ws0_seed0'}",
                  "--config.seed=0"], check=True, env={**os.environ, "FAKE_LOG": str(tmp_path / "setup.jsonl")})
  os.makedirs(runs_dir / "b" / "ws0_seed0" / "checkpoints" / "2")

  env = {"FAKE_LOG": log, "FAKE_FAIL": "a/ws0_seed1"}
  first = sweep(f"--protocol={protocol}", f"--root={root}", train_script, "--max_runs=2", "--machine=m1", env=env)
  assert first.returncode != 0  # a run failed
  runs = _launched(log)
  assert [r["workdir"] for r in runs] == [str(runs_dir / "b" / "ws0_seed0"), str(runs_dir / "a" / "ws0_seed1")]
  assert runs[0]["resumed"] and "--config.sge.p_failure=0" in runs[0]["argv"]
  assert {"--config.seed=1", "--config.sft.seed=0", "--config.train.num_iterations=3"} <= set(runs[1]["argv"])
  assert "FAILED (3)" in first.stdout and "RuntimeError: boom in" in first.stdout  # the stderr tail
  assert "launched 2, failed 1, 2 of 4 complete" in first.stdout
  assert "boom" in (runs_dir / "a" / "ws0_seed1" / "sweep_stderr.log").read_text()

  # The same command again (the failure fixed): the failed run and the last one, nothing complete again.
  second = sweep(f"--protocol={protocol}", f"--root={root}", train_script, "--machine=m1",
                 env={"FAKE_LOG": log, "FAKE_FAIL": ""})
  assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
  assert [r["workdir"] for r in _launched(log)[2:]] == [str(runs_dir / "a" / "ws0_seed1"),
                                                       str(runs_dir / "b" / "ws0_seed1")]
  assert "4 of 4 complete" in second.stdout
  # Every config says method "sge"; compare groups by arm (0.5 and 0.6 for seeds 0 and 1 of each arm).
  table = (root / "compare" / "compare.md").read_text()
  assert "| a | trained / train | 2 | 0.550 ± 0.071 |" in table
  assert "| b | trained / train | 2 | 0.550 ± 0.071 |" in table

  record = tmp_path / "record"
  third = sweep(f"--protocol={protocol}", f"--root={root}", train_script, f"--record={record}", "--machine=m1",
                env={"FAKE_LOG": log})
  assert third.returncode == 0 and len(_launched(log)) == 4 and "launched 0" in third.stdout
  # --record: the small files of every complete run and the comparison, nothing else (no checkpoints).
  assert "recorded 4 complete runs" in third.stdout
  assert sorted(os.listdir(record / "m1" / "b" / "ws0_seed0")) == ["config.json", "metrics.jsonl", "provenance.json",
                                                                   "summary.json"]
  assert (record / "compare" / "compare.md").read_text() == table
  assert sorted(os.listdir(record)) == ["compare", "m1"]


def test_recorded_runs_resume_a_fresh_clone_and_other_machines_are_compared_not_reused(tmp_path):
  protocol, train_script = _fixture(tmp_path)
  log, record = str(tmp_path / "launched.jsonl"), tmp_path / "record"
  # Machine m1 finished 3 of its 4 runs and recorded them; machine m2 finished all 4. Both roots are gone.
  for machine, done in (("m1", 3), ("m2", 4)):
    out = sweep(f"--protocol={protocol}", f"--root={tmp_path / machine}", train_script, f"--record={record}",
                f"--machine={machine}", f"--max_runs={done}", env={"FAKE_LOG": str(tmp_path / f"{machine}.jsonl")})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    shutil.rmtree(tmp_path / machine)
  assert sorted(os.listdir(record)) == ["compare", "m1", "m2"]
  # A run of a warm start and seed the protocol no longer plans (an earlier design) still counts.
  shutil.copytree(record / "m2" / "a" / "ws0_seed0", record / "m2" / "a" / "ws3_seed7")

  # A fresh clone on m1: the one run m1 lacks is launched; m2's runs are not m1's, but they are compared.
  fresh = tmp_path / "fresh"
  out = sweep(f"--protocol={protocol}", f"--root={fresh}", train_script, f"--record={record}", "--machine=m1",
              env={"FAKE_LOG": log})
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert "3 runs of this machine recorded" in out.stdout and "4 of 4 complete" in out.stdout
  assert [os.path.relpath(r["workdir"], fresh) for r in _launched(log)] == ["m1/b/ws0_seed1"]
  table = (record / "compare" / "compare.md").read_text()
  assert "| a | trained / train | 5 | 0.540 ± 0.055 |" in table  # seeds 0 and 1 on each machine, and ws3_seed7
  assert "a on m1: 2, a on m2: 3" in out.stdout
  # A machine with no runs yet launches all of its own.
  other = sweep(f"--protocol={protocol}", f"--root={fresh}", train_script, f"--record={record}", "--machine=m3",
                "--dry_run")
  assert other.returncode == 0 and "4 pending" in other.stdout


def test_max_runs_and_only(tmp_path):
  protocol, train_script = _fixture(tmp_path, warm_starts=2)
  root, log = tmp_path / "root", str(tmp_path / "launched.jsonl")
  out = sweep(f"--protocol={protocol}", f"--root={root}", train_script, "--max_runs=3", "--machine=m1",
              env={"FAKE_LOG": log})
  assert out.returncode == 0, out.stderr[-3000:]
  assert [os.path.relpath(r["workdir"], root / "m1") for r in _launched(log)] == ["a/ws0_seed0", "b/ws0_seed0",
                                                                                  "a/ws1_seed0"]
  assert "5 to go" in out.stdout
  out = sweep(f"--protocol={protocol}", f"--root={root}", train_script, "--only=b", "--max_runs=1", "--machine=m1",
              env={"FAKE_LOG": log})
  assert out.returncode == 0 and os.path.relpath(_launched(log)[-1]["workdir"], root / "m1") == "b/ws1_seed0"
  assert len(_launched(log)) == 4


def test_a_machine_computing_other_warm_starts_cannot_join_a_machine_name(tmp_path):
  protocol, train_script = _fixture(tmp_path)
  record, log = tmp_path / "record", str(tmp_path / "launched.jsonl")
  out = sweep(f"--protocol={protocol}", f"--root={tmp_path / 'm1'}", train_script, f"--record={record}",
              "--machine=m1", "--max_runs=1", env={"FAKE_LOG": log})
  assert out.returncode == 0, out.stderr[-3000:]
  # Another machine run as "m1" whose warm start 0 has other bits: its first run stops the sweep, unrecorded.
  root = tmp_path / "other"
  out = sweep(f"--protocol={protocol}", f"--root={root}", train_script, f"--record={record}", "--machine=m1",
              env={"FAKE_LOG": log, "FAKE_DIGEST": "other-bits"})
  assert out.returncode != 0
  assert "started warm start 0 from parameters other-bits" in out.stderr and "m1-ws0" in out.stderr
  assert len(_launched(log)) == 2 and os.path.isdir(root / "m1" / "b" / "ws0_seed0.mismatch")
  assert not (root / "m1" / "b" / "ws0_seed0").exists() and not (record / "m1" / "b").exists()
  # The same bits under the same name are fine.
  out = sweep(f"--protocol={protocol}", f"--root={root}", train_script, f"--record={record}", "--machine=m1",
              env={"FAKE_LOG": log})
  assert out.returncode == 0 and "4 of 4 complete" in out.stdout, out.stderr[-3000:]


# --- Sweeps made from product / zip override grids; --parallel; --tpu ---------------------------------------


GRID = {"config": "configs/sge_coding.py", "product": {"config.sge.p_failure": [0, 0.25]}, "seeds": 2,
        "overrides": ["--config.train.num_iterations=3"]}


def test_a_sweep_of_two_overrides_by_two_seeds_runs_and_compares(tmp_path):
  grid = write_sweep_file(tmp_path, GRID)
  (tmp_path / "fake_train.py").write_text(FAKE_TRAINER)
  root, log = tmp_path / "root", str(tmp_path / "launched.jsonl")
  out = sweep(f"--sweep={grid}", f"--root={root}", f"--train_script={tmp_path / 'fake_train.py'}", "--machine=m1",
              env={"FAKE_LOG": log})
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  runs = _launched(log)
  assert [os.path.relpath(r["workdir"], root / "m1") for r in runs] == [
      "p_failure=0/ws0_seed0", "p_failure=0.25/ws0_seed0", "p_failure=0/ws0_seed1", "p_failure=0.25/ws0_seed1"]
  assert "--config.sge.p_failure=0.25" in runs[1]["argv"] and "--config.seed=1" in runs[3]["argv"]
  table = (root / "compare" / "compare.md").read_text()
  assert "| p_failure=0 | trained / train | 2 | 0.550 ± 0.071 |" in table
  assert "| p_failure=0.25 | trained / train | 2 | 0.550 ± 0.071 |" in table
  assert "4 of 4 complete" in out.stdout


# The fake trainer, with what --parallel needs proved: a fake SFT cache (the first run of a warm start
# "computes" it, logging whether another run was computing the same one), a checkpoint as a real run has once
# its warm start is done, then, with FAKE_BARRIER, a wait until another run has arrived there too.
FAIL_CHECK = 'if workdir.endswith(os.environ.get("FAKE_FAIL") or "<none>"):'
PARALLEL_TRAINER = FAKE_TRAINER.replace(FAIL_CHECK, textwrap.dedent("""
    import glob, time
    scratch, ws = os.environ["FAKE_SCRATCH"], args["config.sft.seed"]
    computing = glob.glob(os.path.join(scratch, f"computing_ws{ws}_*"))
    if not os.path.exists(os.path.join(scratch, f"cached_ws{ws}")):
      marker = os.path.join(scratch, f"computing_ws{ws}_" + os.path.basename(os.path.dirname(workdir)))
      open(marker, "w").close()
      time.sleep(0.5)
      open(os.path.join(scratch, f"cached_ws{ws}"), "w").close()
      os.remove(marker)
    os.makedirs(os.path.join(workdir, "checkpoints", "0"), exist_ok=True)
    with open(os.environ["FAKE_LOG"], "a") as f:
      f.write(json.dumps({"workdir": workdir, "computing_beside": computing,
                          "mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")}) + "\\n")
    if os.environ.get("FAKE_BARRIER"):
      open(os.path.join(scratch, "arrived_" + workdir.replace(os.sep, "_")), "w").close()
      deadline = time.time() + 60
      while len(glob.glob(os.path.join(scratch, "arrived_*"))) < 2:
        if time.time() > deadline:
          sys.exit("no other run arrived: the runs did not overlap")
        time.sleep(0.05)
    print("stdout of " + workdir)
    """) + FAIL_CHECK)
assert PARALLEL_TRAINER != FAKE_TRAINER


def test_parallel_runs_overlap_hold_back_a_warm_start_being_computed_and_resume(tmp_path):
  grid = write_sweep_file(tmp_path, {**GRID, "warm_starts": 2})
  (tmp_path / "fake_train.py").write_text(PARALLEL_TRAINER)
  (tmp_path / "scratch").mkdir()
  root, log = tmp_path / "root", str(tmp_path / "launched.jsonl")
  common = [f"--sweep={grid}", f"--root={root}", f"--train_script={tmp_path / 'fake_train.py'}", "--machine=m1",
            "--parallel=2"]
  env = {"FAKE_LOG": log, "FAKE_SCRATCH": str(tmp_path / "scratch")}
  # The first two runs must be going at once: each waits at the barrier for the other (a serial sweep fails).
  # They are p_failure=0 on warm starts 0 and 1: p_failure=0.25 on warm start 0 waits while warm start 0 is
  # computed by another arm's run.
  first = sweep(*common, "--max_runs=2", env={**env, "FAKE_BARRIER": "1"})
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  started = [r for r in _launched(log) if "computing_beside" in r]
  assert sorted(os.path.relpath(r["workdir"], root / "m1") for r in started) == ["p_failure=0/ws0_seed0",
                                                                                 "p_failure=0/ws1_seed0"]
  assert all(r["computing_beside"] == [] for r in started)  # never two runs computing one warm start
  # Each of the two gets its share of a GPU's memory (here 0.45, unless this environment chose otherwise).
  assert {r["mem_fraction"] for r in started} == {sweep_py.run_environment(2).get("XLA_PYTHON_CLIENT_MEM_FRACTION")}
  assert "launched 2, failed 0, 2 of 8 complete" in first.stdout
  run_dir = root / "m1" / "p_failure=0" / "ws0_seed0"
  assert "stdout of" in (run_dir / "sweep_stdout.log").read_text()  # each run's output in its own logs
  assert "stdout of" not in first.stdout
  assert "| p_failure=0 | trained / train | 2 |" in (root / "compare" / "compare.md").read_text()

  # Again: the six others, finished ones not redone (one fails, the rest go on); then the failed one alone.
  second = sweep(*common, env={**env, "FAKE_FAIL": "p_failure=0.25/ws1_seed1"})
  assert second.returncode != 0 and "FAILED (3)" in second.stdout and "RuntimeError: boom" in second.stdout
  every = {f"{arm}/ws{ws}_seed{seed}" for arm in ("p_failure=0", "p_failure=0.25") for ws in (0, 1) for seed in (0, 1)}
  assert sorted(os.path.relpath(r["workdir"], root / "m1") for r in _launched(log)[4:] if "argv" in r) == sorted(
      every - {"p_failure=0/ws0_seed0", "p_failure=0/ws1_seed0"})
  assert "launched 6, failed 1, 7 of 8 complete" in second.stdout
  third = sweep(*common, env=env)
  assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
  assert [os.path.relpath(r["workdir"], root / "m1") for r in _launched(log)[16:] if "argv" in r] == [
      "p_failure=0.25/ws1_seed1"]
  assert "launched 1, failed 0, 8 of 8 complete" in third.stdout
  assert "| p_failure=0.25 | trained / train | 4 |" in (root / "compare" / "compare.md").read_text()


def test_runs_side_by_side_share_a_gpu_unless_the_environment_says_how_jax_allocates():
  clean = {"PATH": "/bin"}
  assert sweep_py.run_environment(1, clean) == clean  # one run at a time: JAX's own default
  assert sweep_py.run_environment(2, clean) == {**clean, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.450"}
  assert sweep_py.run_environment(3, clean)["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.300"
  for name, value in (("XLA_PYTHON_CLIENT_MEM_FRACTION", ".2"), ("XLA_CLIENT_MEM_FRACTION", ".2"),
                      ("XLA_PYTHON_CLIENT_PREALLOCATE", "false"), ("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")):
    assert sweep_py.run_environment(3, {**clean, name: value}) == {**clean, name: value}


# A run that never ends by itself; on SIGTERM it either "saves" once every run going has had a SIGTERM too
# (a sweep that stopped its runs one after another would leave it waiting) and exits 143, or ignores it.
STOPPING_TRAINER = textwrap.dedent("""
    import os, signal, sys, time
    args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
    scratch = os.environ["FAKE_SCRATCH"]
    name = os.path.join(scratch, args["workdir"].replace(os.sep, "_"))
    def save_and_leave(*_):
      open(name + ".term", "w").close()
      while len([f for f in os.listdir(scratch) if f.endswith(".term")]) < 2:
        time.sleep(0.05)
      open(name + ".saved", "w").close()
      sys.exit(143)
    signal.signal(signal.SIGTERM, save_and_leave if os.environ["FAKE_ON_SIGTERM"] == "save" else signal.SIG_IGN)
    open(name + ".started", "w").write(str(os.getpid()))
    while True:
      time.sleep(0.05)
""")


@pytest.mark.parametrize("on_sigterm", ["save", "ignore"])
def test_a_sweep_taken_down_asks_its_runs_to_stop_at_once_and_kills_those_that_do_not(tmp_path, on_sigterm):
  grid = write_sweep_file(tmp_path, {**GRID, "warm_starts": 2})  # two runs may go at once (other warm starts)
  (tmp_path / "stopping_train.py").write_text(STOPPING_TRAINER)
  scratch = tmp_path / "scratch"
  scratch.mkdir()
  grace = 600 if on_sigterm == "save" else 1  # the polite runs take no time; the others are killed after it
  proc = subprocess.Popen([sys.executable, os.path.join(REPO, "launch", "sweep.py"), f"--sweep={grid}",
                           f"--root={tmp_path / 'root'}", f"--train_script={tmp_path / 'stopping_train.py'}",
                           "--machine=m1", "--parallel=2", f"--stop_grace_s={grace}"],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "FAKE_SCRATCH": str(scratch), "FAKE_ON_SIGTERM": on_sigterm})
  # A run's file is created before its pid is written into it: only a file with its pid counts as started.
  started = lambda: sorted(p for p in scratch.glob("*.started") if p.read_text().strip())
  assert wait_until(lambda: len(started()) == 2 or proc.poll() is not None, timeout_s=120) and proc.poll() is None, \
      proc.communicate()[1][-3000:]
  pids = [int(p.read_text()) for p in started()]
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 143, out[-3000:] + err[-3000:]
  assert len(list(scratch.glob("*.saved"))) == (2 if on_sigterm == "save" else 0)
  for pid in pids:  # no run outlives the sweep
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)


def test_may_start_keeps_one_run_per_warm_start_until_its_sft_inputs_have_it_cached(tmp_path):
  overrides = {"a": [], "b": ["--config.sft.steps=5"],
               "c": ["--config.optimizer.learning_rate=4e-4", "--config.sft.checkpoint_every=10"]}

  def run(arm, ws, seed):
    return sweep_records.Run(arm, ws, seed, str(tmp_path / arm / f"ws{ws}_seed{seed}"),
                        ["python", "launch/train.py", "--config=configs/x.py", f"--config.seed={seed}",
                         f"--config.sft.seed={ws}", *overrides[arm]])

  runs = [run(arm, ws, seed) for seed in (0, 1) for ws in (0, 1) for arm in ("a", "b")]
  a00, b00, a10, b10, a01, b01, a11, b11 = runs  # arm, warm start, seed
  assert sweep_py.may_start(b00, [a00], runs) is False  # warm start 0 may be computing for arm a
  assert sweep_py.may_start(a10, [a00], runs) and sweep_py.may_start(b10, [a00], runs)  # other warm starts
  assert sweep_py.may_start(a01, [a00], runs) is False
  os.makedirs(os.path.join(a00.workdir, "checkpoints", "0"))  # arm a got past warm start 0: it is cached
  assert sweep_py.may_start(a01, [a00], runs) and sweep_py.may_start(a01, [a00, b00], runs)
  assert sweep_py.may_start(b00, [a00], runs) is False  # arm b's SFT differs: not cached
  assert sweep_py.may_start(b00, [a10], runs)
  # An arm that differs from a only in an RL knob (and how often the SFT saves) shares a's warm start.
  c00, c10 = run("c", 0, 0), run("c", 1, 0)
  assert sweep_records.warm_start_args(c00) == sweep_records.warm_start_args(a00) != sweep_records.warm_start_args(b00)
  assert sweep_py.may_start(c00, [a00], [*runs, c00])
  assert sweep_py.may_start(c10, [a10], [*runs, c10]) is False  # warm start 1: no run has it yet


def test_tpu_dry_run_prints_the_tpu_run_command_of_every_run(tmp_path):
  grid = write_sweep_file(tmp_path, GRID)
  root = tmp_path / "grid_root"
  out = sweep(f"--sweep={grid}", f"--root={root}", "--tpu=ej", "--zone=us-east5-a", "--bucket=my-bucket", "--dry_run")
  assert out.returncode == 0, out.stderr[-2000:]
  assert "on machine ej" in out.stdout and "on TPU ej through launch/tpu.py run --wait" in out.stdout
  lines = [shlex.split(line) for line in out.stdout.splitlines() if "python launch/tpu.py" in line]
  assert len(lines) == 4 and all(line[:3] == ["pending", "python", "launch/tpu.py"] for line in lines)
  arm, run = "p_failure=0.25", "ws0_seed1"
  assert lines[3][3:] == [
      "run", "--name=ej", "--zone=us-east5-a", "--config=configs/sge_coding.py",
      f"--workdir=gs://my-bucket/sweeps/grid_root/ej/{arm}/{run}", f"--log=grid_root.ej.{arm}.{run}.log", "--wait",
      f"--fetch={root}/ej/{arm}/{run}", "--poll_s=60", "--", "--config.seed=1", "--config.sft.seed=0",
      "--config.train.num_iterations=3", "--config.sge.p_failure=0.25"]
  # Each line is launch/tpu.py's own: it parses there, and its start command trains with the run's overrides.
  start = tpu.wait_commands(tpu.parse_args(lines[3][3:]))[1]
  assert start[-1].endswith(f"--workdir=gs://my-bucket/sweeps/grid_root/ej/{arm}/{run} --config.seed=1 "
                            f"--config.sft.seed=0 --config.train.num_iterations=3 --config.sge.p_failure=0.25 > "
                            f"grid_root.ej.{arm}.{run}.log 2>&1 < /dev/null & }}")
  # Without a bucket the run directory is on worker 0's disk; --machine names the slice's runs.
  out = sweep(f"--sweep={grid}", f"--root={root}", "--tpu=ej", "--zone=z", "--machine=v5p-8", "--dry_run")
  assert out.returncode == 0 and f"--workdir=sweeps/grid_root/v5p-8/{arm}/{run}" in out.stdout
  for flags, message in ((["--tpu=ej"], "--tpu needs --zone"), (["--zone=z"], "--zone is for runs on a slice"),
                         (["--tpu=ej", "--zone=z", "--parallel=2"], "a slice runs one run of the sweep at a time"),
                         (["--tpu=EJ", "--zone=z"], "--name='EJ' is not a TPU name")):
    bad = sweep(f"--sweep={grid}", f"--root={root}", *flags, "--dry_run")
    assert bad.returncode != 0 and message in bad.stderr, (flags, bad.stderr)


def test_a_tpu_sweep_runs_on_a_fake_slice_and_resumes_from_it(tmp_path):
  grid = write_sweep_file(tmp_path, {**GRID, "seeds": 1})
  (tmp_path / "fake_train.py").write_text(FAKE_TRAINER)
  bucket = f"bucket-{tmp_path.name}".lower().replace("_", "-")
  env = {**fake_pod.make(tmp_path, str(tmp_path / "fake_train.py")), "FAKE_LOG": str(tmp_path / "trained.jsonl")}
  root = tmp_path / "root"
  command = [f"--sweep={grid}", f"--root={root}", "--tpu=ej", "--zone=z", f"--bucket={bucket}", "--poll_s=0.05",
             "--machine=m1"]
  out = sweep(*command, env=env)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  pod = tmp_path / "gcs" / bucket / "sweeps" / "root" / "m1"
  assert [r["workdir"] for r in _launched(env["FAKE_LOG"])] == [str(pod / "p_failure=0" / "ws0_seed0"),
                                                                str(pod / "p_failure=0.25" / "ws0_seed0")]
  here = root / "m1" / "p_failure=0.25" / "ws0_seed0"  # the run's small files, copied back; its log
  assert {"config.json", "metrics.jsonl", "provenance.json", "summary.json", "sweep_stderr.log"} <= set(
      os.listdir(here))
  table = (root / "compare" / "compare.md").read_text()
  assert "| p_failure=0 | trained / train | 1 | 0.500" in table and "| p_failure=0.25 | trained / train | 1 |" in table

  # Complete here: nothing is asked of the slice. A run whose copy here is lost is complete there: fetched only.
  calls = len(fake_pod.calls(env))
  again = sweep(*command, env=env)
  assert again.returncode == 0 and "launched 0" in again.stdout and len(fake_pod.calls(env)) == calls
  shutil.rmtree(here)
  third = sweep(*command, env=env)
  assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
  assert "launched 1, failed 0, 2 of 2 complete" in third.stdout and len(_launched(env["FAKE_LOG"])) == 2
  assert sweep_records.is_complete(here)


def test_arms_whose_sft_inputs_differ_start_other_warm_starts_without_a_mismatch(tmp_path):
  """Arm c changes an SFT input (sft.steps), so its warm start 0 has other bits than arm a's by design: no
  mismatch, both recorded. The check still holds among runs of the same SFT inputs (test above)."""
  (tmp_path / "protocol.py").write_text(textwrap.dedent("""
      def get_protocol():
        return {"arms": [{"name": "a", "config": "configs/sge_coding.py", "overrides": []},
                         {"name": "c", "config": "configs/sge_coding.py", "overrides": ["--config.sft.steps=7"]}],
                "seeds": 1, "warm_starts": 1, "overrides": []}
  """))
  (tmp_path / "fake_train.py").write_text(FAKE_TRAINER)
  record, log = tmp_path / "record", str(tmp_path / "launched.jsonl")
  out = sweep(f"--protocol={tmp_path / 'protocol.py'}", f"--root={tmp_path / 'root'}",
              f"--train_script={tmp_path / 'fake_train.py'}", f"--record={record}", "--machine=m1",
              env={"FAKE_LOG": log})
  assert out.returncode == 0, out.stderr[-3000:]
  assert len(_launched(log)) == 2 and not list((tmp_path / "root" / "m1").glob("*/*.mismatch"))
  digests = {arm: provenance.load(record / "m1" / arm / "ws0_seed0")["start_digest"] for arm in ("a", "c")}
  assert digests == {"a": "m1-ws0", "c": "m1-ws0-sft7"}


def test_the_recorded_warm_start_key_tells_a_methods_own_sft_inputs_from_another_machines_bits(tmp_path):
  """Arm t's method builds other demonstrations from the same config fields (EMPO2's tips: the key holds its prompt
  hook), so its warm start 0 has other bits than arm a's: the runs' recorded cache keys differ, no mismatch. Another
  machine under the same name, whose key is the same but whose bits are not, is still caught."""
  (tmp_path / "protocol.py").write_text(textwrap.dedent("""
      def get_protocol():
        return {"arms": [{"name": "a", "config": "configs/sge_coding.py", "overrides": []},
                         {"name": "t", "config": "configs/sge_coding.py",
                          "overrides": ["--config.rollout.final_max_new_tokens=128"]},
                         {"name": "b", "config": "configs/sge_coding.py", "overrides": ["--config.sge.p_failure=0"]}],
                "seeds": 1, "warm_starts": 1, "overrides": []}
  """))
  (tmp_path / "fake_train.py").write_text(FAKE_TRAINER)
  command = (f"--protocol={tmp_path / 'protocol.py'}", f"--train_script={tmp_path / 'fake_train.py'}",
             f"--record={tmp_path / 'record'}", "--machine=m1")
  log = str(tmp_path / "launched.jsonl")
  out = sweep(*command, f"--root={tmp_path / 'root'}", "--only=a,t", env={"FAKE_LOG": log, "FAKE_RECORD_KEY": "1"})
  assert out.returncode == 0, out.stderr[-3000:]
  assert len(_launched(log)) == 2 and not list((tmp_path / "root" / "m1").glob("*/*.mismatch"))
  a, t = (str(tmp_path / "root" / "m1" / arm / "ws0_seed0") for arm in ("a", "t"))
  assert sweep_records.warm_start_inputs(a) == sweep_records.warm_start_inputs(t)  # config fields alone: a mismatch
  # Arm b differs from a in an RL knob only: the same key, so other bits under the name m1 are another machine's.
  out = sweep(*command, f"--root={tmp_path / 'other'}", "--only=b",
              env={"FAKE_LOG": log, "FAKE_RECORD_KEY": "1", "FAKE_DIGEST": "other-bits"})
  assert out.returncode != 0 and "started warm start 0 from parameters other-bits" in out.stderr
  assert os.path.isdir(tmp_path / "other" / "m1" / "b" / "ws0_seed0.mismatch")


def test_warm_start_inputs_ignore_how_often_the_sft_saves_and_default_micro_batches(tmp_path):
  """A run made before `sft.checkpoint_every` and `sft.micro_batch_size` existed and one made after, with the same
  SFT otherwise, compute the same warm start; a run with other SFT steps, or in micro-batches, does not."""
  def inputs(name, sft):
    os.makedirs(tmp_path / name)
    (tmp_path / name / "config.json").write_text(json.dumps({"sft": sft, "env": {"id": "x"}}))
    return sweep_records.warm_start_inputs(str(tmp_path / name))

  before = inputs("before", {"steps": 600, "seed": 1})
  assert inputs("after", {"steps": 600, "seed": 1, "checkpoint_every": 50}) == before
  assert inputs("other", {"steps": 150, "seed": 1, "checkpoint_every": 50}) != before
  assert inputs("whole", {"steps": 600, "seed": 1, "checkpoint_every": 50, "micro_batch_size": 0}) == before
  assert inputs("micro", {"steps": 600, "seed": 1, "checkpoint_every": 50, "micro_batch_size": 8}) != before


def test_carried_warm_starts_travel_with_the_record_to_a_fresh_clone_on_another_machine(tmp_path):
  """--carry_warm_starts keeps each run's cached warm start in the record, and a sweep on another machine with
  an empty cache puts it there before its runs start: they reuse it, bit for bit, instead of computing it."""
  protocol, train_script = _fixture(tmp_path)
  record = tmp_path / "record"
  env = {"FAKE_WARM_START_CACHE": "1", "EXPLORE_JAX_CACHE": str(tmp_path / "cache1"),
         "FAKE_LOG": str(tmp_path / "m1.jsonl")}
  out = sweep(f"--protocol={protocol}", f"--root={tmp_path / 'm1'}", train_script, f"--record={record}",
              "--machine=m1", "--max_runs=1", "--carry_warm_starts", env=env)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  kept = record / "warm_starts" / "k0"
  assert f"kept {kept}\n" in out.stdout and f"kept {kept}.pass_at_k/e.json" in out.stdout
  assert (kept / "0" / "params").read_text() == (tmp_path / "cache1" / "sft" / "k0" / "0" / "params").read_text()
  assert (record / "warm_starts" / "k0.pass_at_k" / "e.json").read_text() == "pass@k of m1-ws0"
  assert [(e["warm_start_reused"], e["evaluated"]) for e in _launched(env["FAKE_LOG"]) if "evaluated" in e] == [
      (False, False)]

  # Another machine, a fresh clone: no root, an empty cache but for an unfinished save of the warm start.
  (tmp_path / "cache2" / "sft" / "k0" / "0.orbax-checkpoint-tmp-1").mkdir(parents=True)
  env2 = {**env, "EXPLORE_JAX_CACHE": str(tmp_path / "cache2"), "FAKE_LOG": str(tmp_path / "m2.jsonl")}
  out = sweep(f"--protocol={protocol}", f"--root={tmp_path / 'm2'}", train_script, f"--record={record}",
              "--machine=m2", "--carry_warm_starts", env=env2)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert "warm start k0 recorded in" in out.stdout and "4 of 4 complete" in out.stdout
  assert os.listdir(tmp_path / "cache2" / "sft" / "k0") == ["0"]
  assert [(e["warm_start_reused"], e["evaluated"]) for e in _launched(env2["FAKE_LOG"]) if "evaluated" in e] == [
      (True, True)] * 4
  digests = {json.load(open(record / m / a / r / "provenance.json"))["start_digest"]
             for m in ("m1", "m2") for a in os.listdir(record / m) for r in os.listdir(record / m / a)}
  assert digests == {"m1-ws0"}  # every run on both machines started from m1's warm start
  assert sorted(os.listdir(record / "warm_starts")) == ["k0", "k0.pass_at_k"]

  bad = sweep(f"--protocol={protocol}", f"--root={tmp_path / 'm3'}", train_script, "--carry_warm_starts", env=env)
  assert bad.returncode != 0 and "--carry_warm_starts keeps the warm starts in the --record directory" in bad.stderr


def test_a_warm_start_too_large_to_carry_stays_in_the_cache(tmp_path, monkeypatch):
  workdir = tmp_path / "root" / "m1" / "a" / "ws0_seed0"
  workdir.mkdir(parents=True)
  (workdir / "provenance.json").write_text(json.dumps({"start_digest": "d", "warm_start": "k0", "machines": []}))
  monkeypatch.setenv("EXPLORE_JAX_CACHE", str(tmp_path / "cache"))
  (tmp_path / "cache" / "sft" / "k0" / "0").mkdir(parents=True)
  (tmp_path / "cache" / "sft" / "k0" / "0" / "params").write_bytes(b"x" * 2**20)
  run = sweep_records.Run("a", 0, 0, str(workdir), [])
  notes = []
  monkeypatch.setattr(sweep_records, "MAX_CARRIED_MB", 0.5)
  assert sweep_records.carry_warm_starts([run, run], str(tmp_path / "record"), notes.append) == []
  assert sweep_records.carry_warm_starts([run], str(tmp_path / "record"), notes.append) == []
  assert len(notes) == 1 and "k0" in notes[0] and "not carried" in notes[0]
  assert not (tmp_path / "record" / "warm_starts").exists()
  monkeypatch.setattr(sweep_records, "MAX_CARRIED_MB", 2)
  assert sweep_records.carry_warm_starts([run, run], str(tmp_path / "record"), notes.append) == ["k0"]
