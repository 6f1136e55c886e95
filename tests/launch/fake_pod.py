"""A fake Cloud TPU slice for launch/tpu.py and launch/sweep.py --tpu: a `gcloud` on PATH that plays one worker
and a bucket on local disk, so `run --wait` is exercised end to end without a cloud.

- `gcloud compute tpus tpu-vm ssh ... --command=C` runs C with bash in the worker's home (HOME=<tmp>/home), as
  the real one runs it on every worker (one worker here); a run started there lives on as a background process
  that pgrep sees.
- `gcloud compute tpus tpu-vm scp NAME:PATH ... DEST` copies from the worker's home.
- `gcloud storage ls URL` / `gcloud storage cp URL ... DEST` read the bucket, gs://B/P = <tmp>/gcs/B/P.
- The worker's ~/explore_jax/.venv/bin/python runs the test's trainer file in place of launch/train.py, its
  --workdir=gs://... mapped into the bucket directory.
Every gcloud call is appended to calls.jsonl (its argv, and whether it came from here or from the worker).
"""

import json
import os
import sys

GCLOUD = """#!{python}
import json, os, shutil, subprocess, sys
args = sys.argv[1:]
home, gcs = os.environ["FAKE_HOME"], os.environ["FAKE_GCS"]
with open(os.environ["FAKE_CALLS"], "a") as f:  # a call from a command on the worker (HOME is its) is the worker's
  f.write(json.dumps(["worker" if os.environ.get("HOME") == home else "here", *args]) + "\\n")
words = [a for a in args if not a.startswith("--")]
flags = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


def copy(sources, dest, where):
  missing = [s for s in sources if not os.path.isfile(where(s))]
  for s in sources:
    if s not in missing:
      shutil.copy(where(s), dest)
  for s in missing:
    print(f"fake gcloud: no {{s}}", file=sys.stderr)
  return 1 if missing else 0


bucket = lambda url: os.path.join(gcs, url[len("gs://"):])
if words[:4] == ["compute", "tpus", "tpu-vm", "ssh"]:
  sys.exit(subprocess.run(["bash", "-c", flags["command"]], env={{**os.environ, "HOME": home}}).returncode)
if words[:4] == ["compute", "tpus", "tpu-vm", "scp"]:
  *sources, dest = words[4:]
  sys.exit(copy(sources, dest, lambda s: os.path.join(home, s.split(":", 1)[1])))
if words[:2] == ["storage", "ls"]:
  sys.exit(0 if os.path.exists(bucket(words[2])) else 1)
if words[:2] == ["storage", "cp"]:
  *sources, dest = words[2:]
  sys.exit(copy(sources, dest, bucket))
sys.exit(f"fake gcloud: unexpected {{args}}")
"""

# The worker's venv python: launch/train.py is the test's trainer; a gs:// run directory is the bucket's.
WORKER_PYTHON = """#!{python}
import os, sys
sys.argv = [a.replace("--workdir=gs://", "--workdir=" + os.environ["FAKE_GCS"] + "/", 1) for a in sys.argv[1:]]
assert sys.argv[0] == "launch/train.py", sys.argv
exec(compile(open(os.environ["FAKE_WORKER_TRAINER"]).read(), "fake_train", "exec"))
"""


def make(tmp_path, trainer_file: str) -> dict:
  """Builds the fake slice under tmp_path; returns the environment its commands run in (PATH first)."""
  bin_dir, home, gcs = tmp_path / "bin", tmp_path / "home", tmp_path / "gcs"
  venv_bin = home / "explore_jax" / ".venv" / "bin"
  for d in (bin_dir, venv_bin, gcs):
    d.mkdir(parents=True, exist_ok=True)
  (bin_dir / "gcloud").write_text(GCLOUD.format(python=sys.executable))
  (venv_bin / "python").write_text(WORKER_PYTHON.format(python=sys.executable))
  for f in (bin_dir / "gcloud", venv_bin / "python"):
    f.chmod(0o755)
  return {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_CALLS": str(tmp_path / "calls.jsonl"), "FAKE_HOME": str(home),
          "FAKE_GCS": str(gcs), "FAKE_WORKER_TRAINER": trainer_file}


def calls(env: dict, where: str = "here") -> list[list[str]]:
  """The gcloud calls made so far from `where` ("here" or "worker"), each its argv without the program name."""
  path = env["FAKE_CALLS"]
  logged = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
  return [call[1:] for call in logged if call[0] == where]
