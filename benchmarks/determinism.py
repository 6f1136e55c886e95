"""Determinism fingerprint: hashes of a fixed small workload under this process's settings (prints, asserts nothing).

Two machines (or two settings on one machine) run this and compare one line each:

  .venv/bin/python benchmarks/determinism.py
  XLA_FLAGS=--xla_cpu_multi_thread_eigen=false .venv/bin/python benchmarks/determinism.py
  taskset -c 0 .venv/bin/python benchmarks/determinism.py          # one visible core

The workload is the SFT warm start's arithmetic in miniature, on inputs that are bit-identical on every
machine (integers from numpy's PCG64 only; no floating-point random draws, no files):
  start   the tiny model's shapes; matrices hold integer multiples of 2^-15 scaled to std ~0.02, norm scales
          stay 1: exactly representable, so every machine starts from the same bits
  batch   32 rows x 144 tokens (the coding warm start's batch after its padding trim: prompts of up to 96
          tokens left-padded to random lengths, loss on the 48 response tokens)
  fwd     hash of the forward logits at the start parameters
  grad    hash of loss and gradient at the start parameters (the most sensitive probe: Adam's first updates
          are ~lr * sign(g), so a few steps can hide small gradient differences in the parameters)
  sft     hash of the parameters after --steps AdamW steps (lr 1e-3, clip 1.0: the warm start's optimizer)
          through the project's jitted step (train/sft.py make_train_step)
  fwd2    hash of the forward logits after those steps
  init    hash of Model.init(jax.random.key(0)): the random weights a fresh clone writes as the "tiny"
          checkpoint on first use (hf.tiny_dir)
and, with --demos, of the coding warm start's oracle demonstrations (configs/coding.py's sft block: 512
episodes through the sandbox, slow) and their token arrays.

The first line is the one to compare (`determinism fwd=... grad=... sft=... fwd2=... init=...`); then the
machine (CPU model, vendor, ISA flags, visible cores), the settings in effect (XLA_FLAGS and the other
variables that can matter) and timings (median step time after compilation). `--save=x.npz` keeps the
raw arrays; `--compare=y.npz` prints the largest differences against another run's file (also in ulps of
float32 at each array's largest element), so two machines can see how far apart they are, not only that they differ.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from explore_jax.train import provenance  # noqa: E402

ENV_VARS = ("XLA_FLAGS", "JAX_PLATFORMS", "JAX_ENABLE_X64", "JAX_DEFAULT_MATMUL_PRECISION", "ONEDNN_MAX_CPU_ISA",
            "DNNL_MAX_CPU_ISA", "OMP_NUM_THREADS", "PYTHONHASHSEED", "TF_CPP_MIN_LOG_LEVEL")
def digest(*arrays) -> str:
  h = hashlib.sha256()
  for a in arrays:
    a = np.ascontiguousarray(np.asarray(a))
    h.update(str(a.dtype).encode() + str(a.shape).encode())
    h.update(a.tobytes())
  return h.hexdigest()[:12]


def fixed_params(model, seed: int = 0):
  """The tiny model's parameter tree with exactly representable values (same bits on every machine)."""
  import jax
  shapes = jax.eval_shape(model.init, jax.random.key(0))
  rng = np.random.default_rng(seed)
  paths = jax.tree_util.tree_flatten_with_path(shapes)[0]
  out = []
  for path, s in paths:
    name = jax.tree_util.keystr(path).lower()
    if "norm" in name:
      out.append(np.ones(s.shape, np.float32))
    else:  # uniform integers in [-2^15, 2^15) times 2^-15 * 0.0346 (std 0.02); float64 -> float32 is exact enough
      q = rng.integers(-2**15, 2**15, s.shape).astype(np.float32)
      out.append(q * np.float32(0.02 * 3**0.5 / 2**15))
  return jax.tree.unflatten(jax.tree.structure(shapes), out)


