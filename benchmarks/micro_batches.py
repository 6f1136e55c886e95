"""Benchmark: one RL update step taken whole and in micro-batches (rl.micro_batch_size).

`sft.make_train_step(micro_batches=m)` sums the gradients of m micro-batches of a minibatch under `lax.scan`;
the update is the same (tests/train/test_rl_step.py), the activations are those of one micro-batch at a time.
For each m this prints the step's temporary memory as XLA plans it (the compiled program's
`memory_analysis()`, on the platform it runs on) and the median wall time of `--repeats` steps after a warm-up
(compile time apart), and the process's peak resident memory after each m's steps (ru_maxrss grows only, so the
m are run from the largest m down: each peak is then that m's or an earlier, smaller one's). The default shape
is the ALFWorld tiny recipe's: 64 records of a 448-token prompt and 20-token response on the tiny model.

  python benchmarks/micro_batches.py [--preset=tiny] [--batch=64] [--prompt_len=448] [--response_len=20]
      [--micro=1,2,4,8] [--repeats=3]
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
from explore_jax.train.rl_step import make_rl_step  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument("--preset", default="tiny")
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--prompt_len", type=int, default=448)
  parser.add_argument("--response_len", type=int, default=20)
  parser.add_argument("--micro", default="1,2,4,8", help="micro-batch counts, comma-separated")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()

  model = Model(PRESETS[args.preset])
  params = model.init(jax.random.key(0))
  rng = np.random.default_rng(0)
  batch = make_batch(rng, model.config.vocab_size, args.batch, args.prompt_len, args.response_len)
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
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(args.repeats):
      t0 = time.perf_counter()
      state, metrics = step(state, batch)
      jax.block_until_ready(metrics)
      times.append(time.perf_counter() - t0)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"micro_batches={m}: step {statistics.median(times):.2f} s (compile {compile_s:.1f} s), "
          f"temporary memory {temp_mib:.0f} MiB, process peak so far {peak_mib:.0f} MiB")


if __name__ == "__main__":
  main()
