"""Runs an experiment config.

  python launch/train.py --config=configs/sge_coding.py --workdir=runs/sge_coding
  python launch/train.py --config=configs/sge_coding.py:paper --config.model.checkpoint=/path/to/Qwen3-4B

Any config field can be overridden with `--config.a.b=value`; an unknown field or a value of the wrong
type stops the run with a one-line error naming it.

The config's `method` (a name registered in explore_jax.methods) runs in the RL training loop
(explore_jax/train/loop.py): the run directory gets the resolved config, checkpoints, metrics.jsonl,
TensorBoard events and curves.png, and, where the config asks for pass@k (eval.passk_samples), summary.md,
summary.json and pass_at_k.png comparing the warm-start and the trained policy. A killed run started again
with the same command resumes from its last checkpoint; on SIGTERM (`kill PID`) an RL run first finishes the
iteration it is in and saves it, then exits with status 143 (a second SIGTERM stops it at once;
explore_jax/train/preemption.py). The run directory may be a bucket's, as a multi-host TPU slice needs
(`--workdir=gs://BUCKET/runs/x`; explore_jax/storage.py).
"""

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from explore_jax import cli, storage  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file[:variant].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: resolved config, checkpoints, metrics; a local "
                                "path or a bucket's (gs://BUCKET/runs/x, which a multi-host slice needs).")
flags.mark_flags_as_required(["config"])
_RUN_LOCK = []  # the open lock file of this run's directory, held until the process exits


def hold_run_directory(workdir: str) -> None:
  """Takes the run directory for this process, or stops with an error naming the process that has it: two
  processes resuming one run would write over each other's checkpoints and metrics. The lock (flock) goes with
  the process however it ends; a bucket's run directory (a multi-host slice) has none."""
  if storage.is_remote(workdir):
    return
  import fcntl

  f = open(os.path.join(workdir, ".run.lock"), "a+")
  try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    f.seek(0)
    sys.exit(f"error: the run directory {workdir} is in use by another process (pid {f.read().strip() or '?'}); "
             "a run is resumed by one process at a time")
  f.truncate(0)
  f.write(str(os.getpid()))
  f.flush()
  _RUN_LOCK.append(f)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  # Before anything touches a jax backend: a no-op for one process (the default settings).
  from explore_jax.parallel import distributed
  d = config.get("distributed") or {}
  distributed.initialize(d.get("coordinator_address"), d.get("num_processes"), d.get("process_id"))
  if config.train.get("compilation_cache", True):
    from explore_jax.train import xla_cache
    xla_cache.enable()
  workdir = _WORKDIR.value or os.path.join("runs", os.path.splitext(os.path.basename(
      flags.FLAGS["config"].config_filename))[0])
  logging.set_verbosity(logging.WARNING)
  from explore_jax.methods import registered_methods

  unknown = [m for m in str(config.get("method")).split("+") if m.strip() not in registered_methods()]
  if unknown:
    sys.exit(f"error: unknown method {unknown[0]!r} (config.method); registered: "
             f"{', '.join(registered_methods())}; compose them with '+', e.g. sge+rnd")
  try:
    storage.makedirs(workdir)
  except FileNotFoundError as e:  # a bucket that is not there
    sys.exit(f"error: {e}")
  if distributed.is_primary():  # process 0 writes the run's files (train/loop.py)
    hold_run_directory(workdir)
    with storage.open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json_best_effort(indent=2))
  from explore_jax.train import loop
  from explore_jax.train.builder import build

  try:
    parts = build(config, workdir)
  except (FileNotFoundError, ValueError) as e:  # the config names something that is not there
    sys.exit(f"error: {e}")
  from explore_jax.train import preemption
  try:
    history = loop.run(parts)
  except preemption.Stopped as stopped:  # SIGTERM: the iteration in progress finished and was saved (or a pass@k
                                         # left between its task sets)
    print(f"[stopped] {stopped}", flush=True)
    sys.exit(128 + signal.SIGTERM)
  last = history[-1] if history else {}
  print(f"[done] iteration {last.get('iteration', 0)}; last: " + ", ".join(
      f"{k}={v:.3f}" for k, v in last.items() if k in ("success_rate", "eval/success_rate", "return")))
  print(f"[done] run directory: {storage.resolve(workdir)} (metrics.jsonl, curves.png, tensorboard/, checkpoints/)")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