def fixed_batch(vocab: int, batch: int, prompt_len: int, response_len: int, seed: int = 1):
  rng = np.random.default_rng(seed)
  width = prompt_len + response_len
  tokens = rng.integers(1, vocab, (batch, width)).astype(np.int32)
  lengths = rng.integers(prompt_len // 4, prompt_len + 1, batch)
  attention = np.arange(width)[None] >= (prompt_len - lengths)[:, None]
  loss = np.zeros_like(attention)
  loss[:, prompt_len:] = True
  tokens = np.where(attention, tokens, 0).astype(np.int32)
  return {"tokens": tokens, "attention_mask": attention, "loss_mask": loss}


def demos_digest() -> tuple[str, str, int]:
  """The coding warm start's oracle demonstrations (configs/coding.py, method sge) and their token arrays."""
  import json
  from configs import coding
  from explore_jax import hf
  from explore_jax.methods import make_method
  from explore_jax.train import sft_data, warm_start
  config = coding.get_config("sge")
  method = make_method(config)
  req = warm_start.request(config, method.prompt_hook())
  text = json.dumps(list(req.demonstrations), sort_keys=True).encode()
  tok = hf.load_tokenizer(hf.TINY_ASSETS)
  arrays = sft_data.tokenize_demos(tok, list(req.demonstrations), config.rollout.max_prompt_tokens,
                                   config.rollout.max_new_tokens)
  return hashlib.sha256(text).hexdigest()[:12], digest(*(arrays[k] for k in sorted(arrays))), len(req.demonstrations)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--steps", type=int, default=10, help="AdamW steps of the SFT part")
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--prompt_len", type=int, default=96)
  p.add_argument("--response_len", type=int, default=48)
  p.add_argument("--label", default="", help="a name printed on the first line")
  p.add_argument("--demos", action="store_true", help="also hash the coding warm start's oracle demonstrations")
  p.add_argument("--save", default="", help="write the raw results to this .npz")
  p.add_argument("--compare", default="", help="print the largest differences against another run's .npz")
  args = p.parse_args()

  t_import = time.perf_counter()
  import jax
  import jax.numpy as jnp
  from explore_jax.models import Model
  from explore_jax.models.config import PRESETS
  from explore_jax.train import sft, state as state_lib

  model = Model(PRESETS["tiny"])
  params = fixed_params(model)
  batch = fixed_batch(model.config.vocab_size, args.batch, args.prompt_len, args.response_len)
  mask = batch["attention_mask"]
  positions = np.maximum(np.cumsum(mask, -1) - 1, 0).astype(np.int32)
  forward = jax.jit(lambda p, t, pos, m: model.apply(p, t, pos, attention_mask=m).logits)
  grad_fn = jax.jit(jax.value_and_grad(lambda p, b: sft.next_token_loss(model, p, b)[0]))

  t0 = time.perf_counter()
  logits0 = np.asarray(forward(params, batch["tokens"], positions, mask))
  t_fwd_first = time.perf_counter() - t0
  fwd_times = []
  for _ in range(3):
    t0 = time.perf_counter()
    jax.block_until_ready(forward(params, batch["tokens"], positions, mask))
    fwd_times.append(time.perf_counter() - t0)
  loss0, grads0 = jax.device_get(grad_fn(params, batch))

  opt = state_lib.make_optimizer(1e-3, max_grad_norm=1.0)
  st = state_lib.create_train_state(jax.tree.map(jnp.asarray, params), opt)
  step = sft.make_train_step(model, opt)
  losses, step_times = [], []
  for i in range(args.steps):
    t0 = time.perf_counter()
    st, m = step(st, batch)
    losses.append(float(m["loss"]))  # blocks on the step
    step_times.append(time.perf_counter() - t0)
  params1 = jax.device_get(st.params)
  logits1 = np.asarray(forward(params1, batch["tokens"], positions, mask))
  init = jax.device_get(model.init(jax.random.key(0)))
  t_total = time.perf_counter() - t_import

  grad_leaves = jax.tree.leaves(grads0)
  h = {"fwd": digest(logits0), "grad": digest(loss0, *grad_leaves), "sft": digest(*jax.tree.leaves(params1)),
       "fwd2": digest(logits1), "init": digest(*jax.tree.leaves(init))}
  line = " ".join(f"{k}={v}" for k, v in h.items())
  if args.demos:
    dtext, dtok, n = demos_digest()
    line += f" demos={dtext} demo_tokens={dtok} n_demos={n}"
  print(f"determinism {line} steps={args.steps} loss0={float(loss0)!r} loss_last={losses[-1]!r}"
        + (f" label={args.label}" if args.label else ""))

  cpu = provenance.machine()
  threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else -1
  print(f"machine: {cpu['cpu']} | vendor={cpu['vendor']} | isa={cpu['isa']} | tag={provenance.machine_tag(cpu)} | "
        f"visible_cores={cpu['visible_cores']} of cpu_count={os.cpu_count()} | process_threads={threads}")
  env = {k: os.environ[k] for k in ENV_VARS if k in os.environ}
  print(f"settings: {env or 'no XLA/JAX/oneDNN/OMP variables set'} | jax {jax.__version__} "
        f"jaxlib {jax.lib.__version__} numpy {np.__version__} python {sys.version.split()[0]} | "
        f"backend={jax.default_backend()} devices={jax.device_count()} "
        f"matmul_precision={jax.config.jax_default_matmul_precision}")
  step_ms = statistics.median(step_times[1:]) * 1e3 if len(step_times) > 1 else float("nan")
  print(f"timing: sft step {step_ms:.1f} ms (median of {max(len(step_times) - 1, 0)} after the first), first step "
        f"(compile) {step_times[0]:.2f} s, forward {statistics.median(fwd_times) * 1e3:.1f} ms (first "
        f"{t_fwd_first:.2f} s), total {t_total:.1f} s")

  arrays = {"logits0": logits0, "loss0": np.asarray(loss0), "logits1": logits1, "losses": np.asarray(losses)}
  arrays.update({f"grad_{i}": np.asarray(g) for i, g in enumerate(grad_leaves)})
  arrays.update({f"sft_{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(params1))})
  arrays.update({f"init_{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(init))})
  if args.save:
    np.savez(args.save, **arrays)
  if args.compare:
    other = np.load(args.compare)
    groups: dict[str, list[tuple[float, float, int]]] = {}
    for k, a in arrays.items():
      if k not in other or other[k].shape != a.shape:
        continue
      b = other[k].astype(np.float64)
      a64 = a.astype(np.float64)
      diff = np.abs(a64 - b)
      scale = float(np.spacing(np.float32(max(np.abs(b).max(initial=0.0), 1e-30))))  # an ulp of the largest element
      g = k.split("_")[0]
      groups.setdefault(g, []).append((float(diff.max(initial=0.0)), float(diff.max(initial=0.0)) / scale,
                                      int((diff > 0).sum())))
    for g, rows in groups.items():
      print(f"compare {g}: max |diff| {max(r[0] for r in rows):.3g}, {max(r[1] for r in rows):.3g} ulp of the largest element, "
            f"{sum(r[2] for r in rows)} elements differ")


if __name__ == "__main__":
  main()
