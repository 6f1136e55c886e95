"""LoRA in training: the shared train step differentiates the adapters only, LoRA trains the tiny model on the
mesh, and a run with config.model.lora keeps, checkpoints and samples with adapters on a frozen base."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import grpo_keydoor
from explore_jax import hf
from explore_jax.hf import peft_format, safetensors_io
from explore_jax.models import PRESETS, Model
from explore_jax.models import lora as lora_lib
from explore_jax.models.config import ModelConfig
from explore_jax.parallel import make_mesh, sharding
from explore_jax.train import loop, sft
from explore_jax.train import state as state_lib
from explore_jax.train.builder import build

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=8, qk_norm=True)
LORA = lora_lib.LoraConfig(rank=4, alpha=8.0, target_modules=("all-linear",))


def _batch(vocab, rows=4, length=16, seed=0):
  tokens = np.random.default_rng(seed).integers(1, vocab, (rows, length)).astype(np.int32)
  return {"tokens": tokens, "loss_mask": np.ones_like(tokens, bool)}


def _size(tree):
  return sum(x.size for x in jax.tree.leaves(tree))


def test_gradient_and_optimizer_state_reach_only_the_adapters():
  model = Model(SMALL)
  base = model.init(jax.random.key(0), std=0.1)
  base_copy = jax.tree.map(np.array, base)
  adapters = lora_lib.init(SMALL, LORA)
  batch = _batch(SMALL.vocab_size)

  grads = jax.grad(lambda a: sft.next_token_loss(model, lora_lib.adapted(base, a, LORA), batch)[0])(adapters)
  assert jax.tree.structure(grads) == jax.tree.structure(adapters)
  for leaf in LORA.leaves:  # with B = 0 only B's gradient is non-zero, in every layer (LoRA's first step)
    b = np.asarray(grads[leaf]["b"]).reshape(SMALL.num_layers, -1)
    assert (np.abs(b).max(axis=1) > 0).all(), leaf
    assert not np.asarray(grads[leaf]["a"]).any(), leaf

  optimizer = state_lib.make_optimizer(1e-2)
  state = state_lib.create_train_state(adapters, optimizer)
  moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim > 0]
  assert sum(x.size for x in moments) == 2 * _size(adapters)  # Adam's mu and nu of the adapters, nothing else
  step = sft.make_train_step(model, optimizer, lora=LORA, base=base)
  first = jax.tree.map(np.array, state.params)
  for _ in range(2):
    state, metrics = step(state, batch)
    assert int(metrics["skipped"]) == 0
  for leaf in LORA.leaves:  # B moves at step 1, A once B is non-zero
    assert not np.array_equal(np.asarray(state.params[leaf]["b"]), first[leaf]["b"])
    assert not np.array_equal(np.asarray(state.params[leaf]["a"]), first[leaf]["a"])
  # The base is an argument of the step, neither donated nor changed.
  for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(base_copy)):
    np.testing.assert_array_equal(np.asarray(a), b)
  with pytest.raises(ValueError, match="needs both"):
    sft.make_train_step(model, optimizer, lora=LORA)


def test_lora_trains_the_tiny_model_on_the_mesh():
  """The built-in tiny model, sharded (data 2 x tensor 4), learns a fixed batch with adapters only."""
  mesh = make_mesh((2, 1, 4), ("data", "fsdp", "tensor"))
  rules = sharding.DEFAULT_RULES
  model = Model(PRESETS["tiny"], mesh=mesh, rules=rules)
  base_sh = sharding.tree_shardings(mesh, model.param_axes(), rules, model.param_shapes())
  base = jax.jit(lambda: model.init(jax.random.key(0)), out_shardings=base_sh)()
  lora = lora_lib.LoraConfig(rank=8, alpha=16.0, target_modules=("q_proj", "v_proj", "o_proj", "down_proj"))
  optimizer = state_lib.make_optimizer(1e-2)
  shardings = state_lib.state_shardings(model, optimizer, mesh, rules, lora)
  state = state_lib.create_train_state(lora_lib.init(model.config, lora), optimizer, shardings)
  assert state.params["q"]["b"].sharding.spec == jax.sharding.PartitionSpec(None, None, "tensor", None)
  step = sft.make_train_step(model, optimizer, shardings, lora=lora, base=base)
  batch = _batch(model.config.vocab_size, rows=8, length=24)
  losses = []
  for _ in range(8):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  assert losses[-1] < losses[0] - 1.0, losses
  assert _size(state.params) < 0.05 * _size(base)


def test_a_batch_in_parts_of_its_own_widths_is_the_whole_batchs_lora_step_on_the_mesh():
  """make_train_step given a list of parts (rows cut to the columns they use, as the learner's length-sorted
  micro-batches are): with LoRA on a data 2 x tensor 4 mesh, the same loss and adapters as the whole batch."""
  mesh = make_mesh((2, 1, 4), ("data", "fsdp", "tensor"))
  model = Model(SMALL, mesh=mesh, rules=sharding.DEFAULT_RULES)
  base_sh = sharding.tree_shardings(mesh, model.param_axes(), sharding.DEFAULT_RULES, model.param_shapes())
  base = jax.jit(lambda: model.init(jax.random.key(0), std=0.1), out_shardings=base_sh)()
  optimizer = optax.sgd(0.5)
  shardings = state_lib.state_shardings(model, optimizer, mesh, sharding.DEFAULT_RULES, LORA)
  adapters = jax.tree.map(lambda x: x + 0.01, lora_lib.init(SMALL, LORA))  # B != 0: both A and B move
  batch = _batch(SMALL.vocab_size, rows=8, length=24)
  batch["attention_mask"] = np.ones_like(batch["tokens"], bool)
  batch["attention_mask"][4:, :8] = False  # rows 4-7 are left-padded by 8 columns
  batch["loss_mask"][:, :12] = False  # a 12-column prompt, then the targets: as every layout has
  parts = [{k: v[:4] for k, v in batch.items()}, {k: v[4:, 8:] for k, v in batch.items()}]
  step = sft.make_train_step(model, optimizer, shardings, lora=LORA, base=base)
  out = {}
  for name, given in (("whole", batch), ("parts", parts)):
    state = state_lib.create_train_state(jax.tree.map(jnp.copy, adapters), optimizer, shardings)
    state, metrics = step(state, given)
    out[name] = jax.device_get((state.params, metrics))
  (whole_params, whole), (got_params, got) = out["whole"], out["parts"]
  for k in whole:
    np.testing.assert_allclose(got[k], whole[k], rtol=2e-5, atol=1e-6, err_msg=k)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), got_params, whole_params)
  assert not np.allclose(whole_params["q"]["a"], jax.device_get(adapters)["q"]["a"])  # it did move


def _lora_config():
  c = grpo_keydoor.get_config()
  c.mesh.shape = (2, 1, 4)
  c.model.lora.rank = 4
  c.rollout.num_tasks, c.rollout.group_size = 2, 2
  c.rl.minibatch_size = 4
  c.rl.loss.kl_coef = 0.1  # the reference policy is then adapters too
  c.sft.oracle_episodes, c.sft.steps, c.sft.batch_size = 4, 3, 4
  return c


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
  """A LoRA run directory at iteration 0: built, warm-started by SFT on the adapters, checkpointed."""
  cache = str(tmp_path_factory.mktemp("cache"))
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("EXPLORE_JAX_CACHE", cache)
    parts = build(_lora_config(), str(tmp_path_factory.mktemp("lora_run")))
    assert loop.restore_or_init(parts) == 0
  return parts, cache


def test_a_lora_run_trains_checkpoints_and_samples_adapters(lora_run):
  parts, _ = lora_run
  learner, server, lora = parts.learner, parts.server, parts.learner.lora
  assert lora == lora_lib.LoraConfig(rank=4, alpha=32.0, target_modules=("all-linear",))
  # The train state and the checkpoint hold the adapters and their optimizer state, not the base.
  assert jax.tree.structure(learner.state.params) == jax.tree.structure(lora_lib.shapes(parts.model.config, lora))
  base_size = _size(learner.base_params)
  assert _size(learner.checkpoint_tree()) < 0.2 * base_size
  saved = loop.load_params(parts, 0)
  for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(learner.state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The SFT warm start trained the adapters (B moved off zero) and left the base as loaded.
  assert float(jnp.abs(learner.state.params["q"]["b"]).max()) > 0
  pre = hf.load_pretrained(parts.checkpoint_dir, with_tokenizer=False)
  for a, b in zip(jax.tree.leaves(learner.base_params), jax.tree.leaves(pre.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The sampler gets the merged policy.
  merged = server.policy_params(learner.state.params)["layers"]["up"]
  want = lora_lib.merge(learner.base_params, learner.state.params, lora)["layers"]["up"]
  np.testing.assert_array_equal(np.asarray(merged), np.asarray(want))
  assert not np.array_equal(np.asarray(merged), np.asarray(learner.base_params["layers"]["up"]))

  # One RL update with the KL term against the step-0 adapters: only the adapters move.
  rng = np.random.default_rng(0)
  n, p, r = 4, 8, 4
  batch = {"prompt_tokens": jnp.asarray(rng.integers(1, 100, (n, p)), jnp.int32), "prompt_mask": jnp.ones((n, p), bool),
           "response_tokens": jnp.asarray(rng.integers(1, 100, (n, r)), jnp.int32),
           "response_mask": jnp.ones((n, r), bool), "temperatures": jnp.ones((n, r)),
           "behaviour_logprobs": jnp.full((n, r), -4.0), "advantages": jnp.asarray([1.0, -1.0, 0.5, -0.5]),
           "valid": jnp.ones((n,), bool)}
  before = jax.tree.map(np.array, learner.state.params)
  metrics = learner.update(batch, 0)
  assert metrics["update/skipped"] == 0.0 and np.isfinite(metrics["update/loss"])
  assert not np.array_equal(np.asarray(learner.state.params["q"]["b"]), before["q"]["b"])
  for a, b in zip(jax.tree.leaves(learner.base_params), jax.tree.leaves(pre.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_export_cli_writes_peft_adapters_and_the_merged_model(lora_run, tmp_path):
  parts, cache = lora_run
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out = tmp_path / "export"
  run = subprocess.run([sys.executable, os.path.join(REPO, "launch", "export.py"), "--config=configs/grpo_keydoor.py",
                        "--config.model.lora.rank=4", f"--run={parts.workdir}", "--step=0", f"--output={out}",
                        "--merged"], capture_output=True, text=True, timeout=600, cwd=REPO,
                       env={**env, "EXPLORE_JAX_CACHE": cache})
  assert run.returncode == 0, run.stderr[-3000:]
  adapters, lora = loop.load_params(parts, 0), parts.learner.lora
  written = safetensors_io.SafetensorsFile(str(out / peft_format.WEIGHTS_FILE))
  want = peft_format.peft_tensors(parts.model.config, adapters, lora)
  assert sorted(written.keys()) == sorted(want)
  for name, value in want.items():
    np.testing.assert_array_equal(written.get(name), value)
  # The export ran on one device, this merge on eight: the same sums, not always the same last bit.
  merged = hf.load_pretrained(str(out / "merged"), with_tokenizer=False).params
  for a, b in zip(jax.tree.leaves(merged), jax.tree.leaves(lora_lib.merge(parts.learner.base_params, adapters, lora))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-8)
