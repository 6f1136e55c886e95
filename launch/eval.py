"""Evaluates a policy on a config's task sets: pass@k (unbiased, k = 1..n), success, distinct outcomes.

  # a trained run (its latest checkpoint, or --step)
  python launch/eval.py --config=configs/sge_coding.py --run=runs/sge_coding
  # the warm-start policy of a config (the SFT cache), or a base model zero-shot (the paper's "Base")
  python launch/eval.py --config=configs/sge_coding.py --policy=warm_start
  python launch/eval.py --config=configs/sge_coding.py:paper --policy=base \\
      --config.model.checkpoint=/path/to/Qwen3-4B-Instruct --config.env.kwargs.dataset=/path/to/train.jsonl ...

Samples use the config's evaluation temperature, no method context (no reflection), n = --samples per
task, on the config's task sets (--splits, default all): the held-in training tasks ("train"), the held-out tasks
("held-out") and the held-out seeds of each split in eval.more_splits (ALFWorld: valid_seen). --transcripts=N also writes N episodes of every
task, step by step, to transcripts-<split>.jsonl: how a policy fails, not only how often. Writes summary.md, summary.json and
pass_at_k.png to --output (default: <run>/eval-<step>, or runs/eval-<config>-<policy>).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from explore_jax import cli, storage  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file[:variant].", lock_config=True)
_RUN = flags.DEFINE_string("run", None, "A training run directory (local or gs://...) whose checkpoint to "
                           "evaluate.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step of --run (default: the latest).")
_POLICY = flags.DEFINE_enum("policy", None, ["base", "warm_start"],
                            "Without --run: the imported checkpoint as is (base) or after the config's SFT.")
_SAMPLES = flags.DEFINE_integer("samples", None, "Samples per task (default: config.eval.passk_samples).")
_SPLITS = flags.DEFINE_list("splits", None, "Task sets: train, held-out and/or the splits of eval.more_splits "
                            "(default: every set of the config; train only with a rollout.task_pool).")
_OUTPUT = flags.DEFINE_string("output", None, "Where summary.md, summary.json and pass_at_k.png go.")
_TRANSCRIPTS = flags.DEFINE_integer("transcripts", 0, "Episodes per task written to transcripts-<split>.jsonl in "
                                    "--output (observation, reply, rewards, feedback per step); 0: none.")
flags.mark_flags_as_required(["config"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if (_RUN.value is None) == (_POLICY.value is None):
    raise app.UsageError("give exactly one of --run=<run directory> and --policy=base|warm_start")
  logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  with config.unlocked():
    if _SAMPLES.value is not None:
      config.eval.passk_samples = _SAMPLES.value
  if config.eval.passk_samples < 1:
    raise app.UsageError("pass@k needs at least one sample per task (--samples)")
  name = os.path.splitext(os.path.basename(flags.FLAGS["config"].config_filename))[0]
  from explore_jax.train import loop
  from explore_jax.train.builder import build

  try:
    if _RUN.value:
      if not storage.isdir(os.path.join(_RUN.value, "checkpoints")):
        raise FileNotFoundError(f"{_RUN.value} has no checkpoints/ directory")
      parts = build(config, _RUN.value)
    else:
      output = _OUTPUT.value or os.path.join("runs", f"eval-{name}-{_POLICY.value}")
      parts = build(config, output)
    known = parts.evaluator.task_sets()
    splits = _SPLITS.value or known
    unknown = [s for s in splits if s not in known]
    if unknown:
      raise ValueError(f"unknown split(s) {unknown}; this config has {', '.join(known)} (train is the held-in pool "
                       "of a rollout.task_pool; another split of the environment goes in --config.eval.more_splits)")
    if _RUN.value:
      step = parts.checkpointer.latest_step() if _STEP.value is None else _STEP.value
      params, label = loop.load_params(parts, step), f"step {step}"
      output = _OUTPUT.value or os.path.join(_RUN.value, f"eval-{step}")
    else:
      params = parts.learner.initial_params if _POLICY.value == "base" else parts.warm_start_params()
      label = _POLICY.value.replace("_", " ")
  except (FileNotFoundError, ValueError) as e:  # the config or flags name something that is not there
    sys.exit(f"error: {e}")
  # The warm start samples the streams a training run's warm-start pass@k uses: the same episodes and numbers.
  key = parts.evaluator.warm_start_sampling_key() if not _RUN.value and _POLICY.value == "warm_start" else None
  with parts.make_pool() as pool:
    evals = [parts.evaluator.pass_at_k(
        pool, params, split, policy=label, key=key, transcripts_per_task=_TRANSCRIPTS.value,
        transcripts=os.path.join(output, f"transcripts-{split}.jsonl") if _TRANSCRIPTS.value else None)
        for split in splits]
  text = parts.evaluator.write_summary(evals, output)
  print(text)
  written = [f"transcripts-{split}.jsonl" for split in splits] if _TRANSCRIPTS.value else []
  print(f"[eval] {storage.resolve(output)}: {', '.join(['summary.md', 'summary.json', 'pass_at_k.png'] + written)}")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
