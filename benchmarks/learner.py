"""Benchmark: the learner's loss and gradient with response-only logits against full-sequence logits.

The RL loss needs log-probs of the response tokens only. `sampling.response_logprobs` runs the model
over prompt + response but projects only the last N + 1 hidden states onto the vocabulary; the peer
projects every position (`sampling.token_logprobs` on the concatenation, as a generic scorer must) and
keeps the response's columns. Both compute the same numbers: they are checked to agree before timing.
Each side is one jitted `value_and_grad` of the token-mean policy loss; times are the median of
`--repeats` calls after a warm-up call (compile time printed separately).

  python benchmarks/learner.py                     # tiny model, batch 32, prompt 256, response 48
  python benchmarks/learner.py --preset=qwen3-0.6b --dtype=bfloat16 --batch=8 --prompt_len=2048 \
      --response_len=512                           # on an accelerator

The last line is `speedup_vs_full_sequence_logits=<x>` (peer time / our time).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from explore_jax.models import Model
from explore_jax.models.config import PRESETS
from explore_jax.rl.losses import PolicyLossConfig, policy_loss
from explore_jax.sampling import response_logprobs, token_logprobs


def make_batch(rng: np.random.Generator, vocab: int, batch: int, prompt_len: int, response_len: int,
               prompt_min: Optional[int] = None):
  """Left-padded prompts of random lengths (from `prompt_min`, by default a quarter of `prompt_len`), responses
  of random lengths, two temperatures."""
  prompt = rng.integers(1, vocab, (batch, prompt_len)).astype(np.int32)
  lengths = rng.integers(prompt_len // 4 if prompt_min is None else prompt_min, prompt_len + 1, batch)
  prompt_mask = np.arange(prompt_len)[None] >= (prompt_len - lengths)[:, None]
  response = rng.integers(1, vocab, (batch, response_len)).astype(np.int32)
  response_mask = np.arange(response_len)[None] < rng.integers(1, response_len + 1, batch)[:, None]
  temps = np.where(np.arange(response_len)[None] < response_len // 2, 1.2, 0.7).astype(np.float32)
  temps = np.where(response_mask, temps, 0.0).astype(np.float32)
  return {"prompt_tokens": prompt, "prompt_mask": prompt_mask, "response_tokens": response,
          "response_mask": response_mask, "temperatures": temps,
          "advantages": rng.standard_normal(batch).astype(np.float32)}


def full_sequence_logprobs(model, params, batch):
  """The peer: score every position of prompt + response, keep the response's columns."""
  P = batch["prompt_tokens"].shape[1]
  tokens = jnp.concatenate([batch["prompt_tokens"], batch["response_tokens"]], axis=1)
  mask = jnp.concatenate([batch["prompt_mask"], batch["response_mask"]], axis=1)
  temps = jnp.concatenate([jnp.zeros(batch["prompt_tokens"].shape, jnp.float32), batch["temperatures"]], 1)
  return token_logprobs(model, params, tokens, temps, mask, return_entropy=True).logprobs[:, P:]


def response_only_logprobs(model, params, batch):
  return response_logprobs(model, params, batch["prompt_tokens"], batch["prompt_mask"],
                           batch["response_tokens"], batch["response_mask"], batch["temperatures"],
                           return_entropy=True).logprobs


def make_step(model, scorer):
  config = PolicyLossConfig()

  def loss(params, batch):
    logp = scorer(model, params, batch)
    mask = batch["response_mask"]
    return policy_loss(logp, jax.lax.stop_gradient(logp), batch["advantages"], mask, config)[0]

  return jax.jit(jax.value_and_grad(loss))


def timed(fn, *args, repeats: int) -> tuple[float, float]:
  """(first call incl. compile, median steady-state call) in seconds."""
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  first = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return first, statistics.median(times)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--prompt_len", type=int, default=256)
  parser.add_argument("--response_len", type=int, default=48)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()

  config = dataclasses.replace(PRESETS[args.preset], dtype=args.dtype, param_dtype=args.dtype)
  model = Model(config)
  params = jax.jit(model.init)(jax.random.key(0))
  batch = {k: jnp.asarray(v) for k, v in make_batch(np.random.default_rng(0), config.vocab_size, args.batch,
                                                     args.prompt_len, args.response_len).items()}
  ours, peer = make_step(model, response_only_logprobs), make_step(model, full_sequence_logprobs)

  (loss_ours, grad_ours), (loss_peer, grad_peer) = ours(params, batch), peer(params, batch)
  tol = 1e-4 if args.dtype == "float32" else 5e-2
  np.testing.assert_allclose(float(loss_ours), float(loss_peer), rtol=tol, atol=tol)
  for a, b in zip(jax.tree.leaves(grad_ours), jax.tree.leaves(grad_peer)):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol)

  # Fresh jits for the timings, so "first call" includes compilation.
  ours, peer = make_step(model, response_only_logprobs), make_step(model, full_sequence_logprobs)
  compile_peer, t_peer = timed(peer, params, batch, repeats=args.repeats)
  compile_ours, t_ours = timed(ours, params, batch, repeats=args.repeats)
  B, P, N, V = args.batch, args.prompt_len, args.response_len, config.vocab_size
  print(f"device={jax.devices()[0].device_kind} preset={args.preset} dtype={args.dtype} "
        f"batch={B} prompt={P} response={N} vocab={V}")
  print(f"logits tensor: response-only {B * (N + 1) * V * 4 / 2**20:.1f} MiB, "
        f"full sequence {B * (P + N) * V * 4 / 2**20:.1f} MiB (float32)")
  print(f"response-only logits: {t_ours * 1e3:.1f} ms per loss+grad (first call {compile_ours:.1f} s)")
  print(f"full-sequence logits: {t_peer * 1e3:.1f} ms per loss+grad (first call {compile_peer:.1f} s)")
  print(f"speedup_vs_full_sequence_logits={t_peer / t_ours:.2f}")


if __name__ == "__main__":
  main()
