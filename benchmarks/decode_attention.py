"""Benchmark: one decode step's attention over a per-row KV cache, per implementation (models/decode_attention.py).

B rows of one query token, H query heads over K kv heads of size D, a cache of S slots per row, each row's keys a
range of `--fill` of the cache on average (uniform lengths up to 2 x fill x S, clipped to S). Times each
implementation (jitted, best of --repeats after a warm-up) and prints milliseconds per call, the bytes the dense
path reads (the whole cache) and each implementation's time against dense in the same run; on an accelerator
`pallas` is the GPU kernel, elsewhere it is skipped (its interpreter is a correctness check, not a speed).
Prints, asserts nothing.

  .venv/bin/python benchmarks/decode_attention.py                              # CPU: B 32, S 512
  python benchmarks/decode_attention.py --batch=64 --cache=4096 --heads=16 --kv_heads=8 --head_dim=128 \\
      --dtype=bfloat16                                                         # an accelerator
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from explore_jax.models import decode_attention as da  # noqa: E402


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--cache", type=int, default=512)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--kv_heads", type=int, default=4)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--fill", type=float, default=0.25)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--repeats", type=int, default=20)
  args = parser.parse_args()

  B, S, H, K, D = args.batch, args.cache, args.heads, args.kv_heads, args.head_dim
  dtype = jnp.dtype(args.dtype)
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.normal(size=(B, 1, H, D)), dtype)
  k, v = (jnp.asarray(rng.normal(size=(B, K, S, D)), dtype) for _ in range(2))
  lengths = np.clip(rng.integers(1, max(2, int(2 * args.fill * S)), B), 1, S)
  start = jnp.asarray(rng.integers(0, S - lengths + 1), jnp.int32)
  end = start + jnp.asarray(lengths, jnp.int32)
  impls = ["dense", "blocked"] + (["pallas"] if jax.default_backend() == "gpu" else [])
  print(f"{jax.devices()[0].device_kind}: B {B}, cache {S}, H {H} over K {K}, D {D}, {args.dtype}; mean keys per "
        f"row {lengths.mean():.0f} ({lengths.mean() / S:.0%} of the cache); dense reads "
        f"{2 * B * K * S * D * dtype.itemsize / 1e6:.1f} MB of keys and values")
  times = {}
  for impl in impls:
    fn = jax.jit(lambda q, k, v, s, e, impl=impl: da.decode_attention(q, k, v, s, e, impl))
    jax.block_until_ready(fn(q, k, v, start, end))
    best = float("inf")
    for _ in range(args.repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(fn(q, k, v, start, end))
      best = min(best, time.perf_counter() - t0)
    times[impl] = best
    print(f"{impl:8s} {best * 1e3:8.3f} ms per call ({times['dense'] / best:.2f}x dense)")


if __name__ == "__main__":
  main()
