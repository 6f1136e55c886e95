"""Launching the multi-host tests' worker processes: CPU jax processes with fake devices, joined over loopback.

  coordinator = f"127.0.0.1:{free_port()}"
  run_together([([sys.executable, script, ...], cpu_env(4)) for i in range(2)], log_dir, "worker", timeout_s)
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def cpu_env(devices: int) -> dict[str, str]:
  """This environment with jax on `devices` fake CPU devices, the repository importable, no cluster settings."""
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
  env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices}"])
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
  for key in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    env.pop(key, None)
  return env


def run_together(commands: list[tuple[list[str], dict]], log_dir: str, label: str, timeout_s: float) -> None:
  """Starts the commands together, waits for all (killing all on the first failure or the deadline); raises
  AssertionError with the tail of each one's output when any failed."""
  procs = []
  for i, (cmd, env) in enumerate(commands):
    log = open(os.path.join(log_dir, f"{label}_{i}.log"), "w")
    procs.append((subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT), log))
  deadline = time.monotonic() + timeout_s
  failed = None
  try:
    while any(p.poll() is None for p, _ in procs):
      failed = next((i for i, (p, _) in enumerate(procs) if p.poll() not in (None, 0)), None)
      if failed is not None or time.monotonic() > deadline:
        break
      time.sleep(0.2)
    else:
      failed = next((i for i, (p, _) in enumerate(procs) if p.returncode != 0), None)
  finally:
    for p, log in procs:
      if p.poll() is None:
        p.kill()
      p.wait()
      log.close()
  if failed is not None or any(p.returncode != 0 for p, _ in procs):
    tails = []
    for i in range(len(procs)):
      with open(os.path.join(log_dir, f"{label}_{i}.log")) as f:
        tails.append(f"--- {label} {i} (rc {procs[i][0].returncode}) ---\n" + f.read()[-3000:])
    raise AssertionError(f"{label} processes failed or timed out ({timeout_s} s)\n" + "\n".join(tails))
