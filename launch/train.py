"""Runs an experiment config.

  python launch/train.py --config=configs/sge_coding.py --workdir=runs/sge_coding
  python launch/train.py --config=configs/sge_coding.py:paper --config.model.checkpoint=/path/to/Qwen3-4B

Any config field can be overridden with `--config.a.b=value`; an unknown field or a value of the wrong
type stops the run with a one-line error naming it.

A config whose `method` is registered in explore_jax.methods runs the RL training loop
(explore_jax/train/loop.py): the run directory gets the resolved config, checkpoints, metrics.jsonl,
TensorBoard events and curves.png, and a killed run started again with the same command resumes.

A method that is not implemented yet (SGE, until its issue lands) runs the foundation instead: the
policy is imported onto the mesh, sampled with the method's mixed-temperature schedule, updated a few
times and checkpointed, and the script says plainly that the method's training is not there yet.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from explore_jax import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file[:variant].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: resolved config, checkpoints, metrics.")
flags.mark_flags_as_required(["config"])

DEMO_PROMPTS = (
    "Write a Python function `add(a, b)` that returns the sum of a and b.\n### Strategy\n",
    "Write a Python function `is_even(n)` that tells whether n is even.\n### Strategy\n",
)


def foundation_run(config, workdir: str) -> dict:
  """Imports the policy, samples with the method's schedule, updates, checkpoints; returns a summary."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from explore_jax import hf, sampling
  from explore_jax.hf.parity import padded_batch
  from explore_jax.models import Model
  from explore_jax.parallel import make_mesh
  from explore_jax.parallel.sharding import rules_from_config
  from explore_jax.train import checkpoint, sft, state as state_lib

  t0 = time.time()
  mesh = make_mesh(tuple(config.mesh.shape), tuple(config.mesh.axes))
  rules = rules_from_config(config.sharding_rules)
  pre = hf.load_pretrained(config.model.checkpoint, param_dtype=config.model.param_dtype,
                           dtype=config.model.dtype, mesh=mesh, rules=rules)
  model = Model(pre.config.replace(remat=config.model.remat), mesh=mesh, rules=rules)
  tok = pre.tokenizer
  print(f"[model] {config.model.checkpoint}: {pre.config.num_params() / 1e6:.1f}M parameters on mesh "
        f"{dict(mesh.shape)} ({time.time() - t0:.1f}s)")

  # Sampling with the method's per-segment temperatures (SGE: strategy at tau_s, code at tau).
  prompt, mask = padded_batch(tok, DEMO_PROMPTS * 2, padding_side="left")
  delimiter = tok(config.sge.strategy_delimiter, add_special_tokens=False)["input_ids"]
  params_sampling = sampling.sge_sampling_params(
      config.sge.strategy_temperature, config.sge.temperature, delimiter,
      eos_ids=[tok.eos_token_id], top_p=config.sampling.top_p)
  t0 = time.time()
  out = sampling.generate(model, pre.params, jnp.asarray(prompt), jnp.asarray(mask), params_sampling,
                          jax.random.key(config.seed), max_new_tokens=config.sampling.max_new_tokens,
                          pad_id=tok.pad_token_id)
  jax.block_until_ready(out.tokens)
  new_tokens = int(out.lengths.sum())
  print(f"[sample] {prompt.shape[0]} responses, {new_tokens} tokens in {time.time() - t0:.1f}s "
        f"(compile included); temperatures used: {sorted({round(float(t), 3) for t in np.asarray(out.temperatures)[np.asarray(out.mask)]})}")
  first = np.asarray(out.tokens[0])[: int(out.lengths[0])]
  print(f"[sample] first response: {tok.decode(first)[:160]!r}")

  # A few sharded next-token updates on prompt + response (the SFT step the RL update builds on).
  optimizer = state_lib.make_optimizer(
      config.optimizer.learning_rate, weight_decay=config.optimizer.weight_decay, b1=config.optimizer.b1,
      b2=config.optimizer.b2, eps=config.optimizer.eps, max_grad_norm=config.optimizer.max_grad_norm,
      warmup_steps=config.optimizer.warmup_steps)
  shardings = state_lib.state_shardings(model, optimizer, mesh, rules)
  state = state_lib.create_train_state(pre.params, optimizer, shardings)
  step = sft.make_train_step(model, optimizer, shardings)
  tokens = jnp.concatenate([jnp.asarray(prompt), out.tokens], axis=1)
  batch = {"tokens": tokens, "loss_mask": jnp.concatenate([jnp.zeros_like(mask), out.mask], axis=1),
           "attention_mask": jnp.concatenate([jnp.asarray(mask), out.mask], axis=1)}
  losses = []
  for _ in range(3):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  print(f"[update] 3 sharded AdamW steps on the sampled responses: loss {losses[0]:.4f} -> {losses[-1]:.4f}")

  ckpt_dir = os.path.join(os.path.abspath(workdir), "checkpoints")
  with checkpoint.Checkpointer(ckpt_dir, max_to_keep=config.checkpoint.max_to_keep) as ckpt:
    if ckpt.latest_step() != int(state.step):
      ckpt.save(int(state.step), state, rng=jax.random.key(config.seed),
                metadata={"losses": losses, "config": config.model.checkpoint})
  print(f"[checkpoint] step {int(state.step)} in {ckpt_dir}")
  summary = {"new_tokens": new_tokens, "losses": losses, "checkpoint_dir": ckpt_dir}
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  return summary


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  workdir = _WORKDIR.value or os.path.join("runs", os.path.splitext(os.path.basename(
      flags.FLAGS["config"].config_filename))[0])
  logging.set_verbosity(logging.WARNING)
  from explore_jax.methods import registered_methods

  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))
  if config.get("method") in registered_methods():
    from explore_jax.train.loop import Trainer

    history = Trainer(config, workdir).run()
    last = history[-1] if history else {}
    print(f"[done] iteration {last.get('iteration', 0)}; last: " + ", ".join(
        f"{k}={v:.3f}" for k, v in last.items() if k in ("success_rate", "eval/success_rate", "return")))
    print(f"[done] run directory: {os.path.abspath(workdir)} (metrics.jsonl, curves.png, tensorboard/, checkpoints/)")
    return
  foundation_run(config, workdir)
  print(f"[done] run directory: {os.path.abspath(workdir)}")
  print(f"The {config.get('method', 'RL').upper()} method is not implemented yet; this run exercised model "
        "import, mixed-temperature sampling, the sharded update and checkpointing. Registered methods: "
        f"{', '.join(registered_methods())}.")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
