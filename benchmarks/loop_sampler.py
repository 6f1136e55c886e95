"""Benchmark: the sampler inside the RL loop against the same sampler alone, at the loop's own shapes.

Builds a run of --config (default: `make run`'s configs/sge_coding.py, its cached warm start), plays
--iterations rollouts through the actor pool exactly as the loop does, and records every sampler call the
central inference makes: batch B, prompt width P, rows that carry a request (the rest are filler rows of the
fixed batch), decode steps run (the longest row, filler rows included), the longest real response, new tokens
of the real rows, and wall seconds (the first call at a new width includes its compilation). Then it times
`sampling.generate` alone on full batches at each width the loop used, with the loop's mean response length
as the number of new tokens. Prints:

  loop      new tokens/s of real rows over the seconds spent in sampler calls, and over the whole rollout
  alone     new tokens/s of full batches at the loop's widths and response length (the benchmark's figure at
            the loop's shapes), weighted like the loop's calls
  breakdown where the difference goes: compile seconds, filler rows (1 - real rows / B), decode steps beyond
            the longest real response (steps that only filler rows needed), steps beyond the mean response
            (the batch waits for its longest row), and the rollout's time outside the sampler (actors,
            environments)

Prints, asserts nothing; wall time under whatever load the machine carries (the load average is printed).

  .venv/bin/python benchmarks/loop_sampler.py [--config=configs/sge_coding.py] [--iterations=2] [--config.x=y]
"""

from __future__ import annotations

import collections
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from explore_jax import cli, sampling  # noqa: E402
from explore_jax.train import inference, loop, pipeline, rollout  # noqa: E402
from explore_jax.train.builder import build  # noqa: E402


_CONFIG = config_flags.DEFINE_config_file("config", os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "configs", "sge_coding.py"), "Experiment config file[:variant].", lock_config=True)
_ITERATIONS = flags.DEFINE_integer("iterations", 2, "rollouts to record")
_REPEATS = flags.DEFINE_integer("repeats", 3, "timed calls per width when alone")


