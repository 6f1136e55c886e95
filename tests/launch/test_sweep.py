"""launch/sweep.py: a protocol's plan, and resumable sweeps with a fake trainer (no test here trains)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

from configs.protocols import sge_coding as sge_protocol
from explore_jax.train import provenance

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
    json.dump({"method": "sge"}, open(os.path.join(workdir, "config.json"), "w"))
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      f.write(json.dumps({"iteration": 1, "success_rate": p1, "eval/success_rate": p1}) + "\\n")
    entry = {"pass_at_k": {str(k): p1 for k in (1, 2, 4, 8, 16)}, "tasks_solved_at_least_once": 3,
             "distinct_outcomes_per_task": 1.0}
    json.dump({"trained / train": entry}, open(os.path.join(workdir, "summary.json"), "w"))
    machine = os.path.basename(os.path.dirname(os.path.dirname(workdir)))  # root/<machine>/<arm>/<run>
    digest = os.environ.get("FAKE_DIGEST") or machine + "-ws" + args.get("config.sft.seed", "0")
    json.dump({"start_digest": digest, "machines": []},
              open(os.path.join(workdir, "provenance.json"), "w"))
""")

PROTOCOL = textwrap.dedent("""
    def get_protocol():
      return {"arms": [{"name": "a", "config": "configs/sge_coding.py", "overrides": []},
                       {"name": "b", "config": "configs/sge_coding.py", "overrides": ["--config.sge.p_failure=0"]}],
              "seeds": 2, "warm_starts": WARM_STARTS, "overrides": ["--config.train.num_iterations=3"]}
""")


def sweep(*args, env=None):
  return subprocess.run([sys.executable, os.path.join(REPO, "launch", "sweep.py"), *args], capture_output=True,
                        text=True, timeout=300, cwd=REPO, env={**os.environ, **(env or {})})


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
  arms = ["sge", "grpo", "sge_no_mixed_temperature", "sge_no_negative_reflection", "sge_no_positive_reflection"]
  seeds, warm_starts = sge_protocol.SEEDS, sge_protocol.WARM_STARTS
  assert warm_starts >= 2 and seeds * warm_starts >= 4  # the permutation test needs 4 runs per arm to reach 0.05
  assert len(lines) == len(arms) * warm_starts * seeds
  workdirs = [next(a for a in line if a.startswith("--workdir=")) for line in lines]
  # seed-major, then warm start, then arm: partial results stay balanced across arms.
  expected = [f"--workdir={root}/m1/{arm}/ws{ws}_seed{seed}" for seed in range(seeds) for ws in range(warm_starts)
              for arm in arms]
  assert workdirs == expected
  assert lines[0][0] == "complete" and lines[1][:3] == ["partial", "(checkpoint", "8)"] and lines[2][0] == "pending"
  sge_ws1_seed0 = lines[5]
  assert "--config=configs/sge_coding.py" in sge_ws1_seed0 and "--config.seed=0" in sge_ws1_seed0
  assert "--config.sft.seed=1" in sge_ws1_seed0 and "--config.train.num_iterations=16" in sge_ws1_seed0
  assert "--config=configs/grpo_coding.py" in lines[1]
  assert lines[2][-1] == "--config.sge.strategy_temperature=0.7"
  assert lines[3][-1] == "--config.sge.p_failure=0" and lines[4][-1] == "--config.sge.p_success=0"
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


def test_the_text_world_protocol_plans_every_world_and_method():
  from configs.protocols import textworlds as protocol
  out = sweep("--protocol=configs/protocols/textworlds.py", "--root=/nonexistent/root", "--dry_run", "--machine=m1")
  assert out.returncode == 0, out.stderr[-2000:]
  lines = [line for line in out.stdout.splitlines() if "launch/train.py" in line]
  assert len(lines) == 4 * protocol.WARM_STARTS * protocol.SEEDS and protocol.WARM_STARTS * protocol.SEEDS >= 3
  for world in ("twx", "alfworld"):
    for method in ("gigpo", "grpo"):
      assert sum(f"--config=configs/{method}_{world}.py" in line for line in lines) == protocol.WARM_STARTS
