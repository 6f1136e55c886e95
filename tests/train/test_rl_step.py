"""The RL update on sampled records: ratio starts at 1, positive advantages raise their responses' log-probs;
micro-batches make the same update in a fraction of the memory."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from explore_jax import sampling
from explore_jax.models import Model, ModelConfig
from explore_jax.rl.losses import PolicyLossConfig
from explore_jax.train import sft
from explore_jax.train import state as state_lib
from explore_jax.train.rl_step import make_rl_step, rl_loss

CONFIG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8)


def sampled_batch(model, params, temps=(1.3, 0.6)):
  prompt = jnp.asarray(np.random.default_rng(0).integers(1, 64, (8, 6)), jnp.int32)
  mask = jnp.ones_like(prompt, bool).at[:4, :2].set(False)  # left padding on half the rows
  sp = sampling.make_sampling_params(list(temps), [[5]], eos_ids=[0])
  out = sampling.generate(model, params, prompt, mask, sp, jax.random.key(1), max_new_tokens=6)
  return {"prompt_tokens": prompt, "prompt_mask": mask, "response_tokens": out.tokens,
          "response_mask": out.mask, "temperatures": out.temperatures, "behaviour_logprobs": out.logprobs,
          "advantages": jnp.asarray([1.0, -1.0] * 4), "valid": jnp.ones((8,), bool)}


def test_fresh_batch_has_ratio_one_and_no_clipping():
  model = Model(CONFIG)
  params = model.init(jax.random.key(0), std=0.3)
  batch = sampled_batch(model, params)
  _, metrics = rl_loss(model, params, batch, PolicyLossConfig())
  np.testing.assert_allclose(float(metrics["ratio_mean"]), 1.0, atol=1e-5)
  assert float(metrics["clipfrac_low"]) == 0.0 and float(metrics["clipfrac_high"]) == 0.0


def test_update_moves_log_probs_in_the_advantage_direction():
  model = Model(CONFIG)
  params = model.init(jax.random.key(0), std=0.3)
  batch = sampled_batch(model, params)
  opt = state_lib.make_optimizer(1e-2)
  state = state_lib.create_train_state(params, opt)
  step = make_rl_step(model, opt, PolicyLossConfig(aggregation="seq-mean-token-sum"))

  def seq_logp(p):
    out = sampling.response_logprobs(model, p, batch["prompt_tokens"], batch["prompt_mask"],
                                     batch["response_tokens"], batch["response_mask"], batch["temperatures"])
    return np.asarray(jnp.sum(out.logprobs, axis=1))

  before = seq_logp(params)
  for _ in range(3):
    state, metrics = step(state, batch)
  delta = seq_logp(state.params) - before
  assert int(metrics["skipped"]) == 0
  assert (delta[0::2] > 0).all() and (delta[1::2] < 0).all(), delta


def test_invalid_rows_do_not_contribute():
  model = Model(CONFIG)
  params = model.init(jax.random.key(0), std=0.3)
  batch = sampled_batch(model, params)
  poisoned = {**batch, "advantages": batch["advantages"].at[0].set(1e6), "valid": batch["valid"].at[0].set(False)}
  clean = {**batch, "valid": batch["valid"].at[0].set(False)}
  g1 = jax.grad(lambda p: rl_loss(model, p, poisoned, PolicyLossConfig())[0])(params)
  g2 = jax.grad(lambda p: rl_loss(model, p, clean, PolicyLossConfig())[0])(params)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_array_equal(a, b)


def test_kl_term_against_the_reference_is_zero_at_start_and_grows():
  from explore_jax.train.rl_step import make_reference_logprobs

  model = Model(CONFIG)
  params = model.init(jax.random.key(0), std=0.3)
  batch = sampled_batch(model, params)
  batch["ref_logprobs"] = make_reference_logprobs(model)(params, batch)
  cfg = PolicyLossConfig(kl_coef=0.1, kl_type="k3")
  _, m0 = rl_loss(model, params, batch, cfg)
  assert abs(float(m0["kl_loss"])) < 1e-6
  moved = jax.tree.map(lambda p: p + 0.05 * jax.random.normal(jax.random.key(3), p.shape), params)
  _, m1 = rl_loss(model, moved, batch, cfg)
  assert float(m1["kl_loss"]) > 1e-4


def test_trimming_all_padding_prompt_columns_changes_nothing():
  from explore_jax.train.learner import _trim_prompt_padding

  model = Model(CONFIG)
  params = model.init(jax.random.key(0), std=0.3)
  batch = sampled_batch(model, params)
  pad = 70  # every prompt gets 70 more columns of left padding; 64 of them can go
  wide = {**batch, "prompt_tokens": jnp.pad(batch["prompt_tokens"], ((0, 0), (pad, 0))),
          "prompt_mask": jnp.pad(batch["prompt_mask"], ((0, 0), (pad, 0)))}
  trimmed = _trim_prompt_padding(wide, np.arange(8))
  assert trimmed["prompt_tokens"].shape[1] == batch["prompt_tokens"].shape[1] + pad - 64
  a, _ = rl_loss(model, params, wide, PolicyLossConfig())
  b, _ = rl_loss(model, params, trimmed, PolicyLossConfig())
  np.testing.assert_allclose(float(a), float(b), rtol=1e-5)
  # Columns a used row needs are kept even if other rows are padding there.
  wide["prompt_mask"] = wide["prompt_mask"].at[3, 0].set(True)
  assert _trim_prompt_padding(wide, np.arange(8))["prompt_tokens"].shape[1] == wide["prompt_tokens"].shape[1]
  assert _trim_prompt_padding(wide, np.array([0, 1]))["prompt_tokens"].shape[1] < wide["prompt_tokens"].shape[1]


def _wide_batch(rows=32, prompt_len=64, response_len=8):
  """Random records with left-padded prompts, responses of varied lengths, and two invalid rows."""
  rng = np.random.default_rng(3)
  prompt_mask = np.arange(prompt_len)[None] >= rng.integers(0, prompt_len // 2, rows)[:, None]
  response_mask = np.arange(response_len)[None] < rng.integers(1, response_len + 1, rows)[:, None]
  response_mask[7] = False  # an empty response: no tokens, no sequence
  return {"prompt_tokens": jnp.asarray(rng.integers(1, 64, (rows, prompt_len)), jnp.int32),
          "prompt_mask": jnp.asarray(prompt_mask),
          "response_tokens": jnp.asarray(rng.integers(1, 64, (rows, response_len)), jnp.int32),
          "response_mask": jnp.asarray(response_mask),
          "temperatures": jnp.asarray(rng.uniform(0.5, 1.5, (rows, response_len)), jnp.float32),
          "behaviour_logprobs": jnp.asarray(rng.uniform(-6.0, -2.0, (rows, response_len)), jnp.float32),
          "ref_logprobs": jnp.asarray(rng.uniform(-6.0, -2.0, (rows, response_len)), jnp.float32),
          "advantages": jnp.asarray(rng.normal(size=rows), jnp.float32),
          "valid": jnp.asarray(np.arange(rows) % 11 != 5)}


def test_micro_batches_make_the_whole_minibatchs_update():
  """The gradient summed over 4 micro-batches is the whole minibatch's, with the KL and entropy terms: the same
  loss, metrics and (plain SGD, so any gradient difference shows) step. Every aggregation's shares add up on
  their own (tests/rl/test_losses.py)."""
  aggregation = "seq-mean-token-mean"
  model = Model(CONFIG)
  params = model.init(jax.random.key(0), std=0.3)
  batch = _wide_batch()
  config = PolicyLossConfig(aggregation=aggregation, eps_low=0.1, kl_coef=0.1, entropy_coef=0.01, max_len=8)
  opt = optax.sgd(1.0)
  out = {}
  for m in (1, 4):
    step = make_rl_step(model, opt, config, micro_batches=m)
    state, metrics = step(state_lib.create_train_state(jax.tree.map(jnp.copy, params), opt), batch)
    out[m] = (jax.device_get(state.params), jax.device_get(metrics))
  whole = out[1][1]
  assert whole["clipfrac_low"] + whole["clipfrac_high"] > 0 and whole["response_tokens"] > 100  # all terms on
  _assert_same_update(out[4], out[1], params)


def _assert_same_update(got, whole, params):
  """(params, metrics) of two steps from `params`: the same metrics and parameters up to float sums, and moved."""
  (got_params, got), (whole_params, whole) = got, whole
  assert got.keys() == whole.keys()
  for k in whole:
    np.testing.assert_allclose(got[k], whole[k], rtol=2e-5, atol=1e-6, err_msg=k)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), got_params, whole_params)
  assert not all(jax.tree.leaves(jax.tree.map(np.array_equal, got_params, params)))  # it did move


def test_length_sorted_parts_make_the_whole_minibatchs_update_on_fewer_columns():
  """A minibatch given to the step as learner.length_sorted_parts (rows sorted by prompt length, 8 at a time, each
  part cut to its longest prompt in steps of 16 columns): the same loss, metrics and plain-SGD step as the whole
  minibatch at its full width, with the KL and entropy terms on, and fewer columns computed."""
  from explore_jax.train.learner import _padded_tokens, length_sorted_parts

  model = Model(CONFIG)
  params = model.init(jax.random.key(0), std=0.3)
  batch = _wide_batch(prompt_len=64)
  lengths = np.asarray(batch["prompt_mask"]).sum(1)
  parts = length_sorted_parts(batch, lengths, 8, bucket=16)
  # Every row once, shortest prompts first; each part as wide as its longest prompt, rounded up to 16 columns.
  assert sorted(np.concatenate([idx for idx, _ in parts]).tolist()) == list(range(32))
  assert [lengths[idx].max() <= part["prompt_tokens"].shape[1] < lengths[idx].max() + 16 for idx, part in parts] == [True] * 4
  assert len({part["prompt_tokens"].shape[1] for _, part in parts}) > 1
  assert sum(_padded_tokens(part) for _, part in parts) < _padded_tokens(batch)
  config = PolicyLossConfig(aggregation="seq-mean-token-mean", eps_low=0.1, kl_coef=0.1, entropy_coef=0.01)
  opt = optax.sgd(1.0)
  out = {}
  for name, given in (("whole", batch), ("parts", [part for _, part in parts])):
    step = make_rl_step(model, opt, config)
    state, metrics = step(state_lib.create_train_state(jax.tree.map(jnp.copy, params), opt), given)
    out[name] = (jax.device_get(state.params), jax.device_get(metrics))
  whole = out["whole"][1]
  assert whole["clipfrac_low"] + whole["clipfrac_high"] > 0 and whole["kl_loss"] != 0  # all terms on
  _assert_same_update(out["parts"], out["whole"], params)


def test_a_short_last_part_is_filled_with_repeats_and_positions_are_cut_with_the_prompt():
  from explore_jax.train.learner import length_sorted_parts

  batch = {"prompt_tokens": jnp.arange(5 * 40).reshape(5, 40), "prompt_mask": jnp.arange(40)[None] >= jnp.asarray(
               [[30], [0], [38], [10], [20]]), "response_tokens": jnp.zeros((5, 3), jnp.int32),
           "positions": jnp.arange(5 * 43 * 3).reshape(5, 43, 3), "valid": jnp.ones(5, bool)}
  parts = length_sorted_parts(batch, np.asarray(batch["prompt_mask"]).sum(1), 2, bucket=16)
  assert [idx.tolist() for idx, _ in parts] == [[2, 0], [4, 3], [1]]  # prompts of 2, 10, 20, 30, 40 tokens
  assert [part["prompt_tokens"].shape for _, part in parts] == [(2, 16), (2, 32), (2, 40)]
  short = parts[0][1]
  np.testing.assert_array_equal(short["prompt_tokens"], batch["prompt_tokens"][np.array([2, 0]), 24:])
  np.testing.assert_array_equal(short["positions"], batch["positions"][np.array([2, 0]), 24:])
  np.testing.assert_array_equal(parts[2][1]["prompt_tokens"], batch["prompt_tokens"][np.array([1, 1])])


def test_micro_batches_divide_the_steps_activation_memory():
  model = Model(CONFIG)
  params = model.init(jax.random.key(0), std=0.3)
  batch, opt = _wide_batch(), optax.sgd(1.0)
  state = state_lib.create_train_state(params, opt)
  temp = {m: make_rl_step(model, opt, PolicyLossConfig(), micro_batches=m).lower(state, batch).compile()
          .memory_analysis().temp_size_in_bytes for m in (1, 4)}
  assert temp[4] < temp[1] / 3, temp


def test_micro_batches_must_divide_the_batch():
  model = Model(CONFIG)
  params = model.init(jax.random.key(0), std=0.3)
  opt = optax.sgd(1.0)
  with pytest.raises(ValueError, match="cannot be split into 3 micro-batches"):
    make_rl_step(model, opt, PolicyLossConfig(), micro_batches=3)(state_lib.create_train_state(params, opt),
                                                                  _wide_batch())
  with pytest.raises(ValueError, match="totals_fn"):
    sft.make_train_step(model, opt, loss_fn=lambda *a: None, micro_batches=2)


def test_sft_micro_batches_make_the_whole_batchs_update():
  model = Model(CONFIG)
  params = model.init(jax.random.key(0), std=0.3)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(1, 64, (16, 24)), jnp.int32)
  attention = jnp.asarray(np.arange(24)[None] >= rng.integers(0, 8, 16)[:, None])
  batch = {"tokens": tokens, "attention_mask": attention,
           "loss_mask": attention & jnp.asarray(np.arange(24)[None] >= rng.integers(8, 24, 16)[:, None])}
  opt = optax.sgd(1.0)
  out = [sft.make_train_step(model, opt, micro_batches=m)(
      state_lib.create_train_state(jax.tree.map(jnp.copy, params), opt), batch) for m in (1, 4)]
  (whole_state, whole), (got_state, got) = jax.device_get(out)
  for k in whole:
    np.testing.assert_allclose(got[k], whole[k], rtol=2e-5, atol=1e-6, err_msg=k)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), got_state.params,
               whole_state.params)
