"""train/throughput.py: model FLOPs against the parameter shapes and XLA's own count, the peak table, and the
iteration's throughput metrics on a hand-computed case."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from explore_jax.models import Model
from explore_jax.models.config import PRESETS
from explore_jax.train import throughput

TINY = PRESETS["tiny"]


def test_matmul_weights_are_the_models_matmul_parameters():
  """The count equals the elements of the model's 2-D-per-layer weight leaves (norms and biases excluded; the
  tied embedding counted once, as the vocabulary projection)."""
  shapes = jax.eval_shape(Model(TINY).init, jax.random.key(0))
  total = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
    name = jax.tree_util.keystr(path)
    per_layer = leaf.shape[1:] if "layers" in name else leaf.shape
    if len(per_layer) >= 2 and "norm" not in name:
      total += int(np.prod(leaf.shape))
  assert throughput.matmul_weights_per_token(TINY) == total
  # By hand: 4 layers x (256x(8+2x4)x32 + 8x32x256 + 3x256x704) + 256x4096.
  assert total == 4 * (256 * 16 * 32 + 256 * 256 + 3 * 256 * 704) + 256 * 4096


def test_forward_flops_agree_with_xla_cost_analysis():
  """One forward pass of T tokens: 2 x weights x T plus attention over the full T x T score matrix (XLA computes
  it whole and masks it) is within a few percent of what XLA counts (norms, softmax and RoPE are the rest). One
  layer: XLA's cost analysis counts a loop body (the layers' scan) once."""
  config = dataclasses.replace(TINY, num_layers=1)
  model = Model(config)
  params = model.init(jax.random.key(0))
  T = 256
  tokens = jnp.zeros((1, T), jnp.int32)
  positions = jnp.arange(T)[None]
  forward = jax.jit(lambda p, t, x: model.apply(p, t, x).logits)
  cost = forward.lower(params, tokens, positions).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  ours = throughput.training_flops(config, T, T * T) / 3
  assert ours == pytest.approx(cost["flops"], rel=0.05)


def test_peak_from_override_table_or_unknown():
  tpu = [types.SimpleNamespace(device_kind="TPU v5 lite")] * 4
  assert throughput.peak_tflops(0.0, tpu) == 4 * 197.0
  assert throughput.peak_tflops(0.0, [types.SimpleNamespace(device_kind="TPU v5p")]) == 459.0
  assert throughput.peak_tflops(0.0, [types.SimpleNamespace(device_kind="NVIDIA H100 80GB HBM3")] * 8) == 8 * 989.0
  assert throughput.peak_tflops(0.0, [types.SimpleNamespace(device_kind="cpu")]) is None
  assert throughput.peak_tflops(100.0, [types.SimpleNamespace(device_kind="cpu")] * 2) == 200.0
  assert throughput.peak_tflops(0.0, []) is None


def test_iteration_metrics_by_hand():
  m = {"sample_tokens_per_s": 50.0, "sample_prompt_tokens_per_s": 900.0, "time_rollout_s": 30.0,
       "time_environment_s": 6.0, "time_update_s": 10.0,
       "time_policy_update_s": 4.0, "update/tokens": 1000.0, "update/attention_pairs": 5000.0}
  out = throughput.iteration_metrics(m, TINY, peak=1.0)
  flops = 3 * (2 * throughput.matmul_weights_per_token(TINY) * 1000 + 4 * 4 * 8 * 32 * 5000)
  assert out["throughput/sampler_tokens_per_s"] == 50.0
  assert out["throughput/sampler_prompt_tokens_per_s"] == 900.0
  assert out["throughput/env_wait_share"] == pytest.approx(6 / 40)
  assert out["throughput/learner_tokens_per_s"] == 250.0
  assert out["throughput/learner_tflops"] == pytest.approx(flops / 4 / 1e12)
  assert out["throughput/mfu"] == pytest.approx(flops / 4 / 1e12)
  assert "throughput/mfu" not in throughput.iteration_metrics(m, TINY, peak=None)
