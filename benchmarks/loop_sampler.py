"""Benchmark: the sampler inside the RL loop against the same sampler alone, at the loop's own shapes.

Builds a run of --config (default: `make run`'s configs/sge_coding.py, its cached warm start) and plays
--iterations rollouts through the actor pool exactly as the loop does, each once per sampler mode (--modes,
rollout.batching: the fixed-shape calls of `sampling.generate`, continuous batching through `sampling.slots`, and
streaming, whose rounds of decode slots the pool feeds as actors ask), all from the same episode specs,
parameters and keys: the same episodes, up to a token that a last-bit difference flips. It records every call of
the central inference: rows, prompt widths, new tokens of the real rows, wall seconds and the compilation seconds
inside them (jax's compile events). Then it times `sampling.generate` alone on full batches at each width the
loop's prompts had, with the loop's mean response length as the number of new tokens. Prints, per mode:

  loop      new tokens/s of real rows over the seconds spent in sampler calls, over the same seconds less their
            compilation ("warm"), and over the whole rollout
  breakdown fixed: filler rows (1 - real rows / B), decode steps only filler rows needed, steps waiting for each
            call's longest row. continuous and streaming: prefills (rows, shared), decode calls, slot-steps of
            rows still drawing (the rest: finished or empty slots waiting for a refill or for the tail), batch
            sizes
  alone     new tokens/s of full batches at the loop's widths and response length, weighted like the loop's
            prompts; the ratio alone / loop (warm)

and last `loop_vs_benchmark=<x>`: that ratio for the last mode. Asserts nothing; wall time under whatever load the
machine carries (the load average is printed).

  .venv/bin/python benchmarks/loop_sampler.py [--config=configs/sge_coding.py] [--iterations=2] [--config.x=y]
  .venv/bin/python benchmarks/loop_sampler.py --config=configs/gigpo_twx.py --iterations=1 --modes=continuous
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
from jax import monitoring  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from explore_jax import cli, sampling  # noqa: E402
from explore_jax.sampling import slots  # noqa: E402
from explore_jax.train import inference, loop, pipeline  # noqa: E402
from explore_jax.train.builder import build  # noqa: E402


_CONFIG = config_flags.DEFINE_config_file("config", os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "configs", "sge_coding.py"), "Experiment config file[:variant].", lock_config=True)
_ITERATIONS = flags.DEFINE_integer("iterations", 2, "rollouts to record per mode")
_REPEATS = flags.DEFINE_integer("repeats", 3, "timed calls per width when alone")
_MODES = flags.DEFINE_list("modes", ["fixed", "continuous", "streaming"],
                           "rollout.batching modes to play, in order")

_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")
_compile_s = [0.0]


def _on_event(event: str, seconds: float, **kwargs) -> None:
  if event in _COMPILE_EVENTS:
    _compile_s[0] += seconds


def _timed(fn, record: dict) -> object:
  compiled, t0 = _compile_s[0], time.time()
  out = jax.block_until_ready(fn())
  record["seconds"], record["compile"] = time.time() - t0, _compile_s[0] - compiled
  return out


class Recorder:
  """Records the central inference's sampler calls of one mode while installed (`with`)."""

  def __init__(self, parts, mode: str):
    self.parts, self.mode = parts, mode
    self.calls: list[dict] = []
    self.rollout_s = self.sample_s = 0.0
    self.stats = slots.SlotStats()
    self.tokens = 0  # the rollouts' response tokens (the same episodes in every mode: the same count)

  def __enter__(self):
    generate, sample = self._generate, self._sample = sampling.generate, slots.sample
    advance, submit = self._advance, self._submit = slots.SlotEngine.advance, slots.SlotEngine.submit
    calls = self.calls

    def fixed_call(model, params, prompt, prompt_mask, sampling_params, rng, *, row_ids=None, **kw):
      record = {"B": prompt.shape[0]}
      out = _timed(lambda: generate(model, params, prompt, prompt_mask, sampling_params, rng, row_ids=row_ids, **kw),
                   record)
      lengths = np.asarray(out.lengths)
      real = int(np.asarray(prompt_mask).sum(1).__gt__(1).sum())  # filler rows hold one token
      record.update(real=real, steps=int(lengths.max()), longest_real=int(lengths[:real].max(initial=0)),
                    new_tokens=int(lengths[:real].sum()), mean_real=float(lengths[:real].mean()) if real else 0.0,
                    widths=[prompt.shape[1]] * real)
      calls.append(record)
      return out

    def slots_call(model, params, prompts, sampling_params, rng, **kw):
      record = {"B": kw["slots"], "real": len(prompts)}
      slots.SlotEngine.advance, slots.SlotEngine.submit = advance, submit  # rounds of a call are not calls
      out = _timed(lambda: sample(model, params, prompts, sampling_params, rng, **kw), record)
      slots.SlotEngine.advance, slots.SlotEngine.submit = streamed_round, streamed_submit
      bucket, cap = kw.get("width_bucket", 64), kw["cache_len"]
      record.update(new_tokens=sum(len(o.tokens) for o in out),
                    widths=[min(cap, -(-len(p) // bucket) * bucket) for p in prompts])
      calls.append(record)
      return out

    widths: list[int] = []  # streaming: the widths of prompts submitted since the last round

    def streamed_submit(engine, tag, prompt, *a, **kw):
      widths.append(engine.width(prompt))
      return submit(engine, tag, prompt, *a, **kw)

    def streamed_round(engine):
      record = {"B": engine.slots, "real": len(widths), "widths": list(widths)}
      widths.clear()
      out = _timed(lambda: advance(engine), record)
      record["new_tokens"] = sum(len(row.tokens) for _, row in out)
      calls.append(record)
      return out

    self.parts.server.batching = self.mode
    self.parts.server.slot_stats = self.stats
    inference.sampling.generate, inference.slots_lib.sample = fixed_call, slots_call
    slots.SlotEngine.advance, slots.SlotEngine.submit = streamed_round, streamed_submit
    return self

  def __exit__(self, *exc):
    inference.sampling.generate, inference.slots_lib.sample = self._generate, self._sample
    slots.SlotEngine.advance, slots.SlotEngine.submit = self._advance, self._submit


def play(parts, modes: list[str]) -> dict[str, Recorder]:
  """--iterations rollouts, each played once per mode from the same specs, parameters and keys (the method
  observes the last mode's episodes, as the loop would between iterations)."""
  recorders = {mode: Recorder(parts, mode) for mode in modes}
  with parts.make_pool() as pool, pipeline.RolloutPipeline.from_config(parts, pool) as rollouts:
    for it in range(_ITERATIONS.value):
      for mode in modes:
        with recorders[mode] as r:
          t0 = time.time()
          collected = rollouts.take(it, parts.learner.state.params)
          r.rollout_s += time.time() - t0
          r.sample_s += collected.metrics["time_sampling_s"]
          r.tokens += sum(len(s.response.tokens) for e in collected.results for s in e.steps)
      parts.method.observe(collected.results, training=True)
  return recorders


def alone(parts, config, widths: collections.Counter, n_new: int) -> dict[int, float]:
  """New tokens/s of `generate` on full batches of random prompts at each width, n_new tokens, no EOS stop."""
  params = parts.server.policy_params(parts.learner.state.params)
  B = parts.server.batch_size
  # The loop's own schedule (temperatures, delimiters, top-p) without EOS or stop sequences.
  delimiters = [parts.tokenizer(d, add_special_tokens=False)["input_ids"] for d in parts.method.delimiters()]
  no_stop = sampling.make_sampling_params(parts.method.temperatures(), delimiters, top_p=float(config.rollout.top_p))
  rng = np.random.default_rng(0)
  out = {}
  for P in sorted(widths):
    prompt = rng.integers(10, parts.model.config.vocab_size, (B, P)).astype(np.int32)
    mask = np.ones((B, P), bool)
    run = lambda: jax.block_until_ready(sampling.generate(  # noqa: E731
        parts.model, params, prompt, mask, no_stop, jax.random.key(1), max_new_tokens=n_new,
        pad_id=parts.server.pad_id))
    run()
    times = []
    for _ in range(_REPEATS.value):
      t0 = time.time()
      run()
      times.append(time.time() - t0)
    out[P] = B * n_new / statistics.median(times)
  return out


def report(r: Recorder) -> None:
  mode, calls, rollout_s, sample_s, stats = r.mode, r.calls, r.rollout_s, r.sample_s, r.stats
  call_s = sum(c["seconds"] for c in calls)
  compile_s = sum(c["compile"] for c in calls)
  new_tokens = sum(c["new_tokens"] for c in calls)
  print(f"{mode:10s} {len(calls)} sampler calls (streaming: rounds), {new_tokens} new tokens; "
        f"{new_tokens / call_s:,.0f} new tok/s in "
        f"sampler calls ({call_s:.1f} s, of which compiling {compile_s:.1f} s); warm "
        f"{new_tokens / max(call_s - compile_s, 1e-9):,.0f} tok/s; {new_tokens / max(rollout_s, 1e-9):,.0f} over the "
        f"rollouts ({rollout_s:.1f} s; pool's sampling time {sample_s:.1f} s)")
  if mode == "fixed":
    fill = sum(c["real"] for c in calls) / sum(c["B"] for c in calls)
    steps = sum(c["steps"] for c in calls)
    filler = sum(c["steps"] - c["longest_real"] for c in calls)
    wait = sum(c["longest_real"] - c["mean_real"] for c in calls)
    print(f"  breakdown: rows filled {fill:.0%}; decode steps {steps}, of which {filler} ({filler / max(steps, 1):.0%}) "
          f"only for filler rows and {wait:.0f} ({wait / max(steps, 1):.0%}) waiting for each call's longest row")
    per_width = collections.defaultdict(list)
    for c in calls:
      per_width[c["widths"][0] if c["widths"] else 0].append(c)
    for P in sorted(per_width):
      cs = per_width[P]
      print(f"  P={P:4d}: {len(cs):3d} calls, {sum(c['real'] for c in cs) / len(cs):5.1f} real rows/call, steps "
            f"{statistics.mean(c['steps'] for c in cs):5.1f} (longest real {statistics.mean(c['longest_real'] for c in cs):5.1f}, "
            f"mean real {statistics.mean(c['mean_real'] for c in cs):5.1f}), {sum(c['seconds'] for c in cs):6.1f} s")
  else:
    print(f"  breakdown: {stats.prefills} prefills of {stats.prefill_rows} rows (+{stats.shared} slots from a shared "
          f"prefill); {stats.chunks} decode calls, {stats.decode_steps} decode steps; slot-steps {stats.slot_steps}, "
          f"{stats.live_steps / max(stats.slot_steps, 1):.0%} of them drawing tokens; batch sizes "
          f"{sorted(stats.widths)}; cache slots per row {sorted(stats.cache_lengths)}")
  print(f"  outside the sampler {rollout_s - call_s:.1f} s of the rollouts' {rollout_s:.1f} s")


def main(argv) -> None:
  del argv
  config = _CONFIG.value
  label = " ".join(a for a in sys.argv[1:]) or "configs/sge_coding.py"
  monitoring.register_event_duration_secs_listener(_on_event)
  parts = build(config, tempfile.mkdtemp(prefix="loop_sampler-"))
  loop.restore_or_init(parts)  # the config's warm start (cached), as a run starts
  print(f"{label}: {_ITERATIONS.value} rollouts per mode, load {os.getloadavg()[0]:.1f} (cpu count {os.cpu_count()})")
  played = play(parts, _MODES.value)

  all_calls = [c for r in played.values() for c in r.calls]
  widths = collections.Counter(w for c in all_calls for w in c["widths"])
  mean_len = sum(c["new_tokens"] for c in all_calls) / max(sum(c["real"] for c in all_calls), 1)
  n_new = max(int(round(mean_len)), 1)
  speeds = alone(parts, config, widths, n_new)
  weighted = sum(speeds[P] * n for P, n in widths.items()) / sum(widths.values())
  print(f"alone      {weighted:,.0f} new tok/s (full batches of {parts.server.batch_size}, {n_new} new tokens = the "
        f"loop's mean response; per width: " + ", ".join(f"P={P} x{widths[P]}: {speeds[P]:,.0f}" for P in sorted(speeds))
        + ")")
  ratio = None
  for r in played.values():
    report(r)
    warm = sum(c["new_tokens"] for c in r.calls) / max(sum(c["seconds"] - c["compile"] for c in r.calls), 1e-9)
    ratio = weighted / warm
    print(f"  alone / loop (warm): {ratio:.2f}x; the rollouts' response tokens: {r.tokens}")
  print(f"loop_vs_benchmark={ratio:.2f}")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
