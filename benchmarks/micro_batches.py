"""Benchmark: one RL update step taken whole and in micro-batches (rl.micro_batch_size), interleaved or by length.

`sft.make_train_step(micro_batches=m)` sums the gradients of m micro-batches of a minibatch under `lax.scan`;
the update is the same (tests/train/test_rl_step.py), the activations are those of one micro-batch at a time.
For each m this prints the step's temporary memory as XLA plans it (the compiled program's
`memory_analysis()`, on the platform it runs on) and the median wall time of `--repeats` steps after a warm-up
(compile time apart), and the process's peak resident memory after each m's steps (ru_maxrss grows only, so the
m are run from the largest m down: each peak is then that m's or an earlier, smaller one's). The default shape
is the ALFWorld tiny recipe's: 64 records of a 448-token prompt and 20-token response on the tiny model.

With `--by_length`, each m is also run as the learner runs it by default (rl.micro_batches_by_length): the
minibatch as `learner.length_sorted_parts`, m parts of rows sorted by prompt length, each cut to its longest
prompt in steps of 64 columns, given to the same step as a list. Its line adds the share of the padded tokens
it computes on against the whole width's. Prompt lengths are uniform between `--prompt_min` (default a quarter
of `--prompt_len`) and `--prompt_len`.

  python benchmarks/micro_batches.py [--preset=tiny] [--batch=64] [--prompt_len=448] [--prompt_min=112]
      [--response_len=20] [--micro=1,2,4,8] [--repeats=3] [--by_length]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from benchmarks.learner import make_batch  # noqa: E402
from explore_jax.models import Model  # noqa: E402
from explore_jax.models.config import PRESETS  # noqa: E402
from explore_jax.rl.losses import PolicyLossConfig  # noqa: E402
from explore_jax.train import state as state_lib  # noqa: E402
from explore_jax.train.learner import _padded_tokens, length_sorted_parts  # noqa: E402
from explore_jax.train.rl_step import make_rl_step  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument("--preset", default="tiny")
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--prompt_len", type=int, default=448)
  parser.add_argument("--prompt_min", type=int, default=0, help="shortest prompt (default: prompt_len // 4)")
  parser.add_argument("--response_len", type=int, default=20)
  parser.add_argument("--micro", default="1,2,4,8", help="micro-batch counts, comma-separated")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--by_length", action="store_true", help="also run each m as length-sorted parts")
  args = parser.parse_args()

  model = Model(PRESETS[args.preset])
  params = model.init(jax.random.key(0))
  rng = np.random.default_rng(0)
  batch = make_batch(rng, model.config.vocab_size, args.batch, args.prompt_len, args.response_len,
                     prompt_min=args.prompt_min or None)
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  batch["behaviour_logprobs"] = jnp.full(batch["response_tokens"].shape, -3.0, jnp.float32)
  batch["valid"] = jnp.ones((args.batch,), bool)
  optimizer = optax.adamw(1e-5)
  config = PolicyLossConfig(aggregation="token-mean")
  print(f"{jax.devices()[0].platform}: {args.preset}, {args.batch} records x ({args.prompt_len} + "
        f"{args.response_len}) tokens")
  for m in sorted((int(x) for x in args.micro.split(",")), reverse=True):
    step = make_rl_step(model, optimizer, config, micro_batches=m)
    state = state_lib.create_train_state(jax.tree.map(jnp.copy, params), optimizer)
    t0 = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    compile_s = time.perf_counter() - t0
    temp_mib = compiled.memory_analysis().temp_size_in_bytes / 2**20
    median, state = timed(step, state, batch, args.repeats)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"micro_batches={m}: step {median:.2f} s (compile {compile_s:.1f} s), "
          f"temporary memory {temp_mib:.0f} MiB, process peak so far {peak_mib:.0f} MiB")
    if args.by_length:
      lengths = np.asarray(batch["prompt_mask"]).sum(1)
      parts = [part for _, part in length_sorted_parts(batch, lengths, args.batch // m)]
      step = make_rl_step(model, optimizer, config)
      t0 = time.perf_counter()
      state, metrics = step(state, parts)  # compiles once per width
      jax.block_until_ready(metrics)
      first_s = time.perf_counter() - t0
      median, state = timed(step, state, parts, args.repeats)
      share = sum(_padded_tokens(part) for part in parts) / _padded_tokens(batch)
      peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
      print(f"micro_batches={m} by length: step {median:.2f} s (first, with its compiles, {first_s:.1f} s), "
            f"{share:.2f} of the padded tokens, widths {sorted({p['prompt_tokens'].shape[1] for p in parts})}, "
            f"process peak so far {peak_mib:.0f} MiB")


def timed(step, state, batch, repeats):
  """The median wall time of `repeats` steps after a warm-up one, and the state they leave."""
  state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - t0)
  return statistics.median(times), state


if __name__ == "__main__":
  main()
