"""What the sweep tests share: launch/sweep.py run as a user runs it, and a sweep file written from a dict."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sweep(*args, env=None):
  return subprocess.run([sys.executable, os.path.join(REPO, "launch", "sweep.py"), *args], capture_output=True,
                        text=True, timeout=300, cwd=REPO, env={**os.environ, **(env or {})})


def write_sweep_file(tmp_path, body: dict, name="sweep.py"):
  (tmp_path / name).write_text(f"def get_protocol():\n  return {body!r}\n")
  return str(tmp_path / name)