def main(argv) -> None:
  del argv
  config = _CONFIG.value
  label = " ".join(a for a in sys.argv[1:])
  parts = build(config, tempfile.mkdtemp(prefix="loop_sampler-"))
  loop.restore_or_init(parts)  # the config's warm start (cached), as a run starts

  calls = []
  generate = sampling.generate

  def recorded(model, params, prompt, prompt_mask, sampling_params, rng, *, row_ids=None, **kw):
    t0 = time.time()
    out = jax.block_until_ready(generate(model, params, prompt, prompt_mask, sampling_params, rng,
                                         row_ids=row_ids, **kw))
    seconds = time.time() - t0
    lengths = np.asarray(out.lengths)
    real = int(np.asarray(prompt_mask).sum(1).__gt__(1).sum())  # filler rows hold one token
    calls.append({"B": prompt.shape[0], "P": prompt.shape[1], "real": real, "seconds": seconds,
                  "steps": int(lengths.max()), "longest_real": int(lengths[:real].max(initial=0)),
                  "new_tokens": int(lengths[:real].sum()), "mean_real": float(lengths[:real].mean()) if real else 0.0})
    return out

  inference.sampling.generate = recorded  # the server's calls go through the recorder
  rollout_seconds, sample_seconds = 0.0, 0.0
  with parts.make_pool() as pool, pipeline.RolloutPipeline.from_config(parts, pool) as rollouts:
    for it in range(_ITERATIONS.value):
      t0 = time.time()
      collected = rollouts.take(it, parts.learner.state.params)
      parts.method.observe(collected.results, training=True)
      rollout_seconds += time.time() - t0
      sample_seconds += collected.metrics["time_sampling_s"]
  inference.sampling.generate = generate

  seen, compile_s = set(), 0.0
  for c in calls:
    c["first"] = (c["B"], c["P"]) not in seen
    seen.add((c["B"], c["P"]))
  warm = [c for c in calls if not c["first"]] or calls
  call_s = sum(c["seconds"] for c in calls)
  new_tokens = sum(c["new_tokens"] for c in calls)
  R = parts.server.response_len
  mean_len = sum(c["new_tokens"] for c in calls) / max(sum(c["real"] for c in calls), 1)
  print(f"{label or 'configs/sge_coding.py'}: {_ITERATIONS.value} rollouts, {len(calls)} sampler calls, "
        f"load {os.getloadavg()[0]:.1f} (cpu count {os.cpu_count()})")
  print(f"loop      {new_tokens / call_s:,.0f} new tok/s in sampler calls ({call_s:.1f} s), "
        f"{new_tokens / max(rollout_seconds, 1e-9):,.0f} over the rollouts ({rollout_seconds:.1f} s; pool's "
        f"sampling time {sample_seconds:.1f} s); warm calls only: "
        f"{sum(c['new_tokens'] for c in warm) / sum(c['seconds'] for c in warm):,.0f} tok/s")

  # Alone: full batches of random prompts at each width, the loop's mean response length, no EOS stop.
  params = parts.server.policy_params(parts.learner.state.params)
  B = parts.server.batch_size  # the benchmark's full batch, whatever rows the loop's calls used
  n_new = max(int(round(mean_len)), 1)
  # The loop's own schedule (temperatures, delimiters, top-p) without EOS or stop sequences: every row makes
  # n_new tokens.
  delimiters = [parts.tokenizer(d, add_special_tokens=False)["input_ids"] for d in parts.method.delimiters()]
  no_stop = sampling.make_sampling_params(parts.method.temperatures(), delimiters,
                                          top_p=float(config.rollout.top_p))
  widths = collections.Counter(c["P"] for c in calls)
  alone = {}
  rng = np.random.default_rng(0)
  for P in sorted(widths):
    prompt = rng.integers(10, parts.model.config.vocab_size, (B, P)).astype(np.int32)
    mask = np.ones((B, P), bool)
    run = lambda: jax.block_until_ready(generate(parts.model, params, prompt, mask, no_stop, jax.random.key(1),
                                                 max_new_tokens=n_new, pad_id=parts.server.pad_id))
    run()
    times = []
    for _ in range(_REPEATS.value):
      t0 = time.time()
      run()
      times.append(time.time() - t0)
    alone[P] = B * n_new / statistics.median(times)
  weighted = sum(alone[P] * n for P, n in widths.items()) / sum(widths.values())
  print(f"alone     {weighted:,.0f} new tok/s (full batches of {B}, {n_new} new tokens = the loop's mean "
        f"response; per width: " + ", ".join(f"P={P} x{widths[P]}: {alone[P]:,.0f}" for P in sorted(alone)) + ")")
  print(f"ratio     alone / loop (warm calls): "
        f"{weighted / (sum(c['new_tokens'] for c in warm) / sum(c['seconds'] for c in warm)):.2f}x")

  compile_s = sum(c["seconds"] for c in calls if c["first"]) - sum(
      statistics.median([w["seconds"] for w in warm if w["P"] == c["P"]] or [0.0]) for c in calls if c["first"])
  fill = sum(c["real"] for c in calls) / sum(c["B"] for c in calls)
  steps = sum(c["steps"] for c in calls)
  filler_steps = sum(c["steps"] - c["longest_real"] for c in calls)
  wait_steps = sum(c["longest_real"] - c["mean_real"] for c in calls)
  print(f"breakdown compile ~{max(compile_s, 0.0):.1f} s of {call_s:.1f} s in calls; rows filled {fill:.0%} "
        f"(rows per call: {sorted({c['B'] for c in calls})}); decode steps {steps} (max new tokens {R}), of which {filler_steps} "
        f"({filler_steps / max(steps, 1):.0%}) only for filler rows and {wait_steps:.0f} "
        f"({wait_steps / max(steps, 1):.0%}) waiting for each batch's longest real row; outside the sampler "
        f"{rollout_seconds - call_s:.1f} s of the rollouts' {rollout_seconds:.1f} s")
  per_width = collections.defaultdict(list)
  for c in calls:
    per_width[c["P"]].append(c)
  for P in sorted(per_width):
    cs = per_width[P]
    print(f"  P={P:4d}: {len(cs):3d} calls, {sum(c['real'] for c in cs) / len(cs):5.1f} real rows/call, "
          f"steps {statistics.mean(c['steps'] for c in cs):5.1f} (longest real "
          f"{statistics.mean(c['longest_real'] for c in cs):5.1f}, mean real "
          f"{statistics.mean(c['mean_real'] for c in cs):5.1f}), {sum(c['seconds'] for c in cs):6.1f} s")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
